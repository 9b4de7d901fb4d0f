"""`fedrec reproduce`: plans share runs across tables, results are reused, labels match the paper's."""

from __future__ import annotations

import json

import pytest
import torch

from fedrec.cli import main
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.reproduce.papers import figure
from fedrec.reproduce.runner import PlannedRun, execute, plan


def test_pfedrec_plan_covers_the_papers_rows():
    tables = plan("pfedrec")
    assert set(tables) == {"1", "2", "7", "8"}
    for table, runs in tables.items():
        for r in runs:
            fig = figure("pfedrec", table, r.method, "ml-100k", "hr@10", r.setting)
            assert fig is not None, (table, r)
    assert {r.protocol for r in tables["8"]} == {"loo-full"}
    assert [r.ldp for r in tables["7"]] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    with pytest.raises(FedrecError):
        plan("pfedrec", ["3"])
    with pytest.raises(UnknownNameError):
        plan("nopaper")


def test_execute_runs_once_and_reuses(tmp_path):
    runs = [PlannedRun("pfedrec", "pfedrec"), PlannedRun("fedmf+dual", "fedmf", dual=True),
            PlannedRun("pfedrec", "pfedrec")]
    seen: list[bool] = []
    notes: list[tuple[str, int, int, str]] = []
    kw = dict(dataset="synthetic:120x400", seeds=[0], policies=["leak-free"], rounds=2,
              out_dir=tmp_path, on_run=lambda p, n, s, reused: seen.append(reused),
              on_progress=lambda p, n, s, note: notes.append((p.method, note.round, note.total, note.metric)))
    first = execute(runs, **kw)
    assert seen == [False, False] and len(first) == 2
    # every round of every run that ran, in order, on the protocol's selection metric
    assert notes == [(m, r, 2, "ndcg@10") for m in ("pfedrec", "fedmf+dual") for r in (1, 2)]
    assert {r["algorithm"] for r in first} == {"pfedrec", "fedmf+dual"}
    assert next(r for r in first if r["algorithm"] == "fedmf+dual")["config"]["model"]["dual"]
    again = execute(runs, **kw)
    assert seen[2:] == [True, True] and len(notes) == 4  # reused runs train no round
    assert [r["test"] for r in again] == [r["test"] for r in first]


def test_every_table_trains_its_rows_under_one_stopping_rule():
    """A table whose rows stop by different rules (one after 10 flat rounds, another never)
    compares budgets, not methods: every paper's every table gives its rows one rule."""
    from fedrec.experiment import federated_config
    from fedrec.reproduce.runner import PLANS, ROUNDS

    for paper in PLANS:
        for table, runs in plan(paper).items():
            rules = {federated_config(r.algorithm, None, r.protocol, rounds=ROUNDS.get(paper, 100),
                                      **dict(r.engine)).patience for r in runs}
            assert len(rules) == 1, (paper, table, rules)


def test_a_reused_file_made_with_other_settings_is_reported(tmp_path):
    """A result file is found by its name, which does not hold every setting: reusing one made
    under another stopping rule or round count is reported with what differs (and still used)."""
    stale: list[dict] = []
    kw = dict(dataset="synthetic:120x400", seeds=[0], policies=["leak-free"], out_dir=tmp_path,
              on_stale=lambda p, n, s, changes: stale.append(changes))
    execute([PlannedRun("pfedrec", "pfedrec")], rounds=2, **kw)
    execute([PlannedRun("pfedrec", "pfedrec")], rounds=2, **kw)
    assert stale == []  # the same plan: nothing to report
    again = execute([PlannedRun("pfedrec", "pfedrec", engine=(("patience", 3),))], rounds=5, **kw)
    assert stale == [{"federated.patience": (0, 3), "federated.rounds": (2, 5)}]
    assert len(again) == 1 and again[0]["config"]["federated"]["rounds"] == 2


