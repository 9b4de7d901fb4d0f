"""`PersonalRows` against a per-client dictionary: each client's latest rows, found in every
block that still holds some, for sampled candidates and for every item."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.federated.family.personal import PersonalRows


def _rounds(seed: int, n_clients: int = 40, n_items: int = 30, width: int = 3, merge_rows: bool = False):
    rng = np.random.default_rng(seed)
    store, latest = PersonalRows(n_items, width, merge_rows), {}
    for _ in range(6):  # rounds of partial participation, each trained in a few chunks
        cohort = rng.permutation(n_clients)[: rng.integers(1, n_clients)]
        for chunk in np.array_split(cohort, min(len(cohort), rng.integers(1, 5))):
            items = [np.sort(rng.choice(n_items, rng.integers(0, 8), replace=False)) for _ in chunk]
            ptr = np.cumsum([0] + [len(i) for i in items])
            rows = torch.randn(int(ptr[-1]), width)
            store.update(chunk, np.concatenate(items), ptr, rows)
            for k, c in enumerate(chunk):
                latest[int(c)] = dict(zip(items[k].tolist(), rows[ptr[k] : ptr[k + 1]], strict=True))
        yield rng, store, latest


def _expected(v: torch.Tensor, clients: np.ndarray, items: np.ndarray, latest: dict) -> torch.Tensor:
    out = v.clone()
    for n, c in enumerate(clients):
        for col, item in enumerate(items[n]):
            if int(item) in latest.get(int(c), {}):
                out[n, col] = latest[int(c)][int(item)]
    return out


@pytest.mark.parametrize("merge_rows", [False, True])  # True: as on a GPU
def test_override_writes_each_clients_latest_rows(merge_rows: bool) -> None:
    n_items, width = 30, 3
    for seed in range(3):
        for rng, store, latest in _rounds(seed, n_items=n_items, width=width, merge_rows=merge_rows):
            clients = rng.integers(0, 45, 25)  # repeats, and ids beyond any client with rows
            sampled = rng.integers(0, n_items, (25, 7))
            v = torch.zeros(25, 7, width)
            store.override(v, clients, sampled)
            assert torch.equal(v, _expected(torch.zeros(25, 7, width), clients, sampled, latest))
            every = np.tile(np.arange(n_items), (25, 1))
            v = torch.zeros(25, n_items, width)
            store.override(v, clients, None)
            assert torch.equal(v, _expected(torch.zeros(25, n_items, width), clients, every, latest))


def test_state_round_trips() -> None:
    *_, (rng, store, latest) = _rounds(7)
    again = PersonalRows(30, 3)
    again.load(store.state())
    clients = np.arange(45)
    v, w = torch.zeros(45, 30, 3), torch.zeros(45, 30, 3)
    store.override(v, clients, None)
    again.override(w, clients, None)
    assert torch.equal(v, w) and v.abs().sum() > 0


def test_items_no_client_trained_are_left_alone() -> None:
    store = PersonalRows(10, 2)
    store.update(np.array([0, 1]), np.array([1, 2, 3]), np.array([0, 2, 3]), torch.ones(3, 2))
    v = torch.zeros(2, 3, 2)
    store.override(v, np.array([0, 1]), np.array([[4, 5, 6], [7, 8, 9]]))
    assert not v.any()
    store.override(v, np.array([0, 1]), np.array([[4, 2, 1], [3, 8, 9]]))
    assert v[0, 1:].eq(1).all() and v[1, 0].eq(1).all() and v.sum() == 6
