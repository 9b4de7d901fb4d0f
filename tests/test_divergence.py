"""A run whose loss or scores stop being finite is a result (status ``diverged``), not a crash:
the driver says in which round, `train` writes the results of the rounds before, `fedrec run`
says so on one line, and `fedrec bench` and `fedrec reproduce` record it, go on, and show it
as diverged without averaging it into their figures."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_driver import Scripted as Steady

from fedrec.cli import main
from fedrec.core.driver import run_rounds
from fedrec.errors import Diverged, FedrecError
from fedrec.eval.metrics import NaNScores
from fedrec.results import RoundRecord, diverged, load_result

#: fedmf on this data set at this learning rate: rounds 1 and 2 train (round 1 has the best
#: validation figure), the loss of round 3 is not finite
DATASET, LR, AT = "synthetic:40x200", 1e3, 3


class Scripted(Steady):
    """`test_driver`'s script; loses its loss in ``nan_loss_at``, or its test scores in
    ``nan_test_at``."""

    def __init__(self, nan_loss_at: int = 0, nan_test_at: int = 0) -> None:
        super().__init__()
        self.nan_loss_at, self.nan_test_at = nan_loss_at, nan_test_at

    def train_round(self, r: int) -> RoundRecord:
        record = super().train_round(r)
        if r == self.nan_loss_at:
            record.loss = float("nan")
        return record

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        if stage == "test" and self.trained == self.nan_test_at:
            raise NaNScores("scores contain NaN")
        return super().evaluate(stage, split, users)


def test_the_driver_names_the_round_and_keeps_the_rounds_before():
    with pytest.raises(Diverged, match=r"diverged in round 4 \(the loss is not finite\)") as caught:
        run_rounds(Scripted(nan_loss_at=4), None, select="hr@10", rounds=4)
    assert isinstance(caught.value, FedrecError)  # `fedrec tune` scores it as a diverged trial
    out = caught.value.outcome
    assert caught.value.round == 4 and [h.round for h in out.history] == [1, 2, 3]
    assert (out.best_round, out.valid_at_best, out.test) == (3, {"hr@10": 0.5}, {"hr@10": 0.25})


def test_nan_test_scores_do_not_make_their_round_the_best():
    """Round 3 improves validation but its test scores are NaN: the run diverged in round 3,
    and the figures reported are round 2's, whose test figures exist."""
    with pytest.raises(Diverged, match=r"diverged in round 3 \(its scores are NaN") as caught:
        run_rounds(Scripted(nan_test_at=3), None, select="hr@10", rounds=4)
    out = caught.value.outcome
    assert [h.round for h in out.history] == [1, 2]
    assert (out.best_round, out.valid_at_best, out.test) == (2, {"hr@10": 0.2}, {"hr@10": 0.1})


def test_a_divergence_crosses_a_process_boundary_whole():
    """Worker processes (`fedrec.pool`) send their errors pickled."""
    from fedrec.results import RunResult

    result = RunResult("fedmf", "d", "loo-sampled", 0, {}, "ndcg@10", status="diverged", diverged_at=5)
    again = pickle.loads(pickle.dumps(Diverged("training diverged in round 5", 5, result)))
    assert (str(again), again.round, again.result.diverged_at) == ("training diverged in round 5", 5, 5)


def _diverging(seed: int = 0, rounds: int = 6) -> Any:
    from fedrec.experiment import RunConfig, federated_config

    return RunConfig(algorithm="fedmf", dataset=DATASET, protocol="loo-sampled", seed=seed,
                     federated=federated_config("fedmf", rounds=rounds, lr=LR, paper=True))


