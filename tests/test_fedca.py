"""FedCA: the composite weights' closed form against a QP solver, the similarity and
complementarity on cases with known answers, the vectorised round against clients trained one at
a time with ``torch.optim.Adam`` on whole tables, the FedAvg switch, and runs end to end."""

from __future__ import annotations

import copy
import dataclasses
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
from fedrec.federated.ca import state as ca_state
from fedrec.federated.ca.composite import (
    complementarity,
    composite_weights,
    principal_basis,
    project_simplex,
    similarity,
)
from fedrec.federated.ca.state import CAState, mixtures, sparse_product
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds import draws
from fedrec.rounds.cohort import build_cohort, chunk_clients


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(30, 120, mean_interactions=10, min_interactions=4, seed=7))
    return make_split(x, "loo-full", seed=0)


def _spec(name: str = "fedca", **opts: Any) -> Any:
    alg = get_algorithm(name)
    return alg.build(None, {**alg.defaults, "dim": 6, **opts})  # type: ignore[arg-type]


def _cfg(**kw: Any) -> FederatedConfig:
    return FederatedConfig(**{"lr": 0.05, "local_epochs": 2, "batch_size": 8, "negatives": 2,
                              "rounds": 2, **kw})


# ---- the server's step ---------------------------------------------------------------------


def test_simplex_projection_solves_the_official_quadratic_programme() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(size=7) * rng.choice([0.1, 1.0, 5.0])
        x = project_simplex(torch.as_tensor(v)[None])[0].numpy()
        # min x'x - 2 v'x  s.t. x >= 0, sum x = 1 (what cvxpy solves in the official code): its
        # KKT conditions say x = max(v - t, 0) for one threshold t, and no point of the simplex
        # does better
        on = x > 0
        t = v[on] - x[on]
        assert np.ptp(t) < 1e-12 and (v[~on] <= t[0] + 1e-12).all()
        others = rng.dirichlet(np.ones(7), size=2000)
        assert (x @ x - 2 * v @ x) <= (np.einsum("nd,nd->n", others, others) - 2 * others @ v).min() + 1e-12
        assert x.min() >= 0 and abs(x.sum() - 1) < 1e-12
    p = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    assert torch.equal(project_simplex(p), p)  # a point of the simplex is its own projection


