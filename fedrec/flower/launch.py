"""Start fedrec runs on Flower: in Flower's simulation engine, or on a loopback deployment
(a SuperLink and SuperNodes as separate processes on this machine), started and stopped here.

The deployment is what a real one runs, on one machine: `flower-superlink` serves the
SuperNodes and the run; each `flower-supernode` holds one partition of the users (node config
``partition-id`` / ``num-partitions``); `flwr run` submits the app (`fedrec.flower.app`) with
the run's options in its run config. Telemetry and runtime dependency installation are off.

It is secure unless told otherwise: the SuperLink speaks TLS with a certificate from a CA made
for the deployment and admits only SuperNodes whose public keys were registered with it
(`fedrec.flower.tls`); ``insecure=True`` runs everything in plaintext, unauthenticated. Either
way the SuperLink is `fedrec-superlink` (`fedrec.flower.superlink`), which serves Flower's
unauthenticated Control API to its own host only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig
from fedrec.flower.failures import error_box, exception_line, log_tail
from fedrec.flower.records import RUN_KEY, run_to_json
from fedrec.flower.secagg import RANGE
from fedrec.flower.tls import LOOPBACK_HOSTS, Credentials, make_credentials

QUIET = {"FLWR_TELEMETRY_ENABLED": "0", "RAY_DEDUP_LOGS": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def options(run: RunConfig, nodes: int, *, timeout: float = 600.0, out: str | Path | None = None,
            checkpoint: str | Path | None = None, resume: bool = False,
            client_state_dir: str | Path | None = None, secagg: bool = False,
            secagg_range: float = RANGE, overwrite: bool = False) -> dict[str, Any]:
    """The apps' options (`fedrec.flower.app`) for ``run`` on ``nodes`` SuperNodes; the ServerApp
    replaces an existing ``out`` only with ``overwrite`` (or going on from ``checkpoint``)."""
    opts: dict[str, Any] = {RUN_KEY: run_to_json(run), "nodes": nodes, "round-timeout": float(timeout)}
    if out:
        opts["out"] = str(Path(out).resolve())
    if overwrite:
        opts["overwrite"] = True
    if checkpoint:
        opts["checkpoint"] = str(Path(checkpoint).resolve())
        opts["resume"] = bool(resume)
    if secagg:
        opts["secagg"] = True
        opts["secagg-range"] = float(secagg_range)
    if client_state_dir:
        opts["client-state-dir"] = str(Path(client_state_dir).resolve())
    return opts


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Refuse a ``--ray-address`` that names no reachable Ray head, in one line and before Ray
    starts: otherwise `ray.init` waits on the address and ends in a long traceback.

    ``auto`` (Ray finds a cluster started on this machine) and Ray Client's ``ray://HOST:PORT``
    are passed through; ``HOST:PORT`` must have a port in 1..65535 that accepts a TCP
    connection (the head's GCS port, 6379 by default)."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FedrecError(f"--ray-address {address!r}: give the Ray head's HOST:PORT (e.g. 10.0.0.5:6379) or auto")
    import socket

    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise FedrecError(f"--ray-address {address}: no Ray head answers there ({e.strerror or e}); "
                          f"start one with `ray start --head --port={port}` (docs/scale.md)") from None


def simulate(run: RunConfig, nodes: int, *, ray_address: str | None = None, node_cpus: int = 1,
             node_gpus: float = 0.0, **kw: Any) -> None:
    """Run on Flower's simulation engine (Ray), one virtual SuperNode per partition.

    ``ray_address``: an existing Ray cluster (``HOST:PORT`` of its head, or ``auto``) whose
    machines run the nodes (see docs/scale.md); default: a Ray instance started here. Each node
    is a Ray actor asking for ``node_cpus`` CPUs and ``node_gpus`` of a GPU, and trains its shard
    of clients with the vectorised engine on the run's device.
    """
    os.environ.update(QUIET)
    from flwr.simulation import run_simulation

    from fedrec.flower.app import apps

    backend: dict[str, Any] = {"client_resources": {"num_cpus": node_cpus, "num_gpus": float(node_gpus)}}
    if ray_address:
        backend["init_args"] = {"address": ray_address}
    server, client = apps(options(run, nodes, **kw))
    run_simulation(server_app=server, client_app=client, num_supernodes=nodes, backend_config=backend)


_HANDED_OUT: set[int] = set()
_RNG = random.Random()  # seeded by the OS: two test runs on one host pick different ports


def _quiet_ports() -> range:
    """Ports the kernel never hands out by itself: those below its ephemeral range
    (``ip_local_port_range``, 32768 unless configured) and above 20,000 less than that."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - 12768), low)


