"""Federated runs end to end: learning, resume after a crash, client sampling, uploads, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.core.plan import sample_clients
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, run, run_resumable
from fedrec.federated.engine import FederatedConfig, chunk_bounds

SYN = "synthetic:150x400"


def _cfg(algo: str = "fedmf", **fed) -> RunConfig:  # type: ignore[no-untyped-def]
    f = FederatedConfig(**{"rounds": 4, "batch_size": 64, **fed})
    return RunConfig(algorithm=algo, dataset=SYN, protocol="loo-sampled", seed=0, federated=f,
                     model={"dim": 8})


class Crash(Exception):
    pass


@pytest.mark.parametrize("algo", ["fedmf", "pfedrec", "fedncf", "fedrecon"])
def test_resume_after_a_crash_gives_the_uninterrupted_result(algo, tmp_path):
    whole = run(_cfg(algo, rounds=5))

    def crash_after_3(record, best_round, best_valid):  # type: ignore[no-untyped-def]
        if record.round == 3:
            raise Crash

    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(Crash):
        run(_cfg(algo, rounds=5, checkpoint_every=1), checkpoint=ckpt, on_round=crash_after_3)
    assert ckpt.exists()
    resumed = run(_cfg(algo, rounds=5, checkpoint_every=1), checkpoint=ckpt, resume=True)
    assert [h.round for h in resumed.history] == [1, 2, 3, 4, 5]
    assert resumed.test == whole.test
    assert resumed.best_round == whole.best_round
    assert [h.loss for h in resumed.history] == pytest.approx([h.loss for h in whole.history])


@pytest.mark.parametrize("algo", ["fedmf", "mf"])
def test_a_file_kept_run_goes_on_from_the_checkpoint_a_kill_left(algo, tmp_path):
    """`run_resumable` (bench cells, reproduce runs): a killed attempt's checkpoint is picked up
    by the next attempt, which ends as an uninterrupted run and removes the checkpoint."""
    def cfg():  # type: ignore[no-untyped-def]
        if algo == "mf":  # centralised: epochs, not rounds
            from fedrec.train.centralised import TrainConfig
            return RunConfig(algorithm="mf", dataset=SYN, protocol="loo-sampled", seed=0, model={"dim": 8},
                             train=TrainConfig(epochs=5, batch_size=64))
        return _cfg(algo, rounds=5)

    whole = run(cfg())
    out = tmp_path / "cell.json"

    def crash_after_3(record, best_round, best_valid):  # type: ignore[no-untyped-def]
        if record.round == 3:
            raise Crash

    import fedrec.experiment as experiment
    real = experiment.run
    with pytest.MonkeyPatch.context() as mp:  # the first attempt is killed after round 3
        mp.setattr(experiment, "run", lambda *a, **k: real(*a, **{**k, "on_round": crash_after_3}))
        with pytest.raises(Crash):
            run_resumable(cfg(), out, 2)
    assert out.with_suffix(".ckpt").exists() and not out.exists()
    resumed = run_resumable(cfg(), out, 2)
    assert resumed.resumed_at == [2]
    assert [h.round for h in resumed.history] == [h.round for h in whole.history]
    assert resumed.test == whole.test
    assert not out.with_suffix(".ckpt").exists() and json.loads(out.read_text())["test"] == whole.test
    assert run_resumable(cfg(), tmp_path / "plain.json", 0).test == whole.test  # 0: no checkpoint
    assert not (tmp_path / "plain.ckpt").exists()


def test_pfedrec_learns_and_counts_bytes():
    res = run(_cfg("pfedrec", rounds=6))
    assert res.test["hr@10"] > 0.2  # chance is 0.10
    assert all(h.bytes_up > 0 and h.bytes_down > 0 for h in res.history)
    dense = run(_cfg("pfedrec", rounds=1, ldp=0.1))
    # an LDP upload is the whole table; row uploads are only the touched rows
    assert dense.history[0].bytes_up > res.history[0].bytes_up


def test_ldp_noise_changes_results():
    a, b = run(_cfg(rounds=2)), run(_cfg(rounds=2, ldp=5.0))
    assert a.test != b.test


def test_client_sampling():
    rng = np.random.default_rng(0)
    assert len(sample_clients(100, 1.0, rng)) == 100
    assert len(sample_clients(100, 0.1, rng)) == 10
    assert len(sample_clients(100, 25, rng)) == 25
    picked = sample_clients(100, 0.5, np.random.default_rng(3))
    assert len(np.unique(picked)) == 50
    assert np.array_equal(picked, sample_clients(100, 0.5, np.random.default_rng(3)))


def test_chunk_bounds_respect_budget():
    samples = np.array([50, 40, 30, 20, 10])
    bounds = chunk_bounds(samples, bytes_per_sample=2**20, budget_mb=60)
    assert bounds[0] == (0, 1) and bounds[-1][1] == 5
    assert all(b > a for a, b in bounds)
    assert chunk_bounds(samples, 1.0, 1e6) == [(0, 5)]


def test_partial_participation_runs():
    res = run(_cfg(rounds=3, clients_per_round=0.3))
    assert res.history[0].bytes_up < run(_cfg(rounds=1)).history[0].bytes_up


def test_bad_federated_options():
    with pytest.raises(FedrecError, match="--ldp"):
        run(_cfg(ldp=-1.0))
    with pytest.raises(FedrecError, match="--rounds"):
        run(_cfg(rounds=0))
    with pytest.raises(FedrecError, match="--device tpu"):
        run(_cfg(device="tpu"))


def test_cli_federated_run_and_resume(tmp_path, capsys):
    out = tmp_path / "f.json"
    argv = ["run", "pfedrec", "--dataset", SYN, "--rounds", "2", "--dim", "8", "--out", str(out),
            "-q", "--checkpoint-every", "1"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    first = json.loads(out.read_text())
    assert first["config"]["federated"]["rounds"] == 2 and "train" not in first["config"]
    with pytest.raises(SystemExit) as again:
        main([*argv, "--resume"])
    assert again.value.code == 0
    assert json.loads(out.read_text())["test"] == first["test"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        main(["run", "mf", "--dataset", SYN, "--dual", "--out", str(tmp_path / "x.json")])
    assert bad.value.code == 2 and "--dual" in capsys.readouterr().err


def test_ldp_noise_is_finite_laplace():
    import torch

    from fedrec.rounds.upload import UploadPath

    noise = UploadPath(ldp=0.5).noise_sum(1, (1000, 1000), torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(noise).all())
    assert float(noise.abs().mean()) == pytest.approx(0.5, rel=0.01)  # E|X| = b
    assert float(noise.var()) == pytest.approx(0.5, rel=0.02)  # Var X = 2 b^2


def test_algorithm_engine_defaults_reach_the_run():
    def cfg(algo, **options):  # type: ignore[no-untyped-def]
        return RunConfig(algorithm=algo, dataset=SYN, federated=federated_config(algo, rounds=1, **options),
                         model={"dim": 8})

    ncf = run(cfg("fedncf"))
    assert ncf.config["federated"]["item_lr_scale"] == 60.0  # item rows at 30, as every method of the family
    assert ncf.config["federated"]["lr"] == 0.5
    assert run(cfg("fedncf", paper=True)).config["federated"]["item_lr_scale"] == 20000.0
    assert "item_lr_scale" not in ncf.config["model"]
    mf = run(cfg("fedmf"))
    assert mf.config["federated"]["item_lr_scale"] == 300.0 and mf.config["federated"]["aggregation"] == "samples"
    assert mf.config["federated"]["patience"] == 30
    paper = run(cfg("fedmf", paper=True))
    assert paper.config["federated"]["item_lr_scale"] is None  # the official n_items x 80 rule
    assert (paper.config["federated"]["aggregation"], paper.config["federated"]["patience"]) == ("clients", 0)
    explicit = run(cfg("fedncf", item_lr_scale=3.0, lr=None))
    assert explicit.config["federated"]["item_lr_scale"] == 3.0
    assert explicit.config["federated"]["lr"] == 0.5  # None means "not given"
    rap = federated_config("fedrap", batch_size=None)
    assert (rap.local_epochs, rap.batch_size, rap.encoding) == (10, 2048, "sparse")
    with pytest.raises(FedrecError, match="unknown engine option"):
        federated_config("fedmf", rouds=3)


def test_resume_refuses_changed_options(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    run(_cfg(rounds=2, checkpoint_every=1), checkpoint=ckpt)
    with pytest.raises(FedrecError, match="lr"):
        run(_cfg(rounds=4, checkpoint_every=1, lr=0.3), checkpoint=ckpt, resume=True)
    longer = run(_cfg(rounds=4, checkpoint_every=1), checkpoint=ckpt, resume=True)
    assert [h.round for h in longer.history] == [1, 2, 3, 4]


def test_chunk_budget_follows_the_device_unless_given() -> None:
    from fedrec.federated.engine import CPU_BUDGET_MB, CUDA_BUDGET_MB

    assert FederatedConfig().chunk_budget_mb() == CPU_BUDGET_MB
    assert FederatedConfig(device="cuda:0").chunk_budget_mb() == CUDA_BUDGET_MB > CPU_BUDGET_MB
    assert FederatedConfig(device="cuda", memory_budget_mb=8.0).chunk_budget_mb() == 8.0
    with pytest.raises(FedrecError, match="memory-budget-mb must be > 0"):
        FederatedConfig(memory_budget_mb=0.0).validate()


def test_a_papers_settings_follow_the_data_set_and_fedrecs_defaults_do_not(capsys) -> None:
    """PFedRec's Table 4: under the paper's setting the learning rate per data set, with the
    papers' item-row rule and a fixed budget; a user's option still wins. fedrec's defaults take
    one setting everywhere, and the algorithms whose defaults were not measured elsewhere say
    so."""
    from fedrec.algorithms import get_algorithm

    assert federated_config("pfedrec", "lastfm-2k", paper=True).lr == 0.05
    assert federated_config("pfedrec", "amazon-video", paper=True).lr == 0.01
    assert federated_config("fedmf", "lastfm-2k", paper=True).lr == 0.05
    assert federated_config("fedmf", "ml-1m", paper=True).lr == 0.1
    assert federated_config("pfedrec", "lastfm-2k", paper=True, lr=0.3).lr == 0.3
    assert federated_config("pfedrec", "ciao", paper=True).lr == federated_config("pfedrec").lr == 0.1
    for dataset in ("lastfm-2k", "amazon-video", "ciao", None):
        ours = federated_config("pfedrec", dataset)
        assert (ours.lr, ours.item_lr(5000), ours.aggregation, ours.patience) == (0.1, 30.0, "samples", 30)
    # the papers' rule asked for by name brings the papers' rates, with fedrec's stop
    asked = federated_config("fedmf", "lastfm-2k", aggregation="clients")
    assert (asked.lr, asked.item_lr(100), asked.patience) == (0.05, 400.0, 30)
    # LDP's noise is calibrated per round's clients: the papers' rule unless one is given
    assert federated_config("fedmf", ldp=0.1).aggregation == "clients"
    assert federated_config("fedmf", ldp=0.1, aggregation="samples").aggregation == "samples"
    rap = federated_config("fedrap", ldp=0.1)  # FedRAP too: the papers' rule and its rates
    assert (rap.aggregation, rap.lr, rap.item_lr(100), rap.patience) == ("clients", 3.0, 3000.0, 30)
    pfedrec = get_algorithm("pfedrec")
    assert pfedrec.untuned_note("lastfm-2k") is None and pfedrec.untuned_note("ciao") is None
    assert pfedrec.untuned_note("synthetic:50x80") is None
    assert "untuned" in get_algorithm("gpfedrec").untuned_note("ml-1m")
    assert get_algorithm("fedrap").untuned_note("ml-1m") is None  # measured in the transfer table
    for newer in ("colr", "perfedrec", "fedpergnn"):  # tuned on Lastfm-2K: nothing beat the defaults
        assert get_algorithm(newer).untuned_note("lastfm-2k") is None, newer
    assert "untuned on lastfm-2k" in get_algorithm("fedca").untuned_note("lastfm-2k")  # tuning moved it 0.08
    assert "for ratings were chosen on ml-100k" in get_algorithm("fedpergnn").untuned_note("ciao", "rating")
    with pytest.raises(SystemExit):
        main(["algorithms", "fedmf"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "lastfm-2k" in shown and "--lr 0.05" in shown and "samples" in shown and "--aggregation clients" in shown
    assert "evaluated under sampled, full, rating protocols" in shown
    assert ("under rating protocols (squared error on the ratings): --lr 0.03, --item-lr-scale 1.0, "
            "--cold-items user-mean, --rating-baseline user-item") in shown
    assert "its paper's setting for ratings: --lr 0.03, --item-lr-scale 1000.0" in shown
