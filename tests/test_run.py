"""End-to-end runs: MF/NCF learn, selection uses validation only, results JSON, CLI errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.experiment import RunConfig, run
from fedrec.train.centralised import TrainConfig

SYN = "synthetic:400x1000"


def _cfg(algo: str = "mf", **train) -> RunConfig:  # type: ignore[no-untyped-def]
    t = TrainConfig(epochs=train.pop("epochs", 6), batch_size=512, lr=5e-3, patience=0, **train)
    return RunConfig(algorithm=algo, dataset=SYN, protocol="loo-sampled", seed=0, train=t)


@pytest.mark.parametrize("algo", ["mf", "ncf"])
def test_model_learns_well_above_chance(algo, tmp_path):
    res = run(_cfg(algo), out=tmp_path / "r.json")
    assert res.test["hr@10"] > 0.3  # chance is 0.10
    assert res.history[-1].loss < res.history[0].loss
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["test"] == res.test
    assert saved["best_round"] == res.best_round
    assert {"history", "config", "wall_seconds", "peak_memory_mb", "fedrec_version", "git_revision",
            "protocol", "seed", "select", "valid_at_best"} <= set(saved)
    assert saved["history"][0]["valid"]["ndcg@10"] >= 0


def test_best_round_is_chosen_by_validation(tmp_path):
    res = run(_cfg(epochs=5))
    valid = [r.valid["ndcg@10"] for r in res.history]
    assert res.best_round == int(np.argmax(valid)) + 1
    assert res.valid_at_best["ndcg@10"] == max(valid)


def test_same_seed_same_figures():
    a, b = run(_cfg(epochs=3)), run(_cfg(epochs=3))
    assert a.test == b.test
    assert [r.loss for r in a.history] == [r.loss for r in b.history]


def test_rating_protocol_reports_rmse():
    cfg = _cfg(epochs=4)
    cfg.protocol = "ratio-rating"
    res = run(cfg)
    assert set(res.test) == {"rmse", "users"}
    assert 0 < res.test["rmse"] < 2.0  # synthetic ratings 1-5; predicting the mean gives ~1.2


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"algorithm": "nope"}, UnknownNameError),
        ({"protocol": "loo-magic"}, UnknownNameError),
        ({"negatives": "leaky"}, FedrecError),
        ({"dataset": "no-such-data"}, UnknownNameError),
    ],
)
def test_bad_options_raise_clear_errors(change, error, tmp_path):
    cfg = _cfg()
    for k, v in change.items():
        setattr(cfg, k, v)
    out = tmp_path / "r.json"
    with pytest.raises(error):
        run(cfg, out=out)
    assert not out.exists()


def test_cli_run_and_errors(tmp_path, capsys):
    out = tmp_path / "cli.json"
    with pytest.raises(SystemExit) as done:
        main(["run", "mf", "--dataset", SYN, "--epochs", "2", "--batch-size", "512", "--out", str(out), "-q"])
    assert done.value.code == 0
    assert json.loads(out.read_text())["algorithm"] == "mf"
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    for argv, needle in [
        (["run", "mf", "--dataset", SYN, "--epochs", "0", "--out", str(bad)], "--epochs"),
        (["run", "nosuchalgo", "--dataset", SYN, "--out", str(bad)], "unknown algorithm 'nosuchalgo'"),
        (["run", "mf", "--dataset", SYN, "--protocol", "x", "--out", str(bad)], "unknown protocol 'x'"),
    ]:
        with pytest.raises(SystemExit) as failed:
            main(argv)
        assert failed.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
    assert not bad.exists()


def test_cli_audit_protocol(capsys):
    with pytest.raises(SystemExit) as done:
        main(["audit-protocol", "--dataset", SYN, "--rounds", "30"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "legacy-exclude-heldout" in out and "exclude-candidates" in out


def test_legacy_repeats_keep_a_repeated_event_as_the_test_item(tmp_path):
    """``--legacy-repeats`` splits the file's rows as they are: user 0's last event repeats an
    earlier one, so its test item also trains; by default the pair is one row and never both."""
    from fedrec.experiment import prepare_split

    rows = [(u, u * 10 + k, 1, k + 1) for u in range(12) for k in range(10)]
    rows.append((0, 3, 1, 11))  # user 0 tags item 3 again, last of all
    path = tmp_path / "events.csv"
    path.write_text("user,item,rating,ts\n" + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows))
    for repeats in (True, False):
        split = prepare_split(RunConfig(algorithm="fedmf", dataset=str(path), columns="user,item,rating,ts",
                                        repeats=repeats))
        target = int(split.test.candidates[np.searchsorted(split.test.users, 0), 0])
        assert split.data.item_ids[target] == 3
        trains = target in split.train.indices[split.train.indptr[0]: split.train.indptr[1]]
        assert trains == repeats
    with pytest.raises(FedrecError, match="loo-sampled"):
        prepare_split(RunConfig(algorithm="fedmf", dataset=str(path), columns="user,item,rating,ts",
                                protocol="loo-full", repeats=True))


def test_further_cutoffs_add_figures_and_change_nothing_else(tmp_path):
    """`--ks` adds each ranking metric at further cut-offs; the model is still chosen at the
    protocol's own, so the run and its figures at 10 are the run without them."""
    from dataclasses import asdict, replace

    plain = run(_cfg(epochs=3))
    cfg = replace(_cfg(epochs=3), ks=[20, 5, 20])  # as a results file records them
    assert cfg.ks == (5, 20)
    more = run(cfg, out=tmp_path / "r.json")
    assert set(more.test) == {"users", "hr@5", "ndcg@5", "hr@10", "ndcg@10", "hr@20", "ndcg@20"}
    assert {k: more.test[k] for k in plain.test} == plain.test
    assert [r.loss for r in more.history] == [r.loss for r in plain.history]
    assert more.best_round == plain.best_round
    assert more.test["hr@5"] <= more.test["hr@10"] <= more.test["hr@20"]
    assert json.loads((tmp_path / "r.json").read_text())["config"]["ks"] == [5, 20]
    # without further cut-offs a run's identity (cache keys, checkpoints) is what it was before them
    assert "ks" not in RunConfig.identity(asdict(_cfg())) and "ks" in RunConfig.identity(asdict(cfg))


