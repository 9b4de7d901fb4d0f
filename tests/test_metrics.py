"""Ranking metrics against independent references: brute-force enumeration, scikit-learn, hand
values; and RMSE against the formula."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import ndcg_score

from fedrec.eval.metrics import ALL_METRICS, NaNScores, ranking_metrics, rmse

PER_USER = ("hr", "ndcg", "mrr", "precision", "recall")


def _textbook(order_rel: list[bool], n_rel: int, k: int) -> dict[str, float]:
    """Every metric by its definition, for one fixed ordering of a user's candidates."""
    top = order_rel[:k]
    hits = sum(top)
    dcg = sum(1.0 / math.log2(j + 2) for j, r in enumerate(top) if r)
    idcg = sum(1.0 / math.log2(j + 2) for j in range(min(n_rel, k)))
    first = next((j for j, r in enumerate(order_rel) if r), None)
    return {
        "hr": float(hits > 0),
        "ndcg": dcg / idcg,
        "mrr": 1.0 / (first + 1) if first is not None and first < k else 0.0,
        "precision": hits / k,
        "recall": hits / n_rel,
    }


def _reference_row(
    scores: np.ndarray, rel: np.ndarray, excl: np.ndarray, k: int, ties: str
) -> dict[str, float] | None:
    """Average of the textbook metrics over every ordering consistent with the scores.

    For ``ties="random"`` every permutation within each tie group is enumerated (each is equally
    likely under random tie-breaking); for "pessimistic"/"optimistic" the single ordering with
    relevant candidates last/first within their group. None if the user has nothing relevant.
    """
    keep = [i for i in range(len(scores)) if not excl[i]]
    n_rel = sum(bool(rel[i]) for i in keep)
    if n_rel == 0:
        return None
    if ties != "random":
        sign = 1 if ties == "pessimistic" else -1
        order = sorted(keep, key=lambda i: (-scores[i], sign * bool(rel[i])))
        return _textbook([bool(rel[i]) for i in order], n_rel, k)
    groups = [
        [i for i in keep if scores[i] == v] for v in sorted({scores[i] for i in keep}, reverse=True)
    ]
    totals = dict.fromkeys(PER_USER, 0.0)
    count = 0
    for parts in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = [i for part in parts for i in part]
        for name, value in _textbook([bool(rel[i]) for i in order], n_rel, k).items():
            totals[name] += value
        count += 1
    return {name: total / count for name, total in totals.items()}


def _random_case(rng: np.random.Generator, n_users: int, n_cand: int, excl_rate: float):
    """Scores from {-inf, 0, 1, 2} (many ties; -inf as a model's own masking would give), 0 to
    several relevant per user, some exclusions."""
    scores = rng.integers(-1, 3, size=(n_users, n_cand)).astype(np.float64)
    scores[scores < 0] = -np.inf
    rel = rng.random((n_users, n_cand)) < rng.uniform(0.0, 0.6, size=(n_users, 1))
    excl = rng.random((n_users, n_cand)) < excl_rate
    return scores, rel, excl


@pytest.mark.parametrize("ties", ["random", "pessimistic", "optimistic"])
def test_matches_brute_force_enumeration(ties: str) -> None:
    rng = np.random.default_rng(7)
    checked = 0
    for case in range(60):
        n_cand = int(rng.integers(1, 8))
        scores, rel, excl = _random_case(rng, 8, n_cand, excl_rate=0.25 if case % 2 else 0.0)
        ks = (1, 3, 5, 9)  # 9 exceeds every row length
        got = ranking_metrics(scores, rel, ks=ks, exclude=excl, per_user=True, ties=ties)
        n_scored = 0
        for u in range(scores.shape[0]):
            for k in ks:
                want = _reference_row(scores[u], rel[u], excl[u], k, ties)
                if want is None:
                    assert all(np.isnan(got[f"{m}@{k}"][u]) for m in PER_USER)
                    continue
                for name, value in want.items():
                    assert got[f"{name}@{k}"][u] == pytest.approx(value, abs=1e-12), (
                        case,
                        u,
                        k,
                        name,
                    )
                checked += 1
            n_scored += int((rel[u] & ~excl[u]).any())
        assert got["users"] == n_scored
    assert checked > 1000