def test_a_reused_file_made_under_a_default_since_changed_is_reported(tmp_path):
    """A plan sets few model options; the file records every one as it resolved then, so a
    default changed since (here the file edited as if made when ``dim`` defaulted to one more)
    is reported, as a changed engine option is."""
    stale: list[dict] = []
    kw = dict(dataset="synthetic:120x400", seeds=[0], policies=["leak-free"], rounds=2, out_dir=tmp_path,
              on_stale=lambda p, n, s, changes: stale.append(changes))
    execute([PlannedRun("fedmf", "fedmf")], **kw)
    (path,) = tmp_path.rglob("*.json")
    blob = json.loads(path.read_text())
    dim = blob["config"]["model"]["dim"]
    blob["config"]["model"]["dim"] = dim + 1
    path.write_text(json.dumps(blob))
    execute([PlannedRun("fedmf", "fedmf")], **kw)
    assert stale == [{"model.dim": (dim + 1, dim)}]


def test_patience_replaces_every_runs_stopping_rule(tmp_path):
    """--patience N trains every run of the plan under N (a sensitivity check of a table's rule);
    its files, named as the table's, are then told apart from them when reused."""
    stale: list[dict] = []
    kw = dict(dataset="synthetic:120x400", seeds=[0], policies=["leak-free"], rounds=2, out_dir=tmp_path,
              on_stale=lambda p, n, s, changes: stale.append(changes))
    (made,) = execute([PlannedRun("pfedrec", "pfedrec")], patience=3, **kw)
    assert made["config"]["federated"]["patience"] == 3
    execute([PlannedRun("pfedrec", "pfedrec")], **kw)
    assert stale == [{"federated.patience": (3, 0)}]


def test_execute_with_workers_gives_the_figures_of_one_process(tmp_path):
    """``workers`` > 1 runs the missing runs in spawned one-thread processes: the same files and
    figures as in turn, each run reported once as it ends, a failed one reported and skipped."""
    runs = [PlannedRun("pfedrec", "pfedrec"), PlannedRun("fedmf", "fedmf")]
    kw = dict(dataset="synthetic:120x400", seeds=[0, 1], policies=["leak-free"], rounds=1)
    alone = execute(runs, out_dir=tmp_path / "alone", **kw)
    seen: list[tuple[str, int, bool]] = []
    failed: list[str] = []
    events: list[tuple[str, int, str]] = []
    pooled = execute([*runs, PlannedRun("bad", "fedmf", engine=(("lr", -1.0),))], out_dir=tmp_path / "pooled",
                     workers=2, on_run=lambda p, n, s, reused: (seen.append((p.method, s, reused)),
                                                                events.append((p.method, s, "ended"))),
                     on_fail=lambda p, n, s, why: failed.append(f"{p.method} s{s}: {why}"),
                     on_progress=lambda p, n, s, note: events.append((p.method, s, f"round {note.round}/{note.total}")),
                     **kw)
    assert sorted(seen) == sorted((m, s, False) for m in ("pfedrec", "fedmf") for s in (0, 1))
    # the workers' rounds reach this process, each before its run is reported ended
    for m in ("pfedrec", "fedmf"):
        for s in (0, 1):
            mine = [e for e in events if e[:2] == (m, s)]
            assert mine == [(m, s, "round 1/1"), (m, s, "ended")]
    assert len(failed) == 2 and all(f.startswith("bad s") for f in failed)
    assert [(r["algorithm"], r["seed"], r["test"]) for r in pooled] == \
        [(r["algorithm"], r["seed"], r["test"]) for r in alone]
    again: list[bool] = []
    execute(runs, out_dir=tmp_path / "pooled", workers=2, on_run=lambda p, n, s, reused: again.append(reused), **kw)
    assert again == [True] * 4


def test_cli_reproduce_prints_ours_beside_the_paper(tmp_path, capsys):
    md = tmp_path / "t.md"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "pfedrec", "--tables", "7", "--dataset", "synthetic:120x400",
              "--rounds", "1", "--negatives", "legacy", "--out-dir", str(tmp_path),
              "--markdown", str(md)])
    assert done.value.code == 0
    text = md.read_text()
    assert "ldp=0.3" in text and "legacy" in text
    # not a terminal: a log line for each run as it ends, after its rounds' lines
    log = capsys.readouterr().out
    assert "run 1/6 ended: pfedrec ldp=0 loo-sampled legacy-exclude-heldout s0" in log, log
    assert log.index("pfedrec ldp=0 loo-sampled legacy-exclude-heldout s0: round 1/1") < log.index("run 1/6 ended")
    with pytest.raises(SystemExit) as bad:
        main(["reproduce", "pfedrec", "--seeds", "a,b", "--out-dir", str(tmp_path)])
    assert bad.value.code == 2 and "--seeds" in capsys.readouterr().err


