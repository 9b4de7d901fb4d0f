"""FedRAP: additive personalisation of item embeddings (Li, Long and Zhou, ICLR 2024).

Client i scores item j with sigma(<a_i, D_i[j] + C[j]> + b_i): a private head (``linear``: a
weight vector and a bias, as the official code; ``dot``: the paper's user vector u_i, no bias),
a private item table D_i and the global item table C, averaged by the server. Its batch
objective (Eq. 3) adds two regularisers whose weights follow a curriculum over rounds a (0 in
the first round):

    mean BCE  + s * lambda(a) * mean ||D_i[j] - C[j]||^2 / k  +  mu(a) * mean |C[j]|_1 / k

with means over the batch's slots, as the official code's ``MSELoss`` / ``L1Loss`` on the batch
rows (Appendix A's gradients, too, sum the regularisers over the rated entries). So a step
touches exactly the rows of its batch, and the plain update needs no dense pass over D_i.

* ``dc_sign`` s: the paper contradicts itself. Eq. 3 subtracts the D-C term (``push``: views
  kept apart); Appendix A's gradients add it (``pull``). ``push`` is unbounded below (the
  official code's loss runs to -46,000); fedrec caps each slot's term at ``push_cap`` (mean
  squared entry), past which it stops pushing. ``pull`` is the default: it is stable as
  written and validated better (see docs/fedrap.md).
* The L1 term is applied by soft-thresholding after each step (the proximal step of Eq. 13):
  a touched row of C shrinks by lr x mu(a) x (its share of the batch) / k. ``reg="l2"`` uses
  mu ||C||^2 instead (FedRAP-L2); ``"none"`` drops it (FedRAP-No).
* ``use_c`` / ``use_d`` switch a view off (FedRAP-D / FedRAP-C); the D-C term then goes too.
* ``centralised`` is CentRAP: the same model and objective with all data on one server. C is
  not copied to clients and averaged; every lockstep step updates it directly with the mean
  over the step's users of their gradients (one minibatch step on the mean of the users'
  losses), and the whole population trains as one block, so a step always spans every user
  that still has a batch.
* ``d_rate`` scales D_i's rate against C's (the paper has one rate for both; the official code
  two parameter groups). C's step reaches the global table divided by the round's clients in
  the server's mean, D_i's is kept whole, so on data with many small clients (Lastfm-2K: half
  the users have fewer than 10 training items, each a batch of a few slots) the rate C needs
  blows D_i up, and the rate D_i stands leaves C, all an unseen item is scored by, untrained.
* D_i starts at zero, so an item a client never trained is scored by the global view alone.
  (The official code draws D_i ~ N(0, 1): unseen items then get random personal offsets, which
  only its leaky negatives hide, by training every evaluation negative.)

The D_i are kept only for the (client, item) pairs a client has trained
(`fedrec.rounds.keyed_rows`): memory follows the data. On dense data sets clients end up
touching most items through their fresh negatives (ML-100K, 10 local epochs: 25% of the pairs
after one round, 69% after 10, 87% after 50), so there the store approaches a dense table's
size; on sparse ones (Ciao, a million-user federation) a dense table could not be held at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.federated.family.personal import PersonalRows
from fedrec.federated.family.spec import FamilySpec
from fedrec.federated.family.state import Accumulator, CohortUpload, FamilyState, gather_rows
from fedrec.options import check
from fedrec.rounds.cohort import CohortBatches, Step
from fedrec.rounds.keyed_rows import KeyedRows
from fedrec.rounds.ragged import index_counts
from fedrec.rounds.upload import FLOAT_BYTES, UploadPath

CURRICULA = ("tanh", "fixed", "sin", "square", "frac")
REGULARISERS = ("l1", "l2", "none")
DC_SIGNS = ("pull", "push")


@dataclass(frozen=True)
class Runs:
    """The slots of one lockstep step that share a row, as one entry each.

    A FedRAP slot's logit depends only on its row and owner (a local row belongs to one
    client), so every slot of a row has the same logit, and the row's step is its slots' summed
    gradient: ``m`` slots with label sum ``labels`` contribute ``w (m sigma - labels)``. The
    step is therefore computed once a distinct row (the run of equal rows in the sorted
    step), not once a slot. ``rows`` are local rows (sorted, distinct); ``owner`` the active
    client of each; ``weight`` its batch weight 1/(its slots in the step); ``block``, when set,
    says the rows are exactly ``block[0]:block[1]``, so the step can read and write the row
    tables in place instead of gathering and scattering them.
    """

    rows: torch.Tensor
    owner: torch.Tensor
    mult: torch.Tensor
    labels: torch.Tensor
    weight: torch.Tensor
    n_active: int
    block: tuple[int, int] | None


def step_runs(step: Step, whole_clients: bool = True) -> list[Runs]:
    """``step``'s slots as runs of equal rows (`Runs`), cut in at most two parts by client.

    Slots are sorted by local row (`cohort._lockstep`) and local rows are numbered client by
    client, so runs come grouped by owner. Clients are independent within a step, so the step
    may be cut at a client boundary: the tail in which every row is present (the clients whose
    samples all fit one batch: most clients at a batch of 2048) becomes a block trained in
    place; the head is gathered. ``whole_clients=False`` (CentRAP, whose clients share C) keeps
    one part.
    """
    # the step's slots as tensors where they are (a layout built on the device keeps them there,
    # `fedrec.rounds.device_cohort`); labels are 0/1, so their sums are exact in any order, and
    # weights are 1/n in float64, then float32
    rows = torch.as_tensor(step.flat_rows)
    if not len(rows):
        return []
    owner_all = torch.as_tensor(step.flat_owner)
    new = torch.ones(len(rows), dtype=torch.bool, device=rows.device)
    new[1:] = rows[1:] != rows[:-1]
    starts = torch.nonzero(new).flatten()
    run_rows = rows[starts]
    mult = torch.diff(starts, append=torch.full((1,), len(rows), device=rows.device)).float()
    owner = owner_all[starts]
    labels = torch.zeros(len(starts), device=rows.device).index_add_(
        0, torch.cumsum(new, 0) - 1, torch.as_tensor(step.flat_labels))
    weight = (1.0 / index_counts(owner_all, step.n_active)[owner].double()).float()
    cut = 0
    if whole_clients:
        # the first run after the last gap in the rows, moved on to the next client's first run
        gaps = torch.nonzero(run_rows[1:] != run_rows[:-1] + 1).flatten()
        cut = int(gaps[-1]) + 1 if len(gaps) else 0
        if cut and int(owner[cut]) == int(owner[cut - 1]):
            later = torch.nonzero(owner[cut:] != owner[cut]).flatten()
            cut = cut + int(later[0]) if len(later) else len(run_rows)
    parts = []
    for a, b in ((0, cut), (cut, len(run_rows))):
        if a == b:
            continue
        lo, hi = int(run_rows[a]), int(run_rows[b - 1]) + 1
        parts.append(Runs(run_rows[a:b], owner[a:b], mult[a:b], labels[a:b], weight[a:b], step.n_active,
                          (lo, hi) if hi - lo == b - a else None))
    return parts


def curriculum(name: str, a: int) -> float:
    """Weight in [0, 1] of the regularisers in round ``a`` (0-based), paper Section 4.5.

    ``sin`` is (sin(a/10) + 1) / 2 (the official code's form; the paper's sin(a/10) would go
    negative, outside the stated range [0, v]); ``square`` is 0 for ten rounds, then 1 for ten.
    """
    if name == "tanh":
        return math.tanh(a / 10)
    if name == "fixed":
        return 1.0
    if name == "sin":
        return (math.sin(a / 10) + 1) / 2
    if name == "square":
        return float((a // 10) % 2)
    if name == "frac":
        return 1.0 / (a + 1)
    raise ValueError(f"unknown curriculum '{name}'; known: {', '.join(CURRICULA)}")


@dataclass(frozen=True)
class RAPSpec:
    """A FedRAP variant (see the module docstring). ``lam`` and ``mu`` are v1 and v2."""

    #: the private head: linear (weights and bias, the official code) or dot (a user vector)
    score: str = "linear"
    #: embedding size of the head and of the item tables C and D_i
    dim: int = 32
    #: use the global item table C
    use_c: bool = True
    #: use the private item table D_i
    use_d: bool = True
    #: sparsity term on C: l1 (proximal step), l2 or none
    reg: str = "l1"
    #: weight (v1) of the term between D_i and C
    lam: float = 0.1
    #: weight (v2) of the sparsity term on C
    mu: float = 0.1
    #: how the two weights grow over rounds: tanh, fixed, sin, square or frac
    curriculum: str = "tanh"
    #: the D_i - C term pulls the views together (pull) or pushes them apart (push)
    dc_sign: str = "pull"
    #: largest D_i - C term a slot pushes by (mean squared entry; push only)
    push_cap: float = 1.0
    #: D_i's rate as a multiple of the item rows' rate (1: the paper's one rate for D and C)
    d_rate: float = 1.0
    #: CentRAP: the same model trained with all data on one server
    centralised: bool = False

    def __post_init__(self) -> None:
        check(
            (self.score not in ("linear", "dot"), f"FedRAP score must be linear or dot, not '{self.score}'"),
            (not (self.use_c or self.use_d), "FedRAP needs at least one of C and D"),
            (self.reg not in REGULARISERS, f"unknown regulariser '{self.reg}'; known: {', '.join(REGULARISERS)}"),
            (self.curriculum not in CURRICULA, f"unknown curriculum '{self.curriculum}'; known: {', '.join(CURRICULA)}"),
            (self.dc_sign not in DC_SIGNS, f"dc_sign must be pull or push, not '{self.dc_sign}'"),
            (not (self.lam >= 0 and self.mu >= 0 and self.push_cap > 0), "lam, mu >= 0 and push_cap > 0"),
            (not self.d_rate > 0, f"d_rate must be > 0 (got {self.d_rate})"),
        )

    @property
    def family(self) -> FamilySpec:
        """The head as a member of the item-embedding family (for its init and score)."""
        return FamilySpec(score=self.score, private_score=True, dual=False, dim=self.dim)

    def sides(self) -> tuple[type, type]:
        """The item family's sides (`fedrec.federated.family.sides`): FedRAP's state is one."""
        from fedrec.federated.family.sides import FamilyClient, FamilyServer

        return FamilyClient, FamilyServer

    def flower_refusal(self, secure: bool) -> str | None:
        if secure:
            return "secure aggregation is not wired for FedRAP's sparse C yet"
        return None

    @property
    def item_width(self) -> int:
        return self.dim

    @property
    def bytes_per_sample(self) -> int:
        """Working set per sample: its D and C rows (a step's temporaries are per slot of that
        step only, and the engine adds the steps' index arrays). 0 for CentRAP, whose
        population trains as one block."""
        return 0 if self.centralised else self.dim * 4 * 12

    @property
    def bytes_per_client(self) -> int:
        return 0

    def weights(self, r: int) -> tuple[float, float]:
        """(lambda, mu) of round ``r`` (1-based)."""
        w = curriculum(self.curriculum, r - 1)
        return self.lam * w, self.mu * w

    def algorithm(self, split: Any, cfg: Any, seed: int):  # type: ignore[no-untyped-def]
        """The federated algorithm the round driver trains (`fedrec.federated.family.algorithm`)."""
        from fedrec.federated.family.algorithm import CohortAlgorithm

        return CohortAlgorithm(self, split, cfg, seed)

    def create_state(self, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                     item_std: float, seed: int, train: Any = None,
                     client_ids: Any = None) -> RAPState:
        return RAPState.create_rap(self, n_clients, n_items, lr=lr, lr_item=lr_item,
                                   item_std=item_std, seed=seed, client_ids=client_ids)


@dataclass
class RAPState(FamilyState):
    """Global C (``items``), private heads, and every client's D_i (``personal_views``, keyed
    by ``client * n_items + item``; a pair never trained is zero)."""

    rap: RAPSpec = RAPSpec()
    personal_views: KeyedRows | None = None
    lam_now: float = 0.0
    mu_now: float = 0.0
    round_clients: int = 0

    @property
    def uploads_nothing(self) -> bool:
        """FedRAP-D (no C) and CentRAP (trained on the server) send their server nothing: the
        privacy audit has nothing to read."""
        return not self.rap.use_c or self.rap.centralised

    @property  # type: ignore[override]
    def plain_average(self) -> bool:
        """FedRAP's server averages C's row deltas (CentRAP and a D-only FedRAP share nothing)."""
        return self.rap.use_c and not self.rap.centralised

    @staticmethod
    def create_rap(rap: RAPSpec, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                   item_std: float, seed: int, client_ids: Any = None) -> RAPState:
        base = FamilyState.create(rap.family, n_clients, n_items, lr=lr, lr_item=lr_item,
                                  item_std=item_std, seed=seed, client_ids=client_ids)
        items = base.items if rap.use_c else torch.zeros_like(base.items)
        views = KeyedRows(rap.dim) if rap.use_d else None
        return RAPState(base.spec, items, base.shared, base.private, lr, lr_item,
                        PersonalRows(n_items, rap.dim), None, rap, views)

    @property
    def n_items(self) -> int:
        return int(self.items.shape[0])

    def begin_round(self, r: int) -> Accumulator:
        self.lam_now, self.mu_now = self.rap.weights(r)
        return super().begin_round(r)

    def local_update(self, cohort: CohortBatches, path: UploadPath,
                     fresh_user: torch.Tensor | None = None) -> CohortUpload:
        start, rows_c, params = self._gather(cohort)
        views = self.personal_views
        slots = views.slots(self._keys(cohort)) if views is not None else None
        rows_d = views.rows.index_select(0, slots) if views is not None else None
        item_of = torch.as_tensor(cohort.row_items) if self.rap.centralised else None
        loss_sum = torch.zeros((), dtype=torch.float64)  # on the device: read once, not once a step
        laid_out: dict[int, list[Runs]] = {}  # a step repeated every epoch is laid out once
        for step in cohort.steps:
            if id(step) not in laid_out:
                laid_out[id(step)] = step_runs(step, whole_clients=item_of is None)
            for runs in laid_out[id(step)]:
                loss_sum += self._rap_step(params, rows_c, rows_d, runs, item_of)
        if views is not None:
            views.rows.index_copy_(0, slots, rows_d)
        if item_of is not None:
            rows_c = start  # C was trained in place: clients upload nothing
        up = self._finish(cohort, params, start, rows_c, path, float(loss_sum))
        if not self.rap.use_c or self.rap.centralised:  # nothing shared travels
            up.bytes_up = up.bytes_down = 0
        return up

    def _keys(self, cohort: CohortBatches) -> np.ndarray:
        owner = np.repeat(cohort.clients.astype(np.int64), np.diff(cohort.row_ptr))
        return owner * self.n_items + cohort.row_items

    def _rap_step(self, params: dict[str, torch.Tensor], rows_c: torch.Tensor,
                  rows_d: torch.Tensor | None, runs: Runs,
                  item_of: torch.Tensor | None = None) -> torch.Tensor:
        """One plain SGD step of the active clients of ``runs`` on their batch objective, then
        the L1 prox; returns the batch loss.

        Works a distinct row at a time (`Runs`): the rows of a block are updated in place, other
        rows are gathered, updated and written back. With ``item_of`` (CentRAP) C's rows are the
        global table's, indexed by item (one item's rows come from many users), and its step is
        the mean over the active users.
        """
        rap = self.rap
        block = slice(*runs.block) if runs.block is not None and item_of is None else None
        c = d = None
        if rap.use_c:
            c = rows_c[block] if block is not None else (
                self.items.index_select(0, item_of[runs.rows]) if item_of is not None
                else rows_c.index_select(0, runs.rows))
        if rows_d is not None:
            d = rows_d[block] if block is not None else rows_d.index_select(0, runs.rows)
        if item_of is None:
            loss = self._row_update(params, c, d, runs)
            if c is not None and block is None:
                rows_c.index_copy_(0, runs.rows, c)
        else:  # CentRAP: the users' steps meet in C's rows
            before = c.clone() if c is not None else None
            loss = self._row_update(params, c, d, runs, c_scale=1.0 / runs.n_active, prox=False)
            if c is not None:
                self._centralised_c_step(item_of[runs.rows], c.sub_(before), runs)
        if d is not None and block is None:
            rows_d.index_copy_(0, runs.rows, d)
        return loss

    def _row_update(self, params: dict[str, torch.Tensor], c: torch.Tensor | None, d: torch.Tensor | None,
                    runs: Runs, c_scale: float = 1.0, prox: bool = True) -> torch.Tensor:
        """The step of `_rap_step` on rows ``c`` and ``d`` of ``runs`` (updated in place, as are
        the heads in ``params``); C's step is scaled by ``c_scale``. Returns the batch loss."""
        rap = self.rap
        k, lr = rap.dim, self.lr_item
        owner, mult, w, n = runs.owner, runs.mult, runs.weight, runs.n_active
        head = params["w" if rap.score == "linear" else "user"]
        a = head.index_select(0, owner)
        v = c + d if c is not None and d is not None else (c if c is not None else d).clone()
        logits = torch.linalg.vecdot(a, v)
        if rap.score == "linear":
            logits += params["b"].index_select(0, owner)
        mw = mult * w  # each row's share of its client's batch
        g_sum = mult * torch.sigmoid(logits) - runs.labels  # the row's slots' summed dBCE/dlogit
        g = w * g_sum  # ... of the batch-mean loss
        loss = (w * (mult * F.softplus(logits) - runs.labels * logits)).sum()
        head_step = torch.zeros((n, k)).index_add_(0, owner, v.mul_(g[:, None]))
        bias_step = torch.zeros(n).index_add_(0, owner, g) if rap.score == "linear" else None
        # the rows step on the batch-mean objective, or (`per_sample`) on the batch's summed one,
        # so that a row's step does not grow as its client's batch shrinks; the head keeps the mean.
        # A row's summed weight is its slot count, which a small catalogue can make large (a
        # negative drawn 156 times in a client's 195 slots); BCE's gradient saturates there, but
        # the quadratic terms (the D-C pull, L2 on C) would overshoot, so under `per_sample` they
        # take the implicit step (the proximal step of the quadratic), as L1 takes its prox
        rw = mw
        if self.per_sample:
            g, rw = g_sum, mult
        # from here every row step is -lr x its gradient, the rate folded into per-row factors
        # so that each (rows x k) pass is one fused multiply-add in place
        a_coef = g.mul_(-lr)[:, None]
        diff = coef = None
        if c is not None and d is not None and self.lam_now > 0:
            diff = d - c
            sq = torch.linalg.vecdot(diff, diff)
            if rap.dc_sign == "pull":
                loss = loss + (self.lam_now / k) * (mw * sq).sum()
                kappa = rw * (2 * self.lam_now * lr / k)
                if self.per_sample:  # the implicit step: stable whatever a row's slot count
                    kappa = kappa / (1 + kappa * (rap.d_rate + c_scale))
                coef = -kappa
            else:
                loss = loss - self.lam_now * (mw * (sq / k).clamp(max=rap.push_cap)).sum()
                coef = rw * (sq / k < rap.push_cap) * (2 * self.lam_now * lr / k)
            coef = coef[:, None]
        if d is not None:
            rate = rap.d_rate
            d.addcmul_(a, a_coef if rate == 1.0 else a_coef * rate)
            if diff is not None:
                d.addcmul_(diff, coef if rate == 1.0 else coef * rate)
        if c is not None:
            if self.mu_now > 0 and rap.reg == "l2":
                loss = loss + (self.mu_now / k) * (mw * torch.linalg.vecdot(c, c)).sum()
                shrink = (c_scale * 2 * self.mu_now * lr / k) * rw[:, None]
                if self.per_sample:  # implicit, as the pull
                    c.div_(1 + shrink)
                else:
                    c.mul_(1 - shrink)
            elif self.mu_now > 0 and rap.reg == "l1":
                loss = loss + (self.mu_now / k) * (mw @ c.abs()).sum()  # (vector_norm: 10x slower)
            c.addcmul_(a, a_coef if c_scale == 1.0 else a_coef * c_scale)
            if diff is not None:
                c.addcmul_(diff, coef.neg_() if c_scale == 1.0 else coef * -c_scale)
            if prox and rap.reg == "l1" and self.mu_now > 0:  # soft-thresholding (Eq. 13)
                t = ((lr * self.mu_now / k) * rw)[:, None]
                inside = torch.minimum(c, t)
                c.sub_(torch.maximum(inside, -t, out=inside))  # (clamp with tensor bounds: 3x slower)
        head[:n] -= self.lr * head_step
        if bias_step is not None:
            params["b"][:n] -= self.lr * bias_step
        return loss

    def _centralised_c_step(self, items: torch.Tensor, step: torch.Tensor, runs: Runs) -> None:
        """CentRAP: add the users' steps of C's rows (``items``, repeated across users) to the
        global table, then soft-threshold each item by the sum of its rows' thresholds."""
        self.items.index_add_(0, items, step)
        if self.rap.reg != "l1" or self.mu_now <= 0:
            return
        share = (self.lr_item * self.mu_now / (self.rap.dim * runs.n_active)) * runs.mult
        if not self.per_sample:
            share = share * runs.weight
        t = torch.zeros(self.items.shape[0]).index_add_(0, items, share)[items, None]
        rows = self.items.index_select(0, items)
        rows -= rows.clamp(min=-t, max=t)
        self.items.index_copy_(0, items, rows)  # an item's rows carry equal values

    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None:
        self.round_clients = acc.n + acc.rejected
        if self.rap.use_c and not self.rap.centralised:
            super().aggregate(acc, path, gen)

    # -- records and checkpoints -------------------------------------------------------------

    def round_extra(self) -> dict[str, float]:
        """Sparsity of C (share of entries above 1e-1 and 1e-2) and the bytes of a dense upload."""
        c = self.items.abs()
        return {
            "c_above_1e-1": float((c > 1e-1).float().mean()),
            "c_above_1e-2": float((c > 1e-2).float().mean()),
            "c_zero": float((c == 0).float().mean()),
            "bytes_up_dense": float(self.round_clients * self.items.numel() * FLOAT_BYTES),
            "lambda": self.lam_now,
            "mu": self.mu_now,
        }

    def run_extra(self) -> dict[str, Any]:
        return {"sparsity_of_c": {k: v for k, v in self.round_extra().items() if k.startswith("c_")}}

    def client_state_dict(self) -> dict[str, Any]:
        views = self.personal_views.state() if self.personal_views is not None else None
        return {**super().client_state_dict(), "personal_views": views}

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        super().load_client_state_dict(blob)
        views = blob["personal_views"]
        self.personal_views = KeyedRows.from_state(views) if views is not None else None

    # -- evaluation ------------------------------------------------------------------------

    def _score_block(self, clients: np.ndarray, items: np.ndarray | None) -> torch.Tensor:
        if items is None:  # every item: C + D_i over the whole table, D_i found by client range
            v = self.items.expand(len(clients), *self.items.shape)
            if self.personal_views is not None:
                v = v + self.personal_views.block(clients, self.n_items)
        else:
            v = gather_rows(self.items, torch.as_tensor(items))
            if self.personal_views is not None:
                keys = np.asarray(clients, np.int64)[:, None] * self.n_items + np.asarray(items)
                v = v + self.personal_views.get(keys)
        c = torch.as_tensor(clients)
        head = self.private["w" if self.rap.score == "linear" else "user"][c]
        logits = torch.einsum("cd,cbd->cb", head, v)
        if self.rap.score == "linear":
            logits = logits + self.private["b"][c][:, None]
        return logits
