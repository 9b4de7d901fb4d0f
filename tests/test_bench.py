"""`fedrec bench`: a grid of cells cached under their full config, resumable after a kill, run in
parallel workers; leaderboards with mean ± std, rank and paired tests against the best."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedrec.bench import boards, load_grid, to_markdown
from fedrec.cli import main
from fedrec.errors import FedrecError

GRID = """
[grid]
algorithms = ["fedmf", "pfedrec"]
datasets = ["synthetic:60x500"]
protocols = ["loo-sampled"]
seeds = {seeds}
rounds = {rounds}
workers = {workers}
"""


def _bench(args: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        main(["bench", *args])
    return int(done.value.code or 0)


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    (tmp_path / "f").write_text("x")
    for out, why in ((tmp_path / "f", "is a file; give a folder"), (tmp_path / "f" / "o", "is a file, not a folder")):
        assert _bench([str(grid), "-o", str(out)]) == 2
        printed = capsys.readouterr()
        assert why in printed.out + printed.err and "Traceback" not in printed.out + printed.err


def test_a_grid_runs_once_then_comes_from_its_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0, 2], rounds=2, workers=2))
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 cells: 4 run, 0 cached, 0 failed" in printed
    # without a terminal, each running cell logs its rounds (from its worker process)
    for seed in (0, 2):
        assert f"pfedrec synthetic:60x500 loo-sampled leak-free seed {seed}: round 2/2  loss" in printed
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 4
    stamps = [p.stat().st_mtime_ns for p in cells]
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "4 cells: 0 run, 4 cached, 0 failed" in capsys.readouterr().out
    assert [p.stat().st_mtime_ns for p in cells] == stamps
    stem = out / "leaderboard-synthetic_60x500-loo-sampled"
    for suffix in (".md", ".csv", ".tex", ".png"):
        assert stem.with_suffix(suffix).stat().st_size > 0
    assert "paired t-test and Wilcoxon" in stem.with_suffix(".md").read_text()
    assert r"\pm" in stem.with_suffix(".tex").read_text()
    # another option makes new cells, not stale reuse
    grid.write_text(GRID.format(seeds=[0, 2], rounds=3, workers=2))
    assert {c.key() for c in load_grid(grid).cells}.isdisjoint({p.stem for p in cells})
    assert _bench([str(grid), "-o", str(out), "--report-only"]) == 0  # and says the old ones are not in its tables
    assert "4 result files in" in " ".join(capsys.readouterr().out.split())


def test_a_grid_stopped_before_any_cell_leaves_no_empty_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C before the first cell ends leaves neither ``OUT/cells/`` nor an ``OUT`` it made;
    a folder that was there before, and what it holds, stay."""
    from fedrec import pool

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "run_files", interrupted)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    assert _bench([str(grid), "-o", str(tmp_path / "new" / "out")]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml"]
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    assert _bench([str(grid), "-o", str(tmp_path / "kept")]) == 130
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]


