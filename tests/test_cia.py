"""FedCIA and the client stacks it runs on.

The stack is checked against clients trained one at a time with plain `nn` parameters and
`torch.optim.Adam`; the eigenbasis fine-tune against autograd on ‖E Eᵀ − S‖; the server's
similarity mean against explicit per-client matrices; GF-CF against its dense formula.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.federated.cia.similarity import finetune
from fedrec.federated.cia.spec import CIASpec
from fedrec.federated.cia.stack import ClientStack, propagate
from fedrec.federated.cia.state import CIAState
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.models.gfcf import LocalFilter
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds import draws
from fedrec.rounds.upload import UploadPath

DIM, BATCH, LR = 4, 5, 0.05


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(30, 50, mean_interactions=8, min_interactions=4, seed=4))
    return make_split(x, "ratio-full", seed=0)


def _reference(stack: ClientStack, split: Split, init: dict[str, torch.Tensor],
               seed: int, r: int, epochs: int, k_neg: int) -> dict[str, torch.Tensor]:
    """Each client of ``stack`` trained alone: its own parameters, torch.optim.Adam, its own
    keyed draws of negatives and shuffles, its own LightGCN graph."""
    coo = stack.train.tocoo()
    out = {k: v.clone() for k, v in init.items()}
    m = stack.n_items
    for c in range(stack.n_clients):
        lo, hi = stack.user_ptr[c], stack.user_ptr[c + 1]
        mine = (coo.row >= lo) & (coo.row < hi)
        rows, cols, cid = coo.row[mine], coo.col[mine], stack.clients[c : c + 1]
        u = draws.uniforms((seed, draws.NEGATIVES, r), cid, len(rows) * k_neg).reshape(-1, k_neg)
        neg = split.sampler.sample_at(stack.users[rows], u).ravel()
        user, pos = np.repeat(rows, k_neg), np.repeat(cols, k_neg)
        orders = [np.argsort(draws.uniforms((seed, draws.SHUFFLE, r, e), cid, len(user)), kind="stable")
                  for e in range(epochs)]
        params = {k: (v[lo:hi] if k == "user" else v[c]).clone().requires_grad_(True) for k, v in init.items()}
        opt = torch.optim.Adam(list(params.values()), lr=LR)
        if stack.backbone == "lightgcn":
            a = np.zeros((hi - lo + m, hi - lo + m))
            x = stack.train[lo:hi].toarray()
            a[: hi - lo, hi - lo :], a[hi - lo :, : hi - lo] = x, x.T
            deg = a.sum(1)
            inv = np.divide(1.0, np.sqrt(deg), out=np.zeros_like(deg), where=deg > 0)
            adj = torch.tensor(inv[:, None] * a * inv[None], dtype=torch.float32)
        for order in orders:
            for s in range(0, len(order), BATCH):
                b = order[s : s + BATCH]
                u, p, n = (torch.from_numpy(x[b]) for x in (user - lo, pos, neg))
                ue, ie = params["user"], params["item"]
                if stack.backbone == "lightgcn":
                    x = torch.cat([ue, ie])
                    total, h = x, x
                    for _ in range(stack.layers):
                        h = adj @ h
                        total = total + h
                    total = total / (stack.layers + 1)
                    ue, ie = total[: hi - lo], total[hi - lo :]

                def score(ue: torch.Tensor, uv: torch.Tensor, i: torch.Tensor,
                          params: dict[str, torch.Tensor]) -> torch.Tensor:
                    if stack.backbone != "mlp":
                        return (uv * ue[i]).sum(-1)
                    h = torch.cat([uv, ue[i]], -1)
                    n_layers = sum(1 for k in params if k.startswith("w"))
                    for j in range(n_layers):
                        h = h @ params[f"w{j}"] + params[f"b{j}"]
                        h = torch.relu(h) if j < n_layers - 1 else h
                    return h[:, 0]

                loss = -F.logsigmoid(score(ie, ue[u], p, params) - score(ie, ue[u], n, params)).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        for k, v in params.items():
            if k == "user":
                out[k][lo:hi] = v.detach()
            else:
                out[k][c] = v.detach()
    return out


@pytest.mark.parametrize("backbone", ["mf", "mlp", "lightgcn"])
def test_stack_equals_clients_trained_alone(split: Split, backbone: str) -> None:
    users = [np.arange(0, 4), np.arange(4, 13), np.arange(13, 15), np.arange(15, 30)]
    stack = ClientStack(backbone, DIM, np.arange(4), users, split.n_items, split.train,
                        tower=(6, 3), layers=2, init_std=0.3, key=(1,))
    assert list(stack.client_pairs) == sorted(stack.client_pairs, reverse=True)  # busiest first
    init = {k: v.clone() for k, v in stack.params.items()}
    expected = _reference(stack, split, init, seed=9, r=3, epochs=2, k_neg=2)
    stack.train_round(split.sampler, 2, 2, BATCH, LR, seed=9, r=3)
    # Adam divides by sqrt(v): float32 rounding of near-zero gradients (summed in another order)
    # is amplified to ~1e-4; a client seeing another's data would be off by ~LR (0.05)
    for k, v in expected.items():
        torch.testing.assert_close(stack.params[k], v, rtol=1e-3, atol=5e-4, msg=k)
    assert not torch.equal(stack.params["item"][0], stack.params["item"][1])  # clients differ



@pytest.mark.parametrize("backbone", ["mf", "mlp", "lightgcn"])
def test_stack_scores_each_user_with_its_own_clients_model(split: Split, backbone: str) -> None:
    users = [np.arange(0, 4), np.arange(4, 13), np.arange(13, 15), np.arange(15, 30)]
    stack = ClientStack(backbone, DIM, np.arange(4), users, split.n_items, split.train,
                        tower=(6, 3), layers=2, init_std=0.3, key=(1,))
    stack.train_round(split.sampler, 2, 1, BATCH, LR, seed=9, r=1)
    user_emb, item_emb = stack._embeddings()
    expected = np.empty((30, split.n_items), np.float32)
    for u in range(30):  # one user at a time, the whole tower on [u, q_i] for every item
        k = int(stack.user_client[u])
        h = torch.cat([user_emb[u].expand(split.n_items, -1), item_emb[k]], -1)
        if backbone != "mlp":
            expected[u] = (item_emb[k] @ user_emb[u]).detach().numpy()
            continue
        for j in range(stack.n_layers):
            h = h @ stack.params[f"w{j}"][k] + stack.params[f"b{j}"][k]
            h = torch.relu(h) if j < stack.n_layers - 1 else h
        expected[u] = h[:, 0].detach().numpy()
    asked = np.random.default_rng(0).permutation(30)[:25]  # clients interleaved, one left out
    got = stack.scores(asked, chunk=3)  # chunks cut through the larger clients' users
    np.testing.assert_allclose(got, expected[asked], rtol=1e-5, atol=1e-6)


def test_propagation_equals_torch_sparse_mm_bit_for_bit(split: Split) -> None:
    """`propagate` (the symmetric graph's product, reused for its backward) gives what
    `torch.sparse.mm` and its autograd give, to the last bit, forward and backward."""
    users = [np.arange(0, 4), np.arange(4, 13), np.arange(13, 15), np.arange(15, 30)]
    stack = ClientStack("lightgcn", DIM, np.arange(4), users, split.n_items, split.train,
                        tower=(), layers=2, init_std=0.3, key=(1,))
    a = stack.adjacency
    assert torch.equal(a.t().coalesce().indices(), a.indices())  # symmetric,
    assert torch.equal(a.t().coalesce().values(), a.values())  # to the bit
    x = torch.randn(a.shape[0], DIM, generator=torch.Generator().manual_seed(0))
    weight = torch.randn(a.shape[0], DIM, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for product in (torch.sparse.mm, propagate):
        leaf = x.clone().requires_grad_(True)
        y = product(a, product(a, leaf))  # two layers: the backward's product is used twice
        (y * weight).sum().backward()
        outs.append(y.detach())
        grads.append(leaf.grad)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("backbone", ["mf", "lightgcn"])
def test_scoring_vectors_are_computed_once_until_a_parameter_changes(
        split: Split, backbone: str, monkeypatch: pytest.MonkeyPatch) -> None:
    users = [np.arange(0, 4), np.arange(4, 13), np.arange(13, 15), np.arange(15, 30)]
    stack = ClientStack(backbone, DIM, np.arange(4), users, split.n_items, split.train,
                        tower=(), layers=2, init_std=0.3, key=(1,))
    calls = []
    own = stack._embeddings
    monkeypatch.setattr(stack, "_embeddings", lambda: calls.append(1) or own())
    first = stack.scores(np.arange(0, 15))
    stack.scores(np.arange(15, 30))
    assert len(calls) == 1  # one evaluation's calls share the vectors
    with torch.no_grad():  # an aggregation writes a parameter in place (here: one client's rows)
        stack.params["item"][int(stack.user_client[0])].mul_(2)
    moved = stack.scores(np.arange(0, 15))
    assert len(calls) == 2 and not np.array_equal(moved, first)
    stack.params = {k: v.clone() for k, v in stack.params.items()}  # a loaded checkpoint: new tensors
    np.testing.assert_array_equal(stack.scores(np.arange(0, 15)), moved)
    assert len(calls) == 3
    stack.train_round(split.sampler, 2, 1, BATCH, LR, seed=9, r=1)  # one call a step
    stepped = len(calls)
    trained = stack.scores(np.arange(0, 15))
    assert len(calls) == stepped + 1 and not np.array_equal(trained, moved)
    user_emb, item_emb = own()
    k = int(stack.user_client[0])
    np.testing.assert_allclose(trained[0], (user_emb[0] @ item_emb[k].T).detach().numpy(), rtol=1e-5, atol=1e-7)


def test_adam_step_is_torchs_formula_to_the_bit() -> None:
    """`adam_` with one count per leading row computes lr * (m / bc1) / (sqrt(v / bc2) + eps) in
    reused buffers: the same bits as the expression written out."""
    from fedrec.rounds.optim import BETA1, BETA2, EPS, adam_

    g = torch.Generator().manual_seed(0)
    p, grad = torch.randn(5, 7, 3, generator=g), torch.randn(5, 7, 3, generator=g)
    q, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    m2, v2 = m.clone(), v.clone()
    for t in range(1, 4):
        steps = torch.tensor([t, t + 1, t + 2, t + 3, t + 4.0])
        adam_(p, grad * t, m, v, steps, 0.03)
        m2.mul_(BETA1).add_(grad * t, alpha=1 - BETA1)
        v2.mul_(BETA2).addcmul_(grad * t, grad * t, value=1 - BETA2)
        bc1, bc2 = 1 - BETA1 ** steps.reshape(-1, 1, 1), 1 - BETA2 ** steps.reshape(-1, 1, 1)
        q.sub_(0.03 * (m2 / bc1) / ((v2 / bc2).sqrt() + EPS))
        assert torch.equal(p, q)


def test_adam_step_of_a_prefix_is_torch_optim_adams() -> None:
    """`adam_` with one step count (torch's fused kernel) moves a prefix slice as
    ``torch.optim.Adam`` moves that slice alone, weight decay included, and nothing else."""
    from fedrec.rounds.optim import adam_

    g = torch.Generator().manual_seed(0)
    p = torch.randn(5, 7, 3, generator=g)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    ref = torch.nn.Parameter(p[:3].clone())
    opt = torch.optim.Adam([ref], lr=0.03, weight_decay=0.01)
    rest = p[3:].clone()
    for t in range(1, 6):
        grad = torch.randn(3, 7, 3, generator=g)
        adam_(p[:3], grad, m[:3], v[:3], t, 0.03, 0.01)
        ref.grad = grad.clone()
        opt.step()
        torch.testing.assert_close(p[:3], ref.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(p[3:], rest) and not m[3:].any()


@pytest.mark.parametrize("loss", ["norm", "mse"])
def test_eigenbasis_finetune_equals_autograd(loss: str) -> None:
    g = torch.Generator().manual_seed(0)
    k, m, d = 3, 20, 4
    item = torch.randn(k, m, d, generator=g, dtype=torch.float64)
    a = torch.randn(m, m, generator=g, dtype=torch.float64)
    target = a @ a.T / m + 0.1 * torch.randn(m, m, generator=g, dtype=torch.float64)  # not symmetric
    sym = (target + target.T) / 2
    ref = item.clone()
    for _ in range(6):
        e = ref.clone().requires_grad_(True)
        x = e @ e.transpose(1, 2) - target
        value = x.pow(2).sum((1, 2)).sqrt() if loss == "norm" else x.pow(2).sum((1, 2)) / m**2
        (grad,) = torch.autograd.grad(value.sum(), e)
        ref = ref - 0.05 * grad
    lam, u = torch.linalg.eigh(sym)
    mine = item.clone()
    finetune(mine, u, lam, 6, 0.05, loss, float(((target - sym) ** 2).sum()))
    torch.testing.assert_close(mine, ref, rtol=1e-7, atol=1e-9)
    before = ((item @ item.transpose(1, 2) - sym) ** 2).sum()
    assert ((mine @ mine.transpose(1, 2) - sym) ** 2).sum() < before


def test_finetune_at_the_target_stays_finite_where_the_norm_identity_cancels() -> None:
    """Clients a hair from a target whose eigenvalues are in the thousands (where a long FedCIA
    run on ML-100K gets): the float32 identity for ‖E Eᵀ − S̄‖² comes out at or below zero there,
    which once made the normalised step infinite and the tables NaN; the floor bounds the step
    by the exact gradient's own bound, so the tables stay finite and as far from the target as
    such steps take them."""
    g = torch.Generator().manual_seed(0)
    k, m, d, lr = 4, 300, 8, 0.1
    q, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    lam = torch.zeros(m, dtype=torch.float64)
    lam[-d:] = torch.linspace(500, 3000, d, dtype=torch.float64)
    at = (q[:, -d:] * lam[-d:].sqrt()).float()
    item = (at[None] + 1e-4 * torch.randn(k, m, d, generator=g)).contiguous()
    start = item.clone()
    finetune(item, q.float(), lam.float(), 100, lr, "norm")
    assert torch.isfinite(item).all()
    # each step moves a client by at most 2 lr ‖G‖^½ (‖G‖ ≤ Σλ here, up to float32's slack)
    bound = 100 * 2 * lr * float(lam.sum()) ** 0.5 * 1.01
    assert (torch.linalg.vector_norm(item - start, dim=(1, 2)) <= bound).all()


def test_a_back_off_halves_the_clients_rate_and_the_fine_tunes(split: Split) -> None:
    from fedrec.federated.cia.algorithm import CIAAlgorithm

    state = _state(split)
    cfg = FederatedConfig(lr=0.03)
    algorithm = CIAAlgorithm(state, cfg, seed=0)
    assert algorithm.scale_rates(0.5)
    assert (algorithm.cfg.lr, state.spec.finetune_lr) == (0.015, CIASpec().finetune_lr / 2)
    assert cfg.lr == 0.03  # the run's config is not edited


def _state(split: Split, **kw: object) -> CIAState:
    """Clients start from one shared table; a per-client perturbation stands in for training."""
    spec = CIASpec(**{"clients": 5, "init_std": 0.3, **kw})  # type: ignore[arg-type]
    state = CIAState(spec, split.train, split.sampler, spec.partition(split.n_users, 0), seed=3)
    g = torch.Generator().manual_seed(5)
    for stack in state.stacks:
        stack.params["item"] += 0.2 * torch.randn(stack.params["item"].shape, generator=g)
    return state


def test_server_mean_is_the_mean_of_client_similarities(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(split, models=(("mf", 3), ("mf", 5)), finetune_steps=0)
    seen: dict[str, torch.Tensor] = {}

    def capture(item, u, lam, *args):  # type: ignore[no-untyped-def]
        seen["mean"] = (u.double() * lam.double()) @ u.double().T

    monkeypatch.setattr("fedrec.federated.cia.state.finetune", capture)
    up, down, _ = state.aggregate(UploadPath(), np.random.default_rng(0))
    per_client = [e @ e.T for s in state.stacks for e in s.params["item"].double()]
    assert len(per_client) == 5
    torch.testing.assert_close(seen["mean"], sum(per_client) / 5, rtol=1e-5, atol=1e-6)  # U sent as float32
    m = split.n_items
    assert up == 5 * m * m * 4 and down == 5 * (m * m + m) * 4


def _server_mean(state: CIAState, path: UploadPath, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, int]:
    seen: dict[str, torch.Tensor] = {}

    def capture(item, u, lam, *args):  # type: ignore[no-untyped-def]
        seen["mean"] = (u.double() * lam.double()) @ u.double().T

    monkeypatch.setattr("fedrec.federated.cia.state.finetune", capture)
    up, _, _ = state.aggregate(path, np.random.default_rng(0))
    monkeypatch.undo()
    return seen["mean"], up


def test_rank_d_upload_is_lossless_and_smaller(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    m = split.n_items
    dense, up_dense = _server_mean(_state(split, models=(("mf", 4),)), UploadPath(), monkeypatch)
    low, up_low = _server_mean(_state(split, models=(("mf", 4),), upload_rank=4), UploadPath(), monkeypatch)
    torch.testing.assert_close(low, dense, rtol=1e-5, atol=1e-6)
    assert up_low == 5 * (m * 4 + 4) * 4 < up_dense == 5 * m * m * 4
    cut, _ = _server_mean(_state(split, models=(("mf", 4),), upload_rank=2), UploadPath(), monkeypatch)
    rank = lambda x: int(torch.linalg.matrix_rank(x, rtol=1e-4))  # noqa: E731  (float32 eigh)
    assert rank(cut) <= 5 * 2 < rank(dense) == 5 * 4


def test_local_scope_averages_each_pair_over_the_clients_that_hold_it(split: Split) -> None:
    state = _state(split, scope="local", finetune_steps=30)
    stack = state.stacks[0]
    before = stack.params["item"].clone()
    total, count = np.zeros((split.n_items,) * 2), np.zeros((split.n_items,) * 2)
    for c, items in enumerate(stack.client_items):
        e = before[c, items].double().numpy()
        total[np.ix_(items, items)] += e @ e.T
        count[np.ix_(items, items)] += 1
    mean = total / np.maximum(count, 1)
    up, down, _ = state.aggregate(UploadPath(), np.random.default_rng(0))
    sizes = [len(i) for i in stack.client_items]
    assert up == down == sum(4 * (n * n + n) for n in sizes)
    after = stack.params["item"]
    for c, items in enumerate(stack.client_items):
        untouched = np.setdiff1d(np.arange(split.n_items), items)
        assert torch.equal(after[c, untouched], before[c, untouched])  # only its items move
        target = mean[np.ix_(items, items)]
        new, old = after[c, items].double().numpy(), before[c, items].double().numpy()
        assert np.linalg.norm(new @ new.T - target) < np.linalg.norm(old @ old.T - target)


def test_ldp_noises_the_similarity(split: Split) -> None:
    plain, noisy = _state(split), _state(split)
    _, _, a = plain.aggregate(UploadPath(), np.random.default_rng(0))
    _, _, b = noisy.aggregate(UploadPath(ldp=0.5), np.random.default_rng(0))
    assert b["similarity_norm"] != pytest.approx(a["similarity_norm"])
    assert torch.isfinite(noisy.stacks[0].params["item"]).all()


def test_finetune_moves_clients_towards_the_mean_but_keeps_them_apart(split: Split) -> None:
    state = _state(split, finetune_steps=50)
    e0 = state.stacks[0].params["item"].clone()
    state.aggregate(UploadPath(), np.random.default_rng(0))
    e1 = state.stacks[0].params["item"]
    s = sum(x @ x.T for x in e0) / len(e0)
    gap = lambda e: torch.stack([((x @ x.T - s) ** 2).sum() for x in e])  # noqa: E731
    assert (gap(e1) < gap(e0)).all()
    assert not torch.allclose(e1[0], e1[1])  # no common table is imposed


def test_weighted_average_within_a_shape_only(split: Split) -> None:
    state = _state(split, models=(("mf", 3), ("mlp", 3)), aggregation="waa")
    users_before = [s.params["user"].clone() for s in state.stacks]
    state.train(FederatedConfig(batch_size=BATCH, negatives=1, lr=LR), r=1)
    trained = [s.params["item"].clone() for s in state.stacks]
    state.aggregate(UploadPath(), np.random.default_rng(0))
    for s, t, ub in zip(state.stacks, trained, users_before, strict=True):
        w = torch.tensor(s.client_pairs / s.client_pairs.sum(), dtype=torch.float32)
        torch.testing.assert_close(s.params["item"][0], (w[:, None, None] * t).sum(0))
        assert torch.equal(s.params["item"][0], s.params["item"][-1])
        assert not torch.equal(s.params["user"], ub)  # trained, never averaged
    assert not torch.allclose(state.stacks[0].params["item"][0], state.stacks[1].params["item"][0])


def test_gfcf_filter_matches_its_formula(split: Split) -> None:
    r = (split.train > 0).astype(np.float64).toarray()
    f = LocalFilter.fit(split.train, rank=3, ideal_weight=0.3)
    du, di = r.sum(1), r.sum(0)
    dinv = np.where(di > 0, 1 / np.sqrt(np.maximum(di, 1e-12)), 0.0)
    norm = r / np.sqrt(du)[:, None] * dinv[None]
    _, _, vt = np.linalg.svd(norm, full_matrices=False)
    v = vt[:3]
    expected = norm.T @ norm + 0.3 * (dinv[:, None] * (v.T @ v)) * np.sqrt(di)[None]
    np.testing.assert_allclose(f.dense(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(f.apply(split.train[:7]), r[:7] @ expected, rtol=1e-4, atol=1e-5)
    # a client of two users has at most two singular vectors
    assert LocalFilter.fit(split.train[:2], rank=32, ideal_weight=0.3).v.shape[0] <= 2


def test_fedcia_gfcf_mixes_local_and_mean_filters(split: Split) -> None:
    state = _state(split, models=(("gfcf", 1),), clients=3, beta=2.0, filter_rank=2)
    state.aggregate(UploadPath(), np.random.default_rng(0))
    filters = [LocalFilter.fit(split.train[u], 2, 0.3) for u in state.users_of_client]
    mean = sum(f.dense() for f in filters) / 3
    users = state.users_of_client[1]
    rows = split.train[users]
    expected = filters[1].apply(rows) + 2.0 * (rows @ mean)
    np.testing.assert_allclose(state.scores(users, None), expected, rtol=1e-4, atol=1e-5)


def test_gfcf_upload_rank_truncates_the_filter(split: Split) -> None:
    m = split.n_items
    dense = _state(split, models=(("gfcf", 1),), clients=3, filter_rank=2)
    full = _state(split, models=(("gfcf", 1),), clients=3, filter_rank=2, upload_rank=m)
    cut = _state(split, models=(("gfcf", 1),), clients=3, filter_rank=2, upload_rank=3)
    ups = [s.aggregate(UploadPath(), np.random.default_rng(0))[0] for s in (dense, full, cut)]
    assert ups == [3 * m * m * 4, 3 * (2 * m * m + m) * 4, 3 * (2 * m * 3 + 3) * 4]
    users = np.arange(split.n_users)
    np.testing.assert_allclose(full.scores(users, None), dense.scores(users, None), rtol=1e-3, atol=1e-4)
    assert np.abs(cut.scores(users, None) - dense.scores(users, None)).max() > 1e-3


def test_runs_end_to_end_and_learn(small_data) -> None:  # type: ignore[no-untyped-def]
    split = make_split(small_data, "ratio-full", seed=0)
    cfg = FederatedConfig(rounds=15, batch_size=256, negatives=1, lr=0.05, patience=0)
    spec = CIASpec(models=(("mf", 16),), clients=10, finetune_steps=20)
    out = run_federated(spec, split, cfg, seed=0)
    assert out.history[-1].loss < out.history[0].loss
    gf = run_federated(get_algorithm("gfcf").build(split, {**get_algorithm("gfcf").defaults}), split, cfg)
    assert len(gf.history) == 1  # one shot
    # GF-CF on all training data ranks far above chance (F1@10 of random ranking is ~0.01 here)
    assert gf.test["f1@10"] > 0.05
    assert out.test["f1@10"] > 0.0 and out.extra["clients"] == 10


def test_a_resumed_run_ends_as_an_uninterrupted_one(split: Split, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = CIASpec(models=(("mf", 4), ("lightgcn", 4)), clients=4, finetune_steps=5)
    cfg = FederatedConfig(rounds=4, batch_size=16, negatives=1, lr=0.05, checkpoint_every=2)
    whole = run_federated(spec, split, cfg, seed=1)
    ckpt = tmp_path / "run.ckpt"
    run_federated(spec, split, FederatedConfig(**{**cfg.__dict__, "rounds": 2}), seed=1, checkpoint=ckpt)
    resumed = run_federated(spec, split, cfg, seed=1, checkpoint=ckpt, resume=True)
    assert [h.valid for h in resumed.history] == [h.valid for h in whole.history]
    assert resumed.test == whole.test and resumed.best_round == whole.best_round


def test_errors(split: Split) -> None:
    with pytest.raises(FedrecError, match="GF-CF cannot be mixed"):
        CIASpec(models=(("gfcf", 1), ("mf", 4)))
    with pytest.raises(FedrecError, match="aggregation"):
        CIASpec(aggregation="sum")
    with pytest.raises(FedrecError, match="every client every round"):
        run_federated(CIASpec(clients=3), split, FederatedConfig(clients_per_round=0.5))
    with pytest.raises(FedrecError, match="clients=99"):
        CIASpec(clients=99).partition(30, 0)
    alg = get_algorithm("fedcia")
    spec = alg.build(split, {**alg.defaults, "dims": "4/8", "clients": 6})
    assert spec.models == (("mf", 4), ("mf", 8))
    spec = alg.build(split, {**alg.defaults, "backbone": "mixed"})
    assert [b for b, _ in spec.models] == ["mf", "mlp", "lightgcn"]


def test_cli_run_keeps_the_algorithms_own_defaults(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`fedrec run` options left out take the algorithm's defaults (not the CLI's generic ones)."""
    import json

    from fedrec.cli import main

    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        main(["run", "stacked", "--dataset", "synthetic:60x40", "--protocol", "ratio-full",
              "--rounds", "2", "--set", "clients=3", "--out", str(out), "--quiet"])
    assert done.value.code == 0
    config = json.loads(out.read_text())["config"]
    engine = get_algorithm("stacked").engine
    assert config["model"]["dim"] == get_algorithm("stacked").defaults["dim"] == 64
    assert config["federated"]["lr"] == engine["lr"]
    assert config["federated"]["negatives"] == engine["negatives"] == 1
    assert config["federated"]["patience"] == engine["patience"] == 10
    assert config["federated"]["rounds"] == 2


def _decoded(u) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """A kept upload as the server decodes it: the client's similarity or filter block."""
    t = u.tensors
    if "p" in t:
        return (t["p"].double() * t["lam"].double()) @ t["p"].double().T
    if "u" in t:
        return (t["u"].double() * t["s"].double()) @ t["vt"].double()
    return (t.get("similarity", t.get("filter"))).double()


@pytest.mark.parametrize("kw", [
    {}, {"upload_rank": 2}, {"scope": "local"}, {"scope": "local", "upload_rank": 2},
    {"models": (("gfcf", 1),), "filter_rank": 2}, {"models": (("gfcf", 1),), "filter_rank": 2, "upload_rank": 3},
])
def test_kept_uploads_are_each_clients_own_and_sum_to_the_round(split: Split, kw: dict) -> None:
    state = _state(split, **kw)
    folded = state.client_sums(UploadPath(), np.random.default_rng(0))
    keep: list = []
    _state(split, **kw).client_sums(UploadPath(), np.random.default_rng(0), keep)
    assert sorted(u.client for u in keep) == list(range(5))
    m = split.n_items
    total = torch.zeros(m, m, dtype=torch.float64)
    for u in keep:
        idx = torch.as_tensor(u.items)
        total[idx[:, None], idx[None, :]] += _decoded(u)
    want = folded.get("similarity", folded.get("filter"))
    torch.testing.assert_close(total, torch.as_tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    if not kw:  # a dense similarity upload is E_k E_kᵀ, and only the client's
        for stack in state.stacks:
            for c, client in enumerate(stack.clients):
                e = stack.params["item"][c].double()
                mine = next(u for u in keep if u.client == client)
                torch.testing.assert_close(mine.tensors["similarity"].double(), e @ e.T, rtol=1e-5, atol=1e-5)


def test_kept_waa_uploads_are_each_clients_parameters(split: Split) -> None:
    state = _state(split, models=(("mf", 3), ("mlp", 3)), aggregation="waa")
    keep: list = []
    state.client_sums(UploadPath(), np.random.default_rng(0), keep)
    assert sorted(u.client for u in keep) == list(range(5))
    for stack in state.stacks:
        for c, client in enumerate(stack.clients):
            mine = next(u for u in keep if u.client == client)
            assert set(mine.tensors) == set(stack.shared_names())  # never the user vectors
            for k, v in mine.tensors.items():
                assert torch.equal(v, stack.params[k][c])


def test_a_run_keeping_uploads_ends_as_one_that_folds_them(small_data) -> None:  # type: ignore[no-untyped-def]
    from fedrec.core.driver import run_rounds

    split = make_split(small_data, "ratio-full", seed=0)
    cfg = FederatedConfig(rounds=2, batch_size=64, negatives=1, lr=0.05)
    spec = CIASpec(models=(("mf", 8),), clients=6, finetune_steps=10)
    outs = []
    for keep in (False, True):
        alg = spec.algorithm(split, cfg, 0)
        alg.keep_uploads = keep
        outs.append(run_rounds(alg, split, rounds=2))
    for kept, folded in zip(outs[1].history, outs[0].history, strict=True):
        assert kept.valid == pytest.approx(folded.valid, rel=1e-5)
