"""FedRAP: the lockstep engine equals a plain per-client autograd implementation of its update.

The reference below trains each client alone with autograd on its batch objective (BCE plus
the D-C and C regularisers, means over the batch's slots), takes a plain SGD step on its head,
D_i rows and copy of C, then soft-thresholds the C rows of the batch. It shares nothing with
`fedrec.federated.rap` but the inputs (state and `CohortBatches`), so agreement checks the flat
slot layout, the closed-form gradients, the proximal step and the aggregation.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.federated.engine import FederatedConfig, privacy_spent, run_federated
from fedrec.federated.rap import RAPSpec, RAPState, curriculum, step_runs
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity
from fedrec.rounds.upload import UploadPath, clip_clients, decode_sparse, encode_sparse

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, LR_ITEM, BATCH, EPOCHS = 0.1, 3.0, 8, 2


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(40, 260, mean_interactions=8, min_interactions=3, seed=3))
    return make_split(x, "loo-sampled", seed=0)


def _spec(name: str, **opts: Any) -> RAPSpec:
    alg = get_algorithm(name)
    return alg.build(None, {**alg.defaults, "dim": 6, **opts})  # type: ignore[arg-type]


def _state(spec: RAPSpec, split: Split, seed: int = 2) -> RAPState:
    state = spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5, seed=seed)
    # non-zero D and heads of every shape, so the D-C term and the prox are exercised at once
    if spec.use_d:
        pairs = split.n_users * split.n_items
        views = torch.empty(pairs, spec.dim).normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
        state.personal_views.put(np.arange(pairs), views)
    return state


def _cohort(split: Split, every: int = 2, seed: int = 5, batch: int = BATCH) -> CohortBatches:
    rng = np.random.default_rng(seed)
    clients = order_by_activity(split.train, np.arange(0, split.n_users, every))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    return build_cohort(split.train, clients, negs, batch, rng.random((EPOCHS, int(counts.sum()) * 5)))


def _reference_client(spec: RAPSpec, state: RAPState, cohort: CohortBatches, k: int, lam: float,
                      mu: float, batch: int = BATCH) -> dict[str, torch.Tensor]:
    """Client ``k`` of ``cohort`` trained alone: autograd on its batch objective, SGD, prox."""
    client, n_items, d = int(cohort.clients[k]), state.n_items, spec.dim
    items = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
    head_name = "w" if spec.score == "linear" else "user"
    head = state.private[head_name][client].clone()
    bias = state.private["b"][client].clone() if spec.score == "linear" else torch.zeros(())
    dd = state.personal_views.get(client * n_items + items.numpy()) if spec.use_d else torch.zeros(len(items), d)
    cc = state.items[items].clone()
    mine = cohort.sample_client == k
    order_rows = cohort.sample_row[mine] - cohort.row_ptr[k]
    labels = cohort.sample_label[mine]
    per_epoch = len(order_rows) // EPOCHS
    sign = 1.0 if spec.dc_sign == "pull" else -1.0
    total = 0.0  # the batch losses, each with the L1 term's value (its step is the prox)
    for e in range(EPOCHS):
        for s in range(0, per_epoch, batch):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + batch, per_epoch))
            rows = torch.as_tensor(order_rows[sl])
            y = torch.as_tensor(labels[sl])
            leaves = [t.detach().requires_grad_(True) for t in (head, bias, dd, cc)]
            h, b, D, C = leaves
            vd, vc = D[rows], C[rows]
            v = (vd if spec.use_d else 0) + (vc if spec.use_c else 0)
            logits = v @ h + (b if spec.score == "linear" else 0)
            loss = F.binary_cross_entropy_with_logits(logits, y)
            if spec.use_c and spec.use_d and lam > 0:
                ms = (vd - vc).square().mean(1)
                loss = loss + sign * lam * (ms if sign > 0 else ms.clamp(max=spec.push_cap)).mean()
            if spec.use_c and spec.reg == "l2":
                loss = loss + mu * vc.square().mean(1).mean()
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            l1 = mu * float(vc.abs().mean(1).mean()) if spec.use_c and spec.reg == "l1" else 0.0
            total += float(loss) + l1
            zero = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads, strict=True)]
            head = head - LR * zero[0]
            bias = bias - LR * zero[1]
            dd = dd - LR_ITEM * spec.d_rate * zero[2] if spec.use_d else dd
            if spec.use_c:
                cc = cc - LR_ITEM * zero[3]
                if spec.reg == "l1" and mu > 0:
                    mult = torch.bincount(rows, minlength=len(items)).float()
                    theta = (LR_ITEM * mu / d) * mult / len(rows)
                    cc = cc.sign() * (cc.abs() - theta[:, None]).clamp_min(0)
    return {"head": head, "bias": bias, "D": dd, "C": cc, "items": items, "loss": total}


CASES = [
    ("fedrap", {}),
    ("fedrap", {"dc_sign": "push", "push_cap": 0.4}),  # rows on both sides of the cap
    ("fedrap", {"score": "dot"}),
    ("fedrap", {"d_rate": 0.1}),
    ("fedrap-no", {}),
    ("fedrap-l2", {}),
    ("fedrap-c", {}),
    ("fedrap-c", {"reg": "l2"}),
    ("fedrap-d", {}),
]


#: batch sizes: every client several batches an epoch (its rows gathered a step at a time);
#: some one batch, some several (a step cut in a gathered head and a tail trained in place);
#: every client one batch (each step a block of rows trained in place)
BATCHES = {"several": BATCH, "mixed": 40, "one": 4096}


@pytest.mark.parametrize("batches", list(BATCHES))
@pytest.mark.parametrize(("name", "opts"), CASES)
def test_lockstep_round_matches_per_client_reference(split: Split, name: str, opts: dict[str, Any],
                                                     batches: str) -> None:
    spec = _spec(name, curriculum="fixed", lam=0.3, mu=0.05, **opts)
    state = _state(spec, split)
    before_items = state.items.clone()
    before = _state(spec, split)
    batch = BATCHES[batches]
    cohort = _cohort(split, batch=batch)
    blocks = [runs.block is not None for step in cohort.steps for runs in step_runs(step)]
    assert all(blocks) == (batches == "one") and (batches == "several" or any(blocks))
    acc = state.begin_round(7)
    path = UploadPath()
    up = state.local_update(cohort, path)
    state.accumulate(acc, up)
    state.aggregate(acc, path, torch.Generator())

    total = torch.zeros_like(before_items)
    ref_loss = 0.0
    for k, client in enumerate(cohort.clients):
        ref = _reference_client(spec, before, cohort, k, 0.3, 0.05, batch)
        ref_loss += ref["loss"]
        c = int(client)
        head = state.private["w" if spec.score == "linear" else "user"][c]
        torch.testing.assert_close(head, ref["head"], **TOL)
        if spec.score == "linear":
            torch.testing.assert_close(state.private["b"][c], ref["bias"], **TOL)
        if spec.use_d:
            got_d = state.personal_views.get(c * state.n_items + ref["items"].numpy())
            torch.testing.assert_close(got_d, ref["D"], **TOL)
        total[ref["items"]] += ref["C"] - before_items[ref["items"]]
    expected = before_items + total / len(cohort.clients) if spec.use_c else before_items
    torch.testing.assert_close(state.items, expected, **TOL)
    assert up.loss_sum == pytest.approx(ref_loss, rel=1e-4)
    if not spec.use_c:
        assert up.bytes_up == 0


def test_curricula_follow_the_paper() -> None:
    assert curriculum("tanh", 0) == 0.0 and curriculum("tanh", 10) == pytest.approx(math.tanh(1))
    assert curriculum("fixed", 0) == curriculum("fixed", 50) == 1.0
    assert all(0.0 <= curriculum("sin", a) <= 1.0 for a in range(100))
    assert [curriculum("square", a) for a in (0, 9, 10, 19, 20)] == [0, 0, 1, 1, 0]
    assert curriculum("frac", 3) == 0.25
    spec = RAPSpec(lam=0.2, mu=0.4, curriculum="frac")
    assert spec.weights(1) == (0.2, 0.4)  # round 1 is a = 0
    with pytest.raises(FedrecError, match="curriculum"):
        RAPSpec(curriculum="cosine")


def test_centrap_with_one_user_equals_fedrap(split: Split) -> None:
    """With a single user the server's mean step is that user's step: CentRAP = FedRAP."""
    cohort = _cohort(split, every=1000)
    assert len(cohort.clients) == 1
    results = []
    for name in ("fedrap", "centrap"):
        spec = _spec(name, curriculum="fixed", lam=0.3, mu=0.05)
        state = _state(spec, split)
        acc = state.begin_round(3)
        up = state.local_update(cohort, UploadPath())
        state.accumulate(acc, up)
        state.aggregate(acc, UploadPath(), torch.Generator())
        results.append((state, up))
    (fed, fed_up), (cent, cent_up) = results
    torch.testing.assert_close(cent.items, fed.items, **TOL)
    every = np.arange(split.n_users * split.n_items)
    torch.testing.assert_close(cent.personal_views.get(every), fed.personal_views.get(every), **TOL)
    assert fed_up.bytes_up > 0 and cent_up.bytes_up == 0


def _reference_centrap(spec: RAPSpec, state: RAPState, cohort: CohortBatches, lam: float, mu: float,
                       batch: int) -> dict[str, Any]:
    """CentRAP by autograd: at each lockstep step every user with a batch takes its own SGD step
    on its head and D rows, and the global C takes the mean over those users of their C
    gradients; then each item of C is soft-thresholded by the mean over the users of their
    thresholds (their share of the item's slots)."""
    n_items, d = state.n_items, spec.dim
    head_name = "w" if spec.score == "linear" else "user"
    C = state.items.clone()
    users = []
    for k, client in enumerate(cohort.clients):
        items = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
        mine = cohort.sample_client == k
        users.append({
            "items": items, "head": state.private[head_name][int(client)].clone(),
            "bias": state.private["b"][int(client)].clone() if spec.score == "linear" else torch.zeros(()),
            "D": state.personal_views.get(int(client) * n_items + items.numpy()),
            "rows": cohort.sample_row[mine] - cohort.row_ptr[k], "labels": cohort.sample_label[mine]})
    sign = 1.0 if spec.dc_sign == "pull" else -1.0
    for e in range(EPOCHS):
        for t in range(cohort.steps_per_epoch):
            batches = []
            for u in users:
                per_epoch = len(u["rows"]) // EPOCHS
                lo, hi = e * per_epoch + t * batch, e * per_epoch + min((t + 1) * batch, per_epoch)
                if lo < hi:
                    rows, y = torch.as_tensor(u["rows"][lo:hi]), torch.as_tensor(u["labels"][lo:hi])
                    batches.append((u, rows, y))
            c_leaf = C.detach().requires_grad_(True)
            total, leaves = 0.0, []
            for u, rows, y in batches:
                h, b, D = (u[name].detach().requires_grad_(True) for name in ("head", "bias", "D"))
                leaves.append((u, h, b, D))
                vd, vc = D[rows], c_leaf[u["items"][rows]]
                logits = (vd + vc) @ h + (b if spec.score == "linear" else 0)
                loss = F.binary_cross_entropy_with_logits(logits, y)
                if lam > 0:
                    ms = (vd - vc).square().mean(1)
                    loss = loss + sign * lam * (ms if sign > 0 else ms.clamp(max=spec.push_cap)).mean()
                if spec.reg == "l2":
                    loss = loss + mu * vc.square().mean(1).mean()
                total = total + loss
            wrt = [c_leaf, *(x for _, *xs in leaves for x in xs)]
            grads = torch.autograd.grad(total, wrt, allow_unused=True)
            grads = [torch.zeros_like(x) if g is None else g for x, g in zip(wrt, grads, strict=True)]
            for i, (u, h, b, D) in enumerate(leaves):
                gh, gb, gd = grads[1 + 3 * i:4 + 3 * i]
                u["head"], u["bias"] = h.detach() - LR * gh, b.detach() - LR * gb
                u["D"] = D.detach() - LR_ITEM * spec.d_rate * gd
            C = C - LR_ITEM * grads[0] / len(batches)
            if spec.reg == "l1":
                theta = torch.zeros(n_items)
                for u, rows, _ in batches:
                    share = torch.full((len(rows),), LR_ITEM * mu / d / len(rows))
                    theta.index_add_(0, u["items"][rows], share)
                theta /= len(batches)
                C = C.sign() * (C.abs() - theta[:, None]).clamp_min(0)
    return {"C": C, "users": users}


@pytest.mark.parametrize("batches", ["several", "one"])
@pytest.mark.parametrize("opts", [{}, {"reg": "l2"}, {"dc_sign": "push", "push_cap": 0.4}])
def test_centrap_matches_an_autograd_reference_over_many_users(split: Split, opts: dict[str, Any],
                                                               batches: str) -> None:
    """CentRAP's C is one table all users step at once (the mean of their gradients), with one
    soft-threshold an item summed over the users that trained it."""
    spec = _spec("centrap", curriculum="fixed", lam=0.3, mu=0.05, **opts)
    state = _state(spec, split)
    before = _state(spec, split)
    cohort = _cohort(split, batch=BATCHES[batches])
    assert len(cohort.clients) > 10
    state.begin_round(7)
    state.local_update(cohort, UploadPath())
    ref = _reference_centrap(spec, before, cohort, 0.3, 0.05, BATCHES[batches])
    torch.testing.assert_close(state.items, ref["C"], **TOL)
    for u, client in zip(ref["users"], cohort.clients, strict=True):
        c = int(client)
        head = state.private["w" if spec.score == "linear" else "user"][c]
        torch.testing.assert_close(head, u["head"], **TOL)
        got_d = state.personal_views.get(c * state.n_items + u["items"].numpy())
        torch.testing.assert_close(got_d, u["D"], **TOL)


def test_untrained_items_keep_a_zero_personal_view(split: Split) -> None:
    spec = _spec("fedrap")
    state = spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5, seed=0)
    cohort = _cohort(split)
    state.begin_round(5)
    state.local_update(cohort, UploadPath())
    table = state.personal_views.get(np.arange(split.n_users * split.n_items)).view(split.n_users, split.n_items, -1)
    touched = np.zeros((split.n_users, split.n_items), bool)
    touched[np.repeat(cohort.clients, np.diff(cohort.row_ptr)), cohort.row_items] = True
    assert (table[torch.as_tensor(~touched)] == 0).all()
    assert (table[torch.as_tensor(touched)].abs().sum(1) > 0).all()
    assert len(state.personal_views) == touched.sum()  # only the trained pairs are stored


