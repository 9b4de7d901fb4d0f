from __future__ import annotations

import numpy as np
import pytest

from fedrec.data.interactions import Interactions
from fedrec.data.preprocess import (
    PreprocessConfig,
    deduplicate,
    k_core,
    preprocess,
    remap,
    stats,
    to_implicit,
)
from fedrec.errors import FedrecError


def make(
    users: list[str], items: list[str], ratings: list[float], timestamps: list[int] | None = None
) -> Interactions:
    return Interactions.from_raw(
        np.array(users),
        np.array(items),
        np.array(ratings),
        None if timestamps is None else np.array(timestamps),
    )


def rows(x: Interactions) -> list[tuple[str, str, float, int]]:
    """Rows in raw-id terms, in stored order, to compare against hand-computed answers."""
    return [
        (str(x.user_ids[u]), str(x.item_ids[i]), float(r), int(t))
        for u, i, r, t in zip(x.users, x.items, x.ratings, x.timestamps, strict=True)
    ]


def test_to_implicit_threshold_and_all() -> None:
    x = make(["a", "a", "b", "c"], ["x", "y", "x", "z"], [5, 2, 4, 3])
    y = to_implicit(x, threshold=4)
    assert y.implicit
    assert rows(y) == [("a", "x", 1.0, 0), ("b", "x", 1.0, 2)]
    assert y.row_order.tolist() == [0, 2]
    assert y.ratings.dtype == np.float32
    z = to_implicit(x)
    assert len(z) == 4 and z.implicit and (z.ratings == 1.0).all()
    assert not x.implicit  # input untouched


# Pair (a, x) three times: ratings 3 at t=5, 5 at t=1, 4 at t=5 (a later row tying on time).
DUP = dict(
    users=["a", "a", "b", "a", "a"],
    items=["x", "x", "y", "y", "x"],
    ratings=[3, 5, 2, 1, 4],
    timestamps=[5, 1, 7, 3, 5],
)


def test_dedup_first_last_by_time_then_row_order() -> None:
    x = make(**DUP)
    assert rows(deduplicate(x, "first")) == [
        ("a", "x", 5.0, 1),
        ("b", "y", 2.0, 7),
        ("a", "y", 1.0, 3),
    ]
    # Rows 0 and 4 tie on t=5; the later source row wins "last". Output keeps source order.
    assert rows(deduplicate(x, "last")) == [
        ("b", "y", 2.0, 7),
        ("a", "y", 1.0, 3),
        ("a", "x", 4.0, 5),
    ]
    assert deduplicate(x, "last").row_order.tolist() == [2, 3, 4]


def test_dedup_max_mean_keep() -> None:
    x = make(**DUP)
    assert rows(deduplicate(x, "max")) == [
        ("a", "x", 5.0, 1),
        ("b", "y", 2.0, 7),
        ("a", "y", 1.0, 3),
    ]
    mean = deduplicate(x, "mean")
    assert rows(mean) == [("b", "y", 2.0, 7), ("a", "y", 1.0, 3), ("a", "x", 4.0, 5)]
    x2 = make(["u", "u"], ["i", "i"], [1, 4], [1, 2])
    assert rows(deduplicate(x2, "mean")) == [("u", "i", 2.5, 2)]
    assert deduplicate(x, "keep") is x


def test_dedup_error_names_raw_ids() -> None:
    x = make(["a", "b", "b"], ["x", "y", "y"], [1, 2, 3])
    with pytest.raises(FedrecError, match=r"user 'b' and item 'y' occur together 2 times"):
        deduplicate(x, "error")
    clean = make(["a", "b"], ["x", "y"], [1, 2])
    assert deduplicate(clean, "error") is clean
    with pytest.raises(FedrecError, match="unknown dedup policy 'newest'"):
        deduplicate(clean, "newest")


