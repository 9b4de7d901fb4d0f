"""fedrec's defaults and the papers' settings: what a run takes unless told otherwise, and the
switches (`--paper`, a bench file's ``settings``) that run an algorithm as its paper did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_outcome import outcome

from fedrec.bench import load_grid
from fedrec.errors import FedrecError

DATA = "synthetic:60x300"


def _bench(tmp_path: Path, settings: str | None) -> Path:
    path = tmp_path / f"grid-{settings}.toml"
    line = f'settings = "{settings}"\n' if settings is not None else ""
    path.write_text(f'[grid]\n{line}algorithms = ["fedmf", "mf"]\ndatasets = ["{DATA}"]\n'
                    'protocols = ["loo-sampled"]\nseeds = [0]\nrounds = 2\n')
    return path


def test_run_takes_fedrecs_defaults_and_paper_the_papers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours, paper = tmp_path / "ours.json", tmp_path / "paper.json"
    assert outcome(["run", "fedmf", "-d", DATA, "--rounds", "2", "-q", "-o", str(ours)], capsys)[0] == 0
    assert outcome(["run", "fedmf", "-d", DATA, "--rounds", "2", "-q", "--paper", "-o", str(paper)], capsys)[0] == 0
    mine, theirs = (json.loads(p.read_text())["config"]["federated"] for p in (ours, paper))
    assert (mine["aggregation"], mine["item_lr_scale"], mine["patience"], mine["backoffs"]) == ("samples", 300.0, 30, 3)
    assert (theirs["aggregation"], theirs["item_lr_scale"], theirs["patience"], theirs["backoffs"]) == (
        "clients", None, 0, 0)
    # a centralised algorithm has no paper setting to switch to
    code, _, err = outcome(["run", "mf", "-d", DATA, "--epochs", "1", "--paper", "-q",
                            "-o", str(tmp_path / "mf.json")], capsys)
    assert code == 2 and "--paper" in err
    # what a rating model predicts for an unrated item means nothing to a ranking protocol
    code, _, err = outcome(["run", "fedmf", "-d", DATA, "--rounds", "1", "--cold-items", "user-mean", "-q",
                            "-o", str(tmp_path / "c.json")], capsys)
    assert code == 2 and "--cold-items says what a rating model predicts" in err
    code, _, err = outcome(["run", "fedmf", "-d", DATA, "--rounds", "1", "--rating-baseline", "none", "-q",
                            "-o", str(tmp_path / "b.json")], capsys)
    assert code == 2 and "--rating-baseline says what a rating model predicts" in err
    code, _, err = outcome(["run", "fedmf", "-d", DATA, "-p", "ratio-rating", "--rounds", "1", "--rating-baseline",
                            "user", "-q", "-o", str(tmp_path / "u.json")], capsys)
    assert code == 2 and "--rating-baseline must be one of none, user-item (got 'user')" in err
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "u.json").exists()
    # a rating run records the baseline it fitted beneath the score; the paper's, none
    assert outcome(["run", "fedmf", "-d", DATA, "-p", "ratio-rating", "--rounds", "2", "-q",
                    "-o", str(tmp_path / "r.json")], capsys)[0] == 0
    assert json.loads((tmp_path / "r.json").read_text())["config"]["federated"]["rating_baseline"] == "user-item"


def test_a_bench_file_may_run_the_papers_settings(tmp_path: Path) -> None:
    ours, paper = load_grid(_bench(tmp_path, None)), load_grid(_bench(tmp_path, "paper"))
    by = {c.algorithm: c for c in ours.cells}, {c.algorithm: c for c in paper.cells}
    assert by[0]["fedmf"].key() != by[1]["fedmf"].key()
    assert by[1]["fedmf"].run_config(None).federated.aggregation == "clients"
    assert by[0]["mf"].key() == by[1]["mf"].key()  # a centralised cell is the same either way
    with pytest.raises(FedrecError, match="grid.settings must be one of defaults, paper"):
        load_grid(_bench(tmp_path, "papers"))


def test_secure_flower_runs_take_the_algorithms_own_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Secure aggregation also sums each row's senders, so `fedrec flower --secagg` runs the
    algorithm's own item-row rule, as a plain deployment does, and the papers' when asked."""
    pytest.importorskip("flwr")
    from fedrec.flower import launch

    class Launched(Exception):
        """Stands for the deployment: the test needs only the config it is handed."""

    def simulate(run, nodes, **kw):  # type: ignore[no-untyped-def]
        raise Launched(run)

    monkeypatch.setattr(launch, "simulate", simulate)
    for extra, rule in (([], "samples"), (["--secagg"], "samples"), (["--secagg", "--aggregation", "clients"], "clients")):
        with pytest.raises(Launched) as launched:
            outcome(["flower", "fedmf", "-d", DATA, "--mode", "simulation", "--rounds", "1", *extra,
                     "-o", str(tmp_path / "s.json")], capsys)
        assert launched.value.args[0].federated.aggregation == rule, extra


