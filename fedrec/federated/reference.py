"""A slow, plain reference for the cohort-vectorised engine: one client at a time.

Each client is an ordinary ``nn.Module`` (its score function plus the item rows it downloaded)
trained with ``torch.optim.SGD``. Nothing here calls the batched `score`/`batch_loss` of
`fedrec.federated.family`, so agreement with `FamilyState` is evidence that the lockstep layout,
masking of short batches, the active-client prefix and the scatter-add aggregation are right.
It also gives `benchmarks/` a one-client-at-a-time baseline to time the engine against.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch import nn

from fedrec.federated.cohort import CohortBatches, build_cohort, order_by_activity
from fedrec.federated.engine import FederatedConfig, sample_clients
from fedrec.federated.family import FamilySpec
from fedrec.federated.state import FamilyState
from fedrec.protocols.protocol import Split


class DotScorer(nn.Module):
    """FedMF/FedRecon: logit = <user, item row>."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.user = nn.Parameter(torch.zeros(width))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return v @ self.user


class LinearScorer(nn.Module):
    """PFedRec: logit = Linear(d, 1)(item row)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.linear(v).squeeze(-1)


class NCFScorer(nn.Module):
    """FedNCF: GMF on the first half of the rows, an MLP tower on the second, a linear head."""

    def __init__(self, dim: int, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.dim = dim
        self.user = nn.Parameter(torch.zeros(2 * dim))
        widths = [2 * dim, *layers]
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.head = nn.Linear(dim + widths[-1], 1)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        d = self.dim
        gmf = self.user[:d] * v[:, :d]
        x = torch.cat([self.user[d:].expand(len(v), d), v[:, d:]], dim=1)
        for layer in self.mlp:
            x = torch.relu(layer(x))
        return self.head(torch.cat([gmf, x], dim=1)).squeeze(-1)


class ClientModel(nn.Module):
    """One client's model: its score function and its local copy of the rows it touches."""

    def __init__(self, scorer: nn.Module, rows: torch.Tensor) -> None:
        super().__init__()
        self.scorer = scorer
        self.rows = nn.Parameter(rows.clone())

    def forward(self, local: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.rows[local])


def make_scorer(spec: FamilySpec, values: dict[str, torch.Tensor]) -> nn.Module:
    """A scorer holding ``values`` (the engine's flat parameter names, one client's slice)."""
    scorer: nn.Module
    with torch.no_grad():
        if spec.score == "dot":
            scorer = DotScorer(spec.item_width)
            scorer.user.copy_(values["user"])
        elif spec.score == "linear":
            scorer = LinearScorer(spec.dim)
            scorer.linear.weight.copy_(values["w"][None])
            scorer.linear.bias.copy_(values["b"].reshape(1))
        else:
            scorer = NCFScorer(spec.dim, spec.layers)
            scorer.user.copy_(values["user"])
            for n, layer in enumerate(scorer.mlp):
                layer.weight.copy_(values[f"W{n}"].T)
                layer.bias.copy_(values[f"b{n}"])
            scorer.head.weight.copy_(values["head_w"][None])
            scorer.head.bias.copy_(values["head_b"].reshape(1))
    return scorer


def export_scorer(spec: FamilySpec, scorer: nn.Module) -> dict[str, torch.Tensor]:
    """Inverse of `make_scorer`: the scorer's weights under the engine's names."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(scorer, DotScorer | NCFScorer):
        out["user"] = scorer.user.detach().clone()
    if isinstance(scorer, LinearScorer):
        out["w"] = scorer.linear.weight.detach()[0].clone()
        out["b"] = scorer.linear.bias.detach()[0].clone()
    if isinstance(scorer, NCFScorer):
        for n, layer in enumerate(scorer.mlp):
            out[f"W{n}"] = layer.weight.detach().T.clone()
            out[f"b{n}"] = layer.bias.detach().clone()
        out["head_w"] = scorer.head.weight.detach()[0].clone()
        out["head_b"] = scorer.head.bias.detach()[0].clone()
    return out


def client_batches(cohort: CohortBatches, k: int, epochs: int,
                   batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Client ``k``'s minibatches (local row index, label), epoch after epoch."""
    mine = cohort.sample_client == k
    rows = cohort.sample_row[mine] - cohort.row_ptr[k]
    labels = cohort.sample_label[mine]
    per_epoch = len(rows) // epochs
    out = []
    for e in range(epochs):
        for s in range(e * per_epoch, (e + 1) * per_epoch, batch_size):
            end = min(s + batch_size, (e + 1) * per_epoch)
            out.append((torch.as_tensor(rows[s:end]), torch.as_tensor(labels[s:end])))
    return out