def test_k_core_iterative_cascade() -> None:
    # Item z has one row (from user c). Dropping z leaves c with one row, below min_user=2,
    # and dropping c then leaves item w with one row, so w and its other user d go too.
    users = ["a", "a", "b", "b", "c", "c", "d", "d"]
    items = ["x", "y", "x", "y", "z", "w", "w", "v"]
    x = make(users, items, [1] * 8)
    it = k_core(x, min_user=2, min_item=2, iterative=True)
    assert sorted(rows(it)) == [
        ("a", "x", 1.0, 0),
        ("a", "y", 1.0, 1),
        ("b", "x", 1.0, 2),
        ("b", "y", 1.0, 3),
    ]
    # One pass only removes rows failing on the input counts: z and v (one row each).
    once = k_core(x, min_user=2, min_item=2, iterative=False)
    assert sorted(r[:2] for r in rows(once)) == [
        ("a", "x"),
        ("a", "y"),
        ("b", "x"),
        ("b", "y"),
        ("c", "w"),
        ("d", "w"),
    ]
    assert k_core(x) is x
    with pytest.raises(FedrecError):
        k_core(x, min_user=-1)


def test_remap_contiguous_and_keeps_raw_ids() -> None:
    x = make(["u0", "u1", "u2", "u3"], ["i0", "i1", "i2", "i3"], [1, 2, 3, 4])
    y = remap(x.subset(np.array([False, True, False, True])))
    assert y.n_users == 2 and y.n_items == 2
    assert y.users.tolist() == [0, 1] and y.items.tolist() == [0, 1]
    assert y.user_ids.tolist() == ["u1", "u3"] and y.item_ids.tolist() == ["i1", "i3"]
    assert rows(y) == [("u1", "i1", 2.0, 1), ("u3", "i3", 4.0, 3)]


def test_remap_preserves_order_of_old_ids() -> None:
    # Old ids 5, 2, 7 survive in rows in that order; new ids follow the old numeric order.
    x = Interactions(
        users=np.array([5, 2, 7, 5]),
        items=np.array([0, 3, 3, 0]),
        ratings=np.ones(4, np.float32),
        timestamps=np.arange(4),
        user_ids=np.arange(100, 110),
        item_ids=np.array(list("abcd")),
    )
    y = remap(x)
    assert y.users.tolist() == [1, 0, 2, 1]
    assert y.user_ids.tolist() == [102, 105, 107]
    assert y.items.tolist() == [0, 1, 1, 0] and y.item_ids.tolist() == ["a", "d"]


def test_preprocess_pipeline_and_describe() -> None:
    users = ["a", "a", "a", "b", "b", "c", "c", "c", "d", "d"]
    items = ["x", "x", "y", "x", "y", "x", "y", "z", "x", "y"]
    ratings = [5, 2, 4, 4, 5, 3, 4, 5, 5, 5]
    x = make(users, items, ratings)
    cfg = PreprocessConfig(implicit=True, threshold=4, dedup="last", min_user=2, min_item=2)
    y = preprocess(x, cfg)
    # dedup keeps (a, x) with rating 2 (the later row), which the threshold drops; (c, x) is
    # below it too. The 2-core then drops a (one row) and z (one row), which leaves c with one
    # row, so c goes on the second round.
    assert y.implicit and (y.ratings == 1.0).all()
    assert sorted(rows(y)) == [
        ("b", "x", 1.0, 3),
        ("b", "y", 1.0, 4),
        ("d", "x", 1.0, 8),
        ("d", "y", 1.0, 9),
    ]
    assert y.user_ids.tolist() == ["b", "d"] and y.item_ids.tolist() == ["x", "y"]
    assert y.users.tolist() == [0, 0, 1, 1] and y.items.tolist() == [0, 1, 0, 1]
    loose = preprocess(x, PreprocessConfig(threshold=4, min_user=1, min_item=1))
    assert sorted(r[:2] for r in rows(loose)) == [
        ("a", "y"),
        ("b", "x"),
        ("b", "y"),
        ("c", "y"),
        ("c", "z"),
        ("d", "x"),
        ("d", "y"),
    ]
    assert loose.user_ids.tolist() == ["a", "b", "c", "d"]
    assert loose.item_ids.tolist() == ["x", "y", "z"]
    assert (
        cfg.describe()
        == "dedup=last; implicit (rating >= 4); k-core user>=2 item>=2 (iterative); remap"
    )
    assert (
        PreprocessConfig(implicit=False).describe()
        == "dedup=last; explicit ratings; no k-core; remap"
    )
    with pytest.raises(FedrecError):
        PreprocessConfig(dedup="sometimes")
    with pytest.raises(FedrecError):
        PreprocessConfig(implicit=False, threshold=3)