def test_legacy_split_runs_the_official_setting_whole_and_shows_apart(tmp_path):
    """``--negatives legacy-split``: leaky negatives on the split of repeated events with pandas'
    tie-break, stored and shown apart from the ``legacy`` column (negatives alone)."""
    from fedrec.reproduce.table import summarise

    kw = dict(dataset="synthetic:120x400", seeds=[0], rounds=1, out_dir=tmp_path)
    split, legacy = (execute([PlannedRun("fedmf", "fedmf")], policies=[p], **kw)
                     for p in ("legacy-split", "legacy-exclude-heldout"))
    config = split[0]["config"]
    assert (config["negatives"], config["repeats"], config["tie_break"]) == \
        ("legacy-exclude-heldout", True, "earlier-row-later")
    assert not legacy[0]["config"].get("repeats")
    assert (tmp_path / "synthetic:120x400" / "fedmf-loo-sampled-legacy-split-s0.json").exists()
    assert {k[3] for k in summarise(split + legacy)} == {"legacy-split", "legacy-exclude-heldout"}


def test_settings_pick_one_cell_of_a_sweep():
    from fedrec.reproduce.runner import only_methods, only_settings

    table2 = plan("gfedpp", ["2"])
    one = only_settings(table2, ["ratio=1,alpha=0.9"])
    assert [(r.method, r.setting) for r in one["2"]] == [("gfedpp", "ratio=1,alpha=0.9")]
    # "default": the rows without a setting (GFed-PP's own alpha, 0.5, and every baseline)
    plain = only_settings(only_methods(table2, ["gfedpp"]), ["default", "ratio=1,alpha=0.1"])
    assert sorted(r.setting for r in plain["2"]) == ["", "ratio=1,alpha=0.1"]
    with pytest.raises(FedrecError, match="no row with setting alpha=0.9 .*official-graph"):
        only_settings(table2, ["alpha=0.9"])
    with pytest.raises(FedrecError, match="no settings given; settings: clip=5; default; official-graph"):
        only_settings(table2, [])  # --settings ";": an error, not every table cut away
    with pytest.raises(FedrecError, match="no rows given"):
        only_methods(table2, [])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_execute_trains_on_the_device_asked_for(tmp_path, device):
    """``device`` reaches every run's config, federated and centralised alike, and a CUDA run
    ends with the CPU run's figures (GPFedRec's threshold aside, fedrec's rule for devices)."""
    runs = [PlannedRun("pfedrec", "pfedrec"), PlannedRun("mf", "mf")]
    kw = dict(dataset="synthetic:120x400", seeds=[0], policies=["leak-free"], rounds=2)
    on_device = execute(runs, out_dir=tmp_path / device, device=device, **kw)
    # a result keeps the engine's options (federated) or the trainer's (centralised)
    assert [(r["algorithm"], (r["config"].get("federated") or r["config"]["train"])["device"])
            for r in on_device] == [("pfedrec", device), ("mf", device)]
    if device != "cpu":
        on_cpu = execute(runs, out_dir=tmp_path / "cpu", **kw)
        for mine, cpu in zip(on_device, on_cpu, strict=True):
            assert mine["test"] == pytest.approx(cpu["test"], abs=1e-4)


