"""Trustworthy runs: each failure a new user met, re-run.

Bad options are one line and exit 2 before any work, with no file left; output files are
checked up front, replaced only when asked, and written atomically under unique names.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
from pathlib import Path
from typing import Any

import pytest

from fedrec.cli import main
from fedrec.errors import FedrecError
from fedrec.files import atomic_write, check_folder, check_writable

SYN = "synthetic:60x300"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.err + captured.out


@pytest.mark.parametrize(("algorithm", "flags", "says"), [
    ("mf", ["--batch-size", "0"], "--batch-size must be >= 1"),
    ("pfedrec", ["--rounds", "0"], "--rounds must be >= 1"),  # not "--epochs"
    ("mf", ["--epochs", "0"], "--epochs must be >= 1"),
    ("pfedrec", ["--clients-per-round", "1.5"], "a fraction (<= 1) or a whole number"),
    ("pfedrec", ["--num-negatives", "100000"], "give --num-negatives below"),
    ("pfedrec", ["--dim", "0"], "dim must be >= 1"),
    ("pfedrec", ["--dim", "-5"], "dim must be >= 1"),
    ("mf", ["--ldp", "0.1"], "'mf' is centralised: --ldp does not apply"),
    ("mf", ["--dual", "--clients-per-round", "0.5"], "--dual, --clients-per-round do not apply"),
    ("pfedrec", ["--weight-decay", "0.1"], "'pfedrec' is federated: --weight-decay"),
    ("pfedrec", ["--device", "tpu"], "--device tpu"),
    ("personalfr", ["--num-negatives", "8"], "'personalfr' does not use --num-negatives"),
    # under a rating protocol no trainer draws negatives: even the default count, given, is refused
    ("mf", ["-p", "ratio-rating", "--num-negatives", "4"], "draws no training negatives there (--num-negatives 4)"),
    ("fedmf", ["-p", "ratio-rating", "--num-negatives", "4"], "draws no training negatives there (--num-negatives 4)"),
    ("fedcia", ["--item-lr-scale", "3", "--encoding", "dense"], "does not use --item-lr-scale, --encoding"),
    # servers that aggregate their own way read no item-row rule
    ("fedca", ["--aggregation", "contributors"], "'fedca' does not use --aggregation"),
    ("feddae", ["--aggregation", "contributors"], "'feddae' does not use --aggregation"),
    ("personalfr", ["--aggregation", "samples"], "'personalfr' does not use --aggregation"),
    ("fedmf", ["--seed", "-1"], "--seed must be a whole number in [0, 2^64), not -1"),
    ("fedmf", ["--patience", "-1"], "--patience must be >= 0 (got -1)"),
    ("fedmf", ["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0 (got -1)"),
    ("mf", ["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0 (got -1)"),
    ("fedmf", ["--item-std", "-1"], "--item-std must be >= 0 (got -1.0)"),
    ("fedmf", ["--threshold", "nan"], "--threshold must be a finite number"),
    ("fedmf", ["--seed", str(2**64)], "--seed must be a whole number in [0, 2^64), not 18446744073709551616"),
    ("fedmf", ["--lr", "1e39"], "learning rates must be at most 3.4e+38, the largest float32"),
    ("fedmf", ["--lr-item", "1e39"], "learning rates must be at most 3.4e+38"),
    ("mf", ["--lr", "1e39"], "--lr must be at most 3.4e+38"),
    ("fedmf", ["--lr", "1", "--item-lr-scale", "1e39"], "the item rows' rate --lr x --item-lr-scale must be at most"),
    ("fedmf", ["--threads", str(10**6)], "--threads 1000000 is more than this machine's"),
])
def test_a_bad_option_is_one_line_before_any_work(algorithm: str, flags: list[str], says: str,
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code, text = _cli(["run", algorithm, "-d", SYN, "--out", str(out), "-q", *flags], capsys)
    assert code == 2 and says in text and "Traceback" not in text
    assert len([line for line in text.splitlines() if line.strip()]) == 1
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_output_paths_are_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out, says in [(tmp_path, "is a folder"), (a_file / "r.json", "is a file, not a folder")]:
        code, text = _cli(["run", "mf", "-d", SYN, "--out", str(out), "-q"], capsys)
        assert code == 2 and says in text and "Traceback" not in text
    code, text = _cli(["run", "mf", "-d", SYN, "--out", str(tmp_path / "r.json"), "--save", str(tmp_path), "-q"], capsys)
    assert code == 2 and "--save" in text and not (tmp_path / "r.json").exists()
    code, text = _cli(["run", "mf", "-d", SYN, "--out", "", "-q"], capsys)
    assert code == 2 and "--out . is a folder" in text and "Traceback" not in text
    # the results and the trained run in one file: the second write would replace the first
    same = tmp_path / "same.json"
    code, text = _cli(["run", "mf", "-d", SYN, "--out", str(same), "--save", str(same), "-q"], capsys)
    assert code == 2 and "is the run's --out file too" in text and not same.exists()


def test_an_earlier_run_is_replaced_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = ["run", "pfedrec", "-d", SYN, "--rounds", "2", "--checkpoint-every", "1", "--out", str(out), "-q"]
    assert _cli(argv, capsys)[0] == 0
    first = out.read_text()
    code, text = _cli(argv, capsys)  # the same command again
    assert code == 2 and "exists" in text and "--overwrite" in text and out.read_text() == first
    out.unlink()
    code, text = _cli(argv, capsys)  # results gone, checkpoint still there
    assert code == 2 and "--resume to continue it" in text
    assert _cli([*argv, "--overwrite"], capsys)[0] == 0
    assert (out.stat().st_mode & 0o777) == 0o666 & ~_umask()  # like any other output file



def test_the_default_results_file_is_not_called_an_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --out the file that exists is "the results file", not an --out never typed."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "fedmf", "-d", SYN, "--rounds", "1", "-q"]
    assert _cli(argv, capsys)[0] == 0
    code, text = _cli(argv, capsys)
    assert code == 2 and "the results file runs/" in text and "--out" not in text and "--overwrite" in text


def test_resume_without_a_checkpoint_says_it_starts_afresh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code, text = _cli(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--out", str(out), "-q", "--resume"], capsys)
    assert code == 0 and "no checkpoint" in text and "starting from the first round" in text
    assert json.loads(out.read_text())["best_round"] == 1
    # a finished run without a checkpoint is not one --resume continues: its results stay
    first = out.read_text()
    code, text = _cli(["run", "pfedrec", "-d", SYN, "--rounds", "2", "--out", str(out), "-q", "--resume"], capsys)
    assert code == 2 and "exists" in text and "--overwrite" in text and out.read_text() == first


def test_concurrent_writers_of_one_file_never_collide(tmp_path: Path) -> None:
    """Unique temporary names: eight writers of one path all finish, and the file is whole."""
    path, errors = tmp_path / "shared.json", []

    def write(k: int) -> None:
        try:
            for _ in range(20):
                atomic_write(path, lambda tmp, k=k: Path(tmp).write_text(json.dumps({"writer": k, "pad": "x" * 5000})))
        except Exception as e:  # pragma: no cover - the failure this test exists to catch
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(path.read_text())["pad"] == "x" * 5000
    assert [p.name for p in tmp_path.iterdir()] == ["shared.json"]  # no temporary file left


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def boom(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "r.json", boom)
    assert not list(tmp_path.iterdir())

    def full(tmp: str) -> None:  # the file system refuses what os.access promised (a full disk, /proc)
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(FedrecError, match="cannot write .*r.json: No space left on device"):
        atomic_write(tmp_path / "r.json", full)
    assert not list(tmp_path.iterdir())


def test_check_writable_names_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(FedrecError, match="exists"):
        check_writable(tmp_path / "f", overwrite=False)
    assert check_writable(tmp_path / "new" / "deeper" / "r.json") == tmp_path / "new" / "deeper" / "r.json"


def test_reproduce_refuses_unusable_output_paths_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every output path of `fedrec reproduce` is checked before any run: a file where a folder
    goes, a folder where a file goes, or a file on the way is one line with exit 2."""
    (tmp_path / "f").write_text("x")
    base = ["reproduce", "fedcia", "--tables", "1", "--negatives", "leak-free", "--reuse-only",
            "--out-dir", str(tmp_path / "runs")]
    for extra, why in ((["--leaderboard", str(tmp_path / "f")], "--leaderboard .* is a file"),
                       (["--out-dir", str(tmp_path / "f")], "--out-dir .* is a file"),
                       (["--plots", str(tmp_path / "f" / "p")], "--plots .* is a file, not a folder"),
                       (["--markdown", str(tmp_path)], "--markdown .* is a folder")):
        code, out = _cli([*base, *extra], capsys)
        assert code == 2 and re.search(why, out), (extra, out)
        assert "Traceback" not in out
    assert check_folder(tmp_path / "new" / "deeper", "--plots") == tmp_path / "new" / "deeper"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_resumed_run_says_so_and_counts_all_its_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = ["run", "pfedrec", "-d", SYN, "--checkpoint-every", "1", "--out", str(out), "-q"]
    assert _cli([*argv, "--rounds", "2"], capsys)[0] == 0
    first = json.loads(out.read_text())
    assert first["resumed_at"] == []
    assert _cli([*argv, "--rounds", "3", "--resume"], capsys)[0] == 0
    assert _cli([*argv, "--rounds", "4", "--resume"], capsys)[0] == 0
    last = json.loads(out.read_text())
    assert last["resumed_at"] == [2, 3] and [h["round"] for h in last["history"]] == [1, 2, 3, 4]
    assert last["wall_seconds"] >= sum(h["seconds"] for h in last["history"])  # every part's time
    code, text = _cli([*argv, "--rounds", "3", "--resume"], capsys)  # rounds only go up
    assert code == 2 and "past the 3 rounds asked for" in text