def test_further_cutoffs_are_refused_where_they_mean_nothing(tmp_path, capsys):
    from fedrec.protocols.protocol import get_protocol, parse_cutoffs, with_cutoffs

    assert parse_cutoffs("20, 5,20") == (5, 20)
    assert with_cutoffs(get_protocol("loo-full"), (50,)).ks == (10, 50)
    assert with_cutoffs(get_protocol("loo-sampled"), (99,)).ks == (10, 99)
    bad = tmp_path / "bad.json"
    for ks, needle in [("0", "whole numbers from 1"), ("5,x", "not '5,x'"), ("", "not ''"), ("\u00b2", "not '\u00b2'"),
                       ("9" * 30, "whole numbers from 1 to 1,000,000"),
                       ("100", "ranked among 100 items, so a top 100 holds every one")]:
        with pytest.raises(SystemExit) as failed:
            main(["run", "mf", "--dataset", SYN, "--ks", ks, "--out", str(bad), "-q"])
        assert failed.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
    with pytest.raises(SystemExit) as failed:
        main(["run", "mf", "--dataset", SYN, "--protocol", "ratio-rating", "--ks", "20", "--out", str(bad), "-q"])
    assert failed.value.code == 2 and "scores predicted ratings" in capsys.readouterr().err
    assert not bad.exists()
    # under full ranking, a top K of every item is refused with the data, before training
    with pytest.raises(SystemExit) as failed:
        main(["run", "mf", "--dataset", SYN, "-p", "loo-full", "--ks", "1000", "--out", str(bad), "-q"])
    assert failed.value.code == 2 and "has 921 items, so a top 1000 holds every candidate" in capsys.readouterr().err
    assert not bad.exists()
    for ks in ((0,), (True,), ("20",), ([20],)):
        with pytest.raises(FedrecError, match="whole numbers from 1"):
            run(RunConfig(algorithm="mf", dataset=SYN, ks=ks))
    # numpy's integers count; the protocol's own cut-off is the run without further ones
    assert RunConfig(algorithm="mf", ks=[np.int64(20), 10]).ks == (20,)
    assert RunConfig(algorithm="mf", ks=(10,)).ks == ()
