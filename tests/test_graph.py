"""GPFedRec and GFed-PP: the engine equals a plain per-client, whole-table implementation.

The reference trains each client alone on its *whole* item table with autograd (BCE, plus
GPFedRec's reg x MSE over the table), plain SGD with the three learning rates, then runs the
server's graph step densely on the full tables. The engine trains touched rows only, rebuilds
untouched rows in closed form and runs the server step block by block, so agreement checks the
closed form, the row bookkeeping, the graphs and the block-wise aggregation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.federated.graph import state as graph_module
from fedrec.federated.graph.spec import GraphSpec
from fedrec.federated.graph.state import GraphState
from fedrec.federated.graph.user_graph import (
    FactoredGraph,
    Gram,
    graph_nnz,
    neighbour_graph,
    public_graph,
    public_users,
)
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-4, "atol": 2e-5}
LR, LR_ITEM, BATCH, EPOCHS, DIM, LAYERS = 0.1, 12.0, 8, 2, 6, (8, 4)


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(40, 260, mean_interactions=8, min_interactions=3, seed=3))
    return make_split(x, "loo-sampled", seed=0)


def _spec(name: str, **opts: Any) -> GraphSpec:
    alg = get_algorithm(name)
    spec = alg.build(None, {**alg.defaults, "dim": DIM, **opts})  # type: ignore[arg-type]
    return GraphSpec(**{**spec.__dict__, "layers": LAYERS})


def _state(spec: GraphSpec, split: Split) -> GraphState:
    return spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5,
                             seed=2, train=split.train)


def _cohort(split: Split, seed: int = 5) -> CohortBatches:
    rng = np.random.default_rng(seed)
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    return build_cohort(split.train, clients, negs, BATCH, rng.random((EPOCHS, int(counts.sum()) * 5)))


def _mlp(p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    x = torch.cat([p["user"].expand(len(v), -1), v], dim=1)
    for n in range(len(LAYERS)):
        x = F.relu(x @ p[f"W{n}"] + p[f"b{n}"])
    return x @ p["head_w"] + p["head_b"]


def _reference_client(spec: GraphSpec, state: GraphState, cohort: CohortBatches, k: int,
                      table: torch.Tensor, target: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Client ``k`` trained alone on its whole table (autograd, SGD); returns params and table."""
    client = int(cohort.clients[k])
    params = {name: state.private[name][client].clone() for name in state.spec.private_names()}
    items = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
    mine = cohort.sample_client == k
    local, labels = cohort.sample_row[mine] - cohort.row_ptr[k], cohort.sample_label[mine]
    per_epoch = len(local) // EPOCHS
    table = table.clone()
    for e in range(EPOCHS):
        for s in range(0, per_epoch, BATCH):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + BATCH, per_epoch))
            rows = items[torch.as_tensor(local[sl])]
            leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
            tab = table.detach().requires_grad_(True)
            loss = F.binary_cross_entropy_with_logits(_mlp(leaves, tab[rows]), torch.as_tensor(labels[sl]))
            if target is not None:
                loss = loss + spec.reg * F.mse_loss(tab, target)
            grads = torch.autograd.grad(loss, [*leaves.values(), tab])
            for (n, t), g in zip(leaves.items(), grads[:-1], strict=True):
                params[n] = t.detach() - (LR * spec.user_lr_scale if n == "user" else LR) * g
            table = table - LR_ITEM * grads[-1]
    return params, table


def _train_round(spec: GraphSpec, state: GraphState, cohort: CohortBatches, path: UploadPath | None = None) -> None:
    path = path or UploadPath()
    acc = state.begin_round(1)
    state.accumulate(acc, state.local_update(cohort, path))
    state.aggregate(acc, path, torch.Generator().manual_seed(0))


def _reference_round(spec: GraphSpec, split: Split, cohort: CohortBatches
                     ) -> tuple[GraphState, dict[int, dict[str, torch.Tensor]], torch.Tensor]:
    """A round 1 of the reference: every client's params and whole uploaded table ``(n, m, d)``."""
    before = _state(spec, split)
    start = before.items
    uploads = torch.empty((split.n_users, split.n_items, DIM))
    params = {}
    for k, client in enumerate(cohort.clients):
        target = start if spec.gpfedrec else None  # round 1: every p_i is the initial table
        params[int(client)], uploads[int(client)] = _reference_client(spec, before, cohort, k, start, target)
    return before, params, uploads


