"""Past one machine: Flower's simulation runtime on an existing Ray cluster.

A real two-node cluster on loopback — `ray start --head` and a second `ray start --address`,
each a separate raylet with one CPU — runs a short PFedRec federation of two Flower nodes
(one Ray actor each, so one on each Ray node); it must end with the simulator's figures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from fedrec.experiment import RunConfig, federated_config
from fedrec.flower.launch import QUIET, free_port

RAY = shutil.which("ray", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(RAY is None, reason="Ray is installed with fedrec[flower]")


class LocalRayCluster:
    """A head and ``workers`` more Ray nodes on 127.0.0.1, one CPU each, every port chosen free
    (two raylets on one host would otherwise clash on the agents' fixed ports). Each node is a
    `ray start --block` in its own process group; leaving the context kills those groups (not
    `ray stop`, which would stop every Ray process on the machine)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = Path(tempfile.mkdtemp(prefix="fr-ray-", dir="/tmp"))  # short: socket paths
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, *args: str) -> None:
        ports = {f"--{name}": str(free_port()) for name in (
            "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")}
        cmd = [str(RAY), "start", "--block", "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats",
               "--node-ip-address=127.0.0.1", *[f"{k}={v}" for k, v in ports.items()], *args]
        log = open(self.temp / f"node-{len(self.procs)}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           env={**os.environ, **QUIET}))

    def nodes_alive(self) -> int:
        """Nodes up, asked from a driver on 127.0.0.1 (left to itself, Ray may take the host's
        outward address and look for the head there); a probe that hangs counts as none."""
        try:
            done = subprocess.run([sys.executable, "-c", (
                "import ray, sys; ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', "
                "logging_level='ERROR', log_to_driver=False);"
                "print(sum(n['Alive'] for n in ray.nodes()))"), self.address],
                capture_output=True, text=True, timeout=60, env={**os.environ, **QUIET})
        except subprocess.TimeoutExpired:
            return 0
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0

    def __enter__(self) -> LocalRayCluster:
        self._start("--head", f"--port={self.port}", "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}", f"--temp-dir={self.temp}")
        time.sleep(3)
        for _ in range(self.workers):
            self._start(f"--address={self.address}")
        deadline = time.monotonic() + 90
        while self.nodes_alive() < 1 + self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.__exit__()
                logs = "\n".join(p.read_text()[-1500:] for p in sorted(self.temp.glob("node-*.log")))
                raise RuntimeError(f"the Ray cluster did not come up:\n{logs}")
            time.sleep(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


# Runs in its own process (as `fedrec flower --mode simulation --ray-address` would), and
# records on which Ray node each of Flower's actors was placed, right after Flower builds them.
DRIVER = """
import json, sys
import ray
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from fedrec.flower.launch import simulate
from fedrec.flower.records import run_from_json

build = RayBackend.build

def build_and_record(self, app_fn):
    build(self, app_fn)
    where = lambda actor: ray.get_runtime_context().get_node_id()
    placed = ray.get([a.__ray_call__.remote(where) for a in self.pool.pool])
    open(sys.argv[4], "w").write(json.dumps(placed))

RayBackend.build = build_and_record
simulate(run_from_json(sys.argv[1]), 2, out=sys.argv[2], ray_address=sys.argv[3], timeout=120)
"""


def test_a_two_node_ray_cluster_runs_the_simulators_federation(tmp_path: Path) -> None:
    from flower_support import assert_same_outcome, engine_outcome, read_flower_outcome

    from fedrec.flower.records import run_to_json

    run = RunConfig("pfedrec", dataset="synthetic:60x300", protocol="loo-sampled", seed=3, model={"dim": 8},
                    federated=federated_config("pfedrec", rounds=2, memory_budget_mb=0.05))
    out, placed = tmp_path / "ray.json", tmp_path / "placed.json"
    with LocalRayCluster(workers=1) as cluster:
        done = subprocess.run([sys.executable, "-c", DRIVER, run_to_json(run), str(out), cluster.address,
                               str(placed)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **QUIET})
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    assert len(set(json.loads(placed.read_text()))) == 2  # one Flower actor on each Ray node
    assert_same_outcome(read_flower_outcome(out), engine_outcome(run))


@pytest.mark.parametrize(("args", "says"), [
    (["--mode", "loopback", "--ray-address", "127.0.0.1:6379"], "--ray-address only apply to --mode simulation"),
    (["--mode", "app", "--node-gpus", "0.5"], "--node-gpus only apply to --mode simulation"),
    (["--mode", "simulation", "--node-cpus", "0"], "--node-cpus must be >= 1"),
    (["--mode", "simulation", "--ray-address", "10.0.0.5"], "give the Ray head's HOST:PORT"),
    (["--mode", "simulation", "--ray-address", "head:99999"], "give the Ray head's HOST:PORT"),
    (["--mode", "simulation", "--ray-address", f"127.0.0.1:{free_port()}"], "no Ray head answers there"),
])
def test_ray_options_outside_a_ray_run_are_refused(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.cli import main

    with pytest.raises(SystemExit) as done:
        main(["flower", "pfedrec", "-d", "synthetic:60x300", "--rounds", "1", *args])
    assert done.value.code == 2 and says in capsys.readouterr().err