def test_cli_reproduce_refuses_a_device_it_cannot_use(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "pfedrec", "--tables", "7", "-d", "synthetic:120x400", "--rounds", "1",
              "--device", "tpu", "--out-dir", str(tmp_path)])
    assert done.value.code != 0 and "--device tpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "attacks", "--device", "cuda:0", "--out-dir", str(tmp_path)])
    assert done.value.code != 0 and "CPU only" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "says"), [
    (["nosuch"], "unknown paper 'nosuch'; known: attacks, fedcia, fedrap, gfedpp, personalfr, pfedrec"),
    (["pfedrec", "--rounds", "0"], "--rounds must be >= 1 (got 0)"),
    (["pfedrec", "--tables", ","], "--tables ',' selects nothing"),
    (["pfedrec", "--methods", ""], "--methods '' selects nothing"),
    (["pfedrec", "--seeds", ","], "--seeds ',' names no seed"),
    (["pfedrec", "--seeds", "-1"], "--seed must be a whole number in [0, 2^64)"),
    (["pfedrec", "-d", "nope"], "unknown data set 'nope'"),
    (["attacks", "-d", "ml-1m"], "fedrec reproduce attacks does not take --dataset"),
    (["attacks", "--tables", "1", "--workers", "2"], "does not take --tables, --workers"),
    (["pfedrec", "--tables", "7", "-d", "synthetic:120x400", "--reuse-only"], "no result of these runs is in"),
])
def test_a_reproduction_that_would_do_nothing_or_the_wrong_thing_is_one_line(tmp_path, capsys, args, says):
    """Refused before any run, with no folder left behind; a selection of nothing, or --rounds 0
    (once read as "the default"), is not an empty table or 100 rounds with exit 0."""
    out = tmp_path / "rep"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", *args, "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and says in err, err
    assert not out.exists()


def test_a_reproduction_whose_every_run_failed_exits_non_zero(tmp_path, capsys, monkeypatch):
    """Every run failing (here: its data cannot be read) ends in one error line and exit 2,
    naming the first failure; the out-dir it made is not left behind empty."""
    from fedrec import experiment

    def unreadable(run):  # type: ignore[no-untyped-def]
        raise FedrecError("data unreadable")

    monkeypatch.setattr(experiment, "prepare_split", unreadable)
    out = tmp_path / "rep"
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "pfedrec", "--tables", "7", "-d", "synthetic:120x400", "--rounds", "1",
              "--negatives", "leak-free", "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "no run finished (6 of 6 failed; first: data unreadable)" in err, err
    assert not out.exists()


def test_a_reused_run_read_from_other_events_is_set_aside_and_run_again(tmp_path, monkeypatch, capsys):
    """A run's file is found by its name, which does not say where the data set's copy lives: a
    run of other events (one rating edited) is left out by --reuse-only (nothing renamed), set
    aside (kept under its digest) and run again otherwise; the first events back, their run is
    given back; a copy in another format or none at hand keeps it."""
    from tiny_ml100k import write_atomic, write_u_data

    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))  # nothing to fall back on
    data, out = tmp_path / "data", tmp_path / "out"

    def reproduce(*extra: str, code: int = 0) -> str:
        with pytest.raises(SystemExit) as done:
            main(["reproduce", "pfedrec", "--tables", "1", "--methods", "fedmf", "--negatives", "leak-free",
                  "--rounds", "1", "--data-dir", str(data), "--out-dir", str(out), *extra])
        assert (done.value.code or 0) == code
        return " ".join(capsys.readouterr().out.split())

    u_data = write_u_data(data)
    reproduce()
    (path,) = out.rglob("*.json")
    first = json.loads(path.read_text())
    digest = first["data"]["source"]["content"][:12]
    aside = path.with_name(f"{path.stem}.other-data-{digest}.json")
    write_u_data(data, edited=True)
    said = reproduce("--reuse-only", code=2)  # the only run left out: no table to print
    assert f"left out {path.name}: its run read other events of ml-100k (content {digest})" in said
    assert json.loads(path.read_text()) == first and not aside.exists()  # --reuse-only renames nothing
    said = reproduce()
    assert f"set aside {path.name}: its run read other events of ml-100k (content {digest})" in said
    assert said.count("set aside") == 1 and "run again" in said and json.loads(aside.read_text()) == first
    edited = json.loads(path.read_text())
    assert edited["data"]["source"]["content"][:12] != digest
    assert "set aside" not in reproduce()  # the edited copy's own run: reused
    write_u_data(data)  # the first events back
    said = reproduce()
    assert "the run of the copy at hand given back" in said and "run again" not in said
    assert json.loads(path.read_text()) == first and not aside.exists()
    u_data.unlink()  # the same events in RecBole's atomic file: reused
    write_atomic(data)
    assert "set aside" not in reproduce() and json.loads(path.read_text()) == first
    (data / "ml-100k.inter").unlink()  # no copy at hand: not checked, still reused
    assert "set aside" not in reproduce("--reuse-only") and json.loads(path.read_text()) == first
