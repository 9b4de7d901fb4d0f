"""`fedrec.pool`: runs side by side in worker processes, their rounds reported as they go."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

LEFT_EARLY = """
import time
from fedrec.experiment import RunConfig, federated_config
from fedrec.pool import run_files

def stop(note):
    raise RuntimeError("stop")

cfg = RunConfig("pfedrec", dataset="synthetic:300x800", federated=federated_config("pfedrec", rounds=2000))
jobs = [(cfg, r"{out}/{{}}.json".format(k)) for k in range(3)]
start = time.monotonic()
try:
    for _ in run_files(jobs, 2, on_round=stop):
        pass
except RuntimeError:
    print("stopped", round(time.monotonic() - start, 1))
"""


def test_a_pool_left_early_ends_its_runs(tmp_path: Path) -> None:
    """A callback that raises ends the pool at once: the running runs are ended, the queued ones
    dropped. Waiting for them instead would hang for good, since a worker whose notes nobody
    reads blocks on a full pipe (checked: without the rule, this test hangs)."""
    script = textwrap.dedent(LEFT_EARLY).format(out=tmp_path)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("stopped")
    assert not list(tmp_path.glob("*.json"))  # no run went on to write its result
