"""The GPU benchmark's bookkeeping: rows from streamed rounds, and its split cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import gpu_speed  # noqa: E402

W = gpu_speed.Workload("tiny", "pfedrec", "150x300x4500", 4, "<= 1 s")


def _round(r: int, seconds: float) -> str:
    return "ROUND " + json.dumps({"round": r, "round_s": seconds, "train_s": seconds / 2, "aggregate_s": 0.0,
                                  "eval_s": 0.1, "host_peak_gb": 1.0 + r, "device_peak_gb": None})


def test_a_finished_row_keeps_its_measured_total() -> None:
    lines = ['LOADED {"load_s": 0.5, "users": 120, "items": 60, "train": 1500}',
             *(_round(r, s) for r, s in [(1, 3.0), (2, 1.0), (3, 1.2), (4, 1.1)]),
             json.dumps({"wall_s": 6.4, "rounds": 4, "host_peak_gb": 5.0, "device_peak_gb": None, "test": {"hr@10": 0.5}})]
    row = gpu_speed.summarise(W, "cpu", lines, finished=True)
    assert row["total_s"] == 6.4 and not row["extrapolated"]
    assert row["round_s"] == 1.15 and row["host_peak_gb"] == 5.0 and row["test"] == {"hr@10": 0.5}


def test_a_row_stopped_at_its_budget_is_extrapolated_from_its_median_round() -> None:
    lines = ['LOADED {"load_s": 0.5, "users": 120, "items": 60, "train": 1500}', _round(1, 3.0), _round(2, 1.0),
             _round(3, 1.2)]
    row = gpu_speed.summarise(W, "cpu", lines, finished=False)
    assert row["extrapolated"] and row["rounds"] == 3
    assert row["total_s"] == 1.2 * 4 and row["host_peak_gb"] == 4.0 and row["test"] is None
    assert gpu_speed.summarise(W, "cpu", lines[:1], finished=False) is None  # no round: no row


def test_a_cached_split_is_the_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = gpu_speed.split_of(W, 0, str(tmp_path))
    assert [p.suffix for p in tmp_path.iterdir()] == [".split"]  # no part file left behind

    def no_drawing(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached split must be read, not drawn again")

    monkeypatch.setattr("fedrec.data.synthetic.synthetic", no_drawing)
    again = gpu_speed.split_of(W, 0, str(tmp_path))
    assert (first.train != again.train).nnz == 0
    np.testing.assert_array_equal(first.test.candidates, again.test.candidates)
    # the training negatives' sampler, rebuilt from its stored arrays, draws the same
    users = np.arange(first.n_users)
    np.testing.assert_array_equal(first.sample_negatives(users, 3, np.random.default_rng(5)),
                                  again.sample_negatives(users, 3, np.random.default_rng(5)))
    assert (first.protocol, first.negatives) == (again.protocol, again.negatives)