def test_means_skip_users_without_relevant_and_f1_uses_means() -> None:
    rng = np.random.default_rng(3)
    scores, rel, excl = _random_case(rng, 40, 6, excl_rate=0.2)
    rel[:5] = False  # guaranteed skipped users
    per = ranking_metrics(scores, rel, ks=(2, 4), exclude=excl, per_user=True)
    mean = ranking_metrics(scores, rel, ks=(2, 4), exclude=excl)
    scored = (rel & ~excl).any(axis=1)
    assert mean["users"] == per["users"] == int(scored.sum()) < 40
    for k in (2, 4):
        for name in PER_USER:
            values = per[f"{name}@{k}"]
            assert np.array_equal(np.isnan(values), ~scored)
            assert mean[f"{name}@{k}"] == pytest.approx(values[scored].mean(), rel=1e-12)
        p, r = mean[f"precision@{k}"], mean[f"recall@{k}"]
        assert mean[f"f1@{k}"] == pytest.approx(2 * p * r / (p + r), rel=1e-12)
        assert per[f"f1@{k}"] == mean[f"f1@{k}"]


@pytest.mark.parametrize("levels", [None, 4])
def test_ndcg_matches_sklearn(levels: int | None) -> None:
    rng = np.random.default_rng(11)
    scores = rng.normal(size=(50, 200))
    if levels is not None:
        scores = np.floor(scores * levels / 2)  # coarse quantisation: large tie groups
    rel = rng.random((50, 200)) < 0.05
    rel[np.arange(50), rng.integers(0, 200, size=50)] = True
    for k in (1, 5, 10, 50, 300):
        got = ranking_metrics(scores, rel, ks=(k,), metrics=("ndcg",), per_user=True)
        want = [ndcg_score(rel[[u]], scores[[u]], k=k) for u in range(50)]
        np.testing.assert_allclose(got[f"ndcg@{k}"], want, rtol=1e-10, atol=1e-12)


def test_hand_computed_values() -> None:
    n = 100
    rel = np.zeros((2, n), dtype=bool)
    rel[0, 17] = rel[1, 60] = True
    scores = np.linspace(1.0, 0.0, n)[None, :].repeat(2, axis=0)
    scores[0, 17] = 2.0  # user 0: target ranked 1st
    scores[1, 60] = scores[1, 1] - 1e-9  # user 1: target ranked 3rd
    got = ranking_metrics(scores, rel, ks=(10,), per_user=True)
    assert got["hr@10"][0] == got["ndcg@10"][0] == got["mrr@10"][0] == 1.0
    assert got["hr@10"][1] == 1.0
    assert got["ndcg@10"][1] == pytest.approx(1.0 / math.log2(4))
    assert got["mrr@10"][1] == pytest.approx(1.0 / 3)
    assert got["precision@10"][1] == pytest.approx(0.1)
    assert got["recall@10"][1] == 1.0
    low = ranking_metrics(scores, rel, ks=(2,), per_user=True)
    assert low["hr@2"][1] == low["ndcg@2"][1] == low["mrr@2"][1] == 0.0


def test_constant_scorer_is_chance_level() -> None:
    rng = np.random.default_rng(0)
    n_users, n = 30, 100
    scores = np.full((n_users, n), 0.5, dtype=np.float32)
    rel = np.zeros((n_users, n), dtype=bool)
    rel[np.arange(n_users), rng.integers(0, n, size=n_users)] = True
    got = ranking_metrics(scores, rel, ks=(10,))
    assert got["users"] == n_users
    assert got["hr@10"] == pytest.approx(0.10, abs=1e-15)
    assert got["ndcg@10"] == pytest.approx(sum(1 / math.log2(j + 2) for j in range(10)) / n)
    assert got["mrr@10"] == pytest.approx(sum(1 / r for r in range(1, 11)) / n)
    assert got["precision@10"] == pytest.approx(0.01)
    assert got["recall@10"] == pytest.approx(0.10)
    assert got["f1@10"] == pytest.approx(2 * 0.01 * 0.1 / 0.11)
    worst = ranking_metrics(scores, rel, ks=(10,), ties="pessimistic")
    assert all(worst[f"{m}@10"] == 0.0 for m in ALL_METRICS)
    best = ranking_metrics(scores, rel, ks=(10,), ties="optimistic")
    assert best["hr@10"] == best["ndcg@10"] == best["mrr@10"] == 1.0


