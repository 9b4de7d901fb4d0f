"""The item family on explicit ratings: squared error on the observed ratings, no negatives.

FedMF (Chai et al., 2020) and MetaMF (Lin et al., SIGIR 2020) are rating predictors in their
papers; under a rating protocol (`given-rating`: MetaMF's Ciao split, `ratio-rating`) the family
fits each positive's rating and scores are predicted ratings.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.federated.family.model import batch_loss, linear_grads
from fedrec.federated.family.spec import FamilySpec
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split, user_means
from fedrec.rounds.cohort import build_cohort, order_by_activity


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(synthetic(60, 40, mean_interactions=10, min_interactions=4, seed=2), "ratio-rating", seed=0)


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("score", ["dot", "dot-bias", "linear"])
def test_closed_form_squared_error_equals_autograd(score: str, baseline: bool) -> None:
    """`linear_grads` under ``loss="mse"``: the loss and every gradient equal autograd's of
    `batch_loss` (per client, the mean squared error over its real slots); with the rating
    baseline's item bias too (one more column of each item row, added to the score)."""
    spec = FamilySpec(score=score, private_score=score == "linear", dual=False, dim=4, loss="mse",
                      baseline=baseline)
    assert spec.item_width == 4 + baseline
    gen = torch.Generator().manual_seed(0)
    names = list(spec.user_shapes()) + (list(spec.score_shapes()) if spec.private_score else [])
    shapes = {**spec.user_shapes(), **spec.score_shapes()}
    p = {k: torch.randn(3, *shapes[k], generator=gen) for k in names}
    v = torch.randn(3, 5, spec.item_width, generator=gen)
    if baseline:  # the inner score on the first columns, plus the last
        inner = FamilySpec(score=score, private_score=score == "linear", dual=False, dim=4, loss="mse")
        torch.testing.assert_close(spec.scorer.logits(spec, p, v), inner.scorer.logits(inner, p, v[..., :4]) + v[..., 4])
    y = torch.randint(1, 6, (3, 5), generator=gen).float()
    m = torch.ones(3, 5)
    m[2, 3:] = 0  # a short last batch
    loss_t, grads = linear_grads(spec, p, v, y, m, names, items=True)
    loss = float(loss_t)
    leaves = {k: t.clone().requires_grad_(True) for k, t in p.items()}
    vv = v.clone().requires_grad_(True)
    ref = batch_loss(spec, leaves, vv, y, m)
    ref.backward()
    logits = spec.scorer.logits(spec, p, v)
    by_hand = sum(float(((logits[c] - y[c]) ** 2 * m[c]).sum() / m[c].sum()) for c in range(3))
    assert loss == pytest.approx(ref.item(), rel=1e-5) and loss == pytest.approx(by_hand, rel=1e-5)
    for k in p:
        torch.testing.assert_close(grads[k], leaves[k].grad)
    torch.testing.assert_close(grads["items"], vv.grad)


def test_cohort_labels_are_the_observed_ratings(split: Split) -> None:
    """With ``ratings=True`` every sample is a training rating, labelled with its value."""
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    keys = np.random.default_rng(0).random((1, int(counts.sum())))
    cohort = build_cohort(split.train, clients, None, 8, keys, ratings=True)
    items = cohort.row_items[cohort.sample_row]
    users = clients[cohort.sample_client]
    want = np.asarray(split.train[users, items]).ravel()
    assert len(cohort.sample_label) == split.train.nnz
    assert len(np.unique(want)) > 1 and (want > 0).all()
    np.testing.assert_array_equal(cohort.sample_label, want)


@pytest.mark.parametrize("name", ["fedmf", "fedmf-bias", "metamf"])
def test_fits_ratings_without_negatives(name: str) -> None:
    """Under a rating protocol the run draws no negatives (recorded as 0) and its held-out RMSE
    falls well below the first round's."""
    engine = {"lr": 0.05, "lr_item": 0.5} if name != "metamf" else {"lr": 0.01, "lr_item": 0.5}
    engine["aggregation"] = "clients"  # the rule the rating settings were chosen under
    cfg = RunConfig(name, dataset="synthetic:150x60", protocol="ratio-rating", seed=0, model={"dim": 8},
                    federated=federated_config(name, rounds=12, local_epochs=5, **engine))
    trained = train(cfg)
    result = trained.result
    assert trained.model.state.spec.loss == "mse" and result.config["federated"]["negatives"] == 0
    first = result.history[0].valid["rmse"]
    assert np.isfinite(result.test["rmse"]) and result.valid_at_best["rmse"] < first - 0.3


