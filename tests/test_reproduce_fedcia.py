"""`fedrec reproduce fedcia`: the transcribed figures and the plan behind them (wiring only)."""

from __future__ import annotations

from fedrec.algorithms import get_algorithm
from fedrec.reproduce import figure, load_figures
from fedrec.reproduce.runner import FEDCIA_DIM, plan


def test_fedcia_figures_are_complete_and_spot_checked() -> None:
    figures = load_figures("fedcia")
    assert len(figures) == 2 * 11 * 3 + 8 * 3
    assert figure("fedcia", "1", "fedcia-mf", "ml-100k", "ndcg@10").mean == 0.6766
    assert figure("fedcia", "1", "fedmf", "ml-1m", "f1@10").mean == 0.1106
    assert figure("fedcia", "3", "mlp-cia", "ml-100k", "mrr@10", "per-user").mean == 0.5887


def test_fedcia_plan_has_a_run_for_every_ml100k_row() -> None:
    chosen = plan("fedcia")
    planned = {(r.method, r.setting) for runs in chosen.values() for r in runs}
    rows = {(f.method, f.setting) for f in load_figures("fedcia") if f.dataset == "ml-100k"}
    # graph-guided aggregation exists with GPFedRec's MLP score only, not with an MF backbone
    assert rows - planned == {("mf-gga", "per-user")}
    for runs in chosen.values():
        for r in runs:
            assert r.protocol == "ratio-full"
            spec = get_algorithm(r.algorithm)
            model = dict(r.model)
            if r.algorithm == "stacked":  # options the stacked runner accepts, at fedcia's size
                assert model["dim"] == FEDCIA_DIM and model["aggregation"] in ("none", "waa", "cia")
            assert spec.kind == "federated"
    per_user = [r for r in chosen["3"] if r.algorithm == "stacked"]
    assert all(dict(r.model)["clients"] == 0 for r in per_user)


def test_every_row_of_fedcias_tables_stops_by_the_papers_rule() -> None:
    """FedCIA's protocol stops every method after 10 evaluations without a better validation
    F1@10; PFedRec and GPFedRec, whose own default is no early stopping, get it too, so that no
    row trains on for longer than the others (on both data sets the tables run on)."""
    from fedrec.experiment import federated_config

    for dataset in ("ml-100k", "ml-1m-fedcia"):
        for runs in plan("fedcia", None, dataset).values():
            for r in runs:
                cfg = federated_config(r.algorithm, dataset, r.protocol, rounds=100, **dict(r.engine))
                assert cfg.patience == 10, (r.method, r.setting, dataset)
    assert get_algorithm("pfedrec").engine.get("patience", 0) == 0  # the rule comes from the plan


def test_cli_prints_the_papers_metrics_for_our_runs(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Our F1@10 and MRR@10 appear beside the paper's (not only the default HR/NDCG)."""
    import json
    from dataclasses import asdict

    import pytest

    from fedrec.cli import main

    def fake_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        test = {"f1@10": 0.1234, "mrr@10": 0.4321, "ndcg@10": 0.2222, "users": 5.0}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": asdict(cfg), "data": {"negatives": cfg.negatives},
            "history": [], "valid_at_best": {"f1@10": 0.1}, "test": test, "extra": {}}))

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    md = tmp_path / "fedcia.md"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "fedcia", "--tables", "1", "--rounds", "1", "--negatives", "leak-free",
              "--out-dir", str(tmp_path / "runs"), "--markdown", str(md)])
    assert done.value.code == 0, capsys.readouterr().out
    row = next(line for line in md.read_text().splitlines() if line.startswith("| fedcia-mf "))
    assert "0.1234" in row and "0.4321" in row and "0.2326" in row  # ours F1, ours MRR, paper F1


