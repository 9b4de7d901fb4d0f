"""`fedrec tune`: Optuna on the validation split only; its config makes `fedrec run` repeat the
best trial."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fedrec.algorithms import get_algorithm
from fedrec.cli import main
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, prepare_split
from fedrec.tune import read_config, search_space, tune, validation_only

DATA = "synthetic:80x300"


def _cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        main(args)
    return int(done.value.code or 0)


def test_the_tuned_config_makes_run_repeat_the_best_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "pfedrec.json"
    assert _cli(["tune", "pfedrec", "-d", DATA, "--trials", "3", "--rounds", "2", "-o", str(config)]) == 0
    assert "trial 0: round 2/2  loss" in capsys.readouterr().out  # each trial logs its rounds
    blob = read_config(config)
    assert blob["tuning"]["trials"] == 3 and blob["tuning"]["test_read"] is False
    assert {"torch", "threads", "cpu", "date"} <= set(blob["tuning"]["environment"])  # where it ran
    states = [h["state"] for h in blob["tuning"]["history"]]
    assert [blob["tuning"][k] for k in ("completed", "pruned")] == [states.count("complete"), states.count("pruned")]
    split = validation_only(prepare_split(RunConfig("pfedrec", dataset=DATA)))
    space = {p.name: p for p in search_space(get_algorithm("pfedrec"), split, DATA)}
    assert set(blob["engine"]) == {"rounds", "aggregation", "patience", "backoffs", *space}  # as its trials ran
    assert (blob["engine"]["aggregation"], blob["engine"]["patience"], blob["engine"]["backoffs"]) == ("samples", 30, 3)
    for name, value in blob["engine"].items():
        if name in space:
            assert space[name].low <= value <= space[name].high
    out = tmp_path / "run.json"
    assert _cli(["run", "pfedrec", "-d", DATA, "--config", str(config), "-o", str(out), "-q"]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["federated"]["lr"] == blob["engine"]["lr"]
    assert result["valid_at_best"]["ndcg@10"] == pytest.approx(blob["tuning"]["best_valid"], rel=1e-12)


def test_tuning_never_scores_the_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedrec.eval.evaluate as ev

    real = prepare_split(RunConfig("fedmf", dataset=DATA))
    scored = []
    original = ev.evaluate

    def spy(scores, data, protocol, **kw):  # type: ignore[no-untyped-def]
        scored.append(data)
        return original(scores, data, protocol, **kw)

    monkeypatch.setattr(ev, "evaluate", spy)
    tune("fedmf", DATA, trials=2, rounds=2)
    assert scored
    for data in scored:
        if len(data.users):  # every set with users is the validation set
            assert (data.targets != real.valid.targets).nnz == 0
            assert (data.candidates == real.valid.candidates).all()
    assert any(len(data.users) == 0 for data in scored)  # the driver's test call found nothing


@pytest.mark.parametrize(("alg", "option"), [("fedprox", "mu"), ("fedadam", "server_lr"),
                                             ("fedyogi", "server_lr"), ("fedavgm", "server_lr")])
def test_the_hooks_settings_are_searched_as_model_options(alg: str, option: str) -> None:
    """A client objective's weight and a server optimiser's step are tuned beside the rates, from
    the algorithm's own default, and a trial's value builds the algorithm."""
    split = prepare_split(RunConfig(alg, dataset=DATA))
    space = {p.name: p for p in search_space(get_algorithm(alg), split, DATA)}
    param = space[option]
    assert param.where == "model" and param.low < param.default < param.high
    assert {"lr", "item_lr_scale", "local_epochs"} <= set(space)
    spec = get_algorithm(alg).build(split, {option: param.high})
    part = spec.objective if alg == "fedprox" else spec.server
    assert getattr(part, "mu" if alg == "fedprox" else "lr") == param.high


def test_search_spaces_follow_what_each_algorithm_reads() -> None:
    split = prepare_split(RunConfig("fedrap", dataset=DATA))
    rap = {p.name: p for p in search_space(get_algorithm("fedrap"), split, DATA)}
    assert {"lr", "item_lr_scale", "local_epochs", "lam", "mu"} <= set(rap)
    assert rap["lam"].where == "model" and rap["local_epochs"].integer and rap["local_epochs"].high >= 10
    # FedRAP declares its rates' range (a decade each side of its defaults), as engine options
    assert (rap["lr"].where, rap["lr"].low, rap["lr"].high) == ("engine", 0.1, 10.0)
    assert rap["item_lr_scale"].where == "engine" and rap["item_lr_scale"].high == 100.0
    assert "mu" not in {p.name for p in search_space(get_algorithm("fedrap-no"), split, DATA)}
    assert {"d_rate", "lam"}.isdisjoint(p.name for p in search_space(get_algorithm("fedrap-c"), split, DATA))
    assert rap["d_rate"].where == "model"
    assert [p.name for p in search_space(get_algorithm("mf"), split, DATA)] == ["lr"]
    cia = {p.name for p in search_space(get_algorithm("fedcia-mf"), split, DATA)}
    assert "item_lr_scale" not in cia  # FedCIA does not read it
    lr = federated_config("pfedrec", "lastfm-2k").lr  # the space centres on the data set's setting
    pf = {p.name: p for p in search_space(get_algorithm("pfedrec"), split, "lastfm-2k")}
    assert pf["lr"].low == pytest.approx(lr / 10) and pf["lr"].high == pytest.approx(lr * 10)


def test_a_config_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(FedrecError, match="not a fedrec run config"):
        read_config(bad)
    other = tmp_path / "mf.json"
    other.write_text(json.dumps({"fedrec_config": 1, "algorithm": "mf", "engine": {"lr": 0.01}, "model": {}}))
    assert _cli(["run", "pfedrec", "-d", DATA, "--config", str(other), "-q", "-o", str(tmp_path / "r.json")]) == 2
    assert "tuned for mf, not pfedrec" in capsys.readouterr().err
    # a config written before fedrec's own item-row rule ran its trials under the papers' rule
    # with a fixed budget, and is read so; a centralised one has neither
    old = tmp_path / "fedmf.json"
    old.write_text(json.dumps({"fedrec_config": 1, "algorithm": "fedmf", "engine": {"lr": 0.02}, "model": {}}))
    assert read_config(old)["engine"] == {"aggregation": "clients", "patience": 0, "backoffs": 0, "lr": 0.02}
    # and one for ratings fitted the plain score (no rating baseline)
    rated = tmp_path / "rated.json"
    rated.write_text(json.dumps({"fedrec_config": 1, "algorithm": "fedmf", "protocol": "given-rating",
                                 "engine": {"lr": 0.02}, "model": {}}))
    assert read_config(rated)["engine"]["rating_baseline"] == "none"
    assert read_config(other)["engine"] == {"lr": 0.01}
    out = tmp_path / "old.json"
    assert _cli(["run", "fedmf", "-d", DATA, "--config", str(old), "--rounds", "1", "-q", "-o", str(out)]) == 0
    ran = json.loads(out.read_text())["config"]["federated"]
    assert (ran["aggregation"], ran["patience"], ran["backoffs"], ran["lr"], ran["item_lr_scale"]) == (
        "clients", 0, 0, 0.02, None)
    # `fedrec run --config` reads the rating baseline such a config carries where the run scores
    # ratings (fedrec's default there is user-item), and leaves it where the run ranks items
    # (which has none to set, and is no error)
    for protocol, baseline in (("ratio-rating", "none"), ("loo-full", "none")):
        assert _cli(["run", "fedmf", "-d", DATA, "-p", protocol, "--config", str(rated), "--rounds", "1", "-q",
                     "--overwrite", "-o", str(out)]) == 0, capsys.readouterr().err
        assert json.loads(out.read_text())["config"]["federated"]["rating_baseline"] == baseline


def test_a_search_whose_trials_all_fail_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PFedRec's scores are not ratings: every trial is refused, and so is the search."""
    with pytest.raises(FedrecError, match="no trial of pfedrec completed"):
        tune("pfedrec", DATA, trials=2, rounds=1, protocol="ratio-rating")
    out = tmp_path / "c.json"
    assert _cli(["tune", "pfedrec", "-d", DATA, "--trials", "1", "--rounds", "1", "-p", "ratio-rating",
                 "-o", str(out)]) == 2
    printed = capsys.readouterr()
    assert "cannot be evaluated under protocol" in printed.err and not out.exists()
    assert "trial 0: failed ('pfedrec' cannot be evaluated" in printed.out and "[lr " in printed.out