def test_an_item_no_training_rating_names_is_predicted_at_the_users_mean() -> None:
    """Under a rating protocol fedrec's defaults predict a user's training mean for an item that
    no training rating names (its row is still at its initial value); the model's own scores
    stand everywhere else, and a paper's setting keeps them everywhere."""
    import numpy as np
    import scipy.sparse as sp

    from fedrec.eval.evaluate import evaluate
    from fedrec.experiment import RunConfig, federated_config, prepare_split
    from fedrec.protocols.protocol import ColdFallback, EvalSet, get_protocol

    train = sp.csr_matrix(np.array([[4.0, 2.0, 0, 0], [0, 5.0, 0, 0], [0, 0, 0, 0]], np.float32))
    fallback = ColdFallback.user_means(train)
    assert fallback.cold.tolist() == [False, False, True, True]
    assert fallback.value.tolist() == [3.0, 5.0, pytest.approx(11 / 3)]  # no ratings: the global mean
    held_out = sp.csr_matrix(np.array([[0, 0, 3.0, 0], [1.0, 0, 0, 5.0], [0, 0, 0, 4.0]], np.float32))
    stage = EvalSet(np.arange(3), held_out)

    def zeros(users, items):  # type: ignore[no-untyped-def]
        return np.zeros(items.shape, np.float32)

    protocol = get_protocol("ratio-rating")
    plain = evaluate(zeros, stage, protocol)["rmse"]
    assert plain == pytest.approx(np.sqrt((9 + 1 + 25 + 16) / 4))
    kept = evaluate(zeros, EvalSet(np.arange(3), held_out, fallback=fallback), protocol)["rmse"]
    # item 0 is warm (user 1's 1.0 against the model's 0); the rest fall back to the user's mean
    assert kept == pytest.approx(np.sqrt((0 + 1 + 0 + (4 - 11 / 3) ** 2) / 4))
    ours = prepare_split(RunConfig("fedmf", dataset=DATA, protocol="ratio-rating",
                                   federated=federated_config("fedmf", protocol="ratio-rating")))
    assert ours.valid.fallback is not None and ours.test.fallback is ours.valid.fallback
    paper = prepare_split(RunConfig("fedmf", dataset=DATA, protocol="ratio-rating",
                                    federated=federated_config("fedmf", protocol="ratio-rating", paper=True)))
    assert paper.test.fallback is None
    assert prepare_split(RunConfig("mf", dataset=DATA, protocol="ratio-rating")).test.fallback is None


def test_fedrap_takes_fedrecs_item_row_rule_and_its_paper_the_papers() -> None:
    """FedRAP's defaults step C and D_i per sample and average C over its senders, at rates
    that need no catalogue factor; its paper's setting keeps FedAvg over the round's clients at
    the rates chosen for that rule, and so do its ablations and CentRAP."""
    from fedrec.experiment import federated_config

    for name in ("fedrap", "fedrap-c", "fedrap-d", "centrap"):
        ours = federated_config(name, "lastfm-2k")
        assert (ours.aggregation, ours.lr, ours.item_lr(17_000), ours.patience, ours.backoffs) == (
            "samples", 1.0, 10.0, 30, 3)
        paper = federated_config(name, "lastfm-2k", paper=True)
        assert (paper.aggregation, paper.lr, paper.item_lr(17_000), paper.patience, paper.backoffs) == (
            "clients", 3.0, 3000.0, 0, 0)


def test_fedrap_at_its_defaults_trains_a_tiny_catalogue_without_backing_off() -> None:
    """On 240 items a client's leak-free negatives are the few items outside its evaluation
    candidates, so one row holds most of its slots (156 of 195 here); summed per sample, the D-C
    pull would overshoot and grow each round (diverged in round 3, the back-offs did not save
    it). Its implicit step keeps the run finite and learning, with no back-off."""
    from fedrec.experiment import RunConfig, federated_config, train

    cfg = RunConfig(algorithm="fedrap", dataset="synthetic:120x240", protocol="loo-sampled",
                    federated=federated_config("fedrap", rounds=8))
    result = train(cfg).result
    assert result.status == "completed" and "backoffs" not in result.extra
    losses = [h.loss for h in result.history]
    assert max(losses) < 1.0 and losses[-1] < losses[0]
