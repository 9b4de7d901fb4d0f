"""A slow, plain reference for the cohort-vectorised engine: one client at a time.

Each client is an ordinary ``nn.Module`` (its score function plus the item rows it downloaded)
trained with ``torch.optim.SGD``. Nothing here calls the batched `score`/`batch_loss` of
`fedrec.federated.family.model`, so agreement with `FamilyState` is evidence that the lockstep layout,
masking of short batches, the active-client prefix and the scatter-add aggregation are right.
It also gives `benchmarks/` a one-client-at-a-time baseline to time the engine against.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import torch
from torch import nn

from fedrec.core.plan import sample_clients
from fedrec.federated.engine import FederatedConfig, client_draws
from fedrec.federated.family.spec import FamilySpec
from fedrec.federated.family.state import FamilyState
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity


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
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
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


def export_scorer(scorer: nn.Module) -> dict[str, torch.Tensor]:
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


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def client_batches(cohort: CohortBatches, k: int, epochs: int, batch_size: int) -> Batches:
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


def train_client(spec: FamilySpec, model: ClientModel, batches: Batches, lr: float,
                 lr_item: float, epochs: int = 1) -> None:
    """FedRecon's user-only passes, then per batch one SGD step per phase, in order.

    A reconstruction epoch is one pass over the client's first local epoch of batches
    (``batches`` holds ``epochs`` epochs back to back, equally long). Phases: the score function (and the user vector unless reconstructed) then
    the item rows for dual personalisation; all of them in one step otherwise.
    """
    loss_fn = nn.MSELoss() if spec.loss == "mse" else nn.BCEWithLogitsLoss()
    user = [model.scorer.user] if hasattr(model.scorer, "user") else []
    dense = [p for name, p in model.scorer.named_parameters() if name != "user"]

    def step(opt: torch.optim.Optimizer, idx: torch.Tensor, y: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(idx), y).backward()
        opt.step()

    if spec.reconstruct_epochs:
        opt = torch.optim.SGD(user, lr=lr)
        for _ in range(spec.reconstruct_epochs):
            for idx, y in batches[: len(batches) // epochs]:
                step(opt, idx, y)
    score_params = dense + ([] if spec.reconstruct_epochs else user)
    groups = [[{"params": score_params, "lr": lr}], [{"params": [model.rows], "lr": lr_item}]]
    if not spec.dual:
        groups = [groups[0] + groups[1]]
    opts = [torch.optim.SGD([g for g in group if g["params"]]) for group in groups
            if any(g["params"] for g in group)]
    for idx, y in batches:
        for opt in opts:
            step(opt, idx, y)


@dataclass
class ReferenceState:
    """The reference's own copy of the simulation state; ``personal[u]`` = (items, rows)."""

    spec: FamilySpec
    items: torch.Tensor
    shared: dict[str, torch.Tensor]
    private: dict[str, torch.Tensor]
    lr: float
    lr_item: float
    round_start_items: torch.Tensor | None = None
    personal: dict[int, tuple[np.ndarray, torch.Tensor]] = field(default_factory=dict)

    @staticmethod
    def of(state: FamilyState) -> ReferenceState:
        """A deep copy of an engine state, so both can start from the same point."""
        personal = {}
        flat = state.personal.state()
        owner, items, rows = flat["owner"], flat["items"], flat["rows"]
        for u in np.unique(owner):
            sel = np.flatnonzero(owner == u)
            sel = sel[np.argsort(items[sel], kind="stable")]
            personal[int(u)] = (items[sel].copy(), rows[torch.as_tensor(sel)].clone())
        start = None if state.round_start_items is None else state.round_start_items.clone()
        return ReferenceState(state.spec, state.items.clone(), copy.deepcopy(state.shared),
                              copy.deepcopy(state.private), state.lr, state.lr_item, start,
                              personal)


@dataclass
class ClientUpload:
    """One client's upload: deltas of the rows it touched and its trained shared weights."""

    client: int
    items: np.ndarray
    delta: torch.Tensor
    shared: dict[str, torch.Tensor]
    accepted: bool