def test_cli_says_when_a_reused_file_was_made_under_another_rule(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A PFedRec file made before the table's stopping rule reached PFedRec's row (patience 0)
    is reused with a line saying so and how to run it again; the others say nothing."""
    import json
    from dataclasses import asdict

    import pytest

    from fedrec.cli import main

    def fake_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": asdict(cfg), "data": {"negatives": cfg.negatives},
            "history": [], "valid_at_best": {"f1@10": 0.1}, "test": {"f1@10": 0.1}, "extra": {}}))

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    args = ["reproduce", "fedcia", "--tables", "1", "--methods", "pfedrec,fedmf", "--rounds", "1",
            "--negatives", "leak-free", "--out-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        main(args)
    path = tmp_path / "ml-100k" / "pfedrec-ratio-full-leak-free-s0.json"
    made = json.loads(path.read_text())
    made["config"]["federated"]["patience"] = 0
    path.write_text(json.dumps(made))
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main([*args, "--reuse-only"])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    assert "reused pfedrec ratio-full leak-free s0 was made with patience 0 (the plan now: 10)" in out
    assert "delete its file to run it again" in out and "reused fedmf" not in out


def test_reuse_only_runs_nothing_and_plot_only_tables_show_protocol_metrics(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--reuse-only prints from the results present (runs nothing); a table the paper shows
    only as a plot (the heterogeneous clients) reports its protocol's metrics (F1, MRR, NDCG)."""
    import json

    import pytest

    from fedrec.cli import main
    from fedrec.reproduce.runner import plan

    def no_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        raise AssertionError(f"ran {cfg.algorithm} under --reuse-only")

    monkeypatch.setattr("fedrec.experiment.run", no_run)
    mixed = next(r for r in plan("fedcia", ["hetero"])["hetero"] if r.method == "mixed-cia")
    done = tmp_path / "runs" / "ml-100k" / mixed.file_name("leak-free", 0)
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({
        "algorithm": "stacked", "dataset": "ml-100k", "protocol": "ratio-full", "seed": 0,
        "config": {}, "data": {"negatives": "train-only"}, "history": [], "valid_at_best": {},
        "test": {"f1@10": 0.1887, "mrr@10": 0.4945, "ndcg@10": 0.2881, "precision@10": 0.2}, "extra": {}}))
    md = tmp_path / "h.md"
    with pytest.raises(SystemExit) as end:
        main(["reproduce", "fedcia", "--tables", "hetero", "--negatives", "leak-free", "--reuse-only",
              "--out-dir", str(tmp_path / "runs"), "--markdown", str(md)])
    assert end.value.code == 0, capsys.readouterr().out
    text = md.read_text()
    assert "F1@10" in text and "MRR@10" in text and "PRECISION" not in text
    row = next(line for line in text.splitlines() if line.startswith("| mixed-cia "))
    assert "0.1887" in row and "0.2881" in row


def test_on_fedcias_own_ml1m_split_runs_keep_the_published_split_and_betas() -> None:
    """On ``ml-1m-fedcia`` the runs take ``given-full`` (the split FedCIA published, not a
    re-split) and GF-CF runs the official ML-1M beta; other data sets are untouched."""
    from fedrec.reproduce.runner import GIVEN_SPLITS

    on_ml1m = plan("fedcia", ["1"], "ml-1m-fedcia")["1"]
    assert [r.method for r in on_ml1m] == [r.method for r in plan("fedcia", ["1"])["1"]]
    assert {r.protocol for r in on_ml1m} == {"given-full"}
    betas = {r.method: dict(r.model).get("beta") for r in on_ml1m}
    assert betas["fedcia-gfcf"] == betas["gfcf-im"] == GIVEN_SPLITS[("fedcia", "ml-1m-fedcia")][1]["gfcf"]["beta"]
    assert betas["fedcia-mf"] is None and betas["pfedrec"] is None
    assert plan("fedcia", ["1"], "ml-100k") == plan("fedcia", ["1"])


