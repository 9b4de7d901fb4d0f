"""Server and client state of the item-embedding family, and its batched algorithm steps.

`FamilyState` is the batched kernel of the item-embedding family: `local_update` trains a cohort
(all its clients at once) and returns their uploads; `aggregate` folds uploads into the
global state; `scores` serves evaluation. Shared weights are copied per client for its local
steps, except where the score function's products allow each client's steps to be carried as
outer products and only the uploads' sum is wanted (`FamilyState.train_uncopied`,
`fedrec.rounds.uncopied`). Private parameters live in one ``(n_clients, ...)``
store per name, gathered for a cohort and scattered back after training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from fedrec.core.contract import ClientUpload
from fedrec.core.device import here, score_cells
from fedrec.errors import FedrecError
from fedrec.federated.family.model import (
    ITEMS,
    batch_loss,
    client_params,
    init_params,
    linear_grads,
    mean_loss,
    score,
)
from fedrec.federated.family.personal import PersonalRows
from fedrec.federated.family.server_opt import ServerOptimizer
from fedrec.rounds import draws, step_graphs
from fedrec.rounds.cohort import CohortBatches
from fedrec.rounds.optim import clip_scale
from fedrec.rounds.step_graphs import StepGraphs
from fedrec.rounds.uncopied import MAX_STEPS, SharedHistory, SharedTape, squared_norms
from fedrec.rounds.upload import FLOAT_BYTES, UploadPath


def gather_rows(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[idx]`` for an index array of any shape.

    ``index_select`` on the flattened index is 10-20x faster on CPU than advanced indexing
    with a 2-D index (measured in torch 2.13: 1.3 ms against 27 ms for 240k rows of 32).
    """
    return table.index_select(0, idx.reshape(-1)).view(*idx.shape, table.shape[1])


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
    #: pseudo rows (`fedrec.rounds.padding`): client k's at ``ptr[k]:ptr[k+1]`` of (items, rows)
    padding: tuple[np.ndarray, np.ndarray, torch.Tensor] | None = None
    #: the clients' shared weights already summed (`FamilyState.train_uncopied`; every client
    #: accepted), in place of ``shared``'s one copy a client
    shared_sum: dict[str, torch.Tensor] | None = None
    #: what each row's delta is read against the global table with: the row the client started
    #: from less the global row (PerFedRec: a clustered client starts from its cluster's row);
    #: None where every client starts from the global rows
    offset: torch.Tensor | None = None

    @property
    def global_delta(self) -> torch.Tensor:
        """Each row as it came back less the global row."""
        return self.delta if self.offset is None else self.delta + self.offset

    def per_client(self) -> list[ClientUpload]:
        """Each client's own upload: the row deltas of the items it sent against the global
        table (``items``, before noise; pseudo rows included, in item order) and its shared
        weights, and whether it was accepted."""
        if self.shared_sum is not None:
            raise ValueError("this cohort's shared weights were uploaded summed, not per client")
        c = self.cohort
        delta = self.global_delta
        out = []
        for k in range(len(c.clients)):
            items, rows = c.row_items[c.rows_of(k)], delta[c.rows_of(k)]
            if self.padding is not None:
                ptr, p_items, p_rows = self.padding
                items = np.concatenate([items, p_items[ptr[k]:ptr[k + 1]]])
                rows = torch.cat([rows, p_rows[ptr[k]:ptr[k + 1]]])
                order = np.argsort(items, kind="stable")
                items, rows = items[order], rows[torch.as_tensor(order)]
            out.append(ClientUpload(int(c.clients[k]), items,
                                    {ITEMS: rows, **{n: v[k] for n, v in self.shared.items()}},
                                    bool(self.accepted[k])))
        return out


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
    #: per item row, how many accepted clients sent it (only under ``--aggregation contributors``
    #: or ``samples``, `FamilyState.per_row`)
    item_count: torch.Tensor | None = None

    def contributed(self, items: torch.Tensor) -> None:
        """Count one contributor for each row in ``items`` (a client's rows, or many clients')."""
        if self.item_count is not None:
            self.item_count.index_add_(0, items, torch.ones(len(items), dtype=self.item_count.dtype,
                                                              device=self.item_count.device))

    def count(self, up: CohortUpload) -> None:
        """Add a cohort's bookkeeping: accepted and rejected clients, bytes, losses."""
        n_ok = int(up.accepted.sum())
        self.n += n_ok
        self.rejected += len(up.accepted) - n_ok
        self.bytes_up += up.bytes_up
        self.bytes_down += up.bytes_down
        self.loss_sum += up.loss_sum
        self.client_batches += up.client_batches