def test_large_tie_groups_stay_exact() -> None:
    # One relevant among 100,000 tied candidates: P(hit in top 10) = 10 / 100,000.
    scores = np.zeros((1, 100_000))
    rel = np.zeros((1, 100_000), dtype=bool)
    rel[0, 12_345] = True
    got = ranking_metrics(scores, rel, ks=(10,))
    assert got["hr@10"] == pytest.approx(1e-4, rel=1e-12)
    assert got["mrr@10"] == pytest.approx(sum(1 / r for r in range(1, 11)) / 100_000, rel=1e-12)


def test_random_ties_lie_between_pessimistic_and_optimistic() -> None:
    rng = np.random.default_rng(5)
    scores, rel, excl = _random_case(rng, 200, 30, excl_rate=0.1)
    kw = {"ks": (1, 5, 20), "exclude": excl, "per_user": True}
    lo = ranking_metrics(scores, rel, ties="pessimistic", **kw)
    mid = ranking_metrics(scores, rel, **kw)
    hi = ranking_metrics(scores, rel, ties="optimistic", **kw)
    for key in lo:
        if key == "users" or key.startswith("f1"):
            continue
        ok = ~np.isnan(mid[key])
        assert np.all(lo[key][ok] <= mid[key][ok] + 1e-12)
        assert np.all(mid[key][ok] <= hi[key][ok] + 1e-12)


def test_excluded_top_item_does_not_push_target_down() -> None:
    scores = np.array([[9.0, 5.0, 4.0, 3.0], [9.0, 5.0, 4.0, 3.0]])
    rel = np.array([[False, True, False, False], [True, True, False, False]])
    excl = np.array([[True, False, False, False], [True, False, False, False]])
    plain = ranking_metrics(scores, rel, ks=(1,), per_user=True)
    assert plain["hr@1"][0] == 0.0
    got = ranking_metrics(scores, rel, ks=(1,), exclude=excl, per_user=True)
    # The excluded item is gone: the target is first, and for user 1 the excluded relevant item
    # counts neither as a hit nor towards |rel|.
    assert got["hr@1"][0] == got["ndcg@1"][0] == got["mrr@1"][0] == 1.0
    assert got["hr@1"][1] == got["recall@1"][1] == 1.0
    # Every candidate excluded except those given: rows shorter than K still work.
    short = ranking_metrics(scores, rel, ks=(10,), exclude=excl, per_user=True)
    assert short["precision@10"][1] == pytest.approx(0.1)
    assert short["recall@10"][1] == 1.0


def test_sparse_inputs_and_chunking_agree_with_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    scores = np.round(rng.normal(size=(300, 120)), 1).astype(np.float32)
    rel = rng.random((300, 120)) < 0.03
    excl = rng.random((300, 120)) < 0.2
    dense = ranking_metrics(scores, rel, ks=(5, 20), exclude=excl, per_user=True)
    monkeypatch.setattr("fedrec.eval.metrics._CHUNK_CELLS", 1000)  # several rows per chunk
    chunked = ranking_metrics(
        scores, sp.csr_matrix(rel), ks=(5, 20), exclude=sp.csr_matrix(excl), per_user=True
    )
    for key, value in dense.items():
        np.testing.assert_array_equal(chunked[key], value)


def test_bad_arguments_raise() -> None:
    scores = np.zeros((2, 3))
    rel = np.ones((2, 3), dtype=bool)
    with pytest.raises(ValueError, match="shape"):
        ranking_metrics(scores, rel[:, :2])
    with pytest.raises(ValueError, match="unknown metric"):
        ranking_metrics(scores, rel, metrics=("auc",))
    with pytest.raises(ValueError, match="ks"):
        ranking_metrics(scores, rel, ks=(0,))
    with pytest.raises(ValueError, match="ties"):
        ranking_metrics(scores, rel, ties="first")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        ranking_metrics(np.full((2, 3), np.nan), rel)
    none = ranking_metrics(scores, ~rel, ks=(3,))
    assert none["users"] == 0 and math.isnan(none["hr@3"])


