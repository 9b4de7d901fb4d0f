"""The real thing: a loopback deployment of two SuperNodes as processes (TLS, registered nodes)
makes the simulator's rounds, refuses what it should, and survives a SuperNode killed mid-run;
two deployments share a host."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from flower_support import (
    assert_same_outcome,
    engine_outcome,
    make_run,
    read_flower_outcome,
)


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from fedrec.flower.launch import Loopback

    # two nodes: each message starts a ClientApp process a node (about 6 s of imports), so a
    # third node costs the suite a third more on two cores and checks nothing two do not
    with Loopback(2, workdir=tmp_path_factory.mktemp("loopback")) as deployment:
        yield deployment


def test_secure_loopback_matches_the_simulator_refuses_an_unregistered_node_and_survives_a_killed_one(
        loopback: Any) -> None:
    """The default deployment (TLS, registered SuperNodes only) makes the simulator's rounds,
    while a SuperNode with a key the SuperLink never registered is turned away. SuperNode 1 is
    then SIGKILLed after round 1: round 2 finishes with the other after the timeout, the log
    names the silent node, the results count it. (One run for both: each deployment run costs
    a minute or two of the suite. The timeout leaves a node's fresh ClientApp process time to
    start and train on a busy 2-core machine. A deployment's test figures are compared with
    the in-process deployment's in `tests/test_flower_user_data.py`.)"""
    from fedrec.flower.tls import write_node_key

    assert loopback.credentials is not None and "--enable-supernode-auth" in loopback.credentials.superlink_args()
    key = loopback.workdir / "intruder.key"
    write_node_key(key, key.with_suffix(".pub"))
    intruder = loopback.start_node(0, key=key, name="intruder")
    run = make_run("pfedrec", rounds=2)
    out, ckpt = loopback.workdir / "run.json", loopback.workdir / "run.ckpt"
    proc = loopback.submit(run, out=out, timeout=40, checkpoint=ckpt, wait=False)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and _round_of(ckpt) < 1:
        time.sleep(0.2)
    assert _round_of(ckpt) == 1, (loopback.workdir / "logs" / "flwr-run.log").read_text()[-3000:]
    loopback.kill_node(1)
    proc.wait(timeout=300)
    log = (loopback.workdir / "logs" / "flwr-run.log").read_text()
    assert proc.returncode == 0 and out.exists(), log[-3000:]
    deployed = read_flower_outcome(out)
    assert [h.round for h in deployed.history] == [1, 2]
    blob = json.loads(out.read_text())
    # a node dropped in round 1 is a message slower than the timeout (a machine too busy for
    # it), not a wrong figure: said first, as such
    assert [h["extra"]["dropped_nodes"] for h in blob["history"]] == [0, 1], log[-3000:]
    assert_same_outcome(deployed, engine_outcome(run), rounds=1)  # the round before the kill
    assert intruder.wait(timeout=60) != 0
    assert "Failed to activate SuperNode" in (loopback.workdir / "logs" / "intruder.log").read_text()
    # the SuperLink either lets the message time out or answers for the dead node (no heartbeat)
    assert "gave no train reply" in log or "failed (train)" in log
    assert "did not answer" in log
    assert blob["history"][-1]["valid"]["users"] == 30  # the live node's users were evaluated


def _round_of(ckpt: Path) -> int:
    """The round a run's checkpoint was written after (0: none yet)."""
    from fedrec.core import checkpoint

    return checkpoint.peek_round(ckpt) if ckpt.exists() else 0


def test_the_secure_superlink_speaks_only_tls_with_its_own_ca(loopback: Any) -> None:
    """A plaintext request gets no answer, a TLS client that does not trust the deployment's
    CA fails the handshake, one that does completes it, and a plaintext SuperNode never joins."""
    import http.client
    import ssl

    host, port = "127.0.0.1", loopback.port
    plain = http.client.HTTPConnection(host, port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        plain.request("GET", "/")
        plain.getresponse()
    with pytest.raises(ssl.SSLCertVerificationError):
        http.client.HTTPSConnection(host, port, timeout=10, context=ssl.create_default_context()).connect()
    trusted = http.client.HTTPSConnection(
        host, port, timeout=10, context=ssl.create_default_context(cafile=str(loopback.credentials.ca)))
    trusted.connect()  # the certificate names 127.0.0.1 and chains to the deployment's CA
    trusted.close()
    from fedrec.flower.launch import free_port

    node = loopback.spawn("plaintext-node", [
        "flower-supernode", "--insecure", "--superlink", loopback.address, "--max-retries", "1",
        "--port", str(free_port()), "--node-config", f"partition-id=0 num-partitions={loopback.nodes}"])
    assert node.wait(timeout=60) != 0
    assert "Giving up reconnection" in (loopback.workdir / "logs" / "plaintext-node.log").read_text()


def test_two_loopback_deployments_share_a_host(tmp_path: Path) -> None:
    """Free ports, not fixed ones: two deployments on one host both start and stay up."""
    import socket

    from fedrec.flower.launch import Loopback

    # one secure and one --insecure: both kinds start and serve
    with Loopback(2, workdir=tmp_path / "a") as a, Loopback(2, workdir=tmp_path / "b", insecure=True) as b:
        assert a.credentials is not None and b.credentials is None
        ports = {a.port, b.port, *a.node_ports, *b.node_ports}
        assert len(ports) == 6
        time.sleep(2)  # let every process bind (a clash would end one)
        assert all(p.poll() is None for d in (a, b) for p in d.procs.values())
        for port in (a.port, b.port):
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) == 0


def test_the_superlink_serves_its_control_api_to_its_own_host_only(loopback: Any) -> None:
    """Flower's Control API (submit an app, register a node key) has no authentication; the
    SuperLink fedrec starts answers it only to its own host. From 127.0.0.2 (another address
    of this machine, standing for another host) Control and Runtime are 403 and Fleet is not."""
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(loopback.credentials.ca))

    def status(path: str, source: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", loopback.port, timeout=10, context=context,
                                           source_address=(source, 0))
        try:
            conn.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
            return conn.getresponse().status
        finally:
            conn.close()

    for path in ("/v1/control/list-nodes", "/v1/control/start-run", "/v1/runtime/acquire-task", "/docs"):
        assert status(path, "127.0.0.2") == 403, path
    # reaches Flower, which wants protobuf (415); `flwr supernode register` went through here
    assert status("/v1/control/list-nodes", "127.0.0.1") == 415
    assert status("/v1/fleet/activate-node", "127.0.0.2") == 415
