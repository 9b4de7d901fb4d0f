"""`fedrec reproduce fedrap`: FedRAP's figures as transcribed, its plan, options reaching the runs,
convergence plots, and the CLI's default tables. Runs are faked: these tests check wiring only."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fedrec.cli import main
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig
from fedrec.reproduce import figure, load_figures, papers
from fedrec.reproduce.plots import convergence
from fedrec.reproduce.runner import (
    DP_SETTING,
    PlannedRun,
    execute,
    plan,
    privacy_notes,
    sparsity_notes,
)

DATASETS = ["tafeng", "ml-100k", "ml-1m", "amazon-video", "lastfm-2k", "qb-article"]
FEDRAP_TABLES = ["1", "3", "4", "5", "6", "ablation", "curriculum"]


def _fake_run(calls: list[RunConfig]):  # type: ignore[no-untyped-def]
    """Stands in for `fedrec.experiment.run`: records the config, writes a small results JSON."""

    def run(cfg: RunConfig, out: Path, **_: Any) -> None:
        calls.append(cfg)
        rounds = cfg.federated.rounds
        extra: dict[str, Any] = {}
        if cfg.algorithm.startswith("fedrap"):
            extra["sparsity_of_c"] = {"c_above_1e-1": 0.05, "c_above_1e-2": 0.7, "c_zero": 0.1}
        if cfg.federated.dp_noise > 0:
            extra["privacy"] = {"epsilon": 10.0 + cfg.seed, "delta": cfg.federated.dp_delta}
        result = {
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": asdict(cfg), "data": {"negatives": cfg.negatives},
            "history": [{"round": r, "valid": {"hr@10": 0.3 + r / 100, "ndcg@10": 0.1 + r / 100}}
                        for r in range(1, rounds + 1)],
            "test": {"hr@10": 0.5 + cfg.seed / 100, "ndcg@10": 0.3}, "extra": extra,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result))

    return run


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[RunConfig]:
    seen: list[RunConfig] = []
    monkeypatch.setattr("fedrec.experiment.run", _fake_run(seen))
    return seen


# -- the transcribed figures ------------------------------------------------------------------


def test_fedrap_figures_load_with_every_table_complete():
    figs = load_figures("fedrap")
    assert "fedrap" in papers()
    assert Counter(f.table for f in figs) == {
        "1": 24, "3": 42, "4": 42, "5": 8, "6": 8, "sparsity": 4}
    assert len({f.key for f in figs}) == len(figs)
    assert {f.dataset for f in figs} == set(DATASETS)
    assert {f.metric for f in figs if f.table == "3"} == {"hr@10"}
    assert {f.metric for f in figs if f.table == "4"} == {"ndcg@10"}
    assert {f.method for f in figs if f.table in ("3", "4")} == {
        "ncf", "lightgcn", "centrap", "fedmf", "fedncf", "pfedrec", "fedrap"}
    assert {f.setting for f in figs} == {"", DP_SETTING}
    assert all(0 < f.mean < 1 for f in figs)
    assert all((f.std is not None) == (f.table in ("3", "4")) for f in figs)


@pytest.mark.parametrize(("table", "method", "dataset", "metric", "setting", "mean", "std"), [
    ("1", "fedrap", "ml-100k", "hr@10", "", 0.9709, None),
    ("1", "fedrap", "tafeng", "ndcg@10", DP_SETTING, 0.9365, None),
    ("3", "fedrap", "ml-100k", "hr@10", "", 0.9709, 0.0056),
    ("3", "lightgcn", "qb-article", "hr@10", "", 0.6109, 0.0063),
    ("4", "lightgcn", "tafeng", "ndcg@10", "", 0.987, 0.0147),
    ("4", "fedncf", "lastfm-2k", "ndcg@10", "", 0.0999, 0.0064),
    ("5", "fedncf", "ml-100k", "hr@10", "", 0.6089, None),
    ("5", "fedncf", "ml-100k", "hr@10", DP_SETTING, 0.4348, None),
    ("6", "pfedrec", "ml-100k", "ndcg@10", DP_SETTING, 0.3549, None),
    ("sparsity", "fedrap", "ml-100k", "c_above_1e-2", "", 0.6736, None),
])
def test_spot_checked_figures(table, method, dataset, metric, setting, mean, std):
    f = figure("fedrap", table, method, dataset, metric, setting)
    assert f is not None and f.mean == pytest.approx(mean, abs=1e-9)
    assert f.std == (None if std is None else pytest.approx(std, abs=1e-9))


def test_repeated_figures_agree_and_degradations_match_the_printed_ones():
    """Table 1 repeats Tables 3/4 (but for QB-article NDCG, see README); 5/6 repeat 3/4 and 1."""
    printed = iter([4.09, 5.51, 3.55, 8.72, 1.54, 2.11, 9.93, 6.11, 2.62, 0.91, 7.00, 4.73])
    for d in DATASETS:
        for metric, other in (("hr@10", "3"), ("ndcg@10", "4")):
            plain, noisy, again = (figure("fedrap", t, "fedrap", d, metric, s)
                                   for t, s in (("1", ""), ("1", DP_SETTING), (other, "")))
            assert plain is not None and noisy is not None and again is not None
            assert round((plain.mean - noisy.mean) / plain.mean * 100, 2) == next(printed)
            assert again.mean == (noisy.mean if (d, metric) == ("qb-article", "ndcg@10")
                                  else plain.mean)
    for table, metric, other in (("5", "hr@10", "3"), ("6", "ndcg@10", "4")):
        for method in ("fedmf", "fedncf", "pfedrec", "fedrap"):
            without, with_dp, main_table = (figure("fedrap", t, method, "ml-100k", metric, s)
                                            for t, s in ((table, ""), (table, DP_SETTING),
                                                         (other, "")))
            assert without is not None and with_dp is not None and main_table is not None
            assert without.mean == main_table.mean > with_dp.mean  # the headers' swap undone
        t1 = figure("fedrap", "1", "fedrap", "ml-100k", metric, DP_SETTING)
        t5 = figure("fedrap", table, "fedrap", "ml-100k", metric, DP_SETTING)
        assert t1 is not None and t5 is not None and t1.mean == t5.mean


# -- the plan ---------------------------------------------------------------------------------


def test_fedrap_plan_has_the_papers_tables_and_runs():
    tables = plan("fedrap")
    assert list(tables) == FEDRAP_TABLES
    fedrap, dp = PlannedRun("fedrap", "fedrap"), tables["1"][1]
    assert tables["1"] == [fedrap, dp]
    assert (dp.setting, dict(dp.engine)) == (DP_SETTING, {"dp_clip": 0.1, "dp_noise": 1.0})
    assert [r.method for r in tables["3"]] == ["centrap", "fedmf", "fedncf", "pfedrec", "fedrap"]
    assert tables["4"] == tables["3"] and tables["6"] == tables["5"]
    assert [(r.method, r.setting) for r in tables["5"]] == [
        (m, s) for m in ("fedmf", "fedncf", "pfedrec", "fedrap") for s in ("", DP_SETTING)]
    assert [r.method for r in tables["ablation"]] == [
        "fedrap", "fedrap-c", "fedrap-d", "fedrap-no", "fedrap-l2", "pfedrec"]
    assert tables["curriculum"][0] == fedrap
    assert [(r.setting, dict(r.model)) for r in tables["curriculum"][1:]] == [
        (f"curriculum={c}", {"curriculum": c}) for c in ("fixed", "sin", "square", "frac")]
    for table in ("1", "3", "4", "5", "6"):  # every run of a printed table has a paper figure
        metric = "ndcg@10" if table in ("4", "6") else "hr@10"
        for r in tables[table]:
            assert figure("fedrap", table, r.method, "ml-100k", metric, r.setting) is not None
    with pytest.raises(FedrecError, match="ablation"):
        plan("fedrap", ["2"])


def test_runs_are_shared_by_equality_and_distinct_runs_get_distinct_files():
    every = [r for runs in plan("fedrap").values() for r in runs]
    pfedrec = {r for runs in plan("pfedrec").values() for r in runs}
    assert {r for r in every if r.method in ("fedmf", "fedncf", "pfedrec") and not r.setting} \
        <= pfedrec
    unique = set(every) | pfedrec
    names = {r.file_name("leak-free", 0) for r in unique}
    assert len(names) == len(unique)


def test_pfedrec_file_names_are_unchanged():
    names = [r.file_name("legacy-exclude-heldout", 3)
             for runs in plan("pfedrec").values() for r in runs]
    assert names[:4] == [f"{m}-loo-sampled-legacy-exclude-heldout-s3.json"
                         for m in ("fedmf", "fedncf", "fedrecon", "pfedrec")]
    assert "fedmf+dual-loo-sampled-legacy-exclude-heldout-s3.json" in names
    assert "pfedrec-ldp=0.3-loo-sampled-legacy-exclude-heldout-s3.json" in names
    assert "pfedrec-loo-full-legacy-exclude-heldout-s3.json" in names
    assert all(r.model == () and r.engine == () for runs in plan("pfedrec").values() for r in runs)


# -- execute ----------------------------------------------------------------------------------


def test_execute_passes_model_and_engine_options(calls, tmp_path):
    runs = [PlannedRun("fedrap", "fedrap", setting="curriculum=sin", model=(("curriculum", "sin"),)),
            PlannedRun("fedrap", "fedrap", setting=DP_SETTING,
                       engine=(("dp_clip", 0.1), ("dp_noise", 1.0))),
            PlannedRun("pfedrec", "pfedrec")]
    results = execute(runs, dataset="ml-100k", seeds=[0, 1], policies=["leak-free"], rounds=3,
                      out_dir=tmp_path)
    assert len(calls) == 6 and len(results) == 6
    sin, dp, plain = calls[0], calls[2], calls[4]
    assert sin.model == {"dim": 32, "curriculum": "sin"}
    assert sin.federated.dp_noise == 0 and sin.federated.local_epochs == 10  # fedrap's default
    assert (dp.federated.dp_clip, dp.federated.dp_noise, dp.federated.rounds) == (0.1, 1.0, 3)
    assert dp.model == {"dim": 32} and dp.federated.batch_size == 2048
    assert plain.federated.dp_clip is None and plain.model == {"dim": 32}
    assert (tmp_path / "ml-100k" / "fedrap-curriculum=sin-loo-sampled-leak-free-s1.json").exists()
    assert [(r["algorithm"], r["config"]["setting"]) for r in results[::2]] == [
        ("fedrap", "curriculum=sin"), ("fedrap", DP_SETTING), ("pfedrec", "")]
    execute(runs, dataset="ml-100k", seeds=[0, 1], policies=["leak-free"], rounds=3,
            out_dir=tmp_path)
    assert len(calls) == 6  # all reused

    assert privacy_notes(results) == [
        "privacy of fedrap dp=1 on ml-100k: epsilon = 10.5, delta = 1e-05 (mean over 2 run(s))"]
    assert sparsity_notes("fedrap", results) == []  # the paper has none for these settings
    plain_fedrap = execute([PlannedRun("fedrap", "fedrap")], dataset="ml-1m", seeds=[0],
                           policies=["leak-free"], rounds=1, out_dir=tmp_path)
    (line,) = sparsity_notes("fedrap", plain_fedrap)
    assert "5.00% of entries above 1e-1, 70.00% above 1e-2" in line
    assert "paper on ml-100k: 4.19%, 67.36%" in line


# -- plots ------------------------------------------------------------------------------------


def _history_result(algorithm: str, seed: int, values: list[float], negatives: str,
                    setting: str = "") -> dict[str, Any]:
    return {"algorithm": algorithm, "dataset": "ml-100k", "seed": seed,
            "config": {"setting": setting, "negatives": negatives},
            "history": [{"round": r, "valid": {"hr@10": v}} for r, v in enumerate(values, 1)]}


def test_convergence_writes_a_png(tmp_path):
    results = [_history_result("fedrap", 0, [0.3, 0.5, 0.6], "leak-free"),
               _history_result("fedrap", 1, [0.35, 0.55, 0.62], "leak-free"),
               _history_result("fedrap", 0, [0.4, 0.6, 0.7], "leak-free", "curriculum=sin"),
               _history_result("fedrap-c", 0, [0.2, 0.3, 0.3], "legacy-exclude-heldout")]
    path = convergence(results, "hr@10", tmp_path / "sub" / "hr.png", "test")
    assert path == tmp_path / "sub" / "hr.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with pytest.raises(FedrecError, match="ndcg@10"):
        convergence(results, "ndcg@10", tmp_path / "none.png", "test")


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("paper", "expected"), [
    ("fedrap", FEDRAP_TABLES), ("pfedrec", ["1", "2", "7", "8"])])
def test_cli_tables_default_to_the_papers_own(calls, tmp_path, paper, expected):
    md = tmp_path / "t.md"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", paper, "--rounds", "2", "--negatives", "legacy",
              "--out-dir", str(tmp_path / "runs"), "--markdown", str(md)])
    assert done.value.code == 0
    text = md.read_text()
    headings = [ln.split(" Table ")[1] for ln in text.splitlines() if ln.startswith("### ")]
    assert headings == expected
    plots = sorted(p.name for p in (tmp_path / "runs" / "plots").glob("*.png"))
    if paper == "fedrap":
        assert plots == [f"fedrap-{t}-{m}.png" for t in ("ablation", "curriculum")
                         for m in ("hr", "ndcg")]
        assert "privacy of fedrap dp=1 on ml-100k: epsilon = 10" in text
        assert "paper on ml-100k: 4.19%, 67.36%" in text
        assert "paper on ml-100k: 8.07%, 88.94%" in text  # fedrap-l2
        table5 = text.split("### fedrap Table 5")[1].split("###")[0]
        assert "NDCG" not in table5 and "| fedncf | ml-100k | dp=1 | 0.5000 | 0.4348 |" in table5
        ablation = text.split("### fedrap Table ablation")[1].split("###")[0]
        assert "| fedrap-c | ml-100k | 0.5000 | — |" in ablation
    else:
        assert plots == []


def test_cli_plots_only_for_requested_tables(calls, tmp_path):
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "fedrap", "--tables", "5,curriculum", "--rounds", "1",
              "--negatives", "leak-free", "--out-dir", str(tmp_path),
              "--plots", str(tmp_path / "figs")])
    assert done.value.code == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == [
        "fedrap-curriculum-hr.png", "fedrap-curriculum-ndcg.png"]
    assert {c.algorithm for c in calls} == {"fedmf", "fedncf", "pfedrec", "fedrap"}