def test_results_say_what_made_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert _cli(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--out", str(out), "-q"], capsys)[0] == 0
    blob = json.loads(out.read_text())
    env = blob["environment"]
    assert {"python", "torch", "numpy", "scipy", "date", "platform", "command", "cpu", "cpu_capability"} <= set(env)
    assert env["cpu"] and env["cpu_capability"]  # e.g. "AMD EPYC", "AVX512"
    assert env["date"].endswith("+00:00")
    assert blob["data"]["source"] == {"generator": "fedrec.data.synthetic.synthetic", "users": 60,
                                      "items": 300, "seed": 0}


def test_a_registered_data_set_records_its_file_and_checksum(tmp_path: Path) -> None:
    import hashlib

    from fedrec.data import registry

    fixture = Path(__file__).parent / "fixtures" / "ml-100k"
    data = registry.load("ml-100k", data_dir=fixture, download=False)
    path = Path(data.source["file"])
    assert data.source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert str(fixture) in data.source["origin"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_says_what_was_saved_and_how_to_go_on(sig: str, tmp_path: Path) -> None:
    """Ctrl-C (or a kill) mid-run: one line naming the last checkpointed round and the command
    that continues it, exit 130, no results file; that command then finishes the run."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r.json"
    argv = [sys.executable, "-m", "fedrec", "run", "pfedrec", "-d", "synthetic:200x400", "--rounds",
            "400", "--checkpoint-every", "1", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # a shell's background jobs inherit SIGINT ignored, and Python then keeps ignoring it: the
    # child starts with the default disposition, as a run in a terminal has
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not out.with_suffix(".ckpt").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(getattr(signal, sig))
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted: after round"), stderr
    assert "holds round" in lines[0] and lines[0].endswith("--resume") and "Traceback" not in stderr
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    assert "round " in stdout  # progress lines without a terminal
    go_on = shlex.split(lines[0].split("go on with: ", 1)[1])
    assert go_on[:2] == ["fedrec", "run"] and go_on[-1] == "--resume"
    go_on[go_on.index("--rounds") + 1] = "12"  # the command as printed, for fewer rounds
    done = subprocess.run([sys.executable, "-m", *go_on], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["resumed_at"]


def test_ctrl_c_outside_a_run_is_one_line_too(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C in a command without a run's own handler (here while `audit-protocol` reads its
    data): exit 130 with one line, not the silent exit Typer makes of it."""
    from fedrec import experiment

    def interrupted(run: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "prepare_split", interrupted)
    code, text = _cli(["audit-protocol", "-d", SYN, "-p", "loo-full"], capsys)
    assert code == 130 and [line for line in text.splitlines() if line.strip()] == [
        "interrupted: stopped by Ctrl-C before the command ended"]


@pytest.mark.parametrize(("argv", "says"), [
    (["run"], "error: Missing argument 'ALGORITHM'. (see `fedrec run --help`)"),
    (["run", "mf", "--rounds", "abc"], "'abc' is not a valid integer. (see `fedrec run --help`)"),
    (["run", "mf", "--bogus"], "error: No such option '--bogus'."),
    (["data", "stats", "x", "--sep", ","], "(see `fedrec data stats --help`)"),
    (["bogus"], "error: No such command 'bogus'. (see `fedrec --help`)"),
])
def test_a_usage_error_is_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Click's usage errors are said as fedrec's own are: one line and exit 2, not a box."""
    code, text = _cli(argv, capsys)
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0], text


def test_help_and_a_bare_group_still_show_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _cli(["run", "--help"], capsys)
    assert code == 0 and "Usage: fedrec run" in " ".join(text.split())
    code, text = _cli(["data"], capsys)  # a group without its command: its help, exit 2 (click's)
    assert code == 2 and "Usage: fedrec data" in " ".join(text.split()) and "error:" not in text


def test_running_out_of_memory_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """numpy's MemoryError (a --batch-size of 10^8 asks for a 45 GiB block) is said in one line
    with the options that ask for less, not as a traceback."""
    from fedrec import experiment

    def too_big(run: Any) -> Any:
        raise MemoryError("Unable to allocate 44.7 GiB for an array with shape (60, 100000000)")

    monkeypatch.setattr(experiment, "prepare_split", too_big)
    code, text = _cli(["audit-protocol", "-d", SYN, "-p", "loo-full"], capsys)
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: out of memory (Unable to allocate 44.7 GiB")
    assert "--batch-size" in lines[0]


@pytest.mark.parametrize("failure", ["cpu", "cuda"])
def test_pytorch_running_out_of_memory_is_one_line(failure: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """PyTorch's allocators fail with a RuntimeError (CPU) or its OutOfMemoryError (CUDA): one line
    with the size asked for; any other RuntimeError is a defect and keeps its traceback."""
    import torch

    from fedrec import experiment

    def too_big(run: Any) -> Any:
        if failure == "cpu":  # PyTorch's CPU allocator's words (an OS that overcommits might not refuse 40 TB)
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 40000000000000 bytes. Error code 12 (Cannot allocate memory)")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                                     "capacity of 79.19 GiB of which 1.00 GiB is free.")

    monkeypatch.setattr(experiment, "prepare_split", too_big)
    code, text = _cli(["audit-protocol", "-d", SYN, "-p", "loo-full"], capsys)
    lines = [line for line in text.splitlines() if line.strip()]
    size = "40000000000000 bytes" if failure == "cpu" else "20.00 GiB"
    assert code == 2 and lines == [f"error: out of memory (PyTorch could not allocate {size}); a smaller "
                                   "--batch-size, --clients-per-round or --memory-budget-mb asks for less at once"]

    def broken(run: Any) -> Any:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(experiment, "prepare_split", broken)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _cli(["audit-protocol", "-d", SYN, "-p", "loo-full"], capsys)


def test_threads_default_to_one_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedrec import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.choose() == 1
    assert threads.choose(3) == 3 and threads.choose(0) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")  # the environment's, for every program: the CPUs at most
    assert threads.choose() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(FedrecError, match="OMP_NUM_THREADS"):
        threads.choose()
    with pytest.raises(FedrecError, match="--threads must be >= 0"):
        threads.choose(-1)
    # asked for: refused (thousands of threads crash PyTorch's pool with a segmentation fault)
    with pytest.raises(FedrecError, match="--threads 100000 is more than this machine's 4 CPUs"):
        threads.choose(100000)


def test_threads_hold_numpys_blas_to_pytorchs_number() -> None:
    """NumPy's and SciPy's BLAS take the same number of threads as PyTorch: left at one a core
    they compete with PyTorch's threads (an LDP audit beside one busy process: 6.8-7.1 s against
    5.3-5.5 s held to one)."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from fedrec import threads

    before = torch.get_num_threads()
    with threadpool_limits(limits=None):  # whatever this test sets is undone after it
        threadpool_limits(limits=2, user_api="blas")  # as a process starts on two cores
        try:
            assert threads.apply(1) == 1
            blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
            assert blas and set(blas) == {1}
        finally:
            torch.set_num_threads(before)


def test_the_results_record_the_threads_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    before = torch.get_num_threads()
    out = tmp_path / "r.json"
    try:
        assert _cli(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--out", str(out), "-q", "--threads", "2"], capsys)[0] == 0
        assert json.loads(out.read_text())["environment"]["threads"] == "2"
    finally:
        torch.set_num_threads(before)


def test_a_users_own_file_runs_through_the_generic_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["uid,iid,score,ts"] + [f"u{u},i{(u * 7 + k * 13) % 300},{1 + k % 5},{u * 100 + k}"
                                   for u in range(60) for k in range(20)]
    data = tmp_path / "mine.csv"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.json"
    argv = ["run", "pfedrec", "-d", str(data), "--rounds", "1", "--out", str(out), "-q"]
    code, text = _cli(argv, capsys)
    assert code == 2 and "--columns" in text and not out.exists()
    code, text = _cli([*argv, "--columns", "uid,nope"], capsys)
    assert code == 2 and "no column 'nope'; columns are: uid, iid, score, ts" in text
    assert _cli([*argv, "--columns", "uid,iid,score,ts"], capsys)[0] == 0
    blob = json.loads(out.read_text())
    assert blob["data"]["users"] == 60 and blob["data"]["source"]["origin"] == "--dataset"
    assert blob["config"]["columns"] == "uid,iid,score,ts"


def test_data_stats_says_what_a_run_keeps_of_repeated_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = (Path(__file__).parent / "fixtures" / "ml-100k" / "u.data").read_text().splitlines()
    (tmp_path / "u.data").write_text("\n".join([*lines, lines[0], lines[1]]) + "\n")
    code, text = _cli(["data", "stats", "ml-100k", "--data-dir", str(tmp_path), "--file", "u.data"], capsys)
    assert code == 0 and "2 rows repeat a (user, item) pair; a run keeps the last of each" in text


def test_plot_draws_runs_and_refuses_what_it_cannot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fed, cen = tmp_path / "fed.json", tmp_path / "cen.json"
    assert _cli(["run", "pfedrec", "-d", SYN, "--rounds", "3", "--out", str(fed), "-q"], capsys)[0] == 0
    assert _cli(["run", "mf", "-d", SYN, "--epochs", "2", "--out", str(cen), "-q"], capsys)[0] == 0
    fig = tmp_path / "fig.png"
    code, text = _cli(["plot", str(fed), str(cen), "--out", str(fig)], capsys)
    assert code == 0 and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "junk.json").write_text("{]")
    for argv, says in [([str(tmp_path / "none.json")], "no such results file"),
                       ([str(tmp_path / "junk.json")], "not a results JSON"),
                       ([str(fed), "--metric", "auc"], "no validation auc per round")]:
        code, text = _cli(["plot", *argv, "--out", str(tmp_path / "bad.png")], capsys)
        assert code == 2 and says in text and "Traceback" not in text
    assert not (tmp_path / "bad.png").exists()
    for suffix, magic in ((".pdf", b"%PDF"), (".svg", b"<?xml")):  # the suffix says the format
        code, _ = _cli(["plot", str(fed), "--out", str(tmp_path / f"fig{suffix}")], capsys)
        assert code == 0 and (tmp_path / f"fig{suffix}").read_bytes().startswith(magic)
    code, text = _cli(["plot", str(fed), "--out", str(tmp_path / "fig.xyz")], capsys)
    assert code == 2 and "give a file ending in .png, .pdf, .svg" in text and not (tmp_path / "fig.xyz").exists()
    # the figure never replaces one of the runs it draws
    first = fed.read_bytes()
    fed_png = tmp_path / "fed.png"
    fed_png.write_bytes(first)  # a results file named .png
    code, text = _cli(["plot", str(fed_png), "--out", str(tmp_path / "." / "fed.png")], capsys)
    assert code == 2 and "a file this command reads" in text and fed_png.read_bytes() == first
    blob = json.loads(first)
    for change, says in [({"history": [1, 2]}, "history[0] is not a table"),
                         ({"history": [{"loss": 1.0}]}, "history[0] has no whole round number"),
                         ({"history": [{"round": 1, "valid": {"ndcg@10": "high"}}]}, "history[0].valid is not a table of numbers"),
                         ({"history": [{"round": 1, "bytes_up": "lots"}]}, "history[0].bytes_up is not a number"),
                         ({"seed": "abc"}, "seed is not a whole number"),
                         ({"config": [1]}, "config is not a table")]:
        (tmp_path / "edited.json").write_text(json.dumps({**blob, **change}))
        code, text = _cli(["plot", str(tmp_path / "edited.json"), "--out", str(tmp_path / "bad.png")], capsys)
        assert code == 2 and f"not a fedrec results file ({says})" in text and "Traceback" not in text
    (tmp_path / "empty.json").write_text(json.dumps({**blob, "history": []}))  # diverged in its first round
    code, text = _cli(["plot", str(tmp_path / "empty.json"), "--out", str(tmp_path / "bad.png")], capsys)
    assert code == 2 and "hold no round" in text and not (tmp_path / "bad.png").exists()


def test_a_run_never_writes_over_the_data_file_it_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out and --save naming the run's own data file are refused, --overwrite or not; so is the
    API's ``out``."""
    import fedrec

    data = tmp_path / "mine.csv"
    data.write_text("user,item\n" + "".join(f"u{u},i{(u * 7 + j) % 30}\n" for u in range(20) for j in range(6)))
    first = data.read_text()
    for flag in ("--out", "--save"):
        argv = ["run", "fedmf", "-d", str(data), "--columns", "user,item", "-p", "loo-full", "--rounds", "1", "-q",
                "--overwrite", flag, str(tmp_path / "." / "mine.csv")]
        if flag == "--save":
            argv += ["--out", str(tmp_path / "r.json")]
        code, text = _cli(argv, capsys)
        assert code == 2 and "a file this command reads" in text and data.read_text() == first
    with pytest.raises(FedrecError, match="a file this command reads"):
        fedrec.run("fedmf", dataset=str(data), columns="user,item", protocol="loo-full", rounds=1, out=data)
    assert data.read_text() == first
    # nor does a search's config or journal, nor a run's --out its own --config
    for flag in ("--out", "--journal"):
        code, text = _cli(["tune", "fedmf", "-d", str(data), "--columns", "user,item", "-p", "loo-full", "--trials", "1",
                           "--rounds", "1", "--overwrite", flag, str(data)], capsys)
        assert code == 2 and "a file this command reads" in text and data.read_text() == first
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"fedrec_config": 2, "algorithm": "fedmf", "engine": {"lr": 0.02}, "model": {}}))
    code, text = _cli(["run", "fedmf", "-d", SYN, "--rounds", "1", "-q", "--config", str(config), "--overwrite",
                       "--out", str(config)], capsys)
    assert code == 2 and "a file this command reads" in text and json.loads(config.read_text())["engine"] == {"lr": 0.02}