def test_preprocess_explicit_keeps_ratings() -> None:
    x = make(["a", "a", "b"], ["x", "x", "x"], [1, 3, 5])
    y = preprocess(x, PreprocessConfig(implicit=False, dedup="mean"))
    assert not y.implicit
    assert sorted(rows(y)) == [("a", "x", 2.0, 1), ("b", "x", 5.0, 2)]


def test_stats() -> None:
    x = make(["a", "a", "a", "b"], ["x", "y", "z", "x"], [1, 2, 3, 5])
    s = stats(x)
    assert s["users"] == 2 and s["items"] == 3 and s["interactions"] == 4
    assert s["sparsity"] == pytest.approx(1 - 4 / 6)
    assert (s["rating_min"], s["rating_max"], s["rating_mean"]) == (1.0, 5.0, 2.75)
    assert (s["per_user_min"], s["per_user_median"], s["per_user_max"]) == (1, 2.0, 3)


@pytest.mark.parametrize("policy", ["first", "last", "max", "mean"])
def test_dedup_matches_pandas_groupby(policy: str) -> None:
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 3000
    x = Interactions(
        users=rng.integers(0, 40, n),
        items=rng.integers(0, 30, n),
        ratings=rng.integers(1, 6, n).astype(np.float32),
        timestamps=rng.integers(0, 50, n),
        user_ids=np.arange(40),
        item_ids=np.arange(30),
    )
    df = pd.DataFrame(
        dict(u=x.users, i=x.items, r=x.ratings, t=x.timestamps, o=x.row_order)
    ).sort_values(["t", "o"])
    groups = df.groupby(["u", "i"])
    if policy == "first":
        want = groups.head(1)
    elif policy == "last":
        want = groups.tail(1)
    elif policy == "max":
        want = df.sort_values(["r", "t", "o"]).groupby(["u", "i"]).tail(1)
    else:
        want = groups.tail(1).copy()
        want["r"] = groups["r"].transform("mean")[want.index]
    want = want.sort_values("o")
    got = deduplicate(x, policy)
    np.testing.assert_array_equal(got.row_order, want["o"].to_numpy())
    np.testing.assert_allclose(got.ratings, want["r"].to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got.timestamps, want["t"].to_numpy())


def test_max_users_keeps_the_lowest_ids_left_after_filtering() -> None:
    """PersonalFR's Anime: filter first, then keep the first N users that remain."""
    users = ["u1", "u1", "u2", "u3", "u3", "u4", "u4"]
    items = ["a", "b", "a", "a", "b", "a", "b"]
    x = make(users, items, [5, 4, 3, 5, 4, 3, 2])
    cfg = PreprocessConfig(implicit=False, min_user=2, iterative_core=False, max_users=2)
    out = preprocess(x, cfg)
    assert sorted({str(u) for u in out.user_ids}) == ["u1", "u3"]  # u2 had one rating
    assert out.n_users == 2 and len(out) == 4
    assert "first 2 users" in cfg.describe() and "one pass" in cfg.describe()
    assert preprocess(x, PreprocessConfig(implicit=False, max_users=10)).n_users == 4
    with pytest.raises(FedrecError):
        PreprocessConfig(max_users=0)