def test_other_negative_counts_are_refused(split: Split) -> None:
    cfg = RunConfig("fedmf", dataset="synthetic:40x30", protocol="ratio-rating",
                    federated=federated_config("fedmf", rounds=1, negatives=2))
    with pytest.raises(FedrecError, match="draws no training negatives"):
        train(cfg)
    spec = get_algorithm("fedmf").build(split)  # the engine refuses them too (a Flower node's path)
    with pytest.raises(FedrecError, match="--num-negatives 0"):
        run_federated(spec, split, FederatedConfig(rounds=1, negatives=4), seed=0)


def test_ranking_protocols_keep_bce_and_negatives() -> None:
    ranking = make_split(to_implicit(synthetic(20, 300, seed=0)), "loo-sampled", seed=0)
    assert get_algorithm("fedmf").build(ranking).loss == "bce"
    with pytest.raises(ValueError, match="loss must be one of bce, mse, not 'mae'"):
        FamilySpec("dot", private_score=False, dual=False, loss="mae")
    assert get_algorithm("metamf").build(ranking).loss == "bce"


def test_rating_protocols_take_the_rating_defaults() -> None:
    """Under a rating protocol the engine defaults are the algorithm's rating settings, not a
    paper's ranking rates for the data set; what the user gives still wins."""
    rating = federated_config("fedmf", "lastfm-2k", "ratio-rating")
    assert (rating.lr, rating.item_lr(1000), rating.item_std, rating.negatives) == (0.03, 0.03, 0.1, 0)
    assert (rating.aggregation, rating.rating_baseline) == ("samples", "user-item")
    paper_rating = federated_config("fedmf", "lastfm-2k", "ratio-rating", paper=True)
    assert (paper_rating.lr, paper_rating.item_lr_scale, paper_rating.aggregation, paper_rating.rating_baseline,
            paper_rating.cold_items) == (0.03, 1000.0, "clients", "none", "model")
    ranking = federated_config("fedmf", "lastfm-2k", "loo-sampled")
    assert (ranking.lr, ranking.item_lr_scale, ranking.negatives) == (0.1, 300.0, 4)  # fedrec's, everywhere
    paper = federated_config("fedmf", "lastfm-2k", "loo-sampled", paper=True)
    assert (paper.lr, paper.item_lr_scale, paper.negatives) == (0.05, None, 4)  # PFedRec's Table 4
    assert federated_config("fedmf", "lastfm-2k", "ratio-rating", lr=0.2).lr == 0.2
    fedmf = get_algorithm("fedmf")
    assert "for ratings were chosen on ml-100k" in (fedmf.untuned_note("ciao", "rating") or "")
    assert fedmf.untuned_note("lastfm-2k", "sampled") is None and fedmf.untuned_note("ml-100k", "rating") is None


# -- the rating baseline: the user's training mean and a learned item bias beneath the score --


def test_the_baselines_labels_are_the_ratings_less_the_users_mean(split: Split) -> None:
    """Each client fits its ratings less its own training mean (computed from its own row)."""
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    keys = np.random.default_rng(0).random((1, int(counts.sum())))
    means = user_means(split.train, clients)
    cohort = build_cohort(split.train, clients, None, 8, keys, ratings=True, label_offsets=means)
    items = cohort.row_items[cohort.sample_row]
    users = clients[cohort.sample_client]
    rated = np.asarray(split.train[users, items]).ravel()
    by_hand = np.asarray([split.train[u].data.mean() for u in users], np.float32)
    np.testing.assert_allclose(cohort.sample_label, rated - by_hand, rtol=1e-6)
    assert abs(float(cohort.sample_label.mean())) < 0.1  # centred: a user's labels sum to zero


