from __future__ import annotations

import numpy as np
import pytest

from fedrec.errors import FedrecError
from fedrec.partition import (
    Partition,
    contiguous_groups,
    one_user_per_client,
    random_groups,
    with_public,
)


def assert_consistent(p: Partition) -> None:
    """Every user in exactly one client, and the CSR view agrees with client_of_user."""
    assert p.client_of_user.dtype == np.int64 and len(p.client_of_user) == p.n_users
    assert p.sizes().sum() == p.n_users and len(p.sizes()) == p.n_clients
    assert sorted(p.client_users.tolist()) == list(range(p.n_users))
    for c in range(p.n_clients):
        users = p.client_users[p.client_ptr[c] : p.client_ptr[c + 1]]
        assert (np.diff(users) > 0).all()
        assert (p.client_of_user[users] == c).all()


def test_one_user_per_client() -> None:
    p = one_user_per_client(5)
    assert_consistent(p)
    assert p.n_clients == 5 and p.client_of_user.tolist() == [0, 1, 2, 3, 4]
    assert p.sizes().tolist() == [1] * 5 and p.public is None
    assert p.users_of(np.array([3, 1])).tolist() == [3, 1]


def test_random_groups_sizes_coverage_and_seed() -> None:
    p = random_groups(103, 10, seed=1)
    assert_consistent(p)
    assert sorted(p.sizes().tolist()) == [10] * 7 + [11] * 3
    assert p.sizes()[:3].tolist() == [11, 11, 11]
    same = random_groups(103, 10, seed=1)
    np.testing.assert_array_equal(same.client_of_user, p.client_of_user)
    other = random_groups(103, 10, seed=2)
    assert not np.array_equal(other.client_of_user, p.client_of_user)
    # Shuffled, not blocks of ids: the first client's users are spread over the id range.
    first = p.users_of(np.array([0]))
    assert first.max() - first.min() > 50


def test_contiguous_groups_fedcia_split() -> None:
    p = contiguous_groups(6040, 100)
    assert_consistent(p)
    sizes = p.sizes()
    assert sizes[:99].tolist() == [60] * 99 and sizes[99] == 100
    assert p.users_of(np.array([0])).tolist() == list(range(60))
    assert p.users_of(np.array([99])).tolist() == list(range(5940, 6040))
    assert (np.diff(p.client_of_user) >= 0).all()
    small = contiguous_groups(10, 3)
    assert small.client_of_user.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]


def test_users_of_concatenates_in_client_order() -> None:
    p = contiguous_groups(10, 3)
    assert p.users_of(np.array([2, 0])).tolist() == [6, 7, 8, 9, 0, 1, 2]
    assert p.users_of(np.array([1, 1])).tolist() == [3, 4, 5, 3, 4, 5]
    assert p.users_of(np.array([], dtype=np.int64)).tolist() == []
    with pytest.raises(FedrecError):
        p.users_of(np.array([3]))
    q = random_groups(1000, 37, seed=0)
    clients = np.array([5, 0, 36, 12])
    expected = np.concatenate([np.flatnonzero(q.client_of_user == c) for c in clients])
    np.testing.assert_array_equal(q.users_of(clients), expected)


def test_with_public_count_seed_and_partition_kept() -> None:
    base = random_groups(1000, 10, seed=0)
    p = with_public(base, 0.25, seed=3)
    assert p.public is not None and p.public.dtype == bool and p.public.sum() == 250
    np.testing.assert_array_equal(p.client_of_user, base.client_of_user)
    np.testing.assert_array_equal(p.client_users, base.client_users)
    assert base.public is None
    np.testing.assert_array_equal(with_public(base, 0.25, seed=3).public, p.public)
    assert not np.array_equal(with_public(base, 0.25, seed=4).public, p.public)
    assert with_public(one_user_per_client(7), 0.5).public.sum() == 4  # round(3.5) == 4
    assert with_public(one_user_per_client(5), 0.5).public.sum() == 2  # round(2.5) == 2
    assert with_public(base, 0.0).public.sum() == 0 and with_public(base, 1.0).public.all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: random_groups(10, 0),
        lambda: random_groups(10, 11),
        lambda: contiguous_groups(10, 0),
        lambda: contiguous_groups(5, 6),
        lambda: one_user_per_client(0),
        lambda: with_public(one_user_per_client(4), 1.5),
        lambda: with_public(one_user_per_client(4), -0.1),
        lambda: Partition(np.array([0, 2]), 2),
        lambda: Partition(np.array([0, 1]), 2, public=np.array([True])),
    ],
)
def test_impossible_options_raise(make) -> None:
    with pytest.raises(FedrecError):
        make()