def test_a_killed_grid_resumes_with_the_missing_cells(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    # cells of a few seconds each, so the kill lands between the first and the last
    grid.write_text(GRID.format(seeds=[0, 2, 3], rounds=10, workers=1).replace("60x500", "300x800"))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedrec", "bench", str(grid), "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not list((out / "cells").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole grid, workers included
    proc.wait()
    first = {p.name: p.read_text() for p in (out / "cells").glob("*.json")}
    assert 1 <= len(first) < 6
    for text in first.values():
        json.loads(text)  # no half-written cell
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"6 cells: {6 - len(first)} run, {len(first)} cached, 0 failed" in done.stdout
    assert all((out / "cells" / name).read_text() == text for name, text in first.items())


def _process(pid: int) -> tuple[int, str, int, bytes] | None:
    """``(parent, state, start time, command line)`` of a process (Linux /proc), None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0], int(fields[19]), Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):  # gone meanwhile
        return None


def _workers_of(parent: int) -> dict[int, int]:
    """The pool workers (spawned processes) whose parent is ``parent``: pid -> start time."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        info = _process(int(entry.name))
        if info is not None and info[0] == parent and b"spawn_main" in info[3]:
            found[int(entry.name)] = info[2]
    return found


def _running(pid: int, started: int) -> bool:
    """Whether that very process (not a later one given its pid) still runs (zombies do not)."""
    info = _process(pid)
    return info is not None and info[2] == started and info[1] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_workers_end_when_the_grid_is_killed_alone(tmp_path: Path) -> None:
    """``kill PID`` of the grid, not its process group: its workers must not train on."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0, 2], rounds=400, workers=2).replace("60x500", "300x800"))
    cmd = [sys.executable, "-m", "fedrec", "bench", str(grid), "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    workers: dict[int, int] = {}
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        workers = _workers_of(proc.pid)
    proc.kill()
    proc.wait()
    assert len(workers) == 2, "the grid's two workers never started"
    deadline = time.monotonic() + 30
    while any(_running(pid, t) for pid, t in workers.items()) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid, t in workers.items() if _running(pid, t)]
    for pid in alive:  # not left behind by a failing test
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} still running after their grid was killed"
    assert not list((tmp_path / "out" / "cells").glob("*.json"))


def _result(algorithm: str, seed: int, value: float, protocol: str = "loo-sampled", select: str = "ndcg@10",
            negatives: str = "exclude-candidates") -> dict:
    return {"algorithm": algorithm, "dataset": "d", "protocol": protocol, "seed": seed, "select": select,
            "test": {"users": 10, select: value}, "data": {"negatives": negatives}}


def test_leaderboard_figures_ranks_and_paired_tests() -> None:
    a = [0.30, 0.32, 0.31, 0.35, 0.33]
    b = [0.28, 0.30, 0.31, 0.30, 0.29]
    results = [_result("b", s, v) for s, v in enumerate(b)] + [_result("a", s, v) for s, v in enumerate(a)]
    (board,) = boards(results)
    table = board.table
    assert table["method"].tolist() == ["a", "b"] and table["rank"].tolist() == [1, 2]
    assert table["ndcg@10"].iloc[1] == pytest.approx(np.mean(b))
    assert table["ndcg@10 std"].iloc[1] == pytest.approx(np.std(b, ddof=1))
    assert table["t-test p"].iloc[1] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert table["Wilcoxon p"].iloc[1] == pytest.approx(stats.wilcoxon(a, b).pvalue)
    assert np.isnan(table["t-test p"].iloc[0])  # the best is not tested against itself
    rmse = [_result("x", s, v, "ratio-rating", "rmse") for s, v in enumerate([0.9, 0.95])]
    rmse += [_result("y", s, v, "ratio-rating", "rmse") for s, v in enumerate([1.0, 1.1])]
    (board,) = boards(rmse)
    assert board.table["method"].tolist() == ["x", "y"]  # lower RMSE ranks first
    (single,) = boards([_result("a", 0, 0.3), _result("b", 0, 0.2)])
    assert "| 2 | b | 1 | 0.2000 | — | — |" in to_markdown(single)  # one seed: no std, no test
    mixed = results + [_result("a", 0, 0.2, negatives="legacy-exclude-heldout")]
    (board,) = boards(mixed)
    assert "a (legacy-exclude-heldout)" in board.table["method"].tolist()  # policies kept apart


def test_a_board_says_when_its_rows_were_trained_under_different_budgets() -> None:
    """Rows stopped by different rules are not compared on equal terms: the board says how
    each was bounded, and says nothing when they all were bounded alike."""
    def run(algorithm: str, seed: int, value: float, patience: int, part: str = "federated") -> dict:
        unit = "rounds" if part == "federated" else "epochs"
        return {**_result(algorithm, seed, value), "config": {part: {unit: 100, "patience": patience}}}

    alike = [run(m, s, v + s / 100, 0) for m, v in (("a", 0.3), ("b", 0.2)) for s in range(2)]
    (board,) = boards(alike)
    assert board.stopping == {} and "budgets" not in to_markdown(board)
    mixed = alike + [run("c", s, 0.25, 10) for s in range(2)] + [run("mf", s, 0.4, 10, "train") for s in range(2)]
    (board,) = boards(mixed)
    assert board.stopping == {
        "mf": "up to 100 epochs, stops after 10 evaluations without a better validation figure",
        "a": "up to 100 rounds, no early stopping", "b": "up to 100 rounds, no early stopping",
        "c": "up to 100 rounds, stops after 10 evaluations without a better validation figure"}
    text = to_markdown(board)
    assert "The rows were trained under different budgets:" in text
    assert "- up to 100 rounds, no early stopping: a, b\n" in text  # one line a rule, rows in rank order
    assert "- up to 100 rounds, stops after 10 evaluations without a better validation figure: c\n" in text
    (unknown,) = boards([_result("a", 0, 0.3), run("b", 0, 0.2, 10)])
    assert unknown.stopping["a"] == "" and "- not recorded: a\n" in to_markdown(unknown)


@pytest.mark.parametrize(("text", "says"), [
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [0]\nepochs = 3\n", "unknown key(s) epochs"),
    ("[grid]\nalgorithms = ['fedmff']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [0]\n", "fedmff"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = []\n", "grid.seeds must be a non-empty list"),
    ("grid = 1\n", "no [grid] table"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [0]\nworkers = 'two'\n",
     "grid.workers must hold whole numbers >= 1, not 'two'"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [-1]\n",
     "grid.seeds must be a whole number in [0, 2^64), not -1"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [0]\ncheckpoint_every = -2\n",
     "grid.checkpoint_every must hold whole numbers >= 0, not -2"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-sampled']\nseeds = [0]\nks = 20\n",
     "grid.ks takes cut-offs K such as 20 or 5,20 (whole numbers from 1 to 1,000,000), not 20"),
    ("[grid]\nalgorithms = ['fedmf']\ndatasets = ['ml-100k']\nprotocols = ['loo-full', 'loo-sampled']\nseeds = [0]\n"
     "ks = [100]\n", "grid.ks 100: under 'loo-sampled' a target is ranked among 100 items"),
])
def test_a_bench_file_is_checked_before_anything_runs(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(FedrecError, match=re.escape(says)):
        load_grid(path)


def test_checkpointed_cells_keep_their_keys_and_leave_no_checkpoint(tmp_path: Path) -> None:
    """How often a cell saves itself changes none of its figures, so not its cache key; a cell
    that finishes removes its checkpoint (a killed one's is resumed: test_federated)."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=2, workers=1))
    plain = load_grid(grid)
    grid.write_text(grid.read_text() + "checkpoint_every = 1\n")
    saving = load_grid(grid)
    assert (plain.checkpoint_every, saving.checkpoint_every) == (0, 1)
    assert [c.key() for c in saving.cells] == [c.key() for c in plain.cells]
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert len(list((out / "cells").glob("*.json"))) == 2 and not list((out / "cells").glob("*.ckpt"))


def test_a_grid_of_further_cutoffs_reports_them_and_a_grid_without_keeps_its_cells(tmp_path: Path) -> None:
    """``ks = [20]`` runs each cell with its ranking metrics also at 20, on the boards too; a
    cell's key holds the cut-offs only when they are given, so the cells of a grid without
    them are the ones it had before the key existed."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    plain = load_grid(grid)
    assert plain.cells[0].run_config(None).ks == ()
    grid.write_text(grid.read_text() + "ks = [20, 5]\n")
    further = load_grid(grid)
    assert further.cells[0].run_config(None).ks == (5, 20)
    assert {c.key() for c in further.cells}.isdisjoint(c.key() for c in plain.cells)
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    for cell in (out / "cells").glob("*.json"):
        assert {"hr@5", "ndcg@5", "hr@10", "ndcg@10", "hr@20", "ndcg@20"} <= set(json.loads(cell.read_text())["test"])
    board = (out / "leaderboard-synthetic_60x500-loo-sampled.md").read_text()
    assert "| hr@5 | ndcg@5 | hr@10 | ndcg@10 | hr@20 | ndcg@20 |" in board


def test_cells_run_on_the_gpu_when_one_is_present(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert {c.device for c in load_grid(path).cells} == {expected}
    path.write_text(GRID.format(seeds=[0], rounds=1, workers=1) + 'device = "cpu"\n')
    cells = load_grid(path).cells
    assert {c.device for c in cells} == {"cpu"}
    assert cells[0].run_config(None).federated.device == "cpu"
    # a grid a GPU machine ran is reported here, where running it is one clear error
    path.write_text(GRID.format(seeds=[0], rounds=1, workers=1) + 'device = "cuda:0"\n')
    assert {c.device for c in load_grid(path, check_device=False).cells} == {"cuda:0"}
    if not torch.cuda.is_available():
        with pytest.raises(FedrecError, match="sees no CUDA device"):
            load_grid(path)
    path.write_text(GRID.format(seeds=[0], rounds=1, workers=1) + 'device = "cdua"\n')
    with pytest.raises(FedrecError, match="grid.device: --device cdua is not a device name"):
        load_grid(path, check_device=False)  # a report still names a device fedrec knows


def test_bad_workers_on_the_command_line_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    assert _bench([str(grid), "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_a_leaderboard_names_the_cells_it_lacks_and_why(tmp_path: Path) -> None:
    """A failed cell keeps its reason and a cell not yet run says so: a row with fewer seeds
    than the grid is explained under its board, not silently short."""
    grid = tmp_path / "grid.toml"
    text = GRID.format(seeds=[0], rounds=2, workers=1).replace('["fedmf", "pfedrec"]', '["mf", "pfedrec"]')
    grid.write_text(text.replace('"loo-sampled"', '"ratio-rating"'))
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    board = (out / "leaderboard.md").read_text()
    assert "| 1 | mf | 1 |" in board
    assert "- pfedrec (leak-free) seed 0: failed: 'pfedrec' cannot be evaluated under protocol 'ratio-rating'" in board
    assert len(list((out / "cells").glob("*.failed"))) == 1
    grid.write_text(grid.read_text().replace("seeds = [0]", "seeds = [0, 1]"))
    assert _bench([str(grid), "-o", str(out), "--report-only"]) == 0
    board = (out / "leaderboard.md").read_text()
    assert "- mf (leak-free) seed 1: not run" in board and "(3 cells of the grid without a result)" in board


def test_a_protocol_without_any_result_is_named_not_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    text = GRID.format(seeds=[0], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["pfedrec"]')
    grid.write_text(text.replace('"loo-sampled"', '"ratio-rating"'))
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 2  # nothing ran: a failure, said as one
    captured = capsys.readouterr()
    printed = " ".join(captured.out.split())
    assert "no leaderboard for" in printed and "none of its 1 cells has a result" in printed
    assert "error: no cell of this grid has a result (1 of 1 failed; first: 'pfedrec' cannot be evaluated" in captured.err



def test_a_grid_joins_the_finished_cells_of_another_to_its_boards(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Rows run elsewhere (another machine, another budget) join a board through ``[join]``:
    they are paired seed by seed with its rows, named by their grid's label, never run from the
    joining grid, and their missing cells are listed; two results for one row and seed are an
    error, not a silent pick."""
    other = tmp_path / "other.toml"
    other.write_text(GRID.format(seeds=[0, 1], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["fedmf"]')
                     + 'label = "elsewhere"\n')
    assert _bench([str(other), "-o", str(tmp_path / "other-out")]) == 0
    (tmp_path / "other-out" / "cells" / next((tmp_path / "other-out" / "cells").glob("*.json")).name).unlink()
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0, 1], rounds=1, workers=1) + '\n[join]\n"other.toml" = "other-out"\n')
    capsys.readouterr()
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "4 cells: 4 run, 0 cached, 0 failed" in printed  # the joined grid's missing cell is not run here
    assert len(list((tmp_path / "other-out" / "cells").glob("*.json"))) == 1
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    (kept,) = [json.loads(p.read_text()) for p in (tmp_path / "other-out" / "cells").glob("*.json")]
    assert f"| fedmf (elsewhere) | 1 | {kept['test']['hr@10']:.4f} |" in board
    assert "(in other.toml)" in board and "fedmf (leak-free) seed" in board
    # both seeds of the joined row, paired against the best
    assert _bench([str(other), "-o", str(tmp_path / "other-out")]) == 0
    assert _bench([str(grid), "-o", str(tmp_path / "out"), "--report-only"]) == 0
    csv = (tmp_path / "out" / "leaderboard-synthetic_60x500-loo-sampled.csv").read_text()
    rows = {line.split(",")[1]: line for line in csv.splitlines()[1:]}
    assert set(rows) == {"fedmf", "pfedrec", "fedmf (elsewhere)"} and ",2," in rows["fedmf (elsewhere)"]
    assert "(in other.toml)" not in (tmp_path / "out" / "leaderboard.md").read_text()
    # without a label, the joined grid's fedmf is this grid's fedmf: one row cannot hold both
    other.write_text(other.read_text().replace('label = "elsewhere"\n', ""))
    assert _bench([str(grid), "-o", str(tmp_path / "out"), "--report-only"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "fedmf seed 0 on synthetic:60x500 · loo-sampled has a result in this grid and in other.toml" in said
    grid.write_text(grid.read_text().replace('"other-out"', '"other-ot"'))
    with pytest.raises(FedrecError, match='join."other.toml": .*other-ot is not a folder of results'):
        load_grid(grid)
    grid.write_text(grid.read_text().replace('"other.toml" = "other-ot"', '"othre.toml" = "other-out"'))
    with pytest.raises(FedrecError, match='join."othre.toml": .*othre.toml: not a readable bench file'):
        load_grid(grid)
    grid.write_text(grid.read_text().replace('"othre.toml" = "other-out"', '"other.toml" = "other-ot"'))
    grid.write_text(grid.read_text().replace('"other-ot"', "3"))
    with pytest.raises(FedrecError, match='join."other.toml" must be the folder its cells are in, not 3'):
        load_grid(grid)


def test_a_joined_grid_adds_rows_to_this_grids_boards_and_no_board_of_its_own(tmp_path: Path) -> None:
    """A joined grid's cells under a protocol this grid does not run make no board here (it
    would copy the joined grid's own), and their missing cells are not listed."""
    other = tmp_path / "other.toml"
    other.write_text(GRID.format(seeds=[0, 1], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["fedmf"]')
                     .replace('["loo-sampled"]', '["loo-sampled", "loo-full"]') + 'label = "elsewhere"\n')
    assert _bench([str(other), "-o", str(tmp_path / "other-out")]) == 0
    full = [p for p in (tmp_path / "other-out" / "cells").glob("*.json")
            if json.loads(p.read_text())["protocol"] == "loo-full"]
    full[0].unlink()  # a missing joined cell of the other protocol
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0, 1], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["pfedrec"]')
                    + '\n[join]\n"other.toml" = "other-out"\n')
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("leaderboard-*.md")) == [
        "leaderboard-synthetic_60x500-loo-sampled.md"]
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "| fedmf (elsewhere) | 2 |" in board and "loo-full" not in board and "not run" not in board


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "benchmarks").glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_grids_load(path: Path) -> None:
    """Every grid docs/leaderboard.md runs parses, names known algorithms and protocols, and
    finds the tuned configs it names (a config left uncommitted would fail here, not hours in).
    A grid for a GPU machine is read as its report is, on this machine too."""
    grid = load_grid(path, check_device=False)
    blob = tomllib.loads(path.read_text())
    assert {c.algorithm for c in grid.cells} == set(blob["grid"]["algorithms"])
    for key in blob.get("tuned", {}):  # each tuned config reaches its cells
        assert all(c.engine or c.model for c in grid.cells if c.algorithm == key.split("@")[0])