def free_port() -> int:
    """A TCP port free on every address now, never one this process handed out before.

    A port handed out here is bound later by a child process (a SuperLink, a SuperNode, a Ray
    node). The kernel gives ports of its ephemeral range to every ``bind(0)`` and outgoing
    connection, a just-closed one included, so a port picked there can be taken by another
    process (or by this one's next pick) before the child binds it: a CI run once saw two
    loopback deployments given the same port. So the port is drawn at random below that range,
    where only a process that names its port can take it, checked free, and recorded.
    """
    import socket

    quiet = _quiet_ports()
    for _ in range(1000):
        port = _RNG.choice(quiet) if len(quiet) > 1000 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # noqa: S104 (a probe, closed at once)
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise FedrecError("found no free TCP port in 1,000 tries")


class Loopback:
    """A SuperLink and ``nodes`` SuperNodes on 127.0.0.1, as child processes.

    Use as a context manager; `submit` runs fedrec on it through `flwr run`, `kill_node`
    SIGKILLs one SuperNode (fault tests), leaving the context stops everything. Logs are in
    ``workdir/logs``. Secure unless ``insecure``: TLS with a CA and SuperLink certificate and
    one registered key pair per SuperNode, all in ``workdir/credentials``.
    """

    def __init__(self, nodes: int, workdir: str | Path | None = None, port: int | None = None,
                 node_ports: list[int] | None = None, insecure: bool = False) -> None:
        self.nodes, self.insecure = nodes, insecure
        self.credentials: Credentials | None = None
        # absolute: the processes run in it, and are handed paths inside it (FLWR_HOME, the app)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fedrec-flower-")).resolve()
        self._log_marks: dict[str, int] = {}  # where each log stood when the last run was submitted
        # free ports unless given, so two deployments (or test runs) on one host do not collide
        self.port = port if port is not None else free_port()
        self.node_ports = node_ports if node_ports is not None else [free_port() for _ in range(nodes)]
        _HANDED_OUT.update([self.port, *self.node_ports])  # given ones too: free_port skips them
        if len(self.node_ports) != nodes:
            raise FedrecError(f"{nodes} SuperNodes need {nodes} ports, got {len(self.node_ports)}")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        bin_dir = str(Path(sys.executable).parent)  # flower-* spawn flower-superexec by name
        # the SuperExecs poll for work every second by default; 0.1 s cuts a wait per message
        self.env = {**os.environ, **QUIET, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                    "FLWR_HOME": str(self.workdir / "flwr-home"), "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
        self.bin = Path(bin_dir)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Loopback:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def start(self) -> None:
        """Start the SuperLink, register the SuperNodes' keys (secure), start the SuperNodes."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        link = ["--insecure"]
        if not self.insecure:
            self.credentials = make_credentials(self.workdir / "credentials", self.nodes)
            link = self.credentials.superlink_args()
        (home / "config.toml").write_text(federation_config("loopback", self.address, self.credentials))
        # one HTTPS port serves the SuperLink's APIs (Flower 1.41); each SuperNode has its own
        self.spawn("superlink", ["fedrec-superlink", *link, "--disable-runtime-dependency-installation",
                                  "--host", "127.0.0.1", "--port", str(self.port)])
        self._wait_port(self.port)
        if self.credentials is not None:  # a node started before its key is known is refused
            self.register({f"node{i}": self.credentials.node_public(i) for i in range(self.nodes)})
        for i in range(self.nodes):
            self.start_node(i)

    def register(self, keys: dict[str, Path], timeout: float = 120.0) -> dict[str, int]:
        """Register SuperNodes' public keys, by name, with the SuperLink (`flwr supernode
        register`, one process a key, all at once: each spends seconds importing Flower);
        returns the node id the SuperLink gives each name. Raises `FedrecError` naming the
        first key the SuperLink did not register within ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        procs: dict[str, subprocess.Popen[str]] = {}
        ids = {}
        try:
            for name, key in keys.items():
                procs[name] = subprocess.Popen(
                    [str(self.bin / "flwr"), "supernode", "register", str(key), "loopback", "--name", name,
                     "--format", "json"], env=self.env, cwd=self.workdir, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
            for name, proc in procs.items():
                try:
                    out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise FedrecError(f"the SuperLink did not register {keys[name].name} in {timeout:g} s") from None
                try:
                    ids[name] = int(json.loads(out)["node-id"])
                except (ValueError, KeyError, TypeError):
                    raise FedrecError(f"the SuperLink did not register {keys[name].name}: "
                                      f"{' '.join((out + err).split())[-300:]}") from None
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()  # reaps it and closes its pipes
        return ids

    def start_node(self, i: int, key: Path | None = None, name: str | None = None) -> subprocess.Popen[bytes]:
        """Start a SuperNode for partition ``i``, authenticating with ``key`` (default: the
        registered key of node ``i``); its log is ``logs/NAME.log`` (default ``supernode{i}``)."""
        name = name or f"supernode{i}"
        if self.credentials is None:
            auth = ["--insecure"]
        else:
            auth = self.credentials.supernode_args(key or self.credentials.node_key(i))
        port = self.node_ports[i] if name == f"supernode{i}" else free_port()
        return self.spawn(name, ["flower-supernode", *auth, "--superlink", self.address, "--port", str(port),
                                  "--node-config", f"partition-id={i} num-partitions={self.nodes}"])

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        """Start ``cmd`` (a program of the venv's bin, then its arguments) in its own process
        group as ``name``, logging to ``logs/NAME.log``; stopped with the deployment."""
        log = open(self.workdir / "logs" / f"{name}.log", "wb")  # noqa: SIM115 (kept by the process)
        cmd[0] = str(self.bin / cmd[0])
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            cwd=self.workdir, start_new_session=True)
        return self.procs[name]

    def _wait_port(self, port: int, timeout: float = 60.0) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if self.procs["superlink"].poll() is not None:
                raise FedrecError(f"the SuperLink exited; see {self.workdir / 'logs' / 'superlink.log'}")
            time.sleep(0.2)
        raise FedrecError(f"the SuperLink did not open port {port} in {timeout:g} s")

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its ClientApp processes (a device that vanishes)."""
        proc = self.procs.pop(f"supernode{i}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """SIGTERM every process group (SuperNodes first), then SIGKILL what is left."""
        for name in sorted(self.procs, key=lambda n: n == "superlink"):
            _signal(self.procs[name], signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal(proc, signal.SIGKILL)  # and any superexec children left in its group
            proc.wait()
        self.procs.clear()

    def submit(self, run: RunConfig, *, wait: bool = True, **kw: Any) -> subprocess.Popen[bytes]:
        """`flwr run` fedrec's app with ``run`` on this deployment; returns the `flwr` process
        (finished when ``wait``). Its output (the ServerApp's log) is in ``logs/flwr-run.log``."""
        app = self.workdir / "app"
        app.mkdir(exist_ok=True)
        write_app(app, options(run, self.nodes, **kw))
        logs = self.workdir / "logs"
        self._log_marks = {p.name: p.stat().st_size for p in logs.glob("*.log")}
        log = open(logs / "flwr-run.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen([str(self.bin / "flwr"), "run", str(app), "loopback", "--stream"],
                                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                                start_new_session=True)
        if wait:
            proc.wait()
        return proc

    def failure(self, proc: subprocess.Popen[bytes]) -> str:
        """Why the last submitted run (``proc``, its finished `flwr run`) wrote no results, in
        one line naming the failing process, its reason and its full log.

        Searched in this order, in what each log gained since the run was submitted: the
        SuperNodes' logs for a ClientApp's exception (a node's failure is usually what ended
        the ServerApp too), the run's log for the ServerApp's exception, then processes of the
        deployment that exited, then `flwr run`'s own error."""
        logs = self.workdir / "logs"

        def since_submit(name: str) -> str:
            return log_tail(logs / name, self._log_marks.get(name, 0))

        nodes = [(i, line) for i in range(self.nodes)
                 if (line := exception_line(since_submit(f"supernode{i}.log"))) is not None]
        if nodes:
            (i, line), others = nodes[0], [str(j) for j, _ in nodes[1:]]
            also = f"; node{'s' * (len(others) > 1)} {', '.join(others)} too" if others else ""
            return f"node {i} failed: {line} (full log: {logs / f'supernode{i}.log'}){also}"
        run_log = logs / "flwr-run.log"
        said = since_submit(run_log.name)
        line = exception_line(said)
        if line is not None:
            return f"the ServerApp failed: {line} (full log: {run_log})"
        for name, child in self.procs.items():
            if child.poll() is not None:
                what = "the SuperLink" if name == "superlink" else name
                where = logs / f"{name}.log"
                reason = exception_line(since_submit(where.name)) or f"exit code {child.returncode}"
                return f"{what} exited: {reason} (full log: {where})"
        reason = error_box(said) or (f"exit code {proc.returncode}" if proc.returncode else None)
        if reason is not None:
            return f"`flwr run` failed: {reason} (full log: {run_log})"
        return f"the run wrote no results and no process reported an error; see the logs in {logs}"


def federation_config(name: str, address: str, credentials: Credentials | None) -> str:
    """``FLWR_HOME/config.toml`` naming one federation, ``name`` (the default), at ``address``:
    trusting the deployment's CA, or plaintext without ``credentials``."""
    trust = "insecure = true" if credentials is None else f"root-certificates = {_toml(str(credentials.ca))}"
    return f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{trust}\n'


def superlink_address(credentials: Credentials | None, port: int = 8000) -> str:
    """Where a deployment's SuperLink is dialled: the first name its certificate holds, or
    127.0.0.1 in plaintext."""
    return f"{'127.0.0.1' if credentials is None else credentials.hosts[0]}:{port}"


def by_hand(app: Path, nodes: int, credentials: Credentials | None, home: Path, port: int = 8000,
            federation: str = "fedrec") -> list[str]:
    """The shell commands (with comments) that deploy ``app`` by hand with Flower's own tools:
    a SuperLink, the nodes' keys registered (secure), ``nodes`` SuperNodes, then `flwr run`.
    ``home`` is the deployment's ``FLWR_HOME``, whose ``config.toml`` (`federation_config`)
    names the federation; it is written beside the app, not appended to the user's own."""
    address = superlink_address(credentials, port)
    host = address.rsplit(":", 1)[0]
    link = ["--insecure"] if credentials is None else credentials.superlink_args()
    bin_dir = Path(sys.executable).parent
    lines = ["# in every terminal (the SuperLink and SuperNodes start flower-superexec by name):",
             f"export PATH={bin_dir}:$PATH FLWR_HOME={home} FLWR_TELEMETRY_ENABLED=0",
             f"# 1. the SuperLink (fedrec-superlink: Flower's, its Control API served to this machine "
             f"only, so run the flwr commands here); wait for 'Starting the SuperLink ... on {address}'",
             " ".join(["fedrec-superlink", *link, "--disable-runtime-dependency-installation",
                       "--host", host, "--port", str(port)])]
    if credentials is not None:
        lines += ["# 2. register every SuperNode's public key (a SuperNode whose key is not registered "
                  "yet is refused and exits)",
                  *(f"flwr supernode register {credentials.node_public(i)} {federation}" for i in range(nodes))]
    step = 3 if credentials is not None else 2
    remote = credentials is not None and host not in LOOPBACK_HOSTS
    lines.append(f"# {step}. each SuperNode in its own terminal" + (
        " (on another machine: copy it ca.pem and its own nodeI.key only)" if remote else ""))
    for i in range(nodes):
        auth = ["--insecure"] if credentials is None else credentials.supernode_args(credentials.node_key(i))
        lines.append(" ".join(["flower-supernode", *auth, "--superlink", address, "--port", str(9100 + i),
                               "--node-config", f'"partition-id={i} num-partitions={nodes}"']))
    return [*lines, f"# {step + 1}. the run (streams the ServerApp's log)",
            f"flwr run {app.resolve()} {federation} --stream"]


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def write_app(app: Path, opts: dict[str, Any]) -> None:
    """A Flower app directory whose components are fedrec's installed apps and whose run
    config holds the run's options."""
    config = "\n".join(f"{k} = {_toml(v)}" for k, v in opts.items())
    (app / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedrec-app"
version = "1.0.0"
description = "fedrec on Flower"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedrec"

[tool.flwr.app.components]
serverapp = "fedrec.flower.app:server"
clientapp = "fedrec.flower.app:client"

[tool.flwr.app.config]
{config}
''')


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's