def test_scores_that_are_not_ratings_are_not_scored_as_ratings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PFedRec's scores are logits: under a rating protocol its RMSE was 6.8-9.6 on 1-5 stars."""
    out = tmp_path / "r.json"
    for algorithm in ("pfedrec", "fedrap", "gpfedrec"):
        code, text = _cli(["run", algorithm, "-d", SYN, "-p", "ratio-rating", "--out", str(out), "-q"], capsys)
        assert code == 2 and "its scores are not ratings" in text
    assert _cli(["run", "mf", "-d", SYN, "-p", "ratio-rating", "--epochs", "1", "--out", str(out), "-q"], capsys)[0] == 0
    # FedMF and MetaMF fit the ratings themselves there (squared error; tests/test_ratings_family.py)
    assert _cli(["run", "metamf", "-d", SYN, "-p", "ratio-rating", "--rounds", "1", "--lr", "0.01", "--lr-item", "0.5",
                 "--out", str(out), "-q", "--overwrite"], capsys)[0] == 0


def test_a_run_never_overwrites_results_another_run_wrote_meanwhile(tmp_path: Path) -> None:
    """Two runs with one --out both start (no file yet); the second to finish keeps its results
    beside the first's and says where, instead of silently replacing them."""
    path = tmp_path / "r.json"
    atomic_write(path, lambda tmp: Path(tmp).write_text('{"run": 1}'), exclusive=True)
    with pytest.raises(FedrecError, match="written by another run meanwhile") as e:
        atomic_write(path, lambda tmp: Path(tmp).write_text('{"run": 2}'), exclusive=True)
    assert json.loads(path.read_text()) == {"run": 1}
    kept = Path(str(e.value).rsplit(" ", 1)[1])
    assert json.loads(kept.read_text()) == {"run": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", kept.name])


def test_a_run_from_another_thread_needs_no_signal_handler(tmp_path: Path) -> None:
    """Signal handlers can only be set from the main thread; a run started elsewhere still works."""
    out, codes = tmp_path / "r.json", []

    def go() -> None:
        try:
            main(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--out", str(out), "-q"])
        except SystemExit as e:
            codes.append(e.code)

    t = threading.Thread(target=go)
    t.start()
    t.join()
    assert codes == [0] and out.exists()


def test_an_unwritable_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(The suite runs as root, for whom every folder is writable: the check is asked directly.)"""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    with pytest.raises(FedrecError, match="cannot write in .*locked"):
        check_writable(locked / "deeper" / "r.json")


def test_a_result_names_the_revision_its_run_started_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of hours outlives commits made meanwhile: its result names the code it loaded."""
    import fedrec.experiment as experiment
    from fedrec.experiment import RunConfig, federated_config, run

    revisions = iter(["started", "later"])
    monkeypatch.setattr(experiment, "git_revision", lambda: next(revisions))
    cfg = RunConfig("fedmf", dataset=SYN, federated=federated_config("fedmf", rounds=1))
    assert run(cfg).git_revision == "started"


def test_a_revision_with_uncommitted_changes_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A working tree copied to another machine, or edited and not committed, ran code its
    commit does not hold: a change to the package (a new module too) or to pyproject.toml marks
    the revision ``-dirty``; docs and results beside it do not."""
    import subprocess

    import fedrec.results
    from fedrec.results import git_revision

    pkg = tmp_path / "fedrec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "README.md").write_text("read me\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    monkeypatch.setattr(fedrec.results, "__file__", str(pkg / "results.py"))  # the package's folder
    assert git_revision() == head
    (tmp_path / "README.md").write_text("edited\n")  # not code
    (tmp_path / "results.json").write_text("{}")
    assert git_revision() == head
    (pkg / "__init__.py").write_text("x = 2\n")
    assert git_revision() == f"{head}-dirty"
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "new_module.py").write_text("y = 1\n")  # untracked, but imported all the same
    assert git_revision() == f"{head}-dirty"
    (pkg / "new_module.py").unlink()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert git_revision() == f"{head}-dirty"


def test_an_unknown_name_suggests_the_close_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, said = _cli(["run", "pfedrek", "-d", SYN], capsys)
    assert code == 2 and "unknown algorithm 'pfedrek'; did you mean 'pfedrec'" in said
    code, said = _cli(["run", "fedmf", "-p", "loo-sampeld", "-d", SYN], capsys)
    assert code == 2 and "did you mean 'loo-sampled'?" in said
    code, said = _cli(["run", "zzz", "-d", SYN], capsys)
    assert code == 2 and "did you mean" not in said and "known: ae," in said


def test_too_few_items_for_sampled_evaluation_names_a_protocol_that_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint names what the user can do (a full-ranking protocol), not an option that does
    not exist; following it works."""
    args = ["run", "fedmf", "-d", "synthetic:100x120", "--rounds", "1", "-q", "--out", str(tmp_path / "r.json")]
    code, said = _cli(args, capsys)
    assert code == 2 and "evaluation negatives" in said and "loo-full" in said
    assert _cli([*args, "-p", "loo-full"], capsys)[0] == 0


def test_a_dp_run_prints_its_privacy_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dp.json"
    code, said = _cli(["run", "fedmf", "-d", SYN, "--rounds", "2", "-q", "--dp-clip", "0.1", "--dp-noise", "1.0",
                       "--out", str(out)], capsys)
    privacy = json.loads(out.read_text())["extra"]["privacy"]
    assert code == 0 and f"(ε = {privacy['epsilon']:.3g}, δ = 1e-05) after 2 rounds" in " ".join(said.split())
    code, said = _cli(["run", "fedmf", "-d", SYN, "--rounds", "1", "-q", "--out", str(tmp_path / "plain.json")], capsys)
    assert code == 0 and "ε" not in said


def test_an_interrupt_while_the_temporary_file_is_made_leaves_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands right after the temporary file was created, before anything else:
    its name was known before it existed, so it is removed (a signal mask on this thread could
    not promise it: a process-directed signal goes to any thread of the process)."""
    made = os.open

    def interrupted_open(name: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        fd = made(name, flags, mode, *args, **kwargs)
        os.close(fd)
        assert Path(name).exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open", interrupted_open)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "f.txt", lambda tmp: Path(tmp).write_text("x"))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