def train_client(spec: FamilySpec, model: ClientModel, batches: list[tuple[torch.Tensor, torch.Tensor]],
                 lr: float, lr_item: float) -> None:
    """FedRecon's user-only passes, then per batch one SGD step per phase, in order."""
    bce = nn.BCEWithLogitsLoss()
    user = [model.scorer.user] if hasattr(model.scorer, "user") else []
    dense = [p for name, p in model.scorer.named_parameters() if name != "user"]

    def step(opt: torch.optim.Optimizer, idx: torch.Tensor, y: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        bce(model(idx), y).backward()
        opt.step()

    if spec.reconstruct:
        opt = torch.optim.SGD(user, lr=lr)
        for _ in range(spec.reconstruct):
            for idx, y in batches:
                step(opt, idx, y)
    score_params = dense + ([] if spec.reconstruct else user)
    groups = [[{"params": score_params, "lr": lr}], [{"params": [model.rows], "lr": lr_item}]]
    if not spec.dual:
        groups = [groups[0] + groups[1]]
    opts = [torch.optim.SGD([g for g in group if g["params"]]) for group in groups
            if any(g["params"] for g in group)]
    for idx, y in batches:
        for opt in opts:
            step(opt, idx, y)


def reference_train(state: FamilyState, cohort: CohortBatches, epochs: int, batch_size: int,
                    fresh_user: torch.Tensor | None = None, clip: float | None = None,
                    noise: torch.Tensor | None = None) -> FamilyState:
    """Train ``cohort``'s clients one at a time from ``state``; return the aggregated new state.

    ``noise`` is the sum of the clients' LDP noise tables. ``state`` is not modified.
    """
    spec, new = state.spec, copy.deepcopy(state)
    new.round_start_items = state.items.clone() if spec.dual else None
    item_sum = torch.zeros_like(state.items)
    shared_sum = {k: torch.zeros_like(v) for k, v in state.shared.items()}
    n_ok = 0
    for k, client in enumerate(cohort.clients):
        items = cohort.row_items[cohort.rows_of(k)]
        start = {name: state.private[name][client] for name in spec.private_names()}
        start.update(state.shared)
        if fresh_user is not None:
            start["user"] = fresh_user[k]
        model = ClientModel(make_scorer(spec, start), state.items[torch.as_tensor(items)])
        train_client(spec, model, client_batches(cohort, k, epochs, batch_size), state.lr,
                     state.lr_item)
        trained = export_scorer(spec, model.scorer)
        for name in spec.private_names():
            new.private[name][client] = trained[name]
        rows = model.rows.detach()
        if spec.dual:
            new.personal_items[client] = items
            new.personal_rows[client] = rows.clone()
        delta = rows - state.items[torch.as_tensor(items)]
        if clip is not None:
            delta = torch.stack([d * min(1.0, clip / max(float(d.norm()), 1e-12)) for d in delta])
        shared = {name: trained[name] for name in state.shared}
        if not all(torch.isfinite(t).all() for t in [delta, *shared.values()]):
            continue
        n_ok += 1
        for item, d in zip(items, delta, strict=True):
            item_sum[int(item)] += d
        for name, v in shared.items():
            shared_sum[name] += v
    if n_ok:
        total = item_sum if noise is None else item_sum + noise
        new.items = state.items + total / n_ok
        new.shared = {name: v / n_ok for name, v in shared_sum.items()}
    return new


def reference_round(state: FamilyState, split: Split, cfg: FederatedConfig, seed: int,
                    r: int) -> FamilyState:
    """Round ``r`` of `run_federated` (same clients, negatives, shuffles, draws), unchunked."""
    spec = state.spec
    rng = np.random.default_rng([seed, r])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    cohort = order_by_activity(split.train, sample_clients(split.n_users, cfg.clients_per_round, rng))
    counts = np.diff(split.train.indptr)[cohort]
    negs = split.sample_negatives(np.repeat(cohort, counts), cfg.negatives, rng) if cfg.negatives else None
    keys = rng.random((cfg.local_epochs, int((counts * (1 + cfg.negatives)).sum())))
    fresh = None
    if spec.reconstruct:
        fresh = torch.randn((len(cohort), spec.item_width), generator=gen) * cfg.item_std
    batches = build_cohort(split.train, cohort, negs, cfg.batch_size, keys)
    new = reference_train(state, batches, cfg.local_epochs, cfg.batch_size, fresh, cfg.clip)
    n_ok = len(cohort)
    if cfg.ldp > 0 and n_ok:
        noise = cfg.upload_path.noise_sum(n_ok, tuple(state.items.shape), gen)
        new.items = new.items + noise / n_ok
    return new


@torch.no_grad()
def reference_scores(state: FamilyState, clients: np.ndarray, items: np.ndarray | None) -> np.ndarray:
    """Scores like `FamilyState.scores`, one client at a time through its own module.

    A dual client sees its post-tuned rows for the items it touched in its last round and the
    round-start table for the others.
    """
    spec = state.spec
    n_items = state.items.shape[0]
    base = state.round_start_items if spec.dual and state.round_start_items is not None else state.items
    out = np.empty((len(clients), n_items if items is None else items.shape[1]), np.float32)
    for k, client in enumerate(clients):
        wanted = np.arange(n_items) if items is None else items[k]
        values = {name: state.private[name][client] for name in spec.private_names()}
        scorer = make_scorer(spec, {**values, **state.shared})
        v = base[torch.as_tensor(wanted)].clone()
        if spec.dual:
            own = {int(i): row for i, row in zip(state.personal_items[client],
                                                 state.personal_rows[client], strict=True)}
            for j, item in enumerate(wanted):
                if int(item) in own:
                    v[j] = own[int(item)]
        out[k] = scorer(v).numpy()
    return out


def time_reference_rounds(spec: FamilySpec, split: Split, cfg: FederatedConfig, rounds: int = 2,
                          seed: int = 0) -> float:
    """Seconds per round of training one client at a time (evaluation excluded)."""
    n_items = split.n_items
    scale = cfg.item_lr_scale if cfg.item_lr_scale is not None else n_items * 80.0
    lr_item = cfg.lr_item if cfg.lr_item is not None else cfg.lr * scale
    state = FamilyState.create(spec, split.n_users, n_items, lr=cfg.lr, lr_item=lr_item,
                               item_std=cfg.item_std, seed=seed)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        state = reference_round(state, split, cfg, seed, r)
    return (time.perf_counter() - start) / rounds
