"""Protocols: split shapes, tie breaking, and leak-freedom properties proven on data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.data.interactions import Interactions
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.protocols import PROTOCOLS, make_split
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.split import TEST, TRAIN, VALID, leave_one_out


def _rows(m: sp.csr_matrix, u: int) -> set[int]:
    return set(m.indices[m.indptr[u] : m.indptr[u + 1]].tolist())


def _all_items(x) -> list[set[int]]:  # type: ignore[no-untyped-def]
    out: list[set[int]] = [set() for _ in range(x.n_users)]
    for u, i in zip(x.users, x.items, strict=True):
        out[u].add(int(i))
    return out


def test_leave_one_out_takes_latest_rows(small_data):
    label = leave_one_out(small_data)
    for u in range(0, small_data.n_users, 37):
        rows = np.flatnonzero(small_data.users == u)
        ts = small_data.timestamps[rows]
        assert (label[rows] == TEST).sum() == 1 and (label[rows] == VALID).sum() == 1
        assert ts[label[rows] == TEST][0] == ts.max()
        assert ts[label[rows] == VALID][0] >= ts[label[rows] == TRAIN].max()


def test_timestamp_ties_are_broken_by_row_order(tied_data):
    later = leave_one_out(tied_data, "later-row-later")
    earlier = leave_one_out(tied_data, "earlier-row-later")
    # user 0: items 2 and 3 share the latest timestamp; rows 2 and 3 of the file
    assert tied_data.item_ids[tied_data.items[later == TEST]].tolist() == [3, 1]
    assert tied_data.item_ids[tied_data.items[earlier == TEST]].tolist() == [2, 3]
    with pytest.raises(FedrecError):
        leave_one_out(tied_data, "coin-flip")


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_targets_never_in_training(small_data, name):
    if PROTOCOLS[name].split == "given":  # a file's fixed split, here a random one
        fixed = np.random.default_rng(3).integers(0, 3, len(small_data)).astype(np.int8)
        small_data = dataclasses.replace(small_data, given_split=fixed)
    if PROTOCOLS[name].split == "time":  # users active over the same span (synthetic ones follow each other)
        shuffled = np.random.default_rng(3).permutation(len(small_data)).astype(np.int64)
        small_data = dataclasses.replace(small_data, timestamps=shuffled)
    if PROTOCOLS[name].positive_at is not None:  # ratings, some of them positive
        rated = np.random.default_rng(3).integers(1, 6, len(small_data)).astype(np.float32)
        small_data = dataclasses.replace(small_data, ratings=rated, implicit=False)
    s = make_split(small_data, name, seed=3)
    assert len(s.valid.users) > 0 and len(s.test.users) > 0
    assert s.train.multiply(s.valid.targets).nnz == 0
    assert s.train.multiply(s.test.targets).nnz == 0
    assert s.valid.targets.multiply(s.test.targets).nnz == 0
    assert s.train.nnz + s.valid.targets.nnz + s.test.targets.nnz == len(small_data)


def test_sampled_candidates_hold_no_positive(small_data):
    s = make_split(small_data, "loo-sampled", seed=1)
    positives = _all_items(small_data)
    for stage in (s.valid, s.test):
        assert stage.candidates.shape == (len(stage.users), 100)
        for k, u in enumerate(stage.users):
            row = stage.candidates[k]
            assert row[0] in _rows(stage.targets, u)
            assert not (set(row[1:].tolist()) & positives[u])
            assert len(set(row.tolist())) == 100
    # validation and test negatives of a user are distinct draws
    for k, u in enumerate(s.test.users):
        j = np.searchsorted(s.valid.users, u)
        assert not set(s.test.candidates[k, 1:]) & set(s.valid.candidates[j, 1:])


def test_candidates_are_fixed_by_seed(small_data):
    a = make_split(small_data, "loo-sampled", seed=5)
    b = make_split(small_data, "loo-sampled", seed=5)
    c = make_split(small_data, "loo-sampled", seed=6)
    assert np.array_equal(a.test.candidates, b.test.candidates)
    assert not np.array_equal(a.test.candidates, c.test.candidates)


def _draw_many(s, rounds=30):  # type: ignore[no-untyped-def]
    users, _, _ = s.train_pairs()
    rng = np.random.default_rng(0)
    drawn = [s.sample_negatives(users, 4, rng) for _ in range(rounds)]
    return users, np.concatenate(drawn, axis=1)


def test_default_training_negatives_avoid_every_candidate(small_data):
    s = make_split(small_data, "loo-sampled", seed=2)
    assert s.negatives == "exclude-candidates"
    users, drawn = _draw_many(s)
    pairs = sp.csr_matrix((np.ones(drawn.size), (np.repeat(users, drawn.shape[1]), drawn.ravel())),
                          shape=s.train.shape)
    assert pairs.multiply(s.train).nnz == 0
    assert pairs.multiply(s.valid.targets).nnz == 0
    assert pairs.multiply(s.test.targets).nnz == 0
    for stage in (s.valid, s.test):
        cand = sp.csr_matrix((np.ones(stage.candidates.size),
                              (np.repeat(stage.users, 100), stage.candidates.ravel())), shape=s.train.shape)
        assert pairs.multiply(cand).nnz == 0


@pytest.mark.parametrize("name", ["loo-full", "ratio-full"])
def test_full_ranking_negatives_avoid_training_items(small_data, name):
    s = make_split(small_data, name, seed=2)
    assert s.negatives == "train-only"
    users, drawn = _draw_many(s, rounds=5)
    pairs = sp.csr_matrix((np.ones(drawn.size), (np.repeat(users, drawn.shape[1]), drawn.ravel())),
                          shape=s.train.shape)
    assert pairs.multiply(s.train).nnz == 0


def test_legacy_policy_is_explicit_and_excludes_heldout(small_data):
    s = make_split(small_data, "loo-sampled", seed=2, negatives="legacy-exclude-heldout")
    users, drawn = _draw_many(s, rounds=5)
    pairs = sp.csr_matrix((np.ones(drawn.size), (np.repeat(users, drawn.shape[1]), drawn.ravel())),
                          shape=s.train.shape)
    assert pairs.multiply(s.test.targets).nnz == 0
    assert pairs.multiply(s.train).nnz == 0
    with pytest.raises(UnknownNameError):
        make_split(small_data, "loo-sampled", negatives="leaky")
    with pytest.raises(FedrecError):
        make_split(small_data, "loo-full", negatives="exclude-candidates")


def test_ratio_split_proportions(small_data):
    s = make_split(small_data, "ratio-full", seed=0)
    n = len(small_data)
    assert abs(s.test.targets.nnz / n - 0.2) < 0.02
    assert abs(s.valid.targets.nnz / (n - s.test.targets.nnz) - 0.1) < 0.02
    assert (np.diff(s.train.indptr) >= 1).all()
    assert not np.array_equal(make_split(small_data, "ratio-full", seed=1).label, s.label)


def test_duplicates_are_refused(small_data):
    dup = small_data.subset(np.r_[np.arange(len(small_data)), 0])
    with pytest.raises(FedrecError, match="duplicate"):
        make_split(dup, "loo-sampled")


def test_legacy_repeats_split_the_rows_as_they_are(small_data):
    """The official code's Lastfm-2K split: a repeated event can be a user's test item while an
    earlier event of the same pair trains; evaluation negatives still avoid all of its items."""
    x = small_data
    users = np.arange(0, x.n_users, 5)
    label = leave_one_out(x)
    trained = np.array([np.flatnonzero((x.users == u) & (label == TRAIN))[0] for u in users])
    rep = x.subset(np.r_[np.arange(len(x)), trained])  # each chosen pair once more, latest of all
    ts = rep.timestamps.copy()
    ts[len(x):] = x.timestamps.max() + 1
    rep = dataclasses.replace(rep, timestamps=ts)
    s = make_split(rep, "loo-sampled", negatives="legacy-exclude-heldout", repeats=True)
    items_of = _all_items(rep)
    for u, i in zip(users, x.items[trained], strict=True):
        row = s.test.candidates[np.searchsorted(s.test.users, u)]
        assert row[0] == i and i in _rows(s.train, u)  # the test item is a training positive
        assert not set(row[1:].tolist()) & items_of[u]
    assert set(np.unique(s.train.data).tolist()) == {1.0}
    plain = make_split(x, "loo-sampled")
    for u in np.setdiff1d(np.arange(x.n_users), users)[:20]:  # no repeat: split as without it
        assert _rows(plain.train, u) == _rows(s.train, u)
        assert plain.test.candidates[np.searchsorted(plain.test.users, u), 0] == \
            s.test.candidates[np.searchsorted(s.test.users, u), 0]
    with pytest.raises(FedrecError, match="duplicate"):
        make_split(rep, "loo-sampled")
    with pytest.raises(FedrecError, match="loo-sampled"):
        make_split(rep, "loo-full", repeats=True)


def test_complement_sampler_is_uniform_and_exact():
    forbidden = sp.csr_matrix(np.array([[1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0]], float))
    s = ComplementSampler(forbidden)
    rng = np.random.default_rng(0)
    draws = s.sample(np.repeat([0, 1, 2], 20000), 1, rng).reshape(3, 20000)
    freq0 = np.bincount(draws[0], minlength=6) / 20000
    assert np.allclose(freq0, [0, 0.25, 0, 0.25, 0.25, 0.25], atol=0.015)
    freq1 = np.bincount(draws[1], minlength=6) / 20000
    assert np.allclose(freq1, [0.2] * 5 + [0], atol=0.015)
    assert (draws[2] == 5).all()
    distinct = s.sample_distinct(np.array([0, 1]), 4, rng)
    assert sorted(distinct[0].tolist()) == [1, 3, 4, 5]
    with pytest.raises(FedrecError):
        s.sample_distinct(np.array([2]), 2, rng)


def test_complement_table_and_search_draw_the_same_items(small_data, monkeypatch):
    from fedrec.protocols import negatives

    forbidden = sp.csr_matrix((np.ones(len(small_data)), (small_data.users, small_data.items)),
                              shape=(small_data.n_users, small_data.n_items))
    users = np.repeat(np.arange(small_data.n_users), 7)
    with_table = ComplementSampler(forbidden)
    monkeypatch.setattr(negatives, "TABLE_CELLS", 0)
    searched = ComplementSampler(forbidden)
    assert with_table._table is not None and searched._table is None
    a = with_table.sample(users, 5, np.random.default_rng(3))
    b = searched.sample(users, 5, np.random.default_rng(3))
    assert np.array_equal(a, b)
    assert not forbidden[np.repeat(users, 5), a.ravel()].any()


def test_a_samplers_subset_keeps_its_users_forbidden_items() -> None:
    """A Flower node's sampler: the rows of its users, rebuilt from the search keys alone."""
    rng = np.random.default_rng(0)
    dense = rng.random((40, 30)) < 0.3
    sampler = ComplementSampler(sp.csr_matrix(dense))
    users = np.array([7, 0, 39, 12, 12])
    np.testing.assert_array_equal(sampler.forbidden_of(users).toarray(), dense[users])
    part = sampler.subset(users)
    drawn = part.sample(np.repeat(np.arange(len(users)), 50), 3, rng)
    owners = np.repeat(users, 50)
    assert not dense[owners[:, None], drawn].any()