def test_fedavg_switch_gives_every_row_the_sample_shares() -> None:
    samples = torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64)
    c = torch.rand(3, 3, dtype=torch.float64)
    w = composite_weights(samples, c, c.T, 0.0, 0.0)
    torch.testing.assert_close(w, torch.tensor([[0.1, 0.3, 0.6]] * 3, dtype=torch.float64))
    w = composite_weights(samples, c, c.T, 0.3, 0.3)  # composite: rows differ, still on the simplex
    assert not torch.allclose(w[0], w[1]) and torch.allclose(w.sum(1), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("name", ["fedca", "fedca-ncf"])
def test_mixtures_mix_each_distinct_row_once_with_the_whole_products_sums(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of weights that repeat (every row, under the FedAvg switch) are mixed once; on the
    CPU each client's mixture is bit for bit the one a product over every row gives, in the
    clients' order (tables, and the NCF backbone's tower)."""
    spec = _spec(name)
    gen = torch.Generator().manual_seed(0)
    own = {"tables": torch.randn(5, 7, 6, generator=gen),
           **{f"score.{k}": torch.randn(5, *v, generator=gen) for k, v in spec.model.score_shapes().items()}}
    distinct = project_simplex(torch.rand(3, 5, generator=gen, dtype=torch.float64))
    keep = spec.interpolation
    mixed: list[int] = []  # the rows of weights each product takes
    product = torch.sparse.mm

    def counting(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        mixed.append(a.shape[0])
        return product(a, b)

    for w, rows in ((distinct[[0, 1, 0, 2, 1]], 3), (distinct[[2, 0, 1, 1, 2]], 3), (distinct[[1] * 5], 1),
                    (project_simplex(torch.rand(5, 5, generator=gen, dtype=torch.float64)), 5)):
        mixed.clear()
        with monkeypatch.context() as m:
            m.setattr(torch.sparse, "mm", counting)
            got = mixtures(spec, own, w)
        assert mixed == [rows] * len(own)
        for k, v in own.items():
            flat = v.reshape(5, -1)
            whole = product(w.to(v.dtype).to_sparse(), flat).reshape(v.shape)
            assert torch.equal(got[k], whole.mul_(1 - keep).add_(v, alpha=keep)), k
            torch.testing.assert_close(got[k], ((1 - keep) * (w.to(v.dtype) @ flat)).reshape(v.shape) + keep * v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpu_mixture_in_column_blocks_is_bitwise_the_whole_product(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sparse_product` takes the clients' tables in column blocks on the CPU (a ragged last
    block included): every entry is the one call's sum, bit for bit, with weights summing to 1
    a row as the simplex gives and a row of one weight."""
    gen = torch.Generator().manual_seed(1)
    w = project_simplex(torch.randn(9, 9, generator=gen, dtype=torch.float64) * 3).to(dtype)
    w[4] = 0.0
    w[4, 2] = 1.0
    x = (torch.randn(9, 103, generator=gen, dtype=torch.float64) * 10).to(dtype)
    whole = torch.sparse.mm(w.to_sparse(), x)
    calls: list[int] = []
    product = torch.sparse.mm

    def counting(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(b.shape[1])
        return product(a, b)

    monkeypatch.setattr(ca_state, "PRODUCT_COLUMNS", 10)
    monkeypatch.setattr(torch.sparse, "mm", counting)
    got = sparse_product(w.to_sparse(), x)
    assert calls == [10] * 10 + [3]
    assert torch.equal(got, whole)
    assert torch.equal(got[4], x[2])


def test_complementarity_is_the_cosine_of_the_mean_principal_angle() -> None:
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    a = q[:, :2].T  # a 2-dim subspace of R^6
    rot = torch.tensor([[math.cos(0.7), math.sin(0.7)], [-math.sin(0.7), math.cos(0.7)]], dtype=torch.float64)
    same = -(rot @ a)  # the same subspace, another basis (rotated, signs flipped)
    orth = q[:, 2:4].T  # orthogonal to it
    tilted = torch.stack([a[0], math.cos(0.5) * a[1] + math.sin(0.5) * q[:, 4]])  # angles 0 and 0.5
    c = complementarity(torch.stack([a, same, orth, tilted]))
    assert float(c[0, 1]) == pytest.approx(1.0, abs=1e-6)
    assert float(c[0, 2]) == pytest.approx(0.0, abs=1e-6)
    assert float(c[0, 3]) == pytest.approx(math.cos(0.25), abs=1e-6)
    torch.testing.assert_close(c, c.T)


def test_principal_basis_is_orthonormal_and_pads_few_rows() -> None:
    rows = torch.randn(40, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    b = principal_basis(rows, 3)
    torch.testing.assert_close(b @ b.T, torch.eye(3, dtype=torch.float64))
    assert torch.equal(principal_basis(rows[:1], 3), torch.zeros(3, 5, dtype=torch.float64))
    assert principal_basis(rows[:3], 4)[3].abs().sum() == 0  # 3 centred rows span at most 2 directions (+1 noise)


def test_similarity_is_one_for_equal_moves_and_falls_with_distance() -> None:
    gen = torch.Generator().manual_seed(2)
    start = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    moved = start + 0.5 * torch.randn(50, 4, generator=gen, dtype=torch.float64)
    far = start + 5.0 * torch.randn(50, 4, generator=gen, dtype=torch.float64)
    s = similarity(torch.stack([moved, moved.clone(), far]), start)
    assert float(s[0, 1]) == 1.0 and float(s[0, 0]) == 1.0
    assert 0 < float(s[0, 2]) < 0.9
    torch.testing.assert_close(s, s.T)


# ---- the clients' training -------------------------------------------------------------------


def _alone(state: CAState, spec: Any, cfg: FederatedConfig, client: int, r: int) -> dict[str, torch.Tensor]:
    """``client`` trained alone for round ``r``: a whole item table and its score weights as
    leaves of one ``torch.optim.Adam`` (the official code's client), on the samples in the
    order the round's layout gives them."""
    split = state.split
    clients = np.array([client])
    counts = np.diff(split.train.indptr)[clients] * (1 + cfg.negatives)
    from fedrec.federated.engine import client_negatives

    negs = client_negatives(cfg.negatives, split.train, split.sampler, clients, clients, state.seed, r)
    keys = np.stack([draws.uniforms((state.seed, draws.SHUFFLE, r, e), clients, counts)
                     for e in range(cfg.local_epochs)])
    layout = build_cohort(split.train, clients, negs, cfg.batch_size, keys)
    items = torch.as_tensor(layout.row_items)
    table = state.tables[client].clone().requires_grad_(True)
    p = {k: v[client].clone().requires_grad_(True) for k, v in state.params.items()}
    tower = [v for k, v in p.items() if k != "user"]
    groups = [{"params": [table, p["user"]]}]
    if tower:
        groups.append({"params": tower, "weight_decay": spec.weight_decay})
    opt = torch.optim.Adam(groups, lr=cfg.lr)
    per_epoch = len(layout.sample_row) // cfg.local_epochs
    for e in range(cfg.local_epochs):
        for s in range(0, per_epoch, cfg.batch_size):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + cfg.batch_size, per_epoch))
            v = table[items[torch.as_tensor(layout.sample_row[sl])]]
            y = torch.as_tensor(layout.sample_label[sl])
            if spec.backbone == "fcf":
                logits = v @ p["user"]
            else:
                x = torch.cat([p["user"].expand(len(v), -1), v], 1)
                for j in range(len(spec.layers)):
                    x = torch.relu(x @ p[f"W{j}"] + p[f"b{j}"])
                logits = x @ p["head_w"] + p["head_b"]
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(logits, y).backward()
            opt.step()
    return {"table": table.detach(), **{k: v.detach() for k, v in p.items()}}


@pytest.mark.parametrize("backbone", ["fcf", "ncf"])
def test_a_round_trains_each_client_as_adam_on_its_whole_table(split: Split, backbone: str) -> None:
    spec = _spec("fedca" if backbone == "fcf" else "fedca-ncf", layers=(5, 3))
    cfg = _cfg()
    state = CAState(spec, split, cfg, seed=3)
    # clients that differ (one aggregation would otherwise leave every table equal but its rows)
    state.tables += 0.1 * torch.randn(state.tables.shape, generator=torch.Generator().manual_seed(4))
    clients = np.arange(0, split.n_users, 2)
    want = {c: _alone(state, spec, cfg, int(c), r=2) for c in (int(clients[0]), int(clients[-1]))}
    before = state.tables.clone()
    _, batches, trained = state.train(clients, cfg, r=2)
    assert batches > len(clients)
    for c, ref in want.items():
        # float round-off, amplified by Adam's division: 2e-6 at most here
        torch.testing.assert_close(state.tables[c], ref["table"], rtol=1e-4, atol=1e-5)
        for k in state.params:
            torch.testing.assert_close(state.params[k][c], ref[k], rtol=1e-4, atol=1e-5)
        # rows a client did not touch this round did not move
        other = np.setdiff1d(np.arange(split.n_items), trained[c])
        assert len(other) and torch.equal(state.tables[c, other], before[c, other])
        assert not torch.equal(state.tables[c], before[c])
    assert torch.equal(state.tables[1], before[1])  # not sampled: not trained


def test_chunks_of_a_cohort_train_it_as_one(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cfg = _spec(), _cfg()
    whole, cut = CAState(spec, split, cfg, seed=1), CAState(spec, split, cfg, seed=1)
    clients = np.arange(split.n_users)
    whole.train(clients, cfg, r=1)
    monkeypatch.setattr("fedrec.federated.ca.state.CHUNK_ROWS", 64)
    assert len(chunk_clients(clients, np.full(len(clients), 40), 64)) == len(clients)
    cut.train(clients, cfg, r=1)
    torch.testing.assert_close(whole.tables, cut.tables)


def test_aggregation_mixes_only_the_aggregated_clients(split: Split) -> None:
    spec, cfg = _spec(aggregated=0.3), _cfg()
    alg = spec.algorithm(split, cfg, seed=0)
    plan = alg.plan(1)
    uploads = alg.local_update(plan)
    members, up, _ = uploads.payload
    assert len(members) == int(split.n_users * 0.3)
    before = alg.state.tables.clone()
    alg.aggregate(uploads, plan)
    moved = (alg.state.tables != before).flatten(1).any(1).numpy()
    assert set(np.flatnonzero(moved)) <= set(members.tolist()) and moved[members].all()
    # the FedAvg switch: every aggregated client takes the same mean
    fed = _spec(aggregated=0.3, aggregation="fedavg").algorithm(split, cfg, seed=0)
    uploads = fed.local_update(fed.plan(1))
    members, up, _ = uploads.payload
    own = up["tables"].clone()
    fed.aggregate(uploads, fed.plan(1))
    share = up["samples"] / up["samples"].sum()
    mean = torch.einsum("j,jmd->md", share.float(), own)
    keep = fed.state.spec.interpolation
    torch.testing.assert_close(fed.state.tables[torch.as_tensor(members)], keep * own + (1 - keep) * mean)


def test_runs_end_to_end_and_refuses_what_it_cannot_take(split: Split) -> None:
    for name in ("fedca", "fedca-ncf"):
        spec = _spec(name, aggregated=0.5)
        out = run_federated(spec, split, _cfg(rounds=3), seed=0)
        assert len(out.history) == 3 and all(math.isfinite(h.loss) for h in out.history)
        assert out.history[0].bytes_down > out.history[1].bytes_down > 0  # the start goes down once
        assert out.history[1].extra["aggregated"] == int(split.n_users * 0.5)
    with pytest.raises(FedrecError, match="no noise"):
        _spec().algorithm(split, _cfg(ldp=1.0), seed=0)
    with pytest.raises(FedrecError, match="aggregated"):
        _spec(aggregated=0.0)
    with pytest.raises(FedrecError, match="backbone"):
        dataclasses.replace(_spec(), backbone="lightgcn")


def test_checkpoint_round_trip_continues_the_run(split: Split) -> None:
    spec, cfg = _spec(aggregated=0.5), _cfg()
    a = spec.algorithm(split, cfg, seed=0)
    a.train_round(1)
    blob = a.state_dict()
    b = spec.algorithm(split, cfg, seed=0)
    b.load_state_dict(copy.deepcopy(blob))
    a.train_round(2)
    b.train_round(2)
    torch.testing.assert_close(a.state.tables, b.state.tables)
    users = np.arange(split.n_users)
    np.testing.assert_array_equal(a.scores(users, None), b.scores(users, None))


def test_kept_uploads_show_the_server_exactly_each_clients_step(split: Split) -> None:
    """What a privacy audit reads: an aggregated client's table less the server's last copy of
    it, non-zero on exactly the rows the client trained since then (every client aggregated
    every round: the round's rows)."""
    from fedrec.federated.family.model import ITEMS

    alg = _spec(aggregated=1.0).algorithm(split, _cfg(), seed=0)
    alg.keep_uploads = True
    for r in (1, 2):
        plan = alg.plan(r)
        trained = {}
        original = alg.state.train

        def spy(clients, cfg, rr, original=original, trained=trained):  # type: ignore[no-untyped-def]
            out = original(clients, cfg, rr)
            trained.update(out[2])
            return out

        alg.state.train = spy  # type: ignore[method-assign]
        uploads = alg.local_update(plan)
        alg.state.train = original  # type: ignore[method-assign]
        assert uploads.per_client is not None and len(uploads.per_client) == len(trained)
        for u in uploads.per_client:
            moved = np.flatnonzero(u.tensors[ITEMS].abs().sum(1).numpy() > 0)
            np.testing.assert_array_equal(moved, np.sort(trained[u.client]))
        alg.aggregate(uploads, plan)


def test_user_vectors_start_common_as_in_the_official_code_or_each_its_own(split: Split) -> None:
    """``user_start=common``: every client, a deployment's node's block of them and a malicious
    client start from one vector drawn from the seed; ``own``: each from its own, keyed by id."""
    spec = _spec()
    state = CAState(spec, split, _cfg(), seed=0)
    start = state.params["user"]
    assert spec.user_start == "common"
    torch.testing.assert_close(start, start[:1].expand_as(start))
    node = CAState(spec, split, _cfg(), seed=0, client_ids=np.arange(5, 5 + split.n_users))
    torch.testing.assert_close(node.params["user"], start)
    state.admit_attackers(2)
    torch.testing.assert_close(state.params["user"][-2:], start[:2])
    assert not torch.equal(CAState(spec, split, _cfg(), seed=1).params["user"][0], start[0])

    own = CAState(_spec(user_start="own"), split, _cfg(), seed=0).params["user"]
    assert torch.unique(own, dim=0).shape[0] == split.n_users
    with pytest.raises(FedrecError, match="user_start"):
        _spec(user_start="shared")
