"""`fedrec reproduce gfedpp`: figures as transcribed, the plan, alpha chosen on validation,
public/private rows, the heat map and the CLI. Runs are faked: these tests check wiring only."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fedrec.cli import main
from fedrec.experiment import RunConfig
from fedrec.reproduce import figure, load_figures
from fedrec.reproduce.gfedpp import by_group, choose_alpha, grid, heatmap
from fedrec.reproduce.runner import GFEDPP_ALPHAS, GFEDPP_RATIOS, PlannedRun, execute, plan


def _valid_of(alpha: float) -> float:
    return 0.40 + (0.05 if alpha == 0.9 else 0.0)  # alpha 0.9 wins on validation


def _fake_run(calls: list[RunConfig]):  # type: ignore[no-untyped-def]
    def run(cfg: RunConfig, out: Path, **_: Any) -> None:
        calls.append(cfg)
        model = {"public_ratio": 1.0, "alpha": 0.5, **cfg.model}
        alpha, ratio = float(model["alpha"]), float(model["public_ratio"])
        test = {"hr@10": 0.6 + alpha / 10 + ratio / 100, "ndcg@10": 0.3, "users": 10.0}
        groups = {"public": {**test, "hr@10": 0.7}, "private": {**test, "hr@10": 0.5}}
        result = {
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": {**asdict(cfg), "model": model},
            "data": {"negatives": cfg.negatives}, "history": [],
            "valid_at_best": {"hr@10": _valid_of(alpha)}, "test": test,
            "extra": {"test_groups": groups} if cfg.algorithm == "gfedpp" else {},
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result))

    return run


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[RunConfig]:
    seen: list[RunConfig] = []
    monkeypatch.setattr("fedrec.experiment.run", _fake_run(seen))
    return seen


def test_gfedpp_figures_are_complete_and_spot_checked() -> None:
    figs = load_figures("gfedpp")
    assert Counter(f.table for f in figs) == {"2": 106, "3": 40, "4": 60}  # no FedPerGNN on 2 sets
    assert len({f.key for f in figs}) == len(figs)
    checks = [("2", "gpfedrec", "ml-100k", "hr@10", "", 0.7232), ("2", "metamf", "ml-100k", "ndcg@10", "", 0.4088),
              ("2", "gfedpp", "amazon-video", "ndcg@10", "", 0.7361), ("3", "gfedpp-no-ugc", "ml-1m", "ndcg@10", "", 0.3934),
              ("4", "gfedpp", "ml-100k", "hr@10", "ldp=0.4", 0.7224), ("4", "gfedpp", "hetrec2011", "ndcg@10", "ldp=0.5", 0.4546)]
    for table, method, dataset, metric, setting, value in checks:
        f = figure("gfedpp", table, method, dataset, metric, setting)
        assert f is not None and f.mean == pytest.approx(value)
    assert figure("gfedpp", "2", "fedpergnn", "amazon-video", "hr@10") is None


def test_gfedpp_plan_shares_the_default_run_and_spans_the_grid() -> None:
    tables = plan("gfedpp")
    assert list(tables) == ["2", "3", "4", "ratio", "heatmap"]
    default = PlannedRun("gfedpp", "gfedpp")
    assert all(default in tables[t] for t in tables)
    assert [r.method for r in tables["3"]] == ["gfedpp-no-iei", "gfedpp-no-ugc", "gfedpp-no-upie", "gfedpp"]
    assert [r.ldp for r in tables["4"]] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    cells = {(dict(r.model).get("public_ratio", 1.0), dict(r.model).get("alpha", 0.5)) for r in tables["heatmap"]}
    assert cells == {(0.0, 0.5)} | {(r, a) for r in GFEDPP_RATIOS[1:] for a in GFEDPP_ALPHAS}
    official = [r for r in tables["2"] if r.setting == "official-graph"]
    assert dict(official[0].model) == {"similarity": "legacy-distance"}
    clipped = [r for r in tables["2"] if r.setting == "clip=5"]
    assert [(r.method, dict(r.model)) for r in clipped] == [("metamf", {"clip": 5.0})]
    every = {r for runs in tables.values() for r in runs}
    assert len({r.file_name("leak-free", 0) for r in every}) == len(every)


def test_alpha_is_chosen_on_validation_and_groups_become_rows(calls: list[RunConfig], tmp_path: Path) -> None:
    runs = plan("gfedpp", ["2"])["2"]
    results = execute(runs, dataset="ml-100k", seeds=[0], policies=["leak-free", "legacy-exclude-heldout"],
                      rounds=1, out_dir=tmp_path)
    chosen, notes = choose_alpha(results)
    gfedpp = [r for r in chosen if r["algorithm"] == "gfedpp"]
    assert len(gfedpp) == 2 and {r["config"]["setting"] for r in gfedpp} == {""}
    assert all(r["config"]["model"]["alpha"] == 0.9 for r in gfedpp)
    assert len(notes) == 2 and "0.9 (tried 0.1: 0.4000, 0.5: 0.4000, 0.9: 0.4500)" in notes[0]
    assert len(chosen) == len(results) - 4  # two of three candidates dropped per policy

    rows = by_group([r for r in results if r["algorithm"] == "gfedpp"][:1])
    assert [(r["algorithm"], r["test"]["hr@10"]) for r in rows][1:] == [("gfedpp/public", 0.7), ("gfedpp/private", 0.5)]
    assert rows[0]["config"]["setting"] == "ratio=1"


def test_heatmap_draws_the_grid(calls: list[RunConfig], tmp_path: Path) -> None:
    runs = plan("gfedpp", ["heatmap"])["heatmap"]
    results = execute(runs, dataset="ml-100k", seeds=[0], policies=["leak-free"], rounds=1, out_dir=tmp_path)
    cells = grid(results, "hr@10")["leak-free"]
    assert len(cells) == 1 + (len(GFEDPP_RATIOS) - 1) * len(GFEDPP_ALPHAS)
    assert cells[(0.5, 0.9)] == pytest.approx(0.6 + 0.09 + 0.005)
    path = heatmap(results, "hr@10", tmp_path / "h.png", "test")
    assert path.exists() and path.stat().st_size > 10_000


def test_cli_reproduces_gfedpp_tables(calls: list[RunConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "gfedpp.md"
    argv = ["reproduce", "gfedpp", "--tables", "2,ratio,heatmap", "--rounds", "1", "--negatives", "leak-free",
            "--out-dir", str(tmp_path / "runs"), "--markdown", str(md)]
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    text = md.read_text()
    assert "alpha chosen on validation HR@10 (leak-free, seed 0): 0.9" in text
    assert "gfedpp/private" in text and "gfedpp/public" in text
    assert (tmp_path / "runs" / "plots" / "gfedpp-heatmap-hr.png").exists()
