from __future__ import annotations

import numpy as np
import pytest

from fedrec.data import synthetic as synthetic_module
from fedrec.data.interactions import Interactions
from fedrec.data.synthetic import SyntheticData, synthetic, synthetic_data
from fedrec.errors import FedrecError

N_USERS, N_ITEMS = 3000, 800


@pytest.fixture(scope="module")
def data() -> SyntheticData:
    return synthetic_data(N_USERS, N_ITEMS, mean_interactions=20, seed=7)


def per_user(x: Interactions) -> np.ndarray:
    return np.bincount(x.users, minlength=x.n_users)


def test_shapes_ids_and_dtypes(data: SyntheticData) -> None:
    x = data.interactions
    assert x.n_users == N_USERS and x.n_items == N_ITEMS
    assert x.user_ids.tolist() == list(range(N_USERS)) and x.item_ids.tolist() == list(
        range(N_ITEMS)
    )
    assert x.users.dtype == np.int64 and x.items.dtype == np.int64
    assert x.ratings.dtype == np.float32 and x.timestamps.dtype == np.int64
    assert x.items.min() >= 0 and x.items.max() < N_ITEMS
    assert set(np.unique(x.ratings).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert not x.implicit and x.name == "synthetic"
    assert data.user_factors.shape == (N_USERS, 8) and data.item_factors.shape == (N_ITEMS, 8)
    assert data.popularity.shape == (N_ITEMS,) and data.popularity.sum() == pytest.approx(1.0)


def test_same_seed_same_data_other_seed_differs(data: SyntheticData) -> None:
    again = synthetic(N_USERS, N_ITEMS, mean_interactions=20, seed=7)
    x = data.interactions
    for name in ("users", "items", "ratings", "timestamps", "row_order"):
        np.testing.assert_array_equal(getattr(again, name), getattr(x, name))
    other = synthetic(N_USERS, N_ITEMS, mean_interactions=20, seed=8)
    assert len(other) != len(x) or not np.array_equal(other.items, x.items)


def test_no_duplicates_and_activity(data: SyntheticData) -> None:
    x = data.interactions
    assert len(np.unique(x.users * N_ITEMS + x.items)) == len(x)
    counts = per_user(x)
    assert counts.min() >= 3
    assert counts.mean() == pytest.approx(20, rel=0.1)
    # Heavy tail: the median user is below the mean and the heaviest far above it.
    assert np.median(counts) < counts.mean() < counts.max() / 4


def test_popularity_is_heavy_tailed(data: SyntheticData) -> None:
    counts = np.sort(np.bincount(data.interactions.items, minlength=N_ITEMS))[::-1]
    assert counts[: N_ITEMS // 10].sum() / counts.sum() > 0.3
    # Realised popularity follows the power law the items were drawn from.
    assert (
        np.corrcoef(np.bincount(data.interactions.items, minlength=N_ITEMS), data.popularity)[0, 1]
        > 0.8
    )
    flat = synthetic(N_USERS, N_ITEMS, popularity_exponent=0.0, seed=7)
    flat_counts = np.sort(np.bincount(flat.items, minlength=N_ITEMS))[::-1]
    assert flat_counts[: N_ITEMS // 10].sum() / flat_counts.sum() < 0.2


def test_latent_structure_is_real(data: SyntheticData) -> None:
    x = data.interactions
    rng = np.random.default_rng(0)
    # Compare with items drawn by popularity alone, so the gap is due to the factors only.
    decoys = rng.choice(N_ITEMS, size=len(x), p=data.popularity)
    gap = data.affinity(x.users, x.items).mean() - data.affinity(x.users, decoys).mean()
    assert gap > 0.3
    # The held-out (latest) item of each user also scores above a random item.
    last = np.r_[np.flatnonzero(np.diff(x.users)), len(x) - 1]
    random_items = rng.integers(0, N_ITEMS, len(last))
    held_out = data.affinity(x.users[last], x.items[last])
    assert (held_out > data.affinity(x.users[last], random_items)).mean() > 0.6
    # Ratings rise with affinity.
    aff = data.affinity(x.users, x.items)
    assert aff[x.ratings == 5].mean() > aff[x.ratings == 3].mean() > aff[x.ratings == 1].mean()


def test_rows_grouped_by_user_in_strict_time_order(data: SyntheticData) -> None:
    x = data.interactions
    assert (np.diff(x.users) >= 0).all()
    same_user = np.diff(x.users) == 0
    assert (np.diff(x.timestamps)[same_user] > 0).all()
    # Time order is not item order or affinity order: the latest item is not always the best.
    last = np.r_[np.flatnonzero(np.diff(x.users)), len(x) - 1]
    assert 0.1 < (x.items[last] > x.items[last - 1]).mean() < 0.9


def test_dense_users_fall_back_to_exact_sampling() -> None:
    # 12 of 15 items per user: popularity-drawn pools are often short of distinct items.
    d = synthetic_data(500, 15, mean_interactions=13, min_interactions=12, seed=3)
    x = d.interactions
    counts = per_user(x)
    assert counts.min() >= 12 and counts.max() <= 15
    assert len(np.unique(x.users * 15 + x.items)) == len(x)
    assert (np.diff(x.timestamps)[np.diff(x.users) == 0] > 0).all()


def test_activity_stops_at_max_interactions() -> None:
    # a heavy tail that would fill some users' whole catalogue without the cap
    x = synthetic(400, 60, mean_interactions=40, max_interactions=45, seed=1)
    counts = per_user(x)
    assert counts.max() == 45
    assert per_user(synthetic(400, 60, mean_interactions=40, seed=1)).max() == 60


def test_exact_path_alone_keeps_the_structure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synthetic_module, "POOL_ROUNDS", 0)
    d = synthetic_data(1000, 300, mean_interactions=15, seed=2)
    x = d.interactions
    assert per_user(x).min() >= 3
    assert len(np.unique(x.users * 300 + x.items)) == len(x)
    decoys = np.random.default_rng(1).choice(300, size=len(x), p=d.popularity)
    assert d.affinity(x.users, x.items).mean() - d.affinity(x.users, decoys).mean() > 0.3


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_users=0, n_items=10),
        dict(n_users=10, n_items=5, min_interactions=6, mean_interactions=6),
        dict(n_users=10, n_items=50, min_interactions=5, mean_interactions=4),
        dict(n_users=10, n_items=50, dim=0),
        dict(n_users=10, n_items=50, popularity_exponent=-1.0),
        dict(n_users=10, n_items=50, temperature=0.0),
        dict(n_users=10, n_items=50, max_interactions=2),
        dict(n_users=10, n_items=50, max_interactions=51),
        dict(n_users=10, n_items=50, mean_interactions=30, max_interactions=20),
    ],
)
def test_impossible_options_raise(kwargs: dict) -> None:
    with pytest.raises(FedrecError):
        synthetic(**kwargs)