def test_given_split_is_the_files_and_needs_one() -> None:
    """FedCIA's published split: train/valid/test exactly as the file says (through dedup and
    remapping), full ranking; data without a fixed split is refused by name."""
    import dataclasses

    from fedrec.data.preprocess import PreprocessConfig, preprocess
    from fedrec.data.synthetic import synthetic

    x = synthetic(30, 40, mean_interactions=8, seed=1)
    labels = np.random.default_rng(0).integers(0, 3, len(x)).astype(np.int8)
    data = preprocess(dataclasses.replace(x, given_split=labels), PreprocessConfig(implicit=True))
    split = make_split(data, "given-full")
    assert (split.label == data.given_split).all()
    for code, part in ((TRAIN, split.train), (VALID, split.valid.targets), (TEST, split.test.targets)):
        rows = data.given_split == code
        assert part.nnz == rows.sum()
        assert part[data.users[rows], data.items[rows]].all()
    with pytest.raises(FedrecError, match="given-full reads the split a data set's file fixes"):
        make_split(preprocess(x, PreprocessConfig(implicit=True)), "given-full")


def _spread_over_time(users: int = 60, items: int = 80, per_user: int = 20):  # type: ignore[no-untyped-def]
    """Users whose rows fall anywhere on one timeline (the synthetic generator gives each user
    a stretch of its own, which a global cut would leave with no history)."""
    from fedrec.data.interactions import Interactions

    rng = np.random.default_rng(5)
    u = np.repeat(np.arange(users), per_user)
    i = np.concatenate([rng.choice(items, per_user, replace=False) for _ in range(users)])
    return Interactions.from_raw(u, i, None, rng.integers(0, 10_000, len(u)), implicit=True)


