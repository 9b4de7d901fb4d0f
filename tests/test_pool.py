"""`fedrec.pool`: runs side by side in worker processes, their rounds reported as they go."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedrec.errors import DataFormatError, Diverged, FedrecError, UnknownNameError
from fedrec.experiment import RunConfig, federated_config
from fedrec.pool import run_files

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


def test_a_jobs_own_error_reaches_the_parent_and_the_others_go_on(tmp_path: Path) -> None:
    """An error with arguments of its own (an unknown data set's, a bad file's) crosses back
    from the worker whole, as its message; the pool and the other job are unharmed (an error
    that cannot be pickled breaks the pool and fails every job with it)."""
    bad = RunConfig("fedmf", dataset="no-such-set", federated=federated_config("fedmf", rounds=1))
    good = RunConfig("fedmf", dataset="synthetic:100x400", federated=federated_config("fedmf", rounds=1))
    ended = dict(run_files([(bad, tmp_path / "bad.json"), (good, tmp_path / "good.json")], 2))
    assert ended[0] is not None and ended[0].startswith("unknown data set 'no-such-set'")
    assert ended[1] is None and (tmp_path / "good.json").exists()


@pytest.mark.parametrize("error", [
    FedrecError("plain"), DataFormatError("f.csv", "rating 'x' is not a number", 3),
    UnknownNameError("data set", "ml100k", ["ml-100k", "lastfm-2k"]), Diverged("loss is nan", 4, None),
], ids=lambda e: type(e).__name__)
def test_every_error_a_worker_raises_survives_pickling(error: Exception) -> None:
    import pickle  # how a process pool carries a worker's exception (never a file's contents)

    again = pickle.loads(pickle.dumps(error))  # noqa: S301
    assert type(again) is type(error) and str(again) == str(error)
