"""``fedrec-superlink``: Flower's SuperLink with its Control and Runtime APIs served only to the
SuperLink's own host.

Flower 1.41 serves three APIs on the SuperLink's one HTTPS port: Fleet (SuperNodes fetch
messages and send replies), Control (`flwr run` submits an app, `flwr supernode register`
admits a node key) and Runtime (the ServerApp's process). In the open-source build Control
has no authentication, so anyone who can reach the port, trusting the CA or not, can register
a node key of their own and submit an app whose code then runs on the SuperLink and on every
SuperNode (checked on loopback). TLS and node authentication do not close that: they protect
the wire and the Fleet API.

This launcher is `flower-superlink` with one change: every path outside ``/v1/fleet/`` (the
Fleet API the SuperNodes use) answers 403 unless the peer's address is allowed
(``--control-from``, addresses or host names; default the loopback addresses and the ``--host``
the SuperLink binds).
The operator then runs `flwr run` and `flwr supernode register` on the SuperLink's machine
(or through an SSH tunnel to it), and the SuperNodes reach the Fleet API from anywhere. The
check allow-lists the Fleet prefix, so a route a later Flower adds is closed until allowed.
It wraps Flower's `create_app` and refuses to start under another Flower version than the one
it was checked against.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

#: the Flower release whose app factory and routes this launcher was checked against
FLOWER = "1.41."
#: what SuperNodes use: open to every peer (node authentication guards it)
OPEN = ("/v1/fleet/",)
LOOPBACK = ("127.0.0.1", "::1")

Scope = dict[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def guard(app: ASGI, allowed: Iterable[str]) -> ASGI:
    """``app`` with every HTTP path outside `OPEN` refused (403) to peers not in ``allowed``."""
    allowed = {str(ipaddress.ip_address(a)) for a in allowed}

    async def guarded(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and not str(scope.get("path", "")).startswith(OPEN):
            peer = (scope.get("client") or ("",))[0]
            if _canonical(peer) not in allowed:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})  # policy violation
                    return
                body = b'{"detail":"this API is served to the SuperLink\'s own host only"}'
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def _canonical(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return ""
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return str(mapped or ip)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--control-from A,B`` taken out of ``argv``: (the allowed addresses, Flower's arguments).
    Default: `LOOPBACK` and the ``--host`` value."""
    allowed: list[str] = []
    rest: list[str] = []
    args = iter(argv)
    for a in args:
        if a == "--control-from":
            allowed += next(args, "").split(",")
        elif a.startswith("--control-from="):
            allowed += a.split("=", 1)[1].split(",")
        else:
            rest.append(a)
    if not allowed:
        host = "127.0.0.1"
        for i, a in enumerate(rest):
            if a == "--host" and i + 1 < len(rest):
                host = rest[i + 1]
            elif a.startswith("--host="):
                host = a.split("=", 1)[1]
        allowed = [*LOOPBACK, host]
    return [a.strip() for a in allowed if a.strip()], rest


def addresses(names: list[str]) -> list[str]:
    """The IP addresses ``names`` stand for: an address as it is, a host name resolved (the
    ``--host`` a SuperLink binds may be one); a name that does not resolve adds none."""
    import socket

    out: list[str] = []
    for name in names:
        try:
            out.append(str(ipaddress.ip_address(name)))
        except ValueError:
            try:
                out += sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None)})
            except OSError:
                continue
    return out


def main() -> None:
    """Console entry point: ``fedrec-superlink [--control-from ADDR,...] FLOWER-SUPERLINK-ARGS``."""
    import flwr
    import flwr.superlink.main as superlink_main

    names, rest = split_args(sys.argv[1:])
    allowed = addresses(names)
    version = getattr(flwr, "__version__", "")
    if not version.startswith(FLOWER) or not callable(getattr(superlink_main, "create_app", None)):
        sys.exit(f"fedrec-superlink: checked against Flower {FLOWER}x, found {version or 'unknown'}; "
                 "refusing to start a SuperLink whose Control API it cannot guard")
    make = superlink_main.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        return guard(make(*args, **kwargs), allowed)

    # Flower's CLI imports create_app from this module when it starts the HTTP API
    superlink_main.create_app = create_app
    # uvicorn trusts X-Forwarded-For from the addresses this names; only from loopback here
    os.environ.pop("FORWARDED_ALLOW_IPS", None)
    # Flower starts extra, unguarded gRPC servers (Control among them) when these are set
    for name in [k for k in os.environ if k.startswith("FLWR_INTERNAL_GRPC_")]:
        del os.environ[name]
    from flwr.superlink.cli.flower_superlink import flower_superlink

    sys.argv = ["flower-superlink", *rest]
    flower_superlink()


if __name__ == "__main__":
    main()