def _dense_gfedpp(spec: GraphSpec, split: Split, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The server step of GFed-PP on whole tables: every client's next starting table and q_g."""
    n = split.n_users
    public = public_users(n, spec.public_ratio, 2)
    r = torch.as_tensor(split.train.toarray() > 0, dtype=torch.float32)
    a = torch.zeros((n, n))
    if spec.ablation not in ("ugc", "iei"):
        pub = torch.as_tensor(public)
        a = (r @ r.T) * pub[:, None] * pub[None, :]
        a.fill_diagonal_(0)
    lonely = a.sum(1) == 0
    a[lonely, lonely] = 1.0
    d = a.sum(1).rsqrt()
    norm = d[:, None] * a * d[None, :]
    s = q.reshape(n, -1)
    for _ in range(spec.gcn_layers if spec.ablation not in ("ugc", "iei") else 1):
        s = norm @ s
    s = s.view_as(q)
    q_g = s.mean(0)
    alpha = 0.0 if spec.ablation == "upie" else spec.alpha
    start = q_g.expand_as(q).clone()
    start[torch.as_tensor(public)] = alpha * s[torch.as_tensor(public)] + (1 - alpha) * q_g
    if spec.ablation == "iei":
        start = q.clone()
    return start, q_g


def _check_clients(state: GraphState, params: dict[int, dict[str, torch.Tensor]]) -> None:
    for client, ref in params.items():
        for name, value in ref.items():
            torch.testing.assert_close(state.private[name][client], value, **TOL)


def _check_scores(state: GraphState, split: Split, params: dict[int, dict[str, torch.Tensor]],
                  uploads: torch.Tensor) -> None:
    """Between rounds each client scores with the very table it trained."""
    clients = np.arange(split.n_users)
    items = np.random.default_rng(0).integers(0, split.n_items, (split.n_users, 30))
    got = torch.as_tensor(state.scores(clients, items))
    want = torch.stack([_mlp(params[c], uploads[c][torch.as_tensor(items[c])]) for c in clients])
    torch.testing.assert_close(got, want, **TOL)


GFEDPP_CASES = [
    ("gfedpp", {}),
    ("gfedpp", {"public_ratio": 0.5, "alpha": 0.3, "gcn_layers": 2}),
    ("gfedpp", {"public_ratio": 0.0}),
    ("gfedpp-no-iei", {}),
    ("gfedpp-no-ugc", {"public_ratio": 0.6}),
    ("gfedpp-no-upie", {"public_ratio": 0.6}),
]


@pytest.mark.parametrize(("name", "opts"), GFEDPP_CASES)
def test_gfedpp_round_matches_whole_table_reference(split: Split, name: str, opts: dict[str, Any]) -> None:
    spec = _spec(name, **opts)
    cohort = _cohort(split)
    _, params, uploads = _reference_round(spec, split, cohort)
    state = _state(spec, split)
    _train_round(spec, state, cohort)
    _check_clients(state, params)
    _check_scores(state, split, params, uploads)

    start, q_g = _dense_gfedpp(spec, split, uploads)
    state.begin_round(2)  # the server step
    torch.testing.assert_close(state.items, q_g, **TOL)
    torch.testing.assert_close(state._base_block(0, split.n_items), start, **TOL)


@pytest.mark.parametrize("opts", [{}, {"similarity": "legacy-distance", "mp_layers": 2}, {"threshold": 1.02}])
def test_gpfedrec_round_matches_whole_table_reference(split: Split, opts: dict[str, Any]) -> None:
    spec = _spec("gpfedrec", reg=20.0, **opts)
    cohort = _cohort(split)
    _, params, uploads = _reference_round(spec, split, cohort)
    state = _state(spec, split)
    assert 0.2 < state.kappa < 0.5  # a real pull on the untouched rows, not a no-op
    _train_round(spec, state, cohort)
    _check_clients(state, params)
    _check_scores(state, split, params, uploads)

    n = split.n_users
    # the graph from the tables as the server holds them: one round's tables differ in few rows,
    # their cosines lie within ~1e-5 of the threshold, and float32 noise upstream would flip them
    owner, items, rows = state._flat_uploads()
    held = state._base_block(0, split.n_items)
    held[torch.as_tensor(owner), torch.as_tensor(items)] = rows
    torch.testing.assert_close(held, uploads, **TOL)
    flat = held.reshape(n, -1).double()
    cos = (flat @ flat.T) / (flat.norm(dim=1)[:, None] * flat.norm(dim=1)[None, :])
    value = cos if spec.similarity == "cosine" else 1 - cos
    chosen = value > spec.threshold * value.mean()
    chosen[~chosen.any(1), ~chosen.any(1)] = True
    g = chosen.double() / chosen.sum(1, keepdim=True)
    p = flat
    for _ in range(spec.mp_layers):
        p = g @ p
    state.begin_round(2)
    torch.testing.assert_close(state.table, p.float().view_as(uploads), **TOL)
    torch.testing.assert_close(state.items, p.float().view_as(uploads).mean(0), **TOL)
    assert state.round_extra()["neighbours"] == pytest.approx(float(chosen.sum(1).double().mean()))


def test_server_step_does_not_depend_on_the_block_size(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for block in (10**9, 6 * split.n_users * DIM * 4):  # one block; blocks of 6 items
        monkeypatch.setattr(graph_module, "BLOCK_BYTES", block)
        for name in ("gpfedrec", "gfedpp"):
            spec = _spec(name, **({"public_ratio": 0.5} if name == "gfedpp" else {}))
            state = _state(spec, split)
            _train_round(spec, state, _cohort(split))
            state.begin_round(2)
            results.append((state.items.clone(), None if state.table is None else state.table.clone()))
    for (a_items, a_table), (b_items, b_table) in zip(results[:2], results[2:], strict=True):
        torch.testing.assert_close(a_items, b_items, **TOL)
        if a_table is not None:
            torch.testing.assert_close(a_table, b_table, **TOL)


@pytest.mark.parametrize("blas", [True, False], ids=["cpu-syrk", "halves"])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_gram_over_column_blocks_is_the_whole_product(n: int, blas: bool) -> None:
    """GPFedRec's Gram matrix, accumulated block by block in one triangle (BLAS syrk on the
    CPU; two halves elsewhere), is x xᵀ of the whole table, symmetric."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 90, generator=gen, dtype=torch.float64) + 3.0
    gram = Gram(n)
    gram._cpu = blas  # the halves path is the one a GPU takes
    for block in x.split([40, 1, 49], dim=1):
        gram.add(block.contiguous())
    out = gram.result()
    torch.testing.assert_close(out, x @ x.T, rtol=1e-13, atol=1e-12)
    assert torch.equal(out, out.T)


def test_legacy_distance_picks_the_least_similar_users() -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(1, 50, generator=gen)
    tables = base + torch.randn(30, 50, generator=gen) * torch.linspace(0.05, 2.0, 30)[:, None]
    gram = tables @ tables.T
    _, intent = neighbour_graph(gram, "cosine", 1.0)
    _, legacy = neighbour_graph(gram, "legacy-distance", 1.0)
    assert intent["neighbour_similarity"] > intent["other_similarity"]
    assert legacy["neighbour_similarity"] < legacy["other_similarity"]


def test_public_graph_normalises_and_stays_sparse_when_sparse(split: Split) -> None:
    public = public_users(split.n_users, 0.75, 0)
    assert public.sum() == 30
    dense = public_graph(split.train, public, sparse_below=0.0, factor_above=math.inf)
    sparse = public_graph(split.train, public, sparse_below=1.1, factor_above=math.inf)
    assert sparse.layout == torch.sparse_csr and dense.layout == torch.strided
    torch.testing.assert_close(sparse.to_dense(), dense)
    r = torch.as_tensor(split.train[np.flatnonzero(public)].toarray() > 0, dtype=torch.float32)
    a = r @ r.T
    a.fill_diagonal_(0)
    a[a.sum(1) == 0, a.sum(1) == 0] = 1
    d = a.sum(1).rsqrt()
    torch.testing.assert_close(dense, d[:, None] * a * d[None, :])
    torch.testing.assert_close(dense, dense.T)


def test_the_factored_graph_multiplies_as_the_formed_one() -> None:
    # user 3 shares no item (a lonely self-loop), user 4 has none at all, user 0 shares with two
    train = sp.csr_matrix(np.array([[1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0],
                                    [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], np.float32))
    public = np.array([True, True, True, True, True, False])
    formed = public_graph(train, public, sparse_below=0.0, factor_above=math.inf)
    factored = public_graph(train, public, factor_above=0.0)
    assert isinstance(factored, FactoredGraph) and formed.layout == torch.strided
    assert graph_nnz(factored) == graph_nnz(formed) == 8  # 0-1, 0-2, 1-2 both ways, 3-3, 4-4
    torch.testing.assert_close(factored.to_dense(), formed)
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))  # > one block of columns
    torch.testing.assert_close(factored @ x, formed @ x)
    assert formed[3, 3] == formed[4, 4] == 1.0  # alone, a user keeps its own table


def test_ldp_noises_every_upload_and_counts_whole_tables(split: Split) -> None:
    spec = _spec("gfedpp")
    cohort = _cohort(split)
    plain, noisy = _state(spec, split), _state(spec, split)
    path = UploadPath(ldp=0.3)
    _train_round(spec, plain, cohort)
    acc = noisy.begin_round(1)
    up = noisy.local_update(cohort, path)
    assert up.bytes_up == split.n_users * split.n_items * DIM * 4
    noisy.accumulate(acc, up)
    noisy.aggregate(acc, path, torch.Generator().manual_seed(0))
    plain.begin_round(2)
    noisy.begin_round(2)
    diff = noisy.items - plain.items  # q_g: a mean of n independent Laplace(0, 0.3) per entry
    expected = 0.3 * np.sqrt(2 / split.n_users)
    assert float(diff.std()) == pytest.approx(expected, rel=0.15)


def test_needs_every_client_and_refuses_gaussian_dp(split: Split) -> None:
    spec = _spec("gpfedrec")
    cfg = FederatedConfig(rounds=2, clients_per_round=0.5, batch_size=BATCH, lr=LR, lr_item=LR_ITEM)
    with pytest.raises(FedrecError, match="clients-per-round 1"):
        run_federated(spec, split, cfg, seed=0)
    cfg = FederatedConfig(rounds=1, batch_size=BATCH, lr=LR, lr_item=LR_ITEM, dp_clip=1.0, dp_noise=1.0)
    with pytest.raises(FedrecError, match="--ldp"):
        run_federated(spec, split, cfg, seed=0)


@pytest.mark.parametrize("name", ["gpfedrec", "gfedpp"])
def test_resumed_run_equals_an_uninterrupted_one(split: Split, name: str, tmp_path: Any) -> None:
    spec = _spec(name, **({"public_ratio": 0.5} if name == "gfedpp" else {}))
    cfg = FederatedConfig(rounds=3, batch_size=BATCH, lr=LR, lr_item=LR_ITEM, checkpoint_every=1)
    whole = run_federated(spec, split, cfg, seed=1)
    ckpt = tmp_path / "ckpt.pt"
    run_federated(spec, split, FederatedConfig(**{**cfg.__dict__, "rounds": 2}), seed=1, checkpoint=ckpt)
    resumed = run_federated(spec, split, cfg, seed=1, checkpoint=ckpt, resume=True)
    assert [h.valid for h in resumed.history] == [h.valid for h in whole.history]
    assert resumed.test == whole.test


def test_gfedpp_learns_through_the_cli_and_records_its_graph(tmp_path: Any, capsys: Any) -> None:
    import json

    from fedrec.cli import main

    out = tmp_path / "gfedpp.json"
    argv = ["run", "gfedpp", "--dataset", "synthetic:150x400", "--rounds", "6", "--dim", "8",
            "--batch-size", "64", "--set", "public_ratio=0.6", "--set", "alpha=0.4", "--out", str(out), "-q"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["test"]["hr@10"] > 0.2  # chance is 0.10
    assert (result["config"]["model"]["public_ratio"], result["config"]["model"]["alpha"]) == (0.6, 0.4)
    assert (result["extra"]["public_users"], result["extra"]["private_users"]) == (90, 60)
    assert result["history"][0]["bytes_up"] > result["history"][1]["bytes_up"]  # interactions, once
    groups = result["extra"]["test_groups"]
    assert (groups["public"]["users"], groups["private"]["users"]) == (90, 60)
    mean = (90 * groups["public"]["hr@10"] + 60 * groups["private"]["hr@10"]) / 150
    assert mean == pytest.approx(result["test"]["hr@10"])

    argv = ["run", "gpfedrec", "--dataset", "synthetic:150x400", "--rounds", "2", "--dim", "32",
            "--set", "similarity=legacy-distance", "--out", str(out), "-q", "--overwrite"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0, capsys.readouterr().err
    extra = json.loads(out.read_text())["history"][1]["extra"]
    assert extra["neighbour_similarity"] < extra["other_similarity"]  # the official graph's fault
    # at dim 8 the default rates' MSE pull (lr_item x reg x 2 / (items x dim) = 2) overshoots
    with pytest.raises(SystemExit) as done:
        main([*argv[:6], "--dim", "8", *argv[8:]])
    assert done.value.code != 0 and "overshoots" in capsys.readouterr().err
