"""The layout built with torch on the run's device (`fedrec.rounds.device_cohort`) is the numpy
layout of `client_draws` and `build_cohort`, element for element: the same keyed draws, the same
rows, the same steps and blocks. On the CPU here (so CI checks it), on CUDA where there is one;
and whole runs that take it end with the numpy layout's figures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedrec.federated import engine
from fedrec.federated.rap import step_runs
from fedrec.protocols import negatives
from fedrec.protocols.negatives import ComplementSampler
from fedrec.rounds import draws
from fedrec.rounds.cohort import build_cohort, order_by_activity
from fedrec.rounds.device_cohort import device_cohort, uniforms

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _numpy(x: Any) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@pytest.mark.parametrize("device", DEVICES)
def test_keyed_uniforms_are_numpys_bits(device: str) -> None:
    ids = np.array([0, 1, 7, 2**31 + 5, 2**40 + 3, 123456789])
    counts = np.array([3, 0, 5, 2, 7, 1])
    for key in [(0, draws.NEGATIVES, 1), (2**40, draws.SHUFFLE, 99, 3)]:
        want = draws.uniforms(key, ids, counts)
        got = uniforms(key, torch.as_tensor(ids, device=device), torch.as_tensor(counts, device=device))
        np.testing.assert_array_equal(_numpy(got), want)


def _data(seed: int, ratings: bool) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    dense = rng.random((60, 90)) < np.linspace(0.02, 0.5, 60)[:, None]  # activity from 2 to 45 items
    values = rng.integers(1, 6, dense.shape).astype(np.float32) if ratings else np.ones(dense.shape, np.float32)
    return sp.csr_matrix(dense * values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("k", "epochs", "batch", "ratings", "table"), [
    (4, 1, 32, False, True),
    (4, 2, 8, False, False),  # the sampler's search instead of its table; many steps
    (1, 3, 256, False, True),  # every client fits one batch: the tail step alone
    (0, 2, 16, True, True),  # ratings less each client's offset, no negatives
])
def test_the_device_layout_is_the_numpy_layout(device: str, k: int, epochs: int, batch: int, ratings: bool,
                                               table: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    train = _data(1, ratings)
    if not table:
        monkeypatch.setattr(negatives, "TABLE_CELLS", 0)
    sampler = ComplementSampler(train)
    assert (sampler._table is not None) == table
    rows = order_by_activity(train, np.random.default_rng(2).choice(60, 40, replace=False))
    ids = rows * 7 + 1000  # draws are keyed by client id, which need not be the row
    offsets = np.random.default_rng(3).random(40).astype(np.float32) if ratings else None
    seed, r = 5, 3
    cfg = replace(engine.FederatedConfig(), negatives=k, local_epochs=epochs, batch_size=batch)
    spec = type("Spec", (), {"reconstruct_epochs": 0})()
    negs, keys, _ = engine.client_draws(spec, cfg, train, sampler, rows, ids, seed, r)
    want = build_cohort(train, rows, negs, batch, keys, ratings=ratings, label_offsets=offsets)
    got = device_cohort(train, sampler, rows, ids, k, epochs, batch, seed, r, ratings=ratings,
                        label_offsets=offsets, device=device)
    np.testing.assert_array_equal(got.clients, want.clients)
    np.testing.assert_array_equal(got.row_items, want.row_items)
    np.testing.assert_array_equal(got.row_ptr, want.row_ptr)
    for whole in (True, False):  # FedRAP reads a step as runs of equal rows (`step_runs`)
        for s, t in zip(got.steps, want.steps, strict=True):
            for a, b in zip(step_runs(s, whole), step_runs(t, whole), strict=True):
                assert (a.n_active, a.block) == (b.n_active, b.block)
                for name in ("rows", "owner", "mult", "labels", "weight"):
                    x, y = getattr(a, name), getattr(b, name)
                    assert x.dtype == y.dtype and x.device.type == device, name
                    torch.testing.assert_close(x.cpu(), y, rtol=0, atol=0)
    assert got.steps_per_epoch == want.steps_per_epoch and len(got.steps) == len(want.steps) > 0
    for s, t in zip(got.steps, want.steps, strict=True):
        assert (s.n_active, s.batch_size) == (t.n_active, t.batch_size)
        for name in ("flat_rows", "flat_owner", "flat_labels", "flat_slot", "rows", "labels", "mask"):
            a, b = _numpy(getattr(s, name)), getattr(t, name)
            assert a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=name)
            if isinstance(getattr(s, name), torch.Tensor):
                assert getattr(s, name).device.type == device  # the slots stay where the steps run


@pytest.mark.parametrize(("name", "takes"), [("pfedrec", True), ("fedmf", True), ("fedrecon", True),
                                             ("gpfedrec", True), ("metamf", True), ("fedprox", True),
                                             ("fedrap", True), ("fedrap-d", True)])
def test_runs_that_lay_out_on_the_device_end_with_the_same_figures(name: str, takes: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The device layout forced on the CPU: every round's figures and the final scores are the
    numpy layout's, bit for bit (chunks of a small memory budget, so a round has several)."""
    from test_contract import config

    from fedrec.experiment import train

    run = config(name, rounds=2, memory_budget_mb=0.05)
    plain = train(run)
    taken: list[bool] = []

    def forced(state: Any) -> bool:
        taken.append(bool(getattr(state, "device_steps", False)))
        return taken[-1]

    monkeypatch.setattr(engine, "use_device_layout", forced)
    laid = train(run)
    assert taken and set(taken) == {takes}
    assert [h.valid for h in laid.result.history] == [h.valid for h in plain.result.history]
    assert [h.loss for h in laid.result.history] == [h.loss for h in plain.result.history]
    users = np.arange(plain.split.n_users)
    np.testing.assert_array_equal(laid.model.scores(users, None), plain.model.scores(users, None))