def test_train_writes_a_diverged_run_and_raises_it_with_its_result(tmp_path: Path):
    from fedrec.experiment import train

    out = tmp_path / "r.json"
    with pytest.raises(Diverged) as caught:
        train(_diverging(), out=out)
    result = caught.value.result
    assert caught.value.round == AT and str(caught.value).endswith(f"; wrote {out} (status: diverged)")
    assert (result.status, result.diverged_at) == ("diverged", AT)
    assert [h.round for h in result.history] == [1, 2]
    assert result.best_round == 1 and result.test["hr@10"] >= 0
    assert result.valid_at_best == result.history[0].valid  # selected on validation before it diverged
    saved = json.loads(out.read_text())
    assert (saved["status"], saved["diverged_at"], saved["best_round"]) == ("diverged", AT, 1)
    assert saved["test"] == result.test and len(saved["history"]) == 2
    # a results file written before the field existed is of a completed run
    del saved["status"], saved["diverged_at"]
    (tmp_path / "old.json").write_text(json.dumps(saved))
    old = load_result(tmp_path / "old.json")
    assert (old["status"], old["diverged_at"], diverged(old)) == ("completed", None, False)


def test_fedrec_run_says_it_diverged_on_one_line_and_keeps_the_file(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        main(["run", "fedmf", "-d", DATASET, "--rounds", "6", "--lr", str(LR), "--paper", "-q", "-o", str(out)])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: training diverged in round {AT} (the loss is not finite); lower --lr")
    assert err.endswith(f"wrote {out} (status: diverged)")
    assert json.loads(out.read_text())["status"] == "diverged"


def test_the_documented_api_example_runs_as_written(capsys: pytest.CaptureFixture[str]):
    docs = Path(__file__).resolve().parents[1] / "docs" / "api.md"
    code = next(block for block in re.findall(r"```python\n(.*?)```", docs.read_text(), re.S) if "Diverged" in block)
    exec(compile(code, str(docs), "exec"), {})  # noqa: S102  (our own documentation)
    assert capsys.readouterr().out.split() == [str(AT), "diverged", "1"]


def _result(algorithm: str, seed: int, value: float | None, at: int = 0) -> dict[str, Any]:
    test = {} if value is None else {"users": 10, "ndcg@10": value}
    return {"algorithm": algorithm, "dataset": "d", "protocol": "loo-sampled", "seed": seed, "select": "ndcg@10",
            "test": test, "data": {"negatives": "leak-free"},
            **({"status": "diverged", "diverged_at": at} if at else {})}


def test_a_board_leaves_diverged_runs_out_of_its_figures_ranks_and_tests():
    from fedrec.bench import boards, to_markdown

    results = [_result("a", s, v) for s, v in enumerate([0.30, 0.32, 0.31])]
    # b's seed 2 diverged after a figure better than any: it must not lift b's mean
    results += [_result("b", 0, 0.20), _result("b", 1, 0.22), _result("b", 2, 0.90, at=7)]
    results += [_result("c", s, 0.95 if s else None, at=3 + s) for s in range(2)]  # every seed diverged
    (board,) = boards(results)
    table = board.table
    assert table["method"].tolist() == ["a", "b", "c"]
    assert table["rank"].tolist()[:2] == [1, 2] and table["rank"].isna().tolist() == [False, False, True]
    assert table["ndcg@10"].iloc[1] == pytest.approx(0.21) and table["seeds"].tolist() == [3, 2, 0]
    assert table["diverged"].tolist() == [0, 1, 2]
    assert board.diverged == {"b": {2: 7}, "c": {0: 3, 1: 4}}
    text = to_markdown(board)
    assert "| — | c | 0 | diverged (rounds 3, 4) | 2 (rounds 3, 4) | — | — |" in text
    assert "| 2 | b | 2 | 0.2100 ± 0.0141 | 1 (round 7) |" in text
    assert "left out of the means, ranks and tests: b seed 2 (round 7), c seed 0 (round 3), c seed 1 (round 4)" in text
    (alone,) = boards([_result("c", 0, None, at=3)])  # nothing completed: no best, no rank
    assert "| — | c | 0 | diverged (round 3) | 1 (round 3) | — | — |" in to_markdown(alone)


GRID = """
[grid]
algorithms = ["fedmf", "pfedrec"]
datasets = ["{dataset}"]
protocols = ["loo-sampled"]
seeds = [0]
rounds = 6
workers = 1
checkpoint_every = 1

[tuned]
fedmf = "fedmf.json"
"""


def test_a_grid_records_a_diverged_cell_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "fedmf.json").write_text(json.dumps({"fedrec_config": 1, "algorithm": "fedmf",
                                                    "engine": {"lr": LR}, "model": {}}))
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(dataset=DATASET))
    out = tmp_path / "out"
    said = []
    for _ in range(2):  # the second time the diverged cell is a cached result, not a failure to retry
        with pytest.raises(SystemExit) as done:
            main(["bench", str(grid), "-o", str(out)])
        assert done.value.code in (0, None)
        said.append(" ".join(capsys.readouterr().out.split()))
    assert "2 cells: 1 run, 1 diverged, 0 cached, 0 failed" in said[0]
    assert f"fedmf {DATASET} loo-sampled leak-free seed 0: diverged in round {AT}" in said[0]
    assert "2 cells: 0 run, 2 cached, 0 failed" in said[1]
    cells = sorted((out / "cells").iterdir())
    assert [p.suffix for p in cells] == [".json", ".json"]  # no .failed, no checkpoint left
    assert sorted(load_result(p)["status"] for p in cells) == ["completed", "diverged"]
    board = (out / "leaderboard.md").read_text()
    assert re.search(r"\| 1 \| pfedrec \| 1 \| \d\.\d{4} \|", board)
    assert f"| — | fedmf | 0 | diverged (round {AT}) |" in board
    assert f"fedmf seed 0 (round {AT})" in board


