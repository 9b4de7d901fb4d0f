"""`fedrec flower` on a user's own file: a loopback deployment reads it with --columns from
another folder (the nodes run elsewhere) with a relative --workdir and ends with the in-process
deployment's figures; a failure on the nodes or in the ServerApp ends the command with one
line naming the process, its exception and its log."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrec.experiment import RunConfig, federated_config

COLUMNS = "user,item,rating,time"


def _write_csv(path: Path, users: int = 30, items: int = 150, per_user: int = 8) -> Path:
    """Each user rates ``per_user`` distinct items, one a step later than the last."""
    rng = np.random.default_rng(0)
    rows = ["user,item,rating,time"]
    for u in range(users):
        for k, i in enumerate(rng.choice(items, size=per_user, replace=False)):
            rows.append(f"u{u},item{i},{rng.integers(1, 6)},{1000 * u + k}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from fedrec.cli import main

    with pytest.raises(SystemExit) as done:
        main(["flower", "fedmf", "--rounds", "1", "--nodes", "2", "--dim", "8", *args])
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


def test_loopback_reads_a_users_file_from_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``-d ../data/mine.csv --columns ... --workdir deployment``, both relative to a folder the
    nodes do not run in: the nodes read the file, the deployment's folder is where it was
    asked for (not inside itself), and the figures are the in-process deployment's."""
    from fedrec.flower.dispatch import run_in_process

    data = _write_csv(tmp_path / "data" / "mine.csv")
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = _cli(capsys, "-d", "../data/mine.csv", "--columns", COLUMNS, "--workdir", "deployment",
                          "-o", "mine.json")
    assert code == 0, out + err
    assert (here / "deployment" / "flwr-home").is_dir() and not (here / "deployment" / "deployment").exists()
    blob = json.loads((here / "mine.json").read_text())
    assert blob["dataset"] == str(data.resolve()) and blob["config"]["columns"] == COLUMNS
    assert blob["data"]["clients"] == 30
    engine = {"eval_every": 1, "ldp": 0.0, "dp_noise": 0.0, "dp_delta": 1e-5, "device": "cpu"}  # the CLI's
    run = RunConfig("fedmf", dataset=str(data), columns=COLUMNS, model={"dim": 8},
                    federated=federated_config("fedmf", "../data/mine.csv", "loo-sampled", rounds=1, **engine))
    reference = run_in_process(run, 2).out
    assert blob["history"][0]["valid"] == pytest.approx(reference.history[0].valid, rel=1e-7)
    assert blob["test"] == pytest.approx(reference.test, rel=1e-7)


@pytest.mark.parametrize(("mode", "says"), [
    ("loopback", "error: node 0 failed: {gone}: no such file (full log: "),
    ("simulation", "error: no node answered the first message (2 of 2 failed): {gone}: no such file"),
], ids=["loopback", "simulation"])
def test_a_failure_on_the_nodes_is_one_line_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        mode: str, says: str) -> None:
    """The file is there when the command checks it, gone when the nodes read it: the command
    ends (exit 2) with the nodes' exception, not with 'see the logs'."""
    from fedrec import experiment

    data = _write_csv(tmp_path / "mine.csv")
    real = experiment.prepare_split
    # the command's own check reads a file that exists; the node processes are not patched
    monkeypatch.setattr(experiment, "prepare_split", lambda run: real(replace(run, dataset=str(data))))
    monkeypatch.chdir(tmp_path)
    gone = tmp_path.resolve() / "gone.csv"
    code, out, err = _cli(capsys, "-d", "gone.csv", "--columns", COLUMNS, "--mode", mode,
                          *(["--workdir", "deployment"] if mode == "loopback" else []))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, out + err
    assert errors[0].startswith(says.format(gone=gone)), errors[0]
    assert "wrote no results" not in err
    if mode == "loopback":
        log = tmp_path.resolve() / "deployment" / "logs" / "supernode0.log"
        assert errors[0].endswith(f"(full log: {log}); node 1 too")
        assert "Traceback (most recent call last)" in log.read_text()


# -- finding the reason in what a process wrote ---------------------------------------------------

NODE_LOG = """\x1b[92mINFO \x1b[0m:      Received successfully
\x1b[91mERROR \x1b[0m:     ClientApp raised an exception
Traceback (most recent call last):
  File "/x/flwr/supernode/runtime/run_clientapp.py", line 193, in run_clientapp
    reply_message = client_app(message=message, context=context)
                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/fedrec/data/delimited.py", line 68, in existing
    raise FedrecError(f"{p}: no such file")
fedrec.errors.FedrecError: my.csv: no such file
\x1b[91mERROR \x1b[0m:     Exit Code: 800
INFO:     Shutting down
"""

CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in f
    int("x")
ValueError: invalid literal for int() with base 10: 'x'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "a.py", line 3, in g
    raise KeyError("rating") from e
