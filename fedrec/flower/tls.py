"""The credentials of a secure Flower deployment: a certificate authority, the SuperLink's TLS
certificate signed by it, and one key pair per SuperNode for node authentication.

What Flower 1.41 asks for (read from its CLI and checked on loopback):

* the SuperLink serves every API on one HTTPS port: ``--ssl-certfile`` / ``--ssl-keyfile``
  (PEM) and ``--ssl-ca-certfile`` (the CA, which its own SuperExec uses to reach it); the
  certificate must name the address the others dial, as an IP subject-alternative name for
  an IP (``127.0.0.1``) and a DNS name for a host name, or Python's TLS check refuses it;
* ``--enable-supernode-auth``: a SuperNode is let in only if its public key was registered
  with ``flwr supernode register KEY.pub FEDERATION``; keys are EC on a NIST curve, the
  public key in OpenSSH form, the private key in OpenSSH PEM (``--auth-supernode-private-key``);
* SuperNodes and the ``flwr`` CLI trust the CA (``--root-certificates``, and
  ``root-certificates`` in the federation's entry of ``FLWR_HOME/config.toml``).

The CA's private key signs the SuperLink's certificate and is then dropped: nothing kept on
disk can sign another certificate. Private keys are written readable by their owner only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedrec.errors import FedrecError

#: the names a loopback SuperLink is dialled by
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
VALID_DAYS = 30


@dataclass(frozen=True)
class Credentials:
    """Where a deployment's files are: the CA certificate, the SuperLink's certificate and key,
    and each SuperNode's private and public key (``node{i}.key``, ``node{i}.pub``)."""

    folder: Path
    nodes: int
    #: the names the SuperLink's certificate is valid for (the first is the one dialled)
    hosts: tuple[str, ...] = LOOPBACK_HOSTS

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def superlink_cert(self) -> Path:
        return self.folder / "superlink.pem"

    @property
    def superlink_key(self) -> Path:
        return self.folder / "superlink.key"

    def node_key(self, i: int) -> Path:
        return self.folder / f"node{i}.key"

    def node_public(self, i: int) -> Path:
        return self.folder / f"node{i}.pub"

    def superlink_args(self) -> list[str]:
        """`flower-superlink`'s TLS and authentication flags."""
        return ["--ssl-ca-certfile", str(self.ca), "--ssl-certfile", str(self.superlink_cert),
                "--ssl-keyfile", str(self.superlink_key), "--enable-supernode-auth"]

    def supernode_args(self, key: Path) -> list[str]:
        """`flower-supernode`'s flags: trust the CA, authenticate with ``key``."""
        return ["--root-certificates", str(self.ca), "--auth-supernode-private-key", str(key)]


def make_credentials(folder: str | Path, nodes: int, hosts: Sequence[str] = LOOPBACK_HOSTS,
                     days: int = VALID_DAYS) -> Credentials:
    """Write a fresh CA, a SuperLink certificate for ``hosts`` (IP addresses or DNS names) and
    ``nodes`` SuperNode key pairs into ``folder``; an existing set there is replaced."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise FedrecError("the SuperLink's certificate needs at least one host name or address")
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not h or any(c.isspace() or c in "/:@" for c in h):
                raise FedrecError(f"--tls-host {h!r}: give a host name or an IP address") from None
            names.append(x509.DNSName(h))
    creds = Credentials(Path(folder).resolve(), nodes, tuple(hosts))
    creds.folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    since, until = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedrec deployment CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(since).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_usage(cert_sign=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(since).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    creds.ca.write_bytes(ca.public_bytes(pem))
    creds.superlink_cert.write_bytes(cert.public_bytes(pem))
    _private(creds.superlink_key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    for i in range(nodes):
        write_node_key(creds.node_key(i), creds.node_public(i))
    return creds


def write_node_key(private: Path, public: Path) -> None:
    """A SuperNode key pair: EC P-384, the private key in OpenSSH PEM (owner-only), the public
    key in OpenSSH form (``ecdsa-sha2-nistp384 AAAA...``), as node authentication wants."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    _private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")


def _private(path: Path, content: bytes) -> None:
    """Write ``content`` readable and writable by the owner only, from its creation on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(content)


def _usage(cert_sign: bool) -> object:
    from cryptography import x509

    return x509.KeyUsage(digital_signature=True, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                         key_agreement=not cert_sign, encipher_only=False, decipher_only=False)
