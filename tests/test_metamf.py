"""MetaMF: one lockstep round equals a plain per-client autograd implementation; it learns.

The reference below trains each client alone: its own copy of the memory and hypernetwork,
its downloaded item rows, the official code's forward pass (item vectors V[j] R_u formed
explicitly, then the generated two-layer predictor), mean BCE per batch, plain SGD. It shares
nothing with `fedrec.federated.metamf` but the parameter names and the inputs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
import torch
from client_alone import train_alone

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.experiment import RunConfig, federated_config, run
from fedrec.federated.engine import chunk_bounds, train_cohort
from fedrec.federated.family.state import FamilyState
from fedrec.federated.metamf import MetaMFSpec
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity
from fedrec.rounds.uncopied import MAX_STEPS
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, LR_ITEM, BATCH, EPOCHS = 0.05, 2.0, 8, 2
# small and pairwise different sizes, so that a transposed or mis-reshaped block cannot pass
SIZES = {"dim": 8, "factors": 4, "memory": 12, "hidden": 16}


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(40, 260, mean_interactions=8, min_interactions=3, seed=3))
    return make_split(x, "loo-sampled", seed=0)


def _spec(split: Split) -> MetaMFSpec:
    alg = get_algorithm("metamf")
    return alg.build(split, {**alg.defaults, **SIZES})


def _state(spec: MetaMFSpec, split: Split) -> FamilyState:
    return spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5,
                             seed=2)


def _cohort(split: Split, batch: int = BATCH, epochs: int = EPOCHS) -> CohortBatches:
    rng = np.random.default_rng(5)
    clients = order_by_activity(split.train, np.arange(0, split.n_users, 2))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    return build_cohort(split.train, clients, negs, batch, rng.random((epochs, int(counts.sum()) * 5)))


def _forward(p: dict[str, torch.Tensor], rows: torch.Tensor, spec: MetaMFSpec) -> torch.Tensor:
    """The official code's MetaMF for one user: logits of item rows ``rows`` ``(B, factors)``."""
    d, k, f = spec.dim, spec.dim // 4, spec.factors
    c = p["user"] @ p["memory"]

    def hidden(block: str) -> torch.Tensor:
        return torch.relu(c @ p[f"{block}.hidden_w"] + p[f"{block}.hidden_b"])

    def out(block: str, name: str, h: torch.Tensor) -> torch.Tensor:
        return h @ p[f"{block}.{name}_w"] + p[f"{block}.{name}_b"]

    h1, h2, h3 = hidden("layer1"), hidden("layer2"), hidden("items")
    w1, b1 = out("layer1", "weight", h1).view(d, k), out("layer1", "bias", h1)
    w2, b2 = out("layer2", "weight", h2).view(k, 1), out("layer2", "bias", h2)
    item_vectors = rows @ out("items", "right", h3).view(f, d)
    return (torch.relu(item_vectors @ w1 + b1) @ w2 + b2).squeeze(1)