def test_sparse_encoding_is_lossless_and_counts_what_travels() -> None:
    rows = torch.zeros(5, 32)
    rows[0, 3], rows[2, :], rows[4, :20] = 1.5, -0.25, torch.arange(1.0, 21.0)
    encoded = encode_sparse(rows)
    back, n_bytes = decode_sparse(*encoded)
    torch.testing.assert_close(back, rows, rtol=0, atol=0)
    # ids and counts; row 0: one (column, value) entry; row 2 whole (32 entries would take 160
    # bytes, the row 128); row 4: 20 entries (100 bytes < 128)
    assert n_bytes == 5 * 4 + 5 + (1 + 4) + 32 * 4 + 20 * (1 + 4)
    assert list(encoded[0]) == [1, 0, 255, 0, 20]
    dense = UploadPath(encoding="dense").transmit(rows, torch.zeros_like(rows), torch.tensor([2, 3]), 10)
    sparse = UploadPath(encoding="sparse").transmit(rows, torch.zeros_like(rows), torch.tensor([2, 3]), 10)
    assert sparse[1] == n_bytes < dense[1] == 2 * 10 * 32 * 4
    torch.testing.assert_close(sparse[0], dense[0])
    full = torch.randn(3, 32)  # every row whole (its own path: no masks)
    back, n_bytes = decode_sparse(*encode_sparse(full))
    torch.testing.assert_close(back, full, rtol=0, atol=0)
    assert n_bytes == 3 * 4 + 3 + 3 * 32 * 4