def test_global_time_split_cuts_every_user_at_one_time():
    from fedrec.protocols.split import timeline_leak

    small_data = _spread_over_time()
    s = make_split(small_data, "time-full", seed=3)
    ts, label = small_data.timestamps, s.label
    assert ts[label == TRAIN].max() < ts[label == VALID].min() <= ts[label == VALID].max() < ts[label == TEST].min()
    n = len(small_data)
    assert (label == TEST).sum() >= 0.2 * n and (label == VALID).sum() >= 0.1 * (label != TEST).sum() - 1
    assert timeline_leak(small_data, label) == {"later_train_share": 0.0, "targets_with_later_train": 0.0}
    loo = make_split(small_data, "loo-full", seed=3)  # a per-user split trains on later rows
    leak = timeline_leak(small_data, loo.label)
    assert leak["targets_with_later_train"] > 0.5 and 0 < leak["later_train_share"] < 1
    trained = np.diff(s.train.indptr) > 0  # evaluated users have a history before the cut
    assert len(s.test.users) and trained[s.test.users].all() and trained[s.valid.users].all()
    assert s.held_out_by == "time"


def test_global_time_split_puts_a_cut_timestamps_rows_on_the_later_side():
    from fedrec.data.interactions import Interactions
    from fedrec.protocols.split import global_time_split

    ts = np.array([1, 2, 3, 4, 5, 6, 7, 7, 7, 7])  # the 80% cut falls inside the ties at 7
    x = Interactions.from_raw(np.arange(10) % 3, np.arange(10), None, ts, implicit=True)
    label = global_time_split(x, 0.2, 0.0)
    assert (label == TEST).tolist() == [False] * 6 + [True] * 4
    with pytest.raises(FedrecError, match="no time column"):
        global_time_split(dataclasses.replace(x, clock=False))
    flat = Interactions.from_raw(np.arange(4), np.arange(4), None, np.zeros(4, np.int64), implicit=True)
    with pytest.raises(FedrecError, match="nothing is left to train on"):
        global_time_split(flat)


@pytest.mark.parametrize(("name", "says"), [
    ("loo-full", "no user has a validation item under protocol loo-full: leave-one-out holds out a user's "
                 "last two interactions, so it evaluates only users with at least 3, and the data has none"),
    ("time-full", "no user has a test item under protocol time-full: no user is active on both sides of "
                  "the cut"),
])
def test_a_split_that_evaluates_no_one_is_refused_with_its_reason(name, says):
    """Two interactions a user (leave-one-out), or users who follow each other in time (the
    global cut puts the last ones' every row after it): no one to select a round on or report."""
    two_each = Interactions.from_raw(np.repeat(np.arange(20), 2), np.arange(40) % 7, None,
                                     np.arange(40), implicit=True)
    with pytest.raises(FedrecError) as refused:
        make_split(two_each if name == "loo-full" else
                   to_implicit(synthetic(50, 150, mean_interactions=8, min_interactions=3, seed=0)), name)
    assert str(refused.value).startswith(says)