def _kept_boards() -> list[tuple[Path, Path]]:
    """Each shipped grid whose cells are kept in git, with their folder (the ``-o`` of the grid's
    first line); a GPU machine's grid keeps none here."""
    root = Path(__file__).parents[1]
    kept = []
    for path in sorted((root / "benchmarks").glob("*.toml")):
        found = re.search(r"-o (\S+)", path.read_text().splitlines()[0])
        if found and (root / found.group(1) / "cells").is_dir():
            kept.append((path, root / found.group(1)))
    return kept


@pytest.mark.parametrize(("path", "folder"), _kept_boards(), ids=lambda v: v.name)
def test_the_shipped_boards_hold_no_cell_of_a_former_default(path: Path, folder: Path) -> None:
    """The boards kept in git are redrawn from their cells (`--report-only`): a default changed
    without its cells run again would leave those rows out of the next redraw, and the boards and
    docs would show figures of settings fedrec no longer runs."""
    from fedrec.bench import missing_cells

    grid = load_grid(path, check_device=False, join=False)
    assert [why for _, why in missing_cells(grid, folder) if why.startswith("outdated")] == []


@pytest.mark.parametrize(("change", "says"), [
    (('["fedmf", "pfedrec"]', '[["fedmf"]]'), "grid.algorithms must list names (text), not [['fedmf']]"),
    (('["fedmf", "pfedrec"]', '["fedmf", "fedmf"]'), "grid.algorithms names fedmf more than once"),
    (("seeds = [0]", "seeds = [0, 0]"), "grid.seeds names 0 more than once"),
    (("seeds = [0]", "seeds = [-1]"), "grid.seeds must be a whole number in [0, 2^64), not -1"),
    (("seeds = [0]", f"seeds = [{2**64}]"), "grid.seeds must be a whole number in [0, 2^64)"),
    (("seeds = [0]", "seeds = [0]\nnegatives = [\"legacy\", \"legacy-exclude-heldout\"]"),
     "grid.negatives names legacy-exclude-heldout more than once"),
    (("[grid]", "tuned = 5\n[grid]"), "tuned must be a table ([tuned]), not 5"),
])
def test_a_grids_wrongly_typed_or_repeated_entry_is_one_line_before_any_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], says: str) -> None:
    grid = tmp_path / "grid.toml"
    text = GRID.format(seeds=[0], rounds=1, workers=1)
    assert change[0] in text
    grid.write_text(text.replace(change[0], change[1]))
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"error: {grid}: {says}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_grid_file_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_bytes(GRID.format(seeds=[0], rounds=1, workers=1).encode() + "# caf\xe9\n".encode("latin-1"))
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 2
    assert "not a readable bench file" in capsys.readouterr().err