def test_a_rating_search_centres_on_the_rating_settings_and_never_scores_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedMF on ratings: the space is a decade around its rating settings, the trials minimise
    validation RMSE, and the empty test stage is not scored (it holds no rating to give an RMSE of)."""

    split = validation_only(prepare_split(RunConfig("fedmf", dataset=DATA, protocol="ratio-rating")))
    space = {p.name: p for p in search_space(get_algorithm("fedmf"), split, DATA)}
    assert space["lr"].low == pytest.approx(0.003) and space["item_lr_scale"].high == pytest.approx(10.0)
    result = tune("fedmf", DATA, trials=2, rounds=2, protocol="ratio-rating")
    assert result.metric == "rmse" and result.completed == 2 and 0 < result.best_valid < 5
    assert result.best_valid == min(h["best_valid"] for h in result.history)
    assert result.config()["negatives"] == "leak-free" and result.config()["engine"]["rounds"] == 2
    # the config records the rating model its trials fitted, so later defaults cannot move it
    assert result.config()["engine"]["rating_baseline"] == "user-item"


@pytest.mark.parametrize("workers", [1, 2])
def test_settings_refused_before_training_are_redrawn_not_counted(workers: int, tmp_path: Path) -> None:
    """GPFedRec refuses an item rate whose pull overshoots before it trains a round: such a
    setting is scored as the worst and redrawn, so the budget is trials that train, one at a
    time or side by side."""
    result = tune("gpfedrec", DATA, trials=3, rounds=1, workers=workers,
                  journal=tmp_path / "g.journal" if workers > 1 else None)
    refused = [h for h in result.history if h["state"] == "refused"]
    assert result.trials == 3 and result.refused == len(refused) > 0
    assert len(result.history) == 3 + len(refused)
    n_items, dim = 300, 32

    def kappa(h: dict) -> float:  # the pull's step as a share of its distance (reg 1)
        return h["engine"]["lr"] * h["engine"]["item_lr_scale"] * 2.0 / (n_items * dim)

    assert all(kappa(h) >= 1 for h in refused) and all(kappa(h) < 1 for h in result.history if h not in refused)
    assert result.config()["tuning"]["refused"] == len(refused)


def test_a_search_that_only_draws_refused_settings_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedrec.tune as tuning
    from fedrec.errors import UnstableSetting

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise UnstableSetting("overshoots")

    monkeypatch.setattr(tuning, "train", refuse)
    with pytest.raises(FedrecError, match=r"no trial of fedmf completed on .* \(overshoots\)"):
        tune("fedmf", DATA, trials=2, rounds=1)


def test_from_defaults_makes_the_first_trial_the_algorithms_own_settings() -> None:
    """`--from-defaults`: trial 0 is the algorithm's settings (one of the budget's trials), so
    the best trial is never below them on validation."""
    split = validation_only(prepare_split(RunConfig("fedmf", dataset=DATA)))
    space = search_space(get_algorithm("fedmf"), split, DATA)
    engine = dataclasses.asdict(federated_config("fedmf", DATA, "loo-sampled"))
    result = tune("fedmf", DATA, trials=2, rounds=2, from_defaults=True)
    first = result.history[0]["engine"]
    assert first == pytest.approx({"lr": engine["lr"], "local_epochs": engine["local_epochs"],
                                   "item_lr_scale": engine["item_lr_scale"] or split.n_items * 80.0})
    assert {p.name for p in space} == set(first) and len(result.history) == 2
    assert result.best_valid >= result.history[0]["best_valid"]
    assert result.config()["tuning"]["from_defaults"] is True
    assert tune("fedmf", DATA, trials=1, rounds=1).config()["tuning"]["from_defaults"] is False


def test_a_killed_search_goes_on_from_its_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search killed in its third trial, run again with the same journal, keeps its two
    finished trials (not trained again), runs the cut-off trial again with the same settings,
    and draws new settings for the rest (a reseeded sampler, not the first draws again)."""
    import fedrec.tune as tuning

    journal = tmp_path / "fedmf.journal"
    real_train, calls = tuning.train, []

    def killed_in_third(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0].federated)
        if len(calls) == 3:
            raise SystemExit(9)  # leaves the trial running, as a SIGKILL would
        return real_train(*args, **kwargs)

    monkeypatch.setattr(tuning, "train", killed_in_third)
    with pytest.raises(SystemExit):
        tune("fedmf", DATA, trials=5, rounds=2, journal=journal)
    cut_off = calls[2]
    calls.clear()
    monkeypatch.setattr(tuning, "train", lambda *a, **k: (calls.append(a[0].federated), real_train(*a, **k))[1])
    result = tune("fedmf", DATA, trials=5, rounds=2, journal=journal)
    assert len(calls) == 3 and calls[0] == cut_off  # trials 0 and 1 not trained again
    assert result.trials == 5 and [h["trial"] for h in result.history] == [0, 1, 3, 4, 5]
    settings = [tuple(sorted(h["engine"].items())) for h in result.history]
    assert len(set(settings)) == 5
    uninterrupted = tune("fedmf", DATA, trials=2, rounds=2)
    assert [h["engine"] for h in uninterrupted.history] == [h["engine"] for h in result.history[:2]]
    with pytest.raises(FedrecError, match="holds another search"):
        tune("fedmf", DATA, trials=5, rounds=3, journal=journal)