def test_methods_cuts_the_tables_to_the_named_rows(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--methods runs and shows only the rows named; a name no table has is one clear error."""
    import pytest

    from fedrec.cli import main
    from fedrec.errors import FedrecError
    from fedrec.reproduce.runner import only_methods

    ran: list[tuple[str, str]] = []

    def fake_run(cfg, out, checkpoint=None, resume=False, **_):  # type: ignore[no-untyped-def]
        ran.append((dict(cfg.model).get("aggregation", cfg.algorithm), cfg.protocol))
        # --checkpoint-every: each run saves itself beside its result file
        assert cfg.federated.checkpoint_every == 3 and checkpoint == out.with_suffix(".ckpt") and not resume
        raise FedrecError("not run in this test")

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "fedcia", "--tables", "1,3", "--methods", "fedcia-gfcf,pfedrec",
              "--negatives", "leak-free", "--out-dir", str(tmp_path / "runs"), "--checkpoint-every", "3"])
    assert sorted(ran) == [("cia", "ratio-full"), ("pfedrec", "ratio-full")]  # table 3 has neither
    printed = capsys.readouterr()  # not a terminal: one line per run, for a log file
    # every run failed: the reproduction says so and fails, not an empty table and exit 0
    assert done.value.code == 2 and "no run finished (2 of 2 failed; first: not run in this test)" in printed.err
    printed = printed.out
    assert "failed pfedrec ratio-full leak-free s0: not run in this test" in printed
    assert "failed fedcia-gfcf" in printed
    with pytest.raises(FedrecError, match="no row named gfcf-cia"):
        only_methods(plan("fedcia", ["1"]), ["gfcf-cia"])


def test_leaderboard_ranks_a_tables_rows_with_paired_tests_over_seeds(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--leaderboard writes a table's runs as bench leaderboards: one row per planned method,
    ranked by the protocol's selection metric, with the seeds paired against the best row."""
    import csv
    import json
    from dataclasses import asdict

    import pytest

    from fedrec.cli import main

    def fake_run(cfg, out, **_):  # type: ignore[no-untyped-def]
        model = dict(cfg.model)
        bonus = {"cia": 0.05, "waa": 0.02}.get(model.get("aggregation", ""), 0.0)  # pfedrec: 0
        noise = (cfg.seed * 5 + ord(model.get("aggregation", "p")[0])) % 3  # differs by seed and row
        f1 = 0.10 + bonus + 0.01 * cfg.seed + 0.003 * noise
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "algorithm": cfg.algorithm, "dataset": cfg.dataset, "protocol": cfg.protocol,
            "seed": cfg.seed, "config": asdict(cfg), "data": {"negatives": cfg.negatives},
            "select": "f1@10", "history": [], "valid_at_best": {"f1@10": f1},
            "test": {"f1@10": f1, "ndcg@10": 2 * f1, "users": 5.0}, "extra": {}}))

    monkeypatch.setattr("fedrec.experiment.run", fake_run)
    boards = tmp_path / "boards"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "fedcia", "--tables", "1", "--methods", "fedmf,fedcia-mf,pfedrec",
              "--rounds", "1", "--negatives", "leak-free", "--seeds", "0,1,2",
              "--out-dir", str(tmp_path / "runs"), "--leaderboard", str(boards)])
    assert done.value.code == 0, capsys.readouterr().out
    folder = boards / "fedcia-table-1"
    stem = "leaderboard-ml-100k-ratio-full"
    assert {p.suffix for p in folder.glob(f"{stem}.*")} == {".md", ".csv", ".tex", ".png"}
    rows = list(csv.DictReader((folder / f"{stem}.csv").open()))
    assert [r["method"] for r in rows] == ["fedcia-mf", "fedmf", "pfedrec"]
    assert all(r["seeds"] == "3" for r in rows)
    assert float(rows[0]["f1@10"]) == pytest.approx(0.163)  # mean of 0.15, 0.166, 0.173
    assert rows[0]["t-test p"] == "" and 0 < float(rows[2]["t-test p"]) < 0.05
    assert "| 1 | fedcia-mf | 3 |" in (folder / f"{stem}.md").read_text()