def reference_train(state: ReferenceState, cohort: CohortBatches, epochs: int, batch_size: int,
                    fresh_user: torch.Tensor | None = None, clip: float | None = None,
                    noise: Callable[[int], torch.Tensor] | None = None
                    ) -> tuple[ReferenceState, list[ClientUpload]]:
    """Train ``cohort``'s clients one at a time from ``state``; aggregate their uploads.

    ``noise(n)`` gives the sum of the LDP noise tables of the n accepted uploads. Returns the
    new state (``state`` is left unchanged) and every client's upload.
    """
    spec = state.spec
    new = copy.deepcopy(state)
    new.round_start_items = state.items.clone() if spec.dual else None
    uploads = []
    for k, client in enumerate(cohort.clients):
        items = cohort.row_items[cohort.rows_of(k)]
        start = {name: state.private[name][client] for name in spec.private_names()}
        start.update(state.shared)
        if fresh_user is not None:
            start["user"] = fresh_user[k]
        model = ClientModel(make_scorer(spec, start), state.items[torch.as_tensor(items)])
        train_client(spec, model, client_batches(cohort, k, epochs, batch_size), state.lr,
                     state.lr_item, epochs)
        trained = export_scorer(model.scorer)
        for name in spec.private_names():
            new.private[name][client] = trained[name]
        rows = model.rows.detach()
        if spec.dual:
            new.personal[int(client)] = (items.copy(), rows.clone())
        delta = rows - state.items[torch.as_tensor(items)]
        if clip is not None:
            delta = torch.stack([d * min(1.0, clip / max(float(d.norm()), 1e-12)) for d in delta])
        shared = {name: trained[name] for name in state.shared}
        ok = all(bool(torch.isfinite(t).all()) for t in [delta, *shared.values()])
        uploads.append(ClientUpload(int(client), items, delta, shared, ok))
    accepted = [up for up in uploads if up.accepted]
    if accepted:
        total = torch.zeros_like(state.items) if noise is None else noise(len(accepted))
        for up in accepted:
            for item, d in zip(up.items, up.delta, strict=True):
                total[int(item)] += d
        new.items = state.items + total / len(accepted)
        new.shared = {name: sum(up.shared[name] for up in accepted) / len(accepted)
                      for name in state.shared}
    return new, uploads


def reference_round(state: ReferenceState, split: Split, cfg: FederatedConfig, seed: int,
                    r: int) -> ReferenceState:
    """Round ``r`` of `run_federated` (same clients, negatives, shuffles, draws), unchunked."""
    spec = state.spec
    rng = np.random.default_rng([seed, r])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    sampled = sample_clients(split.n_users, cfg.clients_per_round, rng)
    cohort = order_by_activity(split.train, sampled)
    negs, keys, fresh = client_draws(spec, cfg, split.train, split.sampler, cohort, cohort, seed, r)
    batches = build_cohort(split.train, cohort, negs, cfg.batch_size, keys, ratings=spec.loss == "mse")

    def noise(n: int) -> torch.Tensor:
        return cfg.upload_path().noise_sum(n, tuple(state.items.shape), gen)

    return reference_train(state, batches, cfg.local_epochs, cfg.batch_size, fresh, cfg.clip,
                           noise)[0]


def client_rows(state: ReferenceState, client: int, items: np.ndarray) -> torch.Tensor:
    """The item rows ``client`` scores ``items`` with.

    A dual client sees its post-tuned rows for the items it touched in its latest round and the
    round-start table for the others; everyone else sees the global table.
    """
    dual = state.spec.dual and state.round_start_items is not None
    v = (state.round_start_items if dual else state.items)[torch.as_tensor(items)].clone()
    if state.spec.dual and client in state.personal:
        own = dict(zip(state.personal[client][0].tolist(), state.personal[client][1], strict=True))
        for j, item in enumerate(items.tolist()):
            if item in own:
                v[j] = own[item]
    return v


@torch.no_grad()
def reference_scores(state: ReferenceState, clients: np.ndarray,
                     items: np.ndarray | None) -> np.ndarray:
    """Scores like `FamilyState.scores`, one client at a time through its own module."""
    spec, n_items = state.spec, state.items.shape[0]
    out = np.empty((len(clients), n_items if items is None else items.shape[1]), np.float32)
    for k, client in enumerate(clients):
        wanted = np.arange(n_items) if items is None else items[k]
        values = {name: state.private[name][client] for name in spec.private_names()}
        scorer = make_scorer(spec, {**values, **state.shared})
        out[k] = scorer(client_rows(state, int(client), wanted)).cpu().numpy()
    return out


def time_reference_rounds(spec: FamilySpec, split: Split, cfg: FederatedConfig, rounds: int = 2,
                          seed: int = 0) -> float:
    """Seconds per round of training one client at a time (evaluation excluded)."""
    state = ReferenceState.of(FamilyState.create(spec, split.n_users, split.n_items, lr=cfg.lr,
                                                 lr_item=cfg.item_lr(split.n_items),
                                                 item_std=cfg.item_std, seed=seed))
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        state = reference_round(state, split, cfg, seed, r)
    return (time.perf_counter() - start) / rounds