def test_fedrecs_rating_defaults_take_the_baseline_and_a_paper_the_plain_score(split: Split) -> None:
    """Under a rating protocol fedrec's defaults put the baseline beneath the family's score: a
    state predicts each client's training mean plus its item bias (the rows' last column) plus
    the score; the papers' setting and ranking protocols keep the score alone, and MetaMF, whose
    score is generated per user, refuses it in one line."""
    fedmf = get_algorithm("fedmf")
    ours = federated_config("fedmf", protocol="ratio-rating")
    assert ours.rating_baseline == "user-item"
    spec = fedmf.build(split, {"dim": 4}, engine=ours)
    assert spec.baseline and spec.item_width == 5
    state = spec.create_state(split.n_users, split.n_items, lr=0.1, lr_item=0.1, item_std=0.1, seed=0,
                              train=split.train)
    state.private["user"].zero_()
    state.items[:, -1] = torch.arange(split.n_items, dtype=state.items.dtype) / 10
    users = np.arange(split.n_users)
    want = user_means(split.train)[:, None] + np.arange(split.n_items)[None, :] / 10
    np.testing.assert_allclose(state.scores(users, None), want, rtol=1e-6)
    candidates = np.tile(np.arange(3), (split.n_users, 1))
    np.testing.assert_allclose(state.scores(users, candidates), want[:, :3], rtol=1e-6)

    paper = federated_config("fedmf", protocol="ratio-rating", paper=True)
    assert paper.rating_baseline == "none" and not fedmf.build(split, engine=paper).baseline
    ranking = make_split(to_implicit(synthetic(20, 300, seed=0)), "loo-sampled", seed=0)
    assert not fedmf.build(ranking, engine=federated_config("fedmf", protocol="loo-sampled")).baseline
    with pytest.raises(ValueError, match="rating baseline"):
        FamilySpec("dot", private_score=False, dual=False, loss="bce", baseline=True)
    assert not get_algorithm("metamf").build(split, engine=federated_config("metamf", protocol="ratio-rating")).baseline
    with pytest.raises(FedrecError, match="takes no rating baseline"):
        get_algorithm("metamf").build(split, engine=FederatedConfig(rating_baseline="user-item"))


def _rated_by_level(n_users: int = 240, n_items: int = 40, seed: int = 0) -> Split:
    """Ratings that are a user's level plus an item's plus noise, 1-5 stars: what a baseline
    of the user's mean and an item bias captures and the user's mean alone does not."""
    from dataclasses import replace

    data = synthetic(n_users, n_items, mean_interactions=12, min_interactions=6, seed=seed)
    rng = np.random.default_rng(seed)
    user_level, item_level = rng.normal(0, 0.6, n_users), rng.normal(0, 1.0, n_items)
    stars = 3 + user_level[data.users] + item_level[data.items] + rng.normal(0, 0.3, len(data.users))
    return make_split(replace(data, ratings=np.clip(np.round(stars), 1, 5).astype(np.float32)),
                      "ratio-rating", seed=0)


def test_at_fedrecs_rating_defaults_fedmf_learns_what_the_users_mean_misses() -> None:
    """On ratings made of a user's and an item's level, FedMF at fedrec's rating defaults ends
    well below predicting each user's training mean and below the papers' plain score at its
    own setting, whose private vector must make the rating itself (0.60 against 1.06 and 1.05)."""
    split = _rated_by_level()
    t = split.test.targets.tocoo()
    users_mean = float(np.sqrt(np.mean((user_means(split.train)[t.row] - t.data) ** 2)))
    from fedrec.algorithms import get_algorithm as algorithm
    from fedrec.federated.engine import run_federated as run

    def rmse(paper: bool) -> float:
        cfg = federated_config("fedmf", protocol="ratio-rating", paper=paper, rounds=30)
        spec = algorithm("fedmf").build(split, {"dim": 4}, engine=cfg)
        return float(run(spec, split, cfg, seed=0).test["rmse"])

    ours, papers = rmse(False), rmse(True)
    assert ours < users_mean - 0.3 and ours < papers - 0.3, (ours, papers, users_mean)