def test_dp_clips_each_client_and_noises_the_mean() -> None:
    delta = torch.randn(7, 4) * 10
    clipped = clip_clients(delta, torch.tensor([3, 4]), 1.0)
    assert clipped[:3].norm() == pytest.approx(1.0) and clipped[3:].norm() == pytest.approx(1.0)
    small = delta * 1e-3
    torch.testing.assert_close(clip_clients(small, torch.tensor([3, 4]), 1.0), small)
    path = UploadPath(dp_clip=0.5, dp_noise=2.0)
    assert path.sends_dense
    noise = path.noise_sum(50, (400, 50), torch.Generator().manual_seed(0))
    assert float(noise.std()) == pytest.approx(2 * 2.0 * 0.5, rel=0.02)  # N(0, (2 z S)^2) summed


def test_privacy_is_accounted(split: Split) -> None:
    base = FederatedConfig(rounds=3, clients_per_round=0.5, dp_clip=0.1, dp_noise=1.0)
    eps = privacy_spent(base, 100, 3)
    assert eps["sample_rate"] == 0.5 and eps["delta"] == 1e-5 and eps["rounds"] == 3
    more_noise = privacy_spent(FederatedConfig(clients_per_round=0.5, dp_clip=0.1, dp_noise=3.0), 100, 3)
    longer = privacy_spent(base, 100, 30)
    assert 0 < more_noise["epsilon"] < eps["epsilon"] < longer["epsilon"]
    with pytest.raises(FedrecError, match="dp-clip"):
        FederatedConfig(dp_noise=1.0).validate()


