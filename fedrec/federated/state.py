"""Server and client state of the item-embedding family, and its batched algorithm steps.

`FamilyState` implements the DESIGN interface in batched form: `local_update` trains a cohort
(all its clients at once) and returns their uploads; `aggregate` folds uploads into the
global state; `scores` serves evaluation. Private parameters live in one ``(n_clients, ...)``
store per name, gathered for a cohort and scattered back after training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedrec.federated.cohort import CohortBatches
from fedrec.federated.family import ITEMS, FamilySpec, batch_loss, init_params, score
from fedrec.federated.upload import FLOAT_BYTES, UploadPath


@dataclass
class CohortUpload:
    """What a cohort sends: post-training item rows (as deltas) and shared dense parameters."""

    cohort: CohortBatches
    delta: torch.Tensor
    shared: dict[str, torch.Tensor]
    accepted: torch.Tensor
    bytes_up: int
    bytes_down: int
    loss_sum: float
    client_batches: int


@dataclass
class Accumulator:
    """Running sums of a round's accepted uploads (the server never holds one table per client)."""

    item_sum: torch.Tensor
    shared_sum: dict[str, torch.Tensor]
    n: int = 0
    rejected: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    loss_sum: float = 0.0
    client_batches: int = 0


@dataclass
class FamilyState:
    """Global item table, shared dense parameters, private stores and personalised rows."""

    spec: FamilySpec
    items: torch.Tensor
    shared: dict[str, torch.Tensor]
    private: dict[str, torch.Tensor]
    lr: float
    lr_item: float
    item_std: float
    round_start_items: torch.Tensor | None = None
    personal_items: list[np.ndarray] = field(default_factory=list)
    personal_rows: list[torch.Tensor] = field(default_factory=list)

    @staticmethod
    def create(spec: FamilySpec, n_clients: int, n_items: int, *, lr: float, lr_item: float,
               item_std: float, seed: int) -> FamilyState:
        gen = torch.Generator().manual_seed(seed)
        items = torch.randn((n_items, spec.item_width), generator=gen) * item_std
        shared = {k: v[0] for k, v in init_params(spec, spec.shared_names(), 1, gen, item_std).items()}
        private = init_params(spec, spec.private_names(), n_clients, gen, item_std)
        empty = np.zeros(0, np.int64)
        return FamilyState(
            spec, items, shared, private, lr, lr_item, item_std,
            personal_items=[empty] * n_clients,
            personal_rows=[torch.zeros((0, spec.item_width))] * n_clients,
        )

    # -- one round -------------------------------------------------------------------------

    def begin_round(self) -> Accumulator:
        self.round_start_items = self.items.clone() if self.spec.dual else None
        return Accumulator(
            torch.zeros_like(self.items), {k: torch.zeros_like(v) for k, v in self.shared.items()}
        )

    def local_update(self, cohort: CohortBatches, path: UploadPath,
                     fresh_user: torch.Tensor | None = None) -> CohortUpload:
        """Train every client of ``cohort`` at once; keep private state; return the uploads.

        ``fresh_user`` re-initialises the user vectors (FedRecon's reconstruction).
        """
        spec, clients = self.spec, torch.as_tensor(cohort.clients)
        c = len(cohort.clients)
        row_items = torch.as_tensor(cohort.row_items)
        rows = self.items[row_items].clone().requires_grad_(True)
        params = {k: self.private[k][clients].clone() for k in spec.private_names()}
        params.update({k: v.expand(c, *v.shape).clone() for k, v in self.shared.items()})
        if fresh_user is not None:
            params["user"] = fresh_user.clone()
        for t in params.values():
            t.requires_grad_(True)
        every = {**params, ITEMS: rows}
        steps = [(torch.as_tensor(s.rows), torch.as_tensor(s.labels), torch.as_tensor(s.mask))
                 for s in cohort.steps]
        for _ in range(spec.reconstruct):
            for idx, y, m in steps:
                self._sgd(every, ["user"], idx, y, m)
        loss_sum = 0.0
        for idx, y, m in steps:
            for phase in spec.phases():
                loss_sum_step = self._sgd(every, phase, idx, y, m)
            loss_sum += loss_sum_step

        with torch.no_grad():
            for k in spec.private_names():
                self.private[k][clients] = params[k].detach()
            if spec.dual:
                for k in range(c):
                    sl = cohort.rows_of(k)
                    self.personal_items[cohort.clients[k]] = cohort.row_items[sl]
                    self.personal_rows[cohort.clients[k]] = rows[sl].detach().clone()
            delta = path.clip_rows(rows.detach() - self.items[row_items])
            counts = torch.as_tensor(np.diff(cohort.row_ptr))
            finite = torch.isfinite(delta).all(1).float()
            bad_rows = torch.zeros(c).index_add_(0, torch.repeat_interleave(torch.arange(c), counts), 1 - finite)
            accepted = bad_rows == 0
            for k in self.shared:
                accepted &= torch.isfinite(params[k].detach().reshape(c, -1)).all(1)
            shared = {k: params[k].detach() for k in self.shared}
            shared_floats = sum(v.numel() for v in self.shared.values())
            width = spec.item_width
            up = path.item_bytes(counts, self.items.shape[0], width) + c * shared_floats * FLOAT_BYTES
            down = int(counts.sum()) * width * FLOAT_BYTES + c * shared_floats * FLOAT_BYTES
        n_batches = sum(s.n_active for s in cohort.steps)
        return CohortUpload(cohort, delta, shared, accepted, up, down, loss_sum, n_batches)

    def _sgd(self, every: dict[str, torch.Tensor], names: list[str], idx: torch.Tensor,
             y: torch.Tensor, m: torch.Tensor) -> float:
        """One plain-SGD step on ``names`` (others held fixed); returns the loss before it."""
        p = {k: v for k, v in every.items() if k != ITEMS}
        loss = batch_loss(self.spec, p, every[ITEMS], idx, y, m)
        grads = torch.autograd.grad(loss, [every[k] for k in names])
        with torch.no_grad():
            for k, g in zip(names, grads, strict=True):
                every[k].sub_(g, alpha=self.lr_item if k == ITEMS else self.lr)
        return float(loss.detach())

    def accumulate(self, acc: Accumulator, up: CohortUpload) -> None:
        """Add a cohort's accepted uploads to the round's running sums (scatter-add of rows)."""
        counts = np.diff(up.cohort.row_ptr)
        keep_rows = torch.repeat_interleave(up.accepted, torch.as_tensor(counts))
        items = torch.as_tensor(up.cohort.row_items)[keep_rows]
        acc.item_sum.index_add_(0, items, up.delta[keep_rows])
        for k, v in up.shared.items():
            acc.shared_sum[k] += v[up.accepted].sum(0)
        n_ok = int(up.accepted.sum())
        acc.n += n_ok
        acc.rejected += len(up.accepted) - n_ok
        acc.bytes_up += up.bytes_up
        acc.bytes_down += up.bytes_down
        acc.loss_sum += up.loss_sum
        acc.client_batches += up.client_batches

    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None:
        """Mean of the accepted clients' tables = global + (sum of row deltas + noise) / n."""
        if acc.n == 0:
            return
        noise = path.noise_sum(acc.n, tuple(self.items.shape), gen)
        self.items += (acc.item_sum + noise) / acc.n
        for k in self.shared:
            self.shared[k] = acc.shared_sum[k] / acc.n

    # -- evaluation ------------------------------------------------------------------------

    @torch.no_grad()
    def scores(self, clients: np.ndarray, items: np.ndarray | None, chunk_cells: int = 1 << 22) -> np.ndarray:
        """Scores of ``items`` (``(n, C)``, or None = all) for ``clients`` under their own state."""
        n_items = self.items.shape[0]
        if items is None:
            items = np.broadcast_to(np.arange(n_items), (len(clients), n_items))
        out = np.empty(items.shape, np.float32)
        per = max(1, chunk_cells // max(1, items.shape[1] * self.spec.item_width))
        for s in range(0, len(clients), per):
            cl, it = clients[s : s + per], np.ascontiguousarray(items[s : s + per])
            out[s : s + per] = self._score_block(cl, it).numpy()
        return out

    def _score_block(self, clients: np.ndarray, items: np.ndarray) -> torch.Tensor:
        base = self.round_start_items if (self.spec.dual and self.round_start_items is not None) else self.items
        v = base[torch.as_tensor(items)]
        if self.spec.dual:
            self._override_personal(v, clients, items)
        c = torch.as_tensor(clients)
        p = {k: self.private[k][c] for k in self.spec.private_names()}
        p.update({k: t.expand(len(clients), *t.shape) for k, t in self.shared.items()})
        return score(self.spec, p, v)

    def _override_personal(self, v: torch.Tensor, clients: np.ndarray, items: np.ndarray) -> None:
        """Replace rows the client post-tuned by its own values (dual personalisation)."""
        n_items = self.items.shape[0]
        lens = np.array([len(self.personal_items[u]) for u in clients])
        if lens.sum() == 0:
            return
        keys = np.concatenate([u * n_items + self.personal_items[u] for u in clients])
        values = torch.cat([self.personal_rows[u] for u in clients])
        owner = np.repeat(np.arange(len(clients)), lens)
        keys = owner * n_items + keys % n_items
        query = (np.arange(len(clients))[:, None] * n_items + items).ravel()
        pos = np.searchsorted(keys, query).clip(max=len(keys) - 1)
        hit = keys[pos] == query
        flat = v.view(-1, v.shape[-1])
        flat[torch.as_tensor(np.flatnonzero(hit))] = values[torch.as_tensor(pos[hit])]