def test_rmse_against_formula() -> None:
    rng = np.random.default_rng(1)
    pred = rng.normal(size=(20, 30))
    target = rng.normal(size=(20, 30))
    mask = rng.random((20, 30)) < 0.3
    assert rmse(pred, target) == pytest.approx(math.sqrt(((pred - target) ** 2).mean()))
    diffs = [(p - t) ** 2 for p, t, m in zip(pred.flat, target.flat, mask.flat, strict=True) if m]
    assert rmse(pred, target, mask) == pytest.approx(math.sqrt(sum(diffs) / len(diffs)))
    assert rmse(np.array([1.0, 2.0]), np.array([1.0, 4.0])) == pytest.approx(math.sqrt(2.0))
    with pytest.raises(ValueError):
        rmse(pred, target, np.zeros_like(mask))
    with pytest.raises(ValueError):
        rmse(pred, target[:, :3])


def test_held_out_ratings_are_scored_a_row_a_user() -> None:
    """Under a rating protocol each user's held-out items are scored as one row (a padded one in
    a chunk of users): every rating is predicted as scoring it alone would, padding is not
    counted, users without a held-out rating are not scored, and a user is scored once."""
    from fedrec.eval.evaluate import evaluate
    from fedrec.protocols.protocol import EvalSet, get_protocol

    rng = np.random.default_rng(0)
    n_users, n_items = 9, 30
    dense = np.zeros((n_users, n_items), np.float32)
    for u, count in enumerate([5, 0, 1, 3, 7, 2, 0, 1, 4]):
        dense[u, rng.choice(n_items, count, replace=False)] = rng.integers(1, 6, count)
    targets = sp.csr_matrix(dense)
    users = np.array([0, 2, 3, 4, 5, 6, 7, 8, 1])  # in no particular order, two without ratings
    bias = rng.normal(size=n_users) + 3.0
    scored: list[int] = []

    def scorer(u: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        assert items is not None and items.shape[0] == len(u)
        scored.extend(u.tolist())
        return (bias[u][:, None] + 0.01 * items).astype(np.float32)

    stage = EvalSet(users, targets)
    got = evaluate(scorer, stage, get_protocol("given-rating"), chunk_users=3)
    rows, cols = targets.nonzero()
    want = rmse(bias[rows] + 0.01 * cols, targets.data)  # each rating scored alone
    assert got["rmse"] == pytest.approx(want, rel=1e-6) and got["users"] == len(users)
    assert sorted(scored) == sorted(set(rows.tolist()))  # once a user; users 1 and 6 not at all


@pytest.mark.parametrize("ties", ["random", "pessimistic", "optimistic"])
def test_one_relevant_a_row_counts_as_the_tie_groups_do(ties: str) -> None:
    """Rows with one relevant candidate (sampled ranking) take a path of two counts a row;
    it gives what the tie-group path gives (reached here through a sparse ``relevant``)."""
    rng = np.random.default_rng(3)
    for n_cand, levels in ((7, 3), (30, 5), (101, 1000), (12, 1)):
        scores = rng.integers(0, levels, (200, n_cand)).astype(np.float32)  # many ties
        relevant = np.zeros(scores.shape, bool)
        relevant[np.arange(200), rng.integers(0, n_cand, 200)] = True
        for per_user in (False, True):
            fast = ranking_metrics(scores, relevant, ks=(1, 5, 10, 200), ties=ties, per_user=per_user)
            tied = ranking_metrics(scores, sp.csr_matrix(relevant), ks=(1, 5, 10, 200), ties=ties,
                                   per_user=per_user)
            assert fast.keys() == tied.keys()
            for key in fast:
                np.testing.assert_allclose(fast[key], tied[key], rtol=1e-12, atol=1e-15, err_msg=key)
    with pytest.raises(NaNScores):
        ranking_metrics(np.array([[np.nan, 1.0]]), np.array([[True, False]]))
