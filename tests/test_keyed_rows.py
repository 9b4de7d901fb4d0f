"""The keyed row store behind FedRAP's private views: a zero-default table that holds only the
keys written, checked against a dict."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.rounds.keyed_rows import KeyedRows

WIDTH = 3
batches = st.lists(st.lists(st.integers(0, 10**12), min_size=0, max_size=40, unique=True), max_size=8)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_store_equals_a_dict_of_rows(writes: list[list[int]]) -> None:
    store, model = KeyedRows(WIDTH), {}
    for n, keys in enumerate(writes):
        values = torch.arange(len(keys) * WIDTH, dtype=torch.float32).view(-1, WIDTH) + 1000 * n
        store.put(np.array(keys, np.int64), values)
        model.update({k: values[i] for i, k in enumerate(keys)})
    probe = np.array(sorted(model) + [10**12 + 1, 5], np.int64)
    expected = torch.stack([model.get(int(k), torch.zeros(WIDTH)) for k in probe])
    torch.testing.assert_close(store.get(probe), expected, rtol=0, atol=0)
    assert len(store) == len(model)  # memory follows the keys written, nothing else
    again = KeyedRows.from_state(store.state())
    torch.testing.assert_close(again.get(probe), expected, rtol=0, atol=0)


def test_slots_store_each_new_key_once_and_keep_old_rows_in_place() -> None:
    store = KeyedRows(WIDTH)
    first = store.slots(np.array([7, 3, 7]))
    assert first[0] == first[2] and len(store) == 2
    store.rows[first] = torch.ones(3, WIDTH)
    second = store.slots(np.array([3, 1, 7]))
    assert second[0] == first[1] and second[2] == first[0]  # old keys keep their rows
    assert len(store) == 3 and (store.rows[second[1]] == 0).all()
    assert store.find(np.array([2, 3])).tolist() == [-1, int(first[1])]
    assert torch.equal(store.slots(torch.tensor([3, 1, 7])), second)  # keys as tensors: the same slots


def test_state_does_not_depend_on_the_order_keys_arrived() -> None:
    a, b = KeyedRows(WIDTH), KeyedRows(WIDTH)
    a.put(np.array([5, 9]), torch.ones(2, WIDTH))
    a.put(np.array([1]), 2 * torch.ones(1, WIDTH))
    b.put(np.array([1, 9, 5]), torch.tensor([[2.0] * WIDTH, [1.0] * WIDTH, [1.0] * WIDTH]))
    sa, sb = a.state(), b.state()
    assert torch.equal(sa["keys"], sb["keys"]) and torch.equal(sa["rows"], sb["rows"])


def test_get_keeps_the_keys_shape() -> None:
    store = KeyedRows(WIDTH)
    store.put(np.array([4]), torch.full((1, WIDTH), 3.0))
    got = store.get(np.array([[4, 0], [1, 4]]))
    assert got.shape == (2, 2, WIDTH)
    assert got[0, 0].tolist() == [3.0] * WIDTH and got[1, 1].tolist() == [3.0] * WIDTH
    assert (got[0, 1] == 0).all() and (got[1, 0] == 0).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6 * 7 - 1), max_size=20, unique=True), max_size=6),
       st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_block_equals_get_of_every_key_of_each_owner(writes: list[list[int]], owners: list[int]) -> None:
    """``block(owners, span)`` is ``get`` of keys ``owner * span + j``, j < span, in order:
    written keys in several runs, owners repeated, absent or past every key."""
    span, store = 7, KeyedRows(WIDTH)
    for n, keys in enumerate(writes):
        store.put(np.array(keys, np.int64), torch.arange(len(keys) * WIDTH, dtype=torch.float32).view(-1, WIDTH) + 100 * n + 1)
    who = np.array(owners, np.int64)
    keys = who[:, None] * span + np.arange(span)
    torch.testing.assert_close(store.block(who, span), store.get(keys), rtol=0, atol=0)