def _reference_client(spec: MetaMFSpec, state: FamilyState, cohort: CohortBatches, k: int,
                      clipped: list[bool] | None = None, batch: int = BATCH,
                      epochs: int = EPOCHS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Client ``k`` trained alone (`client_alone.train_alone`), each step's gradient clipped to
    ``spec.clip``; returns its parameters and its item rows."""
    client = int(cohort.clients[k])
    params = {"user": state.private["user"][client].clone(),
              **{n: t.clone() for n, t in state.shared.items()}}
    table = state.items[torch.as_tensor(cohort.row_items[cohort.rows_of(k)])].clone()
    return train_alone(params, table, cohort, k, lambda p, rows: _forward(p, rows, spec), lr=LR,
                       lr_item=LR_ITEM, batch=batch, epochs=epochs, clip=spec.clip, clipped=clipped)


@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("uncopied", [False, True], ids=["copies", "uncopied"])
def test_lockstep_round_matches_per_client_reference(split: Split, clip: float, uncopied: bool) -> None:
    """One vectorised round equals each client trained alone (clip: each client's gradient
    clipped per step, ``--set clip``; 1.0 binds in some steps and not in others), whether each
    client trains its own copies of the shared weights or the one shared copy with its earlier
    steps carried as outer products (`FamilyState.train_uncopied`; its uploads come summed)."""
    spec = dataclasses.replace(_spec(split), clip=clip)
    state, before = _state(spec, split), _state(spec, split)
    batch = 16 if uncopied else BATCH  # at most MAX_STEPS steps
    cohort = _cohort(split, batch)
    assert len({s.n_active for s in cohort.steps}) > 2, "batch counts must differ across clients"
    assert len(cohort.steps) > 4 and cohort.steps_per_epoch < len(cohort.steps), "several batches and epochs"
    assert len(cohort.steps) <= MAX_STEPS or not uncopied
    up = _round(state, cohort, uncopied)
    assert (up.shared_sum is not None) == uncopied and (up.shared == {}) == uncopied
    clipped = _matches_reference(spec, before, state, cohort, up, batch)
    if clip:
        assert 0.1 < np.mean(clipped) < 0.9, f"the clip must bind in some steps only: {np.mean(clipped):.2f}"
    if uncopied:
        return

    # evaluation scores every user with its own generated model and the shared weights
    users = np.array([0, 7, 13])
    cand = np.random.default_rng(0).integers(0, split.n_items, (3, 9))
    got = state.scores(users, cand)
    for i, u in enumerate(users):
        p = {"user": state.private["user"][u], **state.shared}
        want = _forward(p, state.items[torch.as_tensor(cand[i])], spec)
        np.testing.assert_allclose(got[i], want.numpy(), rtol=1e-5, atol=1e-5)


def _round(state: FamilyState, cohort: CohortBatches, uncopied: bool = False) -> Any:
    """One round of ``cohort`` on ``state`` (``uncopied``: by `FamilyState.train_uncopied`); its
    upload."""
    acc = state.begin_round(1)
    up = state.train_uncopied(cohort, UploadPath()) if uncopied else state.local_update(cohort, UploadPath())
    state.accumulate(acc, up)
    state.aggregate(acc, UploadPath(), torch.Generator())
    return up


def _matches_reference(spec: MetaMFSpec, before: FamilyState, state: FamilyState, cohort: CohortBatches,
                       up: Any, batch: int = BATCH, epochs: int = EPOCHS) -> list[bool]:
    """Assert that ``state``, one round of ``cohort`` after ``before``, holds what its clients
    trained alone (`_reference_client`) and averaged give; which steps the clip bound in."""
    n = len(cohort.clients)
    items = before.items.clone()
    shared = {name: torch.zeros_like(t) for name, t in before.shared.items()}
    clipped: list[bool] = []
    for k, client in enumerate(cohort.clients):
        params, table = _reference_client(spec, before, cohort, k, clipped, batch, epochs)
        torch.testing.assert_close(state.private["user"][int(client)], params["user"], **TOL)
        rows = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
        items[rows] += (table - before.items[rows]) / n
        for name in shared:
            shared[name] += params[name] / n
    assert (state.items - before.items).abs().max() > 1e-3, "the round must move the item table"
    torch.testing.assert_close(state.items, items, **TOL)
    for name, t in shared.items():
        assert (t - before.shared[name]).abs().max() > 1e-6, f"'{name}' must be trained"
        torch.testing.assert_close(state.shared[name], t, **TOL)
    assert up.bytes_up > n * sum(t.numel() for t in shared.values()) * 4  # weights and rows
    return clipped


@pytest.mark.parametrize("clip", [0.0, 3.0])
def test_one_step_clients_train_without_copies_as_with_them(split: Split, clip: float) -> None:
    """Clients that each take one step train from the one shared copy (`FamilyState.train_uncopied`):
    the round equals each client trained alone, as the per-client copies' round does, and counts
    the same bytes; with a clip too (each client's gradient norm taken from its products' inputs
    and output gradients; 3.0 binds for some clients only). Its uploads are summed, so it has no
    per-client upload; it is closed where one is kept, and declines a cohort of more steps than
    `MAX_STEPS`."""
    spec = dataclasses.replace(_spec(split), clip=clip)
    cohort = _cohort(split, batch=256, epochs=1)
    assert len(cohort.steps) == 1 and len(cohort.clients) > 10
    before, summed, copied = (_state(spec, split) for _ in range(3))
    assert summed.uncopied_open(summed=True) and not summed.uncopied_open(summed=False)
    up = _round(summed, cohort, uncopied=True)
    assert up.shared_sum is not None and up.shared == {}
    clipped = _matches_reference(spec, before, summed, cohort, up, batch=256, epochs=1)
    if clip:
        assert 0.1 < np.mean(clipped) < 0.9, f"the clip must bind for some clients only: {np.mean(clipped):.2f}"
    kept = _round(copied, cohort)
    assert kept.shared_sum is None and up.bytes_up == kept.bytes_up and up.bytes_down == kept.bytes_down
    assert up.loss_sum == pytest.approx(kept.loss_sum, rel=1e-6)
    with pytest.raises(ValueError, match="summed"):
        up.per_client()
    long = _cohort(split, batch=1, epochs=2)
    assert len(long.steps) > MAX_STEPS
    assert _state(spec, split).train_uncopied(long, UploadPath()) is None


def _train_round(state: FamilyState, split: Split, keep: list[Any] | None, budget_mb: float = 128) -> Any:
    """Round 1 of every client through the engine (`train_cohort`), batches of 2 (so that the
    most active clients take more than `MAX_STEPS` steps); the round's sums."""
    cfg = dataclasses.replace(federated_config("metamf"), batch_size=2, negatives=4, memory_budget_mb=budget_mb)
    acc = state.begin_round(1)
    rows = order_by_activity(split.train, np.arange(split.n_users))
    train_cohort(state, state.spec, cfg, split.train, split.sampler, rows, rows, 0, 1, UploadPath(), acc, keep=keep)
    state.aggregate(acc, UploadPath(), torch.Generator())
    return acc


def test_the_engine_trains_clients_without_copies_unless_it_keeps_uploads(
        split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    """`train_cohort` sends the clients of at most `MAX_STEPS` steps (a suffix of the activity
    order) to `FamilyState.train_uncopied` in chunks charged their activations and history
    alone, the others to the copies; keeping per-client uploads (robust rules, audits) sends
    every client to the copies. Both rounds agree (to round-off: the sums run in another order).
    A client whose gradient is not finite sends its chunk to the copies, sized for them, which
    reject that client alone."""
    spec = _spec(split)
    uncopied_chunks: list[int] = []
    real = FamilyState.train_uncopied

    def spy(self, cohort, path):  # type: ignore[no-untyped-def]
        up = real(self, cohort, path)
        uncopied_chunks.append(len(cohort.clients) if up is not None else -len(cohort.clients))
        return up
    copied_chunks: list[int] = []
    real_copies = FamilyState.local_update

    def copies(self, cohort, *args):  # type: ignore[no-untyped-def]
        copied_chunks.append(len(cohort.clients))
        return real_copies(self, cohort, *args)
    monkeypatch.setattr(FamilyState, "train_uncopied", spy)
    monkeypatch.setattr(FamilyState, "local_update", copies)
    fast, copied = _state(spec, split), _state(spec, split)
    steps = -(-np.diff(split.train.indptr) * 5 // 2)
    assert (steps > MAX_STEPS).any() and (steps <= MAX_STEPS).any() and (steps > 1).sum() > 10
    acc = _train_round(fast, split, None)
    assert uncopied_chunks == [int((steps <= MAX_STEPS).sum())] and acc.n == split.n_users
    assert sum(copied_chunks) == int((steps > MAX_STEPS).sum())
    uncopied_chunks.clear()
    _train_round(copied, split, [])
    assert uncopied_chunks == []
    for name, t in fast.shared.items():
        torch.testing.assert_close(t, copied.shared[name], **TOL)
    torch.testing.assert_close(fast.items, copied.items, **TOL)
    torch.testing.assert_close(fast.private["user"], copied.private["user"], **TOL)

    fast, copied = _state(spec, split), _state(spec, split)
    uncopied_chunks.clear()
    copied_chunks.clear()
    bad = int(np.flatnonzero(steps <= MAX_STEPS)[0])
    for st in (fast, copied):
        st.private["user"][bad] = float("nan")
    weights = 3 * sum(t.numel() for t in fast.shared.values()) * 4 / 2**20  # two clients' copies a chunk
    acc = _train_round(fast, split, None, budget_mb=weights * 2.5)
    assert max(copied_chunks) <= 2  # the declined chunk went to the copies in chunks of their size
    kept = _train_round(copied, split, [], budget_mb=weights * 2.5)
    assert sum(n < 0 for n in uncopied_chunks) == 1 and len(uncopied_chunks) > 1  # its chunk declined
    assert acc.rejected == kept.rejected == 1
    for name, t in fast.shared.items():
        assert torch.isfinite(t).all()
        torch.testing.assert_close(t, copied.shared[name], **TOL)


def test_chunks_fit_the_budget_with_the_weight_copies(split: Split) -> None:
    """A chunk is charged each client's copies of the shared weights once, and its samples'
    activations: many clients a chunk, whatever their number of samples."""
    spec = get_algorithm("metamf").build(split, dict(get_algorithm("metamf").defaults))
    weights = sum(t.numel() for t in _state(spec, split).shared.values()) * 4
    assert weights == 473_617 * 4  # the official sizes
    assert spec.bytes_per_client == 3 * weights
    assert spec.bytes_per_sample < 1024  # activations only
    assert spec.bytes_per_uncopied_client + MAX_STEPS * spec.bytes_per_uncopied_step < spec.bytes_per_client / 3  # no copies
    samples = np.array([5000, 500, 5, 5])  # a heavy client does not crowd the others out
    assert chunk_bounds(samples, spec.bytes_per_sample, 7 * weights / 2**20, spec.bytes_per_client) == [(0, 2), (2, 4)]


def test_metamf_learns_on_synthetic_data() -> None:
    cfg = RunConfig(algorithm="metamf", dataset="synthetic:150x400", protocol="loo-sampled", seed=0,
                    federated=federated_config("metamf", rounds=4, item_lr_scale=3000.0),
                    model={"dim": 32})
    res = run(cfg)
    assert res.valid_at_best["hr@10"] > 0.3  # chance is 0.10
    assert res.history[-1].loss < res.history[0].loss


def test_cli_runs_metamf(tmp_path, capsys) -> None:
    from fedrec.cli import main

    out = tmp_path / "metamf.json"
    argv = ["run", "metamf", "--dataset", "synthetic:60x300", "--rounds", "1", "--dim", "8",
            "--set", "hidden=16", "--set", "memory=12", "--out", str(out), "-q"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["algorithm"] == "metamf"
    assert (result["config"]["model"]["hidden"], result["config"]["model"]["factors"]) == (16, 8)
    assert result["history"][0]["bytes_up"] > 0
    with pytest.raises(SystemExit) as bad:
        main([*argv[:-3], "--dual", "--out", str(tmp_path / "x.json")])
    assert bad.value.code == 2 and "dual" in capsys.readouterr().err