KeyError: 'rating'
"""

# Ray's text for a ClientApp's exception: the node's traceback, then wrappers repeating it
RAY = """\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1, ip=10.0.0.1)
  File "/x/fedrec/flower/app.py", line 58, in _split
    return prepare_split(run_from_json(run_json))
fedrec.errors.FedrecError: nothere.csv: no such file

The above exception was the direct cause of the following exception:

\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1, ip=10.0.0.1)
  File "/x/flwr/simulation/ray_transport/ray_actor.py", line 65, in run
    raise ClientAppException(str(ex)) from ex
flwr.clientapp.client_app.ClientAppException:\x20
Exception ClientAppException occurred. Message: nothere.csv: no such file"""


def test_the_reason_is_the_last_exception_a_traceback_ended_with() -> None:
    from fedrec.flower.failures import error_box, exception_line, reply_reason

    assert exception_line(NODE_LOG) == "my.csv: no such file"  # a FedrecError speaks to the user
    assert exception_line(CHAINED) == "KeyError: 'rating'"
    assert exception_line(NODE_LOG + CHAINED) == "KeyError: 'rating'"
    assert exception_line(RAY) == "nothere.csv: no such file"
    # log lines shaped like 'NAME: text' that no traceback precedes are not exceptions
    assert exception_line("INFO:     Shutting down\nWARNING: x\n    indented\nERROR: y\n") is None
    assert reply_reason("<class 'fedrec.errors.FedrecError'>:<'my.csv: no such file'>") == "my.csv: no such file"
    assert reply_reason("<class 'ValueError'>:<'bad\n  value'>") == "ValueError: bad value"
    assert reply_reason(f"<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'{RAY}'>") == \
        "nothere.csv: no such file"
    box = ("Flower configuration not found.\n\n╭─ Error ──────────╮\n│ Failed to load Flower App"
           "      │\n│ configuration in '/w/app'.  │\n╰──────────────────╯\n")
    assert error_box(box) == "Failed to load Flower App configuration in '/w/app'."
    assert error_box("all well\n") is None


class _Finished:
    """A finished process, as `Loopback.failure` reads one."""

    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_a_deployment_names_the_process_that_failed_and_its_log(tmp_path: Path) -> None:
    """Node logs first (a node's failure is what stops the ServerApp), then the ServerApp's,
    then a process that exited, then `flwr run`'s own error; only what a log gained since the
    run was submitted counts (an earlier run's traceback does not)."""
    from fedrec.flower.launch import Loopback

    deployment = Loopback(3, workdir=tmp_path / "d")
    logs = deployment.workdir / "logs"
    logs.mkdir(parents=True)
    for name in ("superlink", "supernode0", "supernode1", "supernode2", "flwr-run"):
        (logs / f"{name}.log").write_text("started\n")
    (logs / "supernode0.log").write_text(NODE_LOG)  # an earlier run's failure
    deployment.procs = {name: _Finished(None) for name in ("superlink", "supernode0", "supernode1", "supernode2")}
    deployment._log_marks = {p.name: p.stat().st_size for p in logs.glob("*.log")}
    proc: Any = _Finished(0)

    def add(name: str, text: str) -> None:
        with (logs / f"{name}.log").open("a") as f:
            f.write(text)

    assert deployment.failure(proc).startswith("the run wrote no results and no process reported an error")
    add("flwr-run", "fedrec: round 0: node 7 failed (query): x\n" + CHAINED.split("\n\n")[-1])
    assert deployment.failure(proc) == f"the ServerApp failed: KeyError: 'rating' (full log: {logs / 'flwr-run.log'})"
    add("supernode2", NODE_LOG)
    add("supernode1", RAY)
    assert deployment.failure(proc) == (f"node 1 failed: nothere.csv: no such file (full log: "
                                        f"{logs / 'supernode1.log'}); node 2 too")
    # nothing in the logs since the run began: a process that exited, or `flwr run` itself
    deployment._log_marks = {p.name: p.stat().st_size for p in logs.glob("*.log")}
    deployment.procs["supernode1"] = _Finished(-9)
    assert deployment.failure(proc) == f"supernode1 exited: exit code -9 (full log: {logs / 'supernode1.log'})"
    deployment.procs["supernode1"] = _Finished(None)
    add("flwr-run", "╭─ Error ─╮\n│ Failed to load Flower App configuration │\n╰─────────╯\n")
    assert deployment.failure(_Finished(1)) == (  # type: ignore[arg-type]
        f"`flwr run` failed: Failed to load Flower App configuration (full log: {logs / 'flwr-run.log'})")


def test_a_relative_workdir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its processes run inside it and are handed paths in it: relative, they would be doubled."""
    from fedrec.flower.launch import Loopback

    monkeypatch.chdir(tmp_path)
    deployment = Loopback(1, workdir="rel")
    assert deployment.workdir == tmp_path.resolve() / "rel"
    assert deployment.env["FLWR_HOME"] == str(tmp_path.resolve() / "rel" / "flwr-home")