def test_a_folder_named_through_one_that_did_not_exist_is_never_removed(tmp_path: Path) -> None:
    """``a/../b`` is the existing folder b even while a does not exist: not one the block made."""
    from fedrec.files import no_empty_folders

    (tmp_path / "b").mkdir()
    with no_empty_folders(tmp_path / "a" / ".." / "b", tmp_path / "new" / "deeper"):
        (tmp_path / "new" / "deeper").mkdir(parents=True)
    assert (tmp_path / "b").is_dir() and not (tmp_path / "new").exists()


def test_a_cell_run_under_a_default_since_changed_is_run_again(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A cell's key holds the model options the grid sets, not their defaults, so a changed
    default keeps the key: the results file's recorded options tell the cell's old run from its
    current one, the boards leave the old run out and say why, and the next run replaces it."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    capsys.readouterr()
    fedmf = next(p for p in (out / "cells").glob("*.json") if json.loads(p.read_text())["algorithm"] == "fedmf")
    blob = json.loads(fedmf.read_text())
    dim = blob["config"]["model"]["dim"]
    blob["config"]["model"]["dim"] = dim + 1  # as if it ran when the default was one more
    fedmf.write_text(json.dumps(blob))
    assert _bench([str(grid), "-o", str(out), "--report-only"]) == 0
    board = " ".join((out / "leaderboard.md").read_text().split())
    assert f"- fedmf (leak-free) seed 0: outdated: its run had dim {dim + 1} -> {dim} (a default changed since)" in board
    assert "| fedmf |" not in board and "| pfedrec |" in board
    failed = fedmf.with_suffix(".failed")  # its rerun failed: the failure is what the board says
    failed.write_text("failed: out of memory\n")
    assert _bench([str(grid), "-o", str(out), "--report-only"]) == 0
    assert "- fedmf (leak-free) seed 0: failed: out of memory" in (out / "leaderboard.md").read_text()
    failed.unlink()
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "2 cells: 1 run, 1 cached, 0 failed" in capsys.readouterr().out
    assert json.loads(fedmf.read_text())["config"]["model"]["dim"] == dim
    board = (out / "leaderboard.md").read_text()
    assert "outdated" not in board and "| fedmf |" in board


def test_a_cell_whose_options_the_algorithm_no_longer_takes_is_not_called_outdated(tmp_path: Path) -> None:
    """Such a cell fails on its own when run; reading the results of a grid holding it must not
    stop at it."""
    import dataclasses

    from fedrec.bench.grid import outdated

    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1))
    cell = dataclasses.replace(load_grid(grid).cells[0], model=(("gone", 1),))
    assert outdated(cell, {"config": {"model": {"dim": 32}}}) is None


