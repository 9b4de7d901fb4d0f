"""`fedrec reproduce personalfr`: figures, plan, one row from two protocols, ML-1M stand-in
figures beside ML-100K runs, and the communication / computation notes."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.reproduce import figure, load_figures
from fedrec.reproduce.personalfr import compression_notes
from fedrec.reproduce.runner import plan


def test_figures_and_plan() -> None:
    assert len(load_figures("personalfr")) == 26
    assert figure("personalfr", "3", "personalfr", "ml-1m", "rmse", "clients=100").mean == 0.8613
    assert figure("personalfr", "4", "fedavg", "ml-1m", "rmse", "per-user").mean == 0.9508
    chosen = plan("personalfr")
    rows = {(f.method, f.setting) for f in load_figures("personalfr")}
    for table, runs in chosen.items():
        mine = {(r.method, r.setting) for r in runs}
        assert mine == {(f.method, f.setting) for f in load_figures("personalfr") if f.table == table}
        for r in runs:  # every row: an explicit (RMSE) and a binarised (NDCG) run
            assert {p.protocol for p in runs if (p.method, p.setting) == (r.method, r.setting)} == {
                "ratio-rating", "ratio-rating-implicit"}
            assert "rated" in get_algorithm(r.algorithm).rankings
    assert {(r.method, r.setting) for rs in chosen.values() for r in rs} == rows
    per_user = [r for r in chosen["4"] if r.setting == "per-user"]
    assert all(dict(r.model) == {"clients": 0, "optimizer": "sgd"}
               and dict(r.engine) == {"batch_size": 1, "lr": 0.1} for r in per_user)


def test_cli_joins_rmse_and_ndcg_and_shows_ml1m_figures(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from fedrec.cli import main

    def fake_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        explicit = cfg.protocol == "ratio-rating"
        test = {"rmse": 0.9111} if explicit else {"rated-ndcg@10": 0.8222, "ndcg@10": 0.1, "users": 5.0}
        rows = 100 if cfg.algorithm == "personalfr" else 1000
        history = [{"round": 1, "loss": 1.0, "seconds": 0.1, "valid": {}, "bytes_up": rows, "bytes_down": rows,
                    "rejected_uploads": 0, "extra": {"macs": 2.0 * rows, "macs_fedrec": 50.0}}]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": asdict(cfg), "data": {"negatives": "train-only"},
            "history": history, "valid_at_best": {}, "test": test, "extra": {}}))

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    md = tmp_path / "pfr.md"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "personalfr", "--tables", "3", "--negatives", "leak-free",
              "--out-dir", str(tmp_path / "runs"), "--markdown", str(md)])
    assert done.value.code == 0, capsys.readouterr().out
    text = md.read_text()
    assert "paper (ml-1m) RMSE" in text
    row = next(line for line in text.splitlines() if line.startswith("| personalfr | ml-100k | clients=100"))
    assert "0.9111" in row and "0.8222" in row and "0.8613" in row and "0.8538" in row
    assert "10.0x less" in text  # 2000 bytes a round against 200


def test_compression_notes_compare_like_for_like() -> None:
    def result(alg: str, bytes_: int, macs: float) -> dict:  # type: ignore[type-arg]
        return {"algorithm": alg, "protocol": "ratio-rating", "config": {"setting": "clients=100"},
                "history": [{"bytes_up": bytes_, "bytes_down": bytes_, "extra": {"macs": macs, "macs_fedrec": 1e6}}]}

    [line] = compression_notes([result("fedavg", 2**20 * 27, 1.9e9), result("personalfr", 2**20, 1e9)])
    assert "27.0x less" in line and "1.90x fewer" in line and "1M a round" in line


def test_anime_runs_take_the_papers_preprocessing(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`fedrec reproduce personalfr --dataset anime` filters as the paper: 20 ratings per user
    and item (one pass), then the first 6,000 users."""
    from fedrec.reproduce.runner import DATA_OPTIONS, execute

    seen = []

    def fake_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        seen.append((cfg.min_user, cfg.min_item, cfg.one_pass_core, cfg.max_users))
        raise FedrecError("stop here")

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    joint = plan("personalfr", ["3"])["3"][0]
    execute([joint], dataset="anime", seeds=[0], policies=["leak-free"], rounds=1, out_dir=tmp_path,
            data_options=DATA_OPTIONS[("personalfr", "anime")])
    assert seen == [(20, 20, True, 6000)]