def test_fedrap_run_records_sparsity_bytes_and_privacy(split: Split) -> None:
    alg = get_algorithm("fedrap")
    spec = alg.build(split, {**alg.defaults, "dim": 6, "mu": 50.0, "curriculum": "fixed"})
    cfg = FederatedConfig(rounds=2, local_epochs=2, batch_size=64, lr=0.1, lr_item=5.0,
                          encoding="sparse")
    out = run_federated(spec, split, cfg, seed=0)
    last = out.history[-1]
    # the prox leaves exact zeros in the uploaded rows, which the sparse encoding skips: the
    # upload is smaller than the same rows sent whole (what the download counts)
    assert 0 < last.bytes_up < last.bytes_down < last.extra["bytes_up_dense"]
    with pytest.raises(FedrecError, match="reg=none"):
        get_algorithm("fedrap-no").build(split, {**get_algorithm("fedrap-no").defaults, "reg": "l1"})
    assert out.extra["sparsity_of_c"]["c_above_1e-2"] >= out.extra["sparsity_of_c"]["c_above_1e-1"]
    noisy = run_federated(spec, split, FederatedConfig(rounds=2, local_epochs=2, batch_size=64, lr=0.1,
                                                       lr_item=5.0, dp_clip=0.1, dp_noise=1.0), seed=0)
    assert noisy.extra["privacy"]["epsilon"] > 0
    assert noisy.history[-1].bytes_up == len(split.train.indptr[:-1]) * split.n_items * 6 * 4