class CohortState(Protocol):
    """The batched algorithm interface the engine drives (the kernel `CohortAlgorithm` drives, per chunk of a cohort)."""

    def begin_round(self, r: int) -> Accumulator: ...
    def local_update(self, cohort: CohortBatches, path: UploadPath,
                     fresh_user: torch.Tensor | None = None) -> CohortUpload: ...
    def uncopied_open(self, summed: bool) -> bool: ...
    def train_uncopied(self, cohort: CohortBatches, path: UploadPath) -> CohortUpload | None: ...
    def accumulate(self, acc: Accumulator, up: CohortUpload) -> None: ...
    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None: ...
    def scores(self, clients: np.ndarray, items: np.ndarray | None) -> np.ndarray: ...
    def round_extra(self) -> dict[str, float]: ...
    def run_extra(self) -> dict[str, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, blob: dict[str, Any]) -> None: ...


@dataclass
class FamilyState:
    """Global item table, shared dense parameters, private stores and personalised rows."""

    #: it reads its steps' slots as tensors, so a GPU run builds its cohorts' layout on the device
    #: (`fedrec.rounds.device_cohort`)
    device_steps: ClassVar[bool] = True

    #: the member's spec (`fedrec.federated.family.spec.FamilySpec`); the spec builds its state,
    #: so this module does not import it, even for a type (the package imports one way)
    spec: Any
    items: torch.Tensor
    shared: dict[str, torch.Tensor]
    private: dict[str, torch.Tensor]
    lr: float
    lr_item: float
    personal: PersonalRows
    round_start_items: torch.Tensor | None = None
    _server_opt = None  # the spec's server optimiser, made on first use (not a dataclass field)
    #: divide each item row's summed deltas by the clients that sent it (``--aggregation
    #: contributors`` or ``samples``), not by the round's clients (not a dataclass field: set by
    #: the algorithm)
    per_row = False
    #: step item rows by the sum of their slots' gradients over the client's batch, not the
    #: batch mean (``--aggregation samples``): a row's step does not shrink as the client grows
    per_sample = False
    #: the server averages the clients' item-row deltas (so per-row robust rules, poisoning
    #: attacks and pseudo-item padding apply; not a dataclass field)
    plain_average = True
    #: each client's rating baseline offset, its training mean (`FamilySpec.baseline`), added
    #: to its scores; None without a baseline (not a dataclass field: set by the spec)
    offsets = None
    #: the run's seed, from which draws every party shares are keyed (CoLR's basis, PerFedRec's
    #: k-means starts; not a dataclass field: set by `create`)
    seed = 0
    #: the item-row rules of `use_aggregation` apply: the server averages rows through
    #: `FamilyState.aggregate` (not a dataclass field; False where a state aggregates its own way)
    row_rules = True
    #: the run's id of each of the state's clients (a Flower node's hold some; draws are keyed
    #: by id) and the round being trained (not dataclass fields: set by `create`, `begin_round`)
    client_ids = None
    round = 0
    #: what the client objective kept of the server's table (`ClientObjective.observe`: Regula's
    #: popular items; replaced, never changed in place; not a dataclass field: a ClassVar); a
    #: Flower node's is the server's, sent each round
    memo: ClassVar[Mapping[str, torch.Tensor]] = MappingProxyType({})
    #: this state sees the server's table (False on a Flower node, which holds only the rows its
    #: clients need; not a dataclass field)
    observer = True
    #: a GPU run replays its steps from CUDA graphs (`_step_graphs`); False for a state whose
    #: step reads a tensor that is not staged for them (CoLR's basis, drawn anew each round)
    graphed_steps: ClassVar[bool] = True
    _graphs = None  # the state's StepGraphs, made on first use (not a dataclass field)

    @property
    def server_optimizer(self) -> ServerOptimizer:
        """How the server applies the round's mean (`fedrec.federated.family.server_opt`)."""
        if self._server_opt is None:
            self._server_opt = self.spec.server_optimizer()
        return self._server_opt

    @classmethod
    def create(cls, spec: Any, n_clients: int, n_items: int, *, lr: float, lr_item: float,
               item_std: float, seed: int, client_ids: np.ndarray | None = None) -> FamilyState:
        """The state at round 0. The global table and shared weights come from a generator
        seeded by ``seed``; each client's private parameters from draws keyed by its id, so a
        state for a few clients (``client_ids``, a Flower node's) starts them as the
        simulator's state for all clients does."""
        gen = torch.Generator().manual_seed(seed)
        items = here(torch.randn((n_items, spec.item_width), generator=gen, device="cpu")) * item_std
        shared = {k: v[0] for k, v in init_params(spec, spec.shared_names(), 1, gen).items()}
        ids = np.arange(n_clients) if client_ids is None else np.asarray(client_ids)
        private = client_params(spec, spec.private_names(), ids, (seed, draws.INIT))
        state = cls(spec, items, shared, private, lr, lr_item, PersonalRows(n_items, spec.item_width))
        state.seed, state.client_ids = seed, ids
        return state

    # -- one round -------------------------------------------------------------------------

    def begin_round(self, r: int) -> Accumulator:
        """Start round ``r`` (1-based): empty running sums of the uploads to come (and of each
        row's contributors, under ``per_row``)."""
        self.round = r
        self.round_start_items = self.items.clone() if self.spec.dual else None
        term = self.spec.objective
        if self.observer and term is not None and term.observes_table:
            memo = dict(self.memo)
            term.observe(self.items, memo, r)
            self.memo = memo
        counts = torch.zeros(self.items.shape[0], dtype=self.items.dtype) if self.per_row else None
        return Accumulator(
            torch.zeros_like(self.items), {k: torch.zeros_like(v) for k, v in self.shared.items()},
            item_count=counts,
        )

    def local_update(self, cohort: CohortBatches, path: UploadPath,
                     fresh_user: torch.Tensor | None = None) -> CohortUpload:
        """Train every client of ``cohort`` at once, each on its own copies of the shared
        weights; keep private state; return the uploads.

        ``fresh_user`` re-initialises the user vectors (FedRecon's reconstruction).
        """
        spec = self.spec
        start, rows, params = self._gather(cohort)
        steps = [(torch.as_tensor(s.rows), torch.as_tensor(s.labels), torch.as_tensor(s.mask))
                 for s in cohort.steps]
        if fresh_user is not None:
            params["user"] = fresh_user.clone()
        if spec.reconstruct_epochs:  # one reconstruction epoch = one pass over the data; rows are fixed
            epoch = steps[: cohort.steps_per_epoch]
            gathered = [gather_rows(rows, idx) for idx, _, _ in epoch]
            for _ in range(spec.reconstruct_epochs):
                for step, v in zip(epoch, gathered, strict=True):
                    self._step(params, rows, step, [["user"]], v)
        term = spec.objective
        sent = (start, cohort.row_ptr) if term is not None else None
        view = None
        if term is not None and term.reads_rows:
            view = term.cohort_rows(cohort.row_ptr, steps, cohort.row_items, self.memo, self.items,
                                     summed=self.per_sample)
        loss_sum = torch.zeros((), dtype=torch.float64)  # on the device: read once, not once a step
        graphs = self._step_graphs(sent, view)
        if graphs is not None:
            params, rows, loss_sum = self._graphed_steps(graphs, cohort, params, rows, steps)
        for t, step in enumerate(steps if graphs is None else ()):
            # a term on the client's own rows (UNION's, Regula's): its step is taken where the
            # data term's starts, and applied with it
            # (keyed by the epoch and the batch within it: lockstep step b of an epoch is every
            # active client's b-th batch, whichever clients share the cohort)
            extra = user_extra = None
            if view is not None:
                extra = term.rows_step(rows, view, step, self._ids(cohort),
                                       (self.seed, draws.CONTRAST, self.round, *divmod(t, cohort.steps_per_epoch)),
                                       self.lr_item)
                if term.steps_user and "user" in params:
                    user_extra = term.user_step(view, params["user"][: step[0].shape[0]], self.lr_of("user"))
            loss_sum += self._step(params, rows, step, spec.phases(), sent=sent)
            if extra is not None:
                self._apply_item_step(rows, *extra)
            if user_extra is not None:
                params["user"][: len(user_extra)].sub_(user_extra)
        if spec.dual:
            self.personal.update(cohort.clients, cohort.row_items, cohort.row_ptr, rows)
        up = self._finish(cohort, params, start, rows, path, float(loss_sum))
        if view is not None:  # what the term reads beyond the clients' rows (Regula's popular rows)
            up.bytes_down += term.download_bytes(view, cohort.row_ptr, self.items.shape[1])
        return up

    def _step_graphs(self, sent: Any, view: Any) -> StepGraphs | None:
        """The state's CUDA graphs of its steps (`fedrec.rounds.step_graphs`), where its steps
        can be replayed from them: on a GPU (or on the CPU, padded but not captured, where
        `step_graphs.PAD_ON_CPU` asks it of a test), for a state whose step reads only what is
        staged (`graphed_steps`), with no client objective (its step reads the rows as sent) and
        no clipping (its norms group a step's rows with `torch.unique`, whose size the device
        decides)."""
        if not (self.graphed_steps and sent is None and view is None and self.spec.clip <= 0):
            return None
        if self._graphs is None:
            on_gpu = self.items.is_cuda
            if not (on_gpu or step_graphs.PAD_ON_CPU):
                return None
            self._graphs = StepGraphs(capture=on_gpu)
        return self._graphs

    def _graphed_steps(self, graphs: StepGraphs, cohort: CohortBatches, params: dict[str, torch.Tensor],
                       rows: torch.Tensor, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                       live: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """`local_update`'s steps replayed from ``graphs``: the parameters, rows and summed loss
        after them. ``live``: a staged weight a row, set to 1 on the rows of the clients a step
        trains (`StepGraphs.run`)."""
        phases = self.spec.phases()
        staged, w_rows = graphs.begin(len(cohort.clients), params, rows)
        ends = None if live is None else (live, [int(cohort.row_ptr[idx.shape[0]]) for idx, _, _ in steps])
        key = (tuple(map(tuple, phases)), self.lr, self.lr_item, self.per_sample)
        graphs.run(steps, lambda step: self._step(staged, w_rows, step, phases, padded=True), key, ends)
        return graphs.end(staged, w_rows)

    def _ids(self, cohort: CohortBatches) -> np.ndarray:
        """The run's ids of the cohort's clients (rows of this state)."""
        ids = np.asarray(cohort.clients, np.int64)
        return ids if self.client_ids is None else np.asarray(self.client_ids)[ids]

    def _gather(self, cohort: CohortBatches) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """What the cohort downloads and holds: its global rows (and a copy to train), and its
        private and shared parameters stacked along a client axis."""
        c = len(cohort.clients)
        start, params = self._download(cohort)
        params.update({k: v.expand(c, *v.shape).clone() for k, v in self.shared.items()})
        return start, start.clone(), params

    def _download(self, cohort: CohortBatches) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The cohort's global item rows, and its private parameters stacked along a client axis."""
        clients = torch.as_tensor(cohort.clients)
        start = self.items.index_select(0, torch.as_tensor(cohort.row_items))
        return start, {k: self.private[k][clients] for k in self.spec.private_names()}

    def uncopied_open(self, summed: bool) -> bool:
        """Whether `train_uncopied` can train a chunk of clients: only the sum of their uploads
        is wanted (``summed``: no per-client upload is kept), the score function takes the shared
        weights without copies, and a step is one plain phase (no reconstruction, no dual step,
        no client objective: its term reads each client's own copy)."""
        spec = self.spec
        return (summed and spec.shares_unbatched and bool(self.shared) and len(spec.phases()) == 1
                and not spec.reconstruct_epochs and not spec.dual and spec.objective is None)

    def train_uncopied(self, cohort: CohortBatches, path: UploadPath) -> CohortUpload | None:
        """Train a cohort without copying the shared weights per client (the caller has checked
        `uncopied_open`; `fedrec.rounds.uncopied` says why it holds).

        Each step's products read the one shared W, corrected by the client's earlier steps of
        the round (`SharedHistory`); the clients' private parameters and item rows step as in
        `local_update`, and the round's shared upload is their sum, ``n W - lr Xᵀ D``. MetaMF on
        Ciao, where most clients have one batch, spent most of a round on the copies: their
        products, gradients and updates (docs/scale.md). Returns None, having changed nothing,
        if the cohort takes more than `MAX_STEPS` steps, or if any gradient or updated row is not
        finite: the per-client copies then reject just those clients (a sum cannot say whose it
        was).
        """
        spec = self.spec
        if len(cohort.steps) > MAX_STEPS:
            return None
        start, params = self._download(cohort)
        rows = start.clone()
        names = spec.phases()[0]
        items = ITEMS in names
        mine = [k for k in names if k != ITEMS and k not in self.shared]
        history = SharedHistory(len(cohort.clients), len(cohort.steps), self.lr_of)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for s in cohort.steps:
            idx, y, m = torch.as_tensor(s.rows), torch.as_tensor(s.labels), torch.as_tensor(s.mask)
            n = idx.shape[0]  # the clients still training this step (a prefix, by batch count)
            leaves = {k: params[k][:n].detach().requires_grad_(True) for k in mine}
            v = gather_rows(rows, idx).requires_grad_(items)
            tape = SharedTape(history)
            with torch.enable_grad():
                loss = mean_loss(spec, spec.logits_taped({**params, **leaves, **self.shared}, v, tape), y, m)
                wrt = [*leaves.values(), *([v] if items else []), *(t.out for t in tape.products)]
                got = torch.autograd.grad(loss, wrt)
            grads = dict(zip([*leaves, *([ITEMS] if items else [])], got, strict=False))
            outs = got[len(grads):]
            if not all(torch.isfinite(g).all() for g in got):
                return None
            if spec.clip > 0:
                scale = self._clip(grads, idx, extra_sq=squared_norms(tape, outs))
                outs = tuple(d * scale[:, None] for d in outs)
            history.add(tape.products, outs)  # copies the inputs before a private leaf steps
            for k in mine:
                params[k][:n].sub_(grads[k], alpha=self.lr_of(k))
            if items:
                self._apply_item_step(rows, idx, self._item_grads(grads[ITEMS], m).reshape(-1, rows.shape[1])
                                      .mul_(-self.lr_item))
            loss_sum += loss.detach()
        shared_sum = history.summed(self.shared)
        if not (torch.isfinite(rows).all() and all(torch.isfinite(t).all() for t in shared_sum.values())):
            return None
        return self._finish(cohort, params, start, rows, path, float(loss_sum), shared_sum)

    def _finish(self, cohort: CohortBatches, params: dict[str, torch.Tensor], start: torch.Tensor,
                rows: torch.Tensor, path: UploadPath, loss_sum: float,
                shared_sum: dict[str, torch.Tensor] | None = None) -> CohortUpload:
        """Keep the private parameters; encode the item upload through ``path``; count bytes.
        ``shared_sum``: the clients' shared weights, summed (`train_uncopied`), in place of their
        copies in ``params``."""
        c = len(cohort.clients)
        clients = torch.as_tensor(cohort.clients)
        for k in self.spec.private_names():
            self.private[k][clients] = params[k]
        counts = torch.as_tensor(np.diff(cohort.row_ptr))
        delta, up_items, down_items = path.transmit(rows, start, counts, self.items.shape[0])
        owner = torch.repeat_interleave(torch.arange(c), counts)
        bad = torch.zeros(c).index_add_(0, owner, (~torch.isfinite(delta.sum(1))).float())
        accepted = bad == 0
        for k in self.shared if shared_sum is None else ():
            accepted &= torch.isfinite(params[k].reshape(c, -1).sum(1))
        shared = {k: params[k] for k in self.shared} if shared_sum is None else {}
        shared_bytes = c * sum(v.numel() for v in self.shared.values()) * FLOAT_BYTES
        n_batches = sum(s.n_active for s in cohort.steps)
        return CohortUpload(cohort, delta, shared, accepted, up_items + shared_bytes,
                            down_items + shared_bytes, loss_sum, n_batches, shared_sum=shared_sum)

    def _step(self, params: dict[str, torch.Tensor], rows: torch.Tensor,
              step: tuple[torch.Tensor, torch.Tensor, torch.Tensor], phases: list[list[str]],
              v: torch.Tensor | None = None, sent: tuple[torch.Tensor, np.ndarray] | None = None,
              padded: bool = False) -> torch.Tensor:
        """One minibatch: a plain-SGD step per phase, in order (each client's gradient clipped
        to ``spec.clip`` first, when set), then the client objective's step on what the phase
        trained of what the round sent (``sent``: the rows as downloaded and the clients' row
        pointers; `fedrec.federated.family.objective`); returns the last phase's loss (a 0-d tensor).

        The item vectors of the batch are gathered once (or passed in as ``v``); the item phase differentiates the
        loss w.r.t. those vectors and scatter-adds the step into ``rows`` (the same update as
        differentiating w.r.t. ``rows``, without a dense gradient of every local row).
        ``padded``: a step of `fedrec.rounds.step_graphs`, whose padded slots all index one zero
        row; their item steps are set to exactly zero (a diverged client's are NaN x 0).
        """
        idx, y, m = step
        loss_value = torch.zeros(())
        for names in phases:
            if v is None:
                v = gather_rows(rows, idx)
            train_items = ITEMS in names
            others = [k for k in names if k != ITEMS]
            if not self.spec.scorer.closed_form:
                loss, grads = self._autograd(params, v, y, m, others, train_items)
            else:
                loss, grads = linear_grads(self.spec, params, v, y, m, others, train_items)
            if self.spec.clip > 0:
                self._clip(grads, idx)
            n = idx.shape[0]  # the clients still training this step (a prefix, by batch count)
            for k in others:
                params[k][:n].sub_(grads[k], alpha=self.lr_of(k))
            if train_items:
                # scaling first: index_add_ with alpha takes a slow path (4x, torch 2.13 CPU)
                step_rows = self._item_grads(grads[ITEMS], m).reshape(-1, rows.shape[1]).mul_(-self.lr_item)
                if padded:  # a diverged client's padded slots (NaN x 0) must not reach the zero row
                    step_rows = torch.where(m.reshape(-1, 1) > 0, step_rows, 0.0)
                self._apply_item_step(rows, idx, step_rows)
                v = None
            if sent is not None:
                self._objective_step(params, rows, sent, others, train_items, n)
            loss_value = loss
        return loss_value

    def _objective_step(self, params: dict[str, torch.Tensor], rows: torch.Tensor,
                        sent: tuple[torch.Tensor, np.ndarray], names: list[str], train_items: bool,
                        n: int) -> None:
        """The client objective's step (`fedrec.federated.family.objective`) for the step's ``n``
        active clients: on the shared weights among ``names`` (against the server's copy) and,
        when the phase trained them, on their item rows (against the rows downloaded)."""
        objective = self.spec.objective
        assert objective is not None
        for k in names:
            if k in self.shared:
                d = objective.step(k, params[k][:n], self.shared[k], self.lr_of(k))
                if d is not None:
                    params[k][:n].sub_(d)
        if train_items:
            start, row_ptr = sent
            end = int(row_ptr[n])  # the active clients' rows come first (clients ordered by activity)
            d = objective.step(ITEMS, rows[:end], start[:end], self.lr_item)
            if d is not None:
                rows[:end].sub_(d)

    def _clip(self, grads: dict[str, torch.Tensor], idx: torch.Tensor,
              extra_sq: torch.Tensor | None = None) -> torch.Tensor:
        """Scale each active client's gradient to L2 norm <= ``spec.clip`` in place, as
        ``clip_grad_norm_`` on that client's model alone: a row drawn twice in its batch counts
        once, with the sum of its slots' gradients (``grads[ITEMS]`` holds one per slot).
        ``extra_sq``: each client's squared norm of gradients not in ``grads`` (`train_uncopied`'s
        shared weights); returns the factors."""
        n = idx.shape[0]
        parts: list[tuple[torch.Tensor, torch.Tensor | None]] = [(g[:n], None) for k, g in grads.items() if k != ITEMS]
        if ITEMS in grads:
            slots = grads[ITEMS].reshape(-1, grads[ITEMS].shape[-1])
            rows, inverse = torch.unique(idx.reshape(-1), return_inverse=True)
            per_row = torch.zeros((len(rows), slots.shape[1]), dtype=slots.dtype).index_add_(0, inverse, slots)
            slot_client = torch.arange(n).repeat_interleave(idx.shape[1])  # a row has one client
            owner = torch.zeros(len(rows), dtype=torch.long).scatter_(0, inverse, slot_client)
            parts.append((per_row, owner))
        scale = clip_scale(parts, n, self.spec.clip, extra_sq)
        for g in grads.values():
            g[:n] *= scale.view(-1, *[1] * (g.dim() - 1))
        return scale

    def _item_grads(self, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The item gradient of each slot ``(n_active, B, width)``, of the batch-mean loss, or
        (`per_sample`) of the batch's summed loss: times each client's real slots."""
        if not self.per_sample:
            return slots
        n = slots.shape[0]
        return slots * mask[:n].sum(1).to(slots.dtype).view(n, *[1] * (slots.dim() - 1))

    def lr_of(self, name: str) -> float:
        """Learning rate of a (non-item) parameter; one rate for all in this family."""
        return self.lr

    def _apply_item_step(self, rows: torch.Tensor, idx: torch.Tensor, step_rows: torch.Tensor) -> None:
        """Add a step's scaled item gradients (``step_rows``, one per slot of ``idx``) to ``rows``."""
        rows.index_add_(0, idx.reshape(-1), step_rows)

    def _autograd(self, params: dict[str, torch.Tensor], v: torch.Tensor, y: torch.Tensor,
                  m: torch.Tensor, names: list[str], train_items: bool
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Gradients of the batch loss by autograd (any score function), for the step's
        ``n_active`` clients only (``(n_active, ...)``): a leaf over every client, sliced in the
        loss, would have autograd fill and copy a gradient of every client's copy each step
        (MetaMF on ML-100K: a quarter of its CPU profile; a round 5.9-6.0 s that way, 4.5-4.7 s
        this way on one thread, the same figures)."""
        n = v.shape[0]
        leaves = {k: params[k][:n].detach().requires_grad_(True) for k in names}
        p = {**params, **leaves}
        vv = v.detach().requires_grad_(True) if train_items else v
        with torch.enable_grad():
            loss = batch_loss(self.spec, p, vv, y, m)
            got = torch.autograd.grad(loss, [*leaves.values(), *([vv] if train_items else [])])
        grads = dict(zip([*leaves, *([ITEMS] if train_items else [])], got, strict=True))
        return loss.detach(), grads

    def accumulate(self, acc: Accumulator, up: CohortUpload) -> None:
        """Add a cohort's accepted uploads to the round's running sums (scatter-add of rows)."""
        items = torch.as_tensor(up.cohort.row_items)
        everyone = bool(up.accepted.all())  # the usual case: no masked copy of the uploads
        if everyone:
            acc.item_sum.index_add_(0, items, up.delta)
            acc.contributed(items)
        else:
            keep = torch.repeat_interleave(up.accepted, torch.as_tensor(np.diff(up.cohort.row_ptr)))
            acc.item_sum.index_add_(0, items[keep], up.delta[keep])
            acc.contributed(items[keep])
        if up.padding is not None:  # a padded row is a row the client sent, to the server as to anyone
            ptr, p_items, p_rows = up.padding
            keep = torch.repeat_interleave(up.accepted, torch.as_tensor(np.diff(ptr)))
            acc.item_sum.index_add_(0, torch.as_tensor(p_items)[keep], p_rows[keep])
            acc.contributed(torch.as_tensor(p_items)[keep])
        if up.shared_sum is not None:  # summed by `train_uncopied`, which accepts every client or none
            assert everyone, "a summed upload has every client accepted"
            for k, v in up.shared_sum.items():
                acc.shared_sum[k] += v
        for k, v in up.shared.items():  # MetaMF's: 473k floats a client, a copy was 15% of a round
            acc.shared_sum[k] += (v if everyone else v[up.accepted]).sum(0)
        acc.count(up)

    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None:
        """Mean of the accepted clients' tables = global + (sum of row deltas + noise) / n; under
        ``per_row`` each row's sum is divided by the clients that sent it instead (a row no
        one sent stays as it is)."""
        if acc.n == 0:
            return
        noise = self.noise_rows(acc.n, acc.n, path, gen)
        opt = self.server_optimizer
        divisor: torch.Tensor | int = acc.n if acc.item_count is None else acc.item_count.clamp(min=1)[:, None]
        self.items = opt.update(ITEMS, self.items, self.items + (acc.item_sum + noise) / divisor)
        for k in self.shared:
            self.shared[k] = opt.update(k, self.shared[k], acc.shared_sum[k] / acc.n)

    def noise_rows(self, k: int, n_clients: int, path: UploadPath, gen: torch.Generator) -> torch.Tensor:
        """The sum of ``k`` clients' own LDP/DP noise on the item rows they send, out of a round
        of ``n_clients`` (`UploadPath.local_noise`), as the rows' change it makes: drawn on
        what travels (`wire_rows`), which for CoLR is each row's coordinates."""
        return path.local_noise(k, n_clients, tuple(self.items.shape), gen)

    # -- what travels on a deployment's wire ---------------------------------------------------

    @property
    def wire_width(self) -> int:
        """Numbers an item row's change takes in a message (`fedrec.federated.family.sides`)."""
        return int(self.items.shape[1])

    def wire_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Row changes as a message carries them (as they are; CoLR sends coordinates)."""
        return rows

    def unwire_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Row changes back from a message (`wire_rows`' inverse)."""
        return rows

    # -- records and checkpoints -------------------------------------------------------------

    def round_extra(self) -> dict[str, float]:
        """Algorithm-specific figures for the round record (none for this family)."""
        return {}

    def run_extra(self) -> dict[str, Any]:
        """Algorithm-specific figures for the results JSON (none for this family)."""
        return {}

    def user_groups(self) -> dict[str, np.ndarray]:
        """Groups of users whose test figures are reported apart (none in this family)."""
        return {}

    # server and client state, declared apart: a Flower node keeps only the clients' part
    def server_state_dict(self) -> dict[str, Any]:
        return {"items": self.items, "round_start_items": self.round_start_items, "shared": self.shared,
                "server_optimizer": self.server_optimizer.state_dict(), "objective_memo": dict(self.memo)}

    def client_state_dict(self) -> dict[str, Any]:
        return {"private": self.private, "personal": self.personal.state()}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.items, self.round_start_items = blob["items"], blob["round_start_items"]
        self.shared = blob["shared"]
        self.server_optimizer.load_state_dict(blob["server_optimizer"])
        self.memo = dict(blob.get("objective_memo", {}))

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        self.private = blob["private"]
        self.personal.load(blob["personal"])

    def state_dict(self) -> dict[str, Any]:
        return {**self.server_state_dict(), **self.client_state_dict()}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.load_server_state_dict(blob)
        self.load_client_state_dict(blob)

    # -- evaluation ------------------------------------------------------------------------

    @torch.no_grad()
    def scores(self, clients: np.ndarray, items: np.ndarray | None, chunk_cells: int | None = None) -> np.ndarray:
        """Scores of ``items`` (``(n, C)``, or None = all) for ``clients`` under their own state,
        ``chunk_cells`` item-row cells at a time (default: `fedrec.core.device.score_cells`)."""
        chunk_cells = chunk_cells or score_cells()
        n_items = self.items.shape[0]
        width = n_items if items is None else items.shape[1]
        out = np.empty((len(clients), width), np.float32)
        per = max(1, chunk_cells // max(1, width * self.spec.item_width))
        for s in range(0, len(clients), per):
            it = None if items is None else np.ascontiguousarray(items[s : s + per])
            out[s : s + per] = self._score_block(clients[s : s + per], it).cpu().numpy()
        return out

    def _score_block(self, clients: np.ndarray, items: np.ndarray | None) -> torch.Tensor:
        """Logits ``(n, C)`` of ``items`` (``(n, C)``; None: every item) under each client's state."""
        base = self.round_start_items if (self.spec.dual and self.round_start_items is not None) else self.items
        if items is None:  # the table for each client: a view, a copy where own rows go in
            v = base.expand(len(clients), *base.shape)
            if self.spec.dual:
                v = v.clone(memory_format=torch.contiguous_format)
        else:
            v = base[torch.as_tensor(items)]
        if self.spec.dual:
            self.personal.override(v, clients, items)
        c = torch.as_tensor(clients)
        p = {k: self.private[k][c] for k in self.spec.private_names()}
        unbatched = self.spec.shares_unbatched  # one weight read by every client (MetaMF)
        p.update({k: t if unbatched else t.expand(len(clients), *t.shape) for k, t in self.shared.items()})
        if self.offsets is not None:
            return score(self.spec, p, v) + self.offsets[c][:, None]
        return score(self.spec, p, v)


def use_aggregation(state: Any, aggregation: str) -> None:
    """Set ``state``'s item-row rule (`FederatedConfig.aggregation`), in the simulator and on
    Flower's server and nodes alike; one clear error where the state aggregates its own way."""
    if aggregation == "clients":
        return
    if not getattr(state, "row_rules", False):
        raise FedrecError(f"--aggregation {aggregation} applies to the item-embedding family (FedMF, FedNCF, "
                          "FedRecon, PFedRec, FedMF-bias, FedAdam, FedAvgM, MetaMF) and FedRAP; this "
                          "algorithm's server aggregates its own way")
    state.per_row = True
    state.per_sample = aggregation == "samples"