def test_reproduce_records_a_diverged_run_and_its_table_says_so(tmp_path: Path):
    from fedrec.reproduce.runner import PlannedRun, execute
    from fedrec.reproduce.table import summarise, to_markdown

    runs = [PlannedRun("fedmf", "fedmf"), PlannedRun("fedmf", "fedmf", setting="lr=1000", engine=(("lr", LR),))]
    failed: list[str] = []
    results = execute(runs, dataset=DATASET, seeds=[0], policies=["leak-free"], rounds=4, out_dir=tmp_path,
                      checkpoint_every=1, on_fail=lambda p, n, s, why: failed.append(why))
    assert len(failed) == 1 and failed[0].startswith(f"training diverged in round {AT}")
    assert sorted(r["status"] for r in results) == ["completed", "diverged"]
    assert not list(tmp_path.rglob("*.ckpt"))
    md = to_markdown(summarise(results, metrics=["hr@10"]), "pfedrec", 1, metrics=["hr@10"])
    row = next(line for line in md.splitlines() if "lr=1000" in line)
    assert row == f"| fedmf | {DATASET} | lr=1000 | diverged (round {AT}) | — |"
    assert "1 run diverged and is left out of the figures" in md
    # one group of a completed seed and a diverged one: its figure is the completed seed's alone
    done, gone = sorted(results, key=lambda r: r["status"])
    both = [{**done, "seed": 1}, {**gone, "config": {**gone["config"], "setting": ""}}]
    row = next(line for line in to_markdown(summarise(both, ["hr@10"]), "pfedrec", 1, metrics=["hr@10"]).splitlines()
               if line.startswith("| fedmf"))
    assert row == f"| fedmf | {DATASET} | {done['test']['hr@10']:.4f} (1 diverged) | — |"


def test_a_diverged_tuning_trial_is_scored_as_the_worst():
    from fedrec.experiment import prepare_split
    from fedrec.tune import train_trial, trial_value

    class Trial:
        reported: list[int] = []

        def report(self, value: float, step: int) -> None:
            self.reported.append(step)

        def should_prune(self) -> bool:
            return False

    cfg = _diverging()
    trial = Trial()
    outcome = train_trial(trial, cfg, prepare_split(cfg), "ndcg@10", None)
    assert outcome["state"] == "failed" and outcome["reason"].startswith(f"training diverged in round {AT}")
    assert trial.reported == [1, 2] and trial_value(outcome, maximise=True) == -np.inf