def test_a_journal_is_not_continued_on_a_data_file_edited_since(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A search's journal holds its base run as it resolves and its data file's sha256: killed,
    then run again after the file was edited, it is refused with what differs (its finished
    trials ran on the old data); on the unedited file it goes on."""
    import numpy as np

    import fedrec.tune as tuning

    rng = np.random.default_rng(0)
    data = tmp_path / "events.csv"
    rows = [f"u{u},i{i}" for u in range(40) for i in sorted(rng.choice(120, 12, replace=False))]
    data.write_text("user,item\n" + "\n".join(rows) + "\n")
    journal = tmp_path / "fedmf.journal"
    real_train, calls = tuning.train, []

    def killed_in_second(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise SystemExit(9)
        return real_train(*args, **kwargs)

    kw = dict(trials=3, rounds=1, journal=journal, columns="user,item", protocol="loo-full")
    monkeypatch.setattr(tuning, "train", killed_in_second)
    with pytest.raises(SystemExit):
        tune("fedmf", str(data), **kw)
    monkeypatch.setattr(tuning, "train", real_train)
    original = data.read_text()
    data.write_text(original.replace("u0,", "u1,", 1))
    with pytest.raises(FedrecError, match=r"holds another search: base\.data_sha256"):
        tune("fedmf", str(data), **kw)
    data.write_text(original)
    assert tune("fedmf", str(data), **kw).trials == 3


def test_a_search_identity_from_before_it_held_its_base_run_is_compared_without_it() -> None:
    """A journal or config written before search identities held ``base`` is compared on the
    rest (a killed search of an older fedrec goes on); every other difference is named."""
    from fedrec.tune import search_changes

    now = {"algorithm": "fedmf", "rounds": 2, "base": {"model": {"dim": 32}, "federated": {"patience": 30}}}
    assert search_changes({"algorithm": "fedmf", "rounds": 2}, now) == []
    assert search_changes({"algorithm": "fedmf", "rounds": 3}, now) == ["rounds (then 3, now 2)"]
    then = {"algorithm": "fedmf", "rounds": 2, "base": {"model": {"dim": 32}, "federated": {"patience": 10}}}
    assert search_changes(then, now) == ["base.federated.patience (then 10, now 30)"]


def test_a_cut_off_trial_goes_on_from_its_last_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``checkpoint_every``, a search killed in round 5 of its third trial, run again, goes on
    with that trial from its round-4 save (rounds 1-4 are not trained again), re-reports the saved
    rounds to the pruner (which reads the trial's best figure so far), and the trial ends as in a
    search never killed: the same state, best figure, best round and per-round figures in the
    journal. Its save is removed once it ends; a save needs a journal."""
    import optuna

    import fedrec.tune as tuning

    def per_round(journal: Path) -> list[dict[int, float]]:
        study = optuna.load_study(study_name=tuning.STUDY, storage=tuning._journal_storage(journal))
        return [t.intermediate_values for t in study.trials]

    uncut = tune("fedmf", DATA, trials=4, rounds=6, journal=tmp_path / "uncut.journal")
    assert uncut.history[2]["state"] == "complete"  # trains all six rounds: the kill in round 5 cuts it
    journal, calls, trained = tmp_path / "fedmf.journal", [], []
    real_train, kill = tuning.train, True

    def killed_in_round_5_of_the_third(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        trial, report = len(calls) - 1, kwargs["on_round"]

        def watch(record, *rest):  # type: ignore[no-untyped-def]
            trained.append(record.round)
            if kill and trial == 2 and record.round == 5:
                raise SystemExit(9)  # as a SIGKILL would: the trial stays running, its save stays
            report(record, *rest)
        return real_train(*args, **{**kwargs, "on_round": watch})

    monkeypatch.setattr(tuning, "train", killed_in_round_5_of_the_third)
    with pytest.raises(SystemExit):
        tune("fedmf", DATA, trials=4, rounds=6, journal=journal, checkpoint_every=2)
    saves = tuning.trial_checkpoints(journal)
    assert sorted(p.name for p in saves.iterdir()) == ["trial-2.ckpt"]
    kill = False
    trained.clear()
    with pytest.raises(FedrecError, match="beside the search's journal"):
        tune("fedmf", DATA, trials=4, rounds=6, checkpoint_every=2)
    result = tune("fedmf", DATA, trials=4, rounds=6, journal=journal, checkpoint_every=2)
    assert trained[:2] == [5, 6]  # the cut-off trial went on from its save
    again = result.history[2]
    assert again["trial"] == 3 and again["resumes"] == 2 and again["resumed_at"] == 4
    assert {k: again[k] for k in ("state", "best_valid", "best_round", "engine")} == \
        {k: uncut.history[2][k] for k in ("state", "best_valid", "best_round", "engine")}
    assert per_round(journal)[3] == per_round(tmp_path / "uncut.journal")[2]
    assert list(saves.iterdir()) == []


def test_the_cli_keeps_a_journal_until_the_config_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedrec.tune as tuning

    config = tmp_path / "fedmf.json"
    real_train, calls = tuning.train, []

    def interrupted_in_second(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C: Optuna fails the trial
        return real_train(*args, **kwargs)

    monkeypatch.setattr(tuning, "train", interrupted_in_second)
    assert _cli(["tune", "fedmf", "-d", DATA, "--trials", "2", "--rounds", "1", "-o", str(config)]) == 130  # Ctrl-C
    assert (tmp_path / "fedmf.journal").exists() and not config.exists()
    assert _cli(["tune", "fedmf", "-d", DATA, "--trials", "2", "--rounds", "1", "-o", str(config),
                 "--checkpoint-every", "1"]) == 0
    assert len(calls) == 3 and read_config(config)["tuning"]["trials"] == 2
    assert not (tmp_path / "fedmf.journal").exists() and not (tmp_path / "fedmf.trials").exists()


def test_set_holds_a_model_option_in_every_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`fedrec tune --set clip=5`: every trial trains with the option, the config carries it
    (so `fedrec run --config` repeats it), and a bad, unknown or searched option is refused
    before any trial."""
    import fedrec.tune as tuning

    real_train, trained = tuning.train, []
    monkeypatch.setattr(tuning, "train", lambda *a, **k: (trained.append(dict(a[0].model)), real_train(*a, **k))[1])
    config = tmp_path / "metamf.json"
    assert _cli(["tune", "metamf", "-d", DATA, "--trials", "2", "--rounds", "1", "--set", "clip=5",
                 "-o", str(config)]) == 0
    assert trained == [{"clip": 5.0}, {"clip": 5.0}]
    blob = read_config(config)
    assert blob["model"] == {"clip": 5.0} and all(h["model"] == {"clip": 5.0} for h in blob["tuning"]["history"])
    out = tmp_path / "run.json"
    assert _cli(["run", "metamf", "-d", DATA, "--config", str(config), "-o", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["config"]["model"]["clip"] == 5.0
    trained.clear()
    for bad, said in ((["clip=-1"], "clip must be >= 0"), (["nonsense=1"], "unknown option nonsense")):
        assert _cli(["tune", "metamf", "-d", DATA, "--trials", "1", "--rounds", "1",
                     *[x for s in bad for x in ("--set", s)], "-o", str(tmp_path / "x.json")]) == 2
        assert said in capsys.readouterr().err
    with pytest.raises(FedrecError, match="--set lam: fedrap's search draws it"):
        tune("fedrap", DATA, trials=1, rounds=1, fixed={"lam": 0.1})
    assert trained == []  # refused before any trial
    journal = tmp_path / "m.journal"
    tune("metamf", DATA, trials=1, rounds=1, journal=journal, fixed={"clip": 5.0})
    with pytest.raises(FedrecError, match="holds another search"):  # the held options are the search's
        tune("metamf", DATA, trials=1, rounds=1, journal=journal, fixed={"clip": 1.0})


def test_trials_in_parallel_draw_the_one_at_a_time_searchs_settings(tmp_path: Path) -> None:
    """`--workers 3`: each trial trains in its own process, yet while fewer than ten trials have
    ended the settings drawn are the sequential search's, trial by trial, and a trial that trains
    to the end in both scores the same; the pruner, which sees fewer finished trials, may let
    more through."""
    sequential = tune("fedmf", DATA, trials=5, rounds=3, from_defaults=True)
    parallel = tune("fedmf", DATA, trials=5, rounds=3, from_defaults=True, journal=tmp_path / "p.journal",
                    workers=3, checkpoint_every=1)  # saving each round changes no figure
    assert [h["trial"] for h in parallel.history] == [0, 1, 2, 3, 4]
    assert [h["engine"] for h in parallel.history] == [h["engine"] for h in sequential.history]
    both = [(a, b) for a, b in zip(sequential.history, parallel.history, strict=True)
            if a["state"] == b["state"] == "complete"]
    assert len(both) >= 3
    assert all(a["best_valid"] == b["best_valid"] and a["best_round"] == b["best_round"] for a, b in both)
    assert parallel.pruned <= sequential.pruned
    assert parallel.environment["workers"] == "3" and parallel.environment["device"] == "cpu"
    assert list((tmp_path / "p.trials").iterdir()) == []  # each trial's save, removed as it ended
    with pytest.raises(FedrecError, match="through a journal"):
        tune("fedmf", DATA, trials=2, rounds=1, workers=2)


def test_a_killed_parallel_search_trains_every_cut_off_trial_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill leaves every trial the workers were training "running" in the journal: the search
    run again trains each of them with its settings before it draws new ones."""
    import optuna

    import fedrec.tune as tuning

    journal = tmp_path / "fedmf.journal"
    tune("fedmf", DATA, trials=1, rounds=1, journal=journal)
    study = optuna.load_study(study_name=tuning.STUDY, storage=tuning._journal_storage(journal))
    split = validation_only(prepare_split(RunConfig("fedmf", dataset=DATA)))
    space = search_space(get_algorithm("fedmf"), split, DATA)
    cut: list[dict[str, float]] = []
    for _ in range(2):  # two trials asked, as `_parallel` asks them, and never told
        trial = study.ask()
        cut.append({p.name: trial.suggest_float(p.name, p.low, p.high, log=p.log) if not p.integer
                    else trial.suggest_int(p.name, int(p.low), int(p.high)) for p in space})
    real_train, trained = tuning.train, []
    monkeypatch.setattr(tuning, "train", lambda *a, **k: (trained.append(a[0].federated), real_train(*a, **k))[1])
    result = tune("fedmf", DATA, trials=4, rounds=1, journal=journal)
    assert len(trained) == 3 and result.trials == 4
    for settings, cfg in zip(cut, trained[:2], strict=True):
        assert {k: getattr(cfg, k) for k in settings} == settings
    assert [h["trial"] for h in result.history] == [0, 3, 4, 5]


@pytest.mark.parametrize(("change", "says"), [
    ({"engine": [1, 2]}, "'engine' must be an object of options, not [1, 2]"),
    ({"model": "dim=4"}, "'model' must be an object of options, not 'dim=4'"),
    ({"engine": {"rounds": "abc"}}, "engine.rounds must be int, not 'abc'"),
    ({"engine": {"rounds": 1.5}}, "engine.rounds must be int, not 1.5"),
    ({"engine": {"rounds": True}}, "engine.rounds must be int, not True"),
    ({"engine": {"lr": "fast"}}, "engine.lr must be a number, not 'fast'"),
    ({"engine": {"aggregation": 3}}, "engine.aggregation must be str, not 3"),
    ({"model": {"dim": {"a": 4}}}, "model.dim must be a number, text, true/false or a list of them, not {'a': 4}"),
], ids=lambda v: json.dumps(v)[:40] if isinstance(v, dict) else None)
def test_a_configs_wrongly_typed_option_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    change: dict, says: str) -> None:
    config = tmp_path / "c.json"
    blob = {"fedrec_config": 2, "algorithm": "fedmf", "engine": {"rounds": 1, "lr": 0.1}, "model": {}}
    config.write_text(json.dumps({**blob, **change}))
    assert _cli(["run", "fedmf", "-d", DATA, "--config", str(config), "-q", "-o", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert f"--config {config}: {says}" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


def test_a_file_that_is_not_text_given_as_a_config_is_one_line(tmp_path: Path) -> None:
    """A run saved with --save (binary) is an easy mistake for a config."""
    config = tmp_path / "r.run"
    config.write_bytes(b"PK\x03\x04\xff\xfe binary")
    with pytest.raises(FedrecError, match="not a readable fedrec config"):
        read_config(config)


def test_a_tuned_config_with_a_list_option_or_a_null_rate_is_read(tmp_path: Path) -> None:
    """What `fedrec tune` writes passes its own reader: a typed --set option (layers=64,32) is a
    list, an item rate left to the algorithm is null."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"fedrec_config": 2, "algorithm": "fedca-ncf", "engine": {"lr_item": None},
                                  "model": {"layers": [64, 32]}}))
    assert read_config(config)["model"] == {"layers": [64, 32]}


def test_tune_keeps_an_existing_out_and_refuses_a_journal_that_is_not_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("mine\n")
    args = ["tune", "fedmf", "-d", DATA, "--trials", "1", "--rounds", "1"]
    assert _cli([*args, "-o", str(kept)]) == 2
    assert "exists" in capsys.readouterr().err and kept.read_text() == "mine\n"
    garbage = tmp_path / "g.journal"
    garbage.write_text("not json\n")
    assert _cli([*args, "-o", str(tmp_path / "new.json"), "--journal", str(garbage)]) == 2
    assert f"--journal {garbage}: not a journal of a search" in capsys.readouterr().err
    assert not (tmp_path / "new.json").exists()


def test_the_command_line_overrides_a_configs_model_options(tmp_path: Path) -> None:
    """A --config's model options sit under the command line's: its own flag (--dim) or --set
    replaces the config's value, neither is refused as given twice; a list option is passed
    as the list it is."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"fedrec_config": 2, "algorithm": "fedmf", "engine": {"rounds": 1},
                                  "model": {"dim": 8}}))
    for extra, dim in (([], 8), (["--dim", "16"], 16), (["--set", "dim=4"], 4)):
        out = tmp_path / f"r{dim}.json"
        assert _cli(["run", "fedmf", "-d", DATA, "--config", str(config), "-o", str(out), "-q", *extra]) == 0
        assert json.loads(out.read_text())["config"]["model"]["dim"] == dim
    config.write_text(json.dumps({"fedrec_config": 2, "algorithm": "fedca-ncf", "engine": {"rounds": 1},
                                  "model": {"layers": [16, 8]}}))
    out = tmp_path / "ncf.json"
    assert _cli(["run", "fedca-ncf", "-d", DATA, "--config", str(config), "-o", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["config"]["model"]["layers"] == [16, 8]