def test_a_joined_cell_read_from_other_events_is_left_off_the_board(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Rows are paired seed by seed, so a board holds one copy of each data set's events: a
    joined grid's cell whose run read other events than the board's other rows (its recorded
    content digest differs) is listed, not shown; this grid's own rows set the reference even
    when the joined grid has more of them, and a result recording no digest is kept."""
    other = tmp_path / "other.toml"
    other.write_text(GRID.format(seeds=[0, 1], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["fedmf"]')
                     + 'label = "elsewhere"\n')
    assert _bench([str(other), "-o", str(tmp_path / "other-out")]) == 0
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1).replace('["fedmf", "pfedrec"]', '["pfedrec"]')
                    + '\n[join]\n"other.toml" = "other-out"\n')
    assert _bench([str(grid), "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()

    def record(folder: str, seed: int, content: str | None) -> None:
        for p in (tmp_path / folder / "cells").glob("*.json"):
            blob = json.loads(p.read_text())
            if blob["seed"] == seed:
                blob["data"]["source"].pop("content", None)
                blob["data"]["source"].update({"content": content} if content else {})
                p.write_text(json.dumps(blob))

    def shown() -> dict[str, str]:
        assert _bench([str(grid), "-o", str(tmp_path / "out"), "--report-only"]) == 0
        csv = (tmp_path / "out" / "leaderboard-synthetic_60x500-loo-sampled.csv").read_text()
        return {line.split(",")[1]: line.split(",")[2] for line in csv.splitlines()[1:]}

    assert shown() == {"pfedrec": "1", "fedmf (elsewhere)": "2"}  # no digests: nothing to compare
    record("out", 0, "a" * 64)
    record("other-out", 0, "b" * 64)
    record("other-out", 1, "b" * 64)
    assert shown() == {"pfedrec": "1"}  # two against one, but this grid's own copy is the reference
    board = " ".join((tmp_path / "out" / "leaderboard.md").read_text().split())
    assert ("fedmf (leak-free) seed 1: read other events of synthetic:60x500 (content bbbbbbbbbbbb) than the "
            "board's other rows (aaaaaaaaaaaa): run it again with their copy at hand (in other.toml)") in board
    record("other-out", 1, "a" * 64)
    assert shown() == {"pfedrec": "1", "fedmf (elsewhere)": "1"}
    record("other-out", 0, None)  # written before runs recorded the digest: kept
    assert shown() == {"pfedrec": "1", "fedmf (elsewhere)": "2"}
    record("out", 0, None)  # no own digest: the joined rows' own (both "a") are the reference
    record("other-out", 0, "c" * 64)
    assert shown() == {"pfedrec": "1", "fedmf (elsewhere)": "1"}


def test_a_cell_whose_run_read_other_events_is_set_aside_and_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A built-in data set's cells are keyed without where its copy lives, so a copy in another
    format keeps them (the events are the same: their content digest is); a copy with other
    events sets the old results aside, never on the boards, and runs the cell again; the first
    events back, their results are back. Data not at hand are not checked."""
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))  # nothing to fall back on
    from tiny_ml100k import write_atomic, write_u_data

    data = tmp_path / "data"
    u_data = write_u_data(data)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(seeds=[0], rounds=1, workers=1).replace('"synthetic:60x500"', '"ml-100k"')
                    .replace('["fedmf", "pfedrec"]', '["fedmf"]') + f'data_dir = "{data}"\n')
    out = tmp_path / "out"
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "1 cells: 1 run, 0 cached, 0 failed" in capsys.readouterr().out
    cell = next((out / "cells").glob("*.json"))
    first = json.loads(cell.read_text())
    # the same events as RecBole's atomic file: the cell stays
    u_data.unlink()
    write_atomic(data)
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "1 cells: 0 run, 1 cached, 0 failed" in capsys.readouterr().out
    # one rating changed: the old results are set aside (kept, named by their data) and the cell runs again
    (data / "ml-100k.inter").unlink()
    write_u_data(data, edited=True)
    assert _bench([str(grid), "-o", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "1 cells: 1 run, 0 cached, 0 failed" in printed and "1 cell had results read from other events" in printed
    aside = out / "cells" / f"{cell.stem}.other-data-{first['data']['source']['content'][:12]}.json"
    assert json.loads(aside.read_text()) == first
    edited = json.loads(cell.read_text())
    assert edited["data"]["source"]["content"] != first["data"]["source"]["content"]
    assert _bench([str(grid), "-o", str(out), "--report-only"]) == 0
    assert "1 result files in" in " ".join(capsys.readouterr().out.split())
    # the first events back: their results are back, the edited events' set aside in turn
    write_u_data(data)
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "1 cells: 0 run, 1 cached, 0 failed" in capsys.readouterr().out
    assert json.loads(cell.read_text()) == first and not aside.exists()
    assert json.loads((out / "cells" / f"{cell.stem}.other-data-{edited['data']['source']['content'][:12]}.json")
                      .read_text()) == edited
    # no copy at hand: nothing to compare with, the cell stays
    u_data.unlink()
    assert _bench([str(grid), "-o", str(out)]) == 0
    assert "1 cells: 0 run, 1 cached, 0 failed" in capsys.readouterr().out