def test_push_stays_finite_where_it_is_capped(split: Split) -> None:
    alg = get_algorithm("fedrap")
    spec = alg.build(split, {**alg.defaults, "dim": 6, "dc_sign": "push", "lam": 50.0,
                             "curriculum": "fixed"})
    out = run_federated(spec, split, FederatedConfig(rounds=3, local_epochs=3, batch_size=64,
                                                     lr=0.1, lr_item=5.0), seed=0)
    assert all(math.isfinite(h.loss) for h in out.history)


def test_cli_runs_fedrap_with_settings_dp_and_engine_defaults(tmp_path, capsys) -> None:
    from fedrec.cli import main

    out = tmp_path / "rap.json"
    argv = ["run", "fedrap", "--dataset", "synthetic:60x300", "--rounds", "2", "--dim", "8",
            "--set", "curriculum=sin", "--set", "lam=0.05", "--set", "dc-sign=push",
            "--dp-clip", "0.1", "--dp-noise", "2", "--out", str(out), "-q"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    model, fed = result["config"]["model"], result["config"]["federated"]
    assert (model["curriculum"], model["lam"], model["dc_sign"]) == ("sin", 0.05, "push")
    assert (fed["local_epochs"], fed["batch_size"], fed["encoding"]) == (10, 2048, "sparse")
    assert (fed["dp_clip"], fed["dp_noise"]) == (0.1, 2.0)
    assert result["extra"]["privacy"]["noise_multiplier"] == 2.0
    assert result["history"][-1]["extra"]["lambda"] == pytest.approx(0.05 * (math.sin(0.1) + 1) / 2)
    with pytest.raises(SystemExit) as bad:
        main(["run", "fedrap", "--dataset", "synthetic:60x300", "--set", "lam", "--out", str(tmp_path / "x.json")])
    assert bad.value.code == 2 and "KEY=VALUE" in capsys.readouterr().err
