"""Graph-guided personalisation of item tables: GPFedRec (Zhang et al., KDD 2024) and GFed-PP
(Na et al., KDD 2026).

Both train the same local model: a private user vector (32) concatenated with the item row
(32) through a private MLP 64-32-16-8-1 (the family's ``mlp`` score), BCE with sampled
negatives, plain SGD. They differ in what the server does with the item tables clients upload.

**GPFedRec.** Every client starts the round from the global table q_g and trains with
BCE + reg x MSE(its whole table, its personalised table p_i), one joint step per batch. The
server builds a user graph from the cosine similarity of the uploaded tables: user i's
neighbours are the users whose similarity exceeds ``threshold`` x the mean of all similarities,
each weighted 1/|neighbours| (none: the user alone). The new personalised tables are
P = G^mp_layers Q, and q_g is their mean. The official code feeds scikit-learn's cosine
*distance* where a similarity is meant, so it keeps the most *dissimilar* users;
``similarity="legacy-distance"`` reproduces that.

**GFed-PP.** Users are public (share their interactions with the server) or private, chosen at
random (``public_ratio``, seeded by the run seed). The server builds A = R_pub R_pubᵀ
(co-interaction counts among public users) with no self-loops, gives private users a self-loop
(and a public user without any co-interaction one too, rather than an empty row), and
normalises Ã = D^-1/2 A D^-1/2. Each round S = Ã^gcn_layers Q from everyone's uploaded table,
q_g = mean of the rows of S, and client i starts the next round from α s_i + (1-α) q_g if
public, q_g if private (Algorithm 1). Ablations (Table 3; the paper does not spell them out,
so these are our readings): ``iei`` — clients do not initialise from the server and keep their
own table across rounds (no federation of item tables at all); ``ugc`` — no user graph
(S = Q, so q_g is the plain mean and public users get α q_i + (1-α) q_g); ``upie`` — public
users get q_g like private ones (α = 0; the graph still shapes q_g).

**One table per user, exactly and without copies.** A client trains only the rows it touches
(positives and this round's negatives). Its uploaded table is its starting table with those rows
replaced, so it travels as row deltas and the server rebuilds the rest; under GPFedRec the
untouched rows also move, but only under the MSE pull, which in closed form leaves
c_i q_g + (1 - c_i) p_i with c_i = (1 - κ)^steps, κ = lr_item x reg x 2 / (n_items x dim): the
client sends its step count, 4 bytes. The server holds one dense table per user that has one
(GPFedRec: p_i for all; GFed-PP: α s_i + (1-α) q_g for public users only — private users are
q_g plus their rows), processes the round column block by column block (Q of one block of items,
~32 MB, at a time), and keeps Ã sparse where it is sparse, or factored through R where
that is cheaper (`FactoredGraph`). The server step runs at the start of
the next round (Algorithm 1's order), so between rounds every client is evaluated with the very
table it trained. Both methods need every client every round (the graph is over all users), as
the official GPFedRec.

**Local differential privacy** (``--ldp δ``): Laplace(0, δ) on every entry of every uploaded
table (Eq. 9); the upload then is the whole table, since noise on touched rows alone would
reveal them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.core.contract import ClientUpload
from fedrec.core.device import here
from fedrec.errors import FedrecError, UnstableSetting
from fedrec.federated.family.model import ITEMS, client_params, score
from fedrec.federated.family.personal import PersonalRows
from fedrec.federated.family.state import Accumulator, CohortUpload, FamilyState
from fedrec.federated.graph.user_graph import (
    Gram,
    Graph,
    graph_nnz,
    neighbour_graph,
    public_graph,
    public_users,
)
from fedrec.rounds import draws
from fedrec.rounds.cohort import CohortBatches, argsort_ints
from fedrec.rounds.step_graphs import StepGraphs
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES, UploadPath

BLOCK_BYTES = 32 * 2**20  # one column block of every user's table: sized to the L3 cache


@dataclass
class GraphUpload(CohortUpload):
    """A cohort's upload plus the rows the server receives (start + clipped delta)."""

    received: torch.Tensor = field(default_factory=lambda: torch.zeros(0))


@dataclass
class GraphState(FamilyState):
    """Private models, q_g (``items``), the per-user dense tables, and the round's uploads."""

    plain_average = False  # every client's table feeds the graph step, never their mean
    row_rules = False  # nor a row's mean over its contributors
    #: its `fedrec.federated.graph.spec.GraphSpec` (not imported: the spec builds this state)
    graph: Any = None  # type: ignore[assignment]  # always given (`create_graph`)
    table: torch.Tensor | None = None
    dense_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    public: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    adjacency: Graph | None = None
    decay: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    shared_interactions: int = 0
    pending: bool = False
    ldp: float = 0.0
    noise_seed: int = 0
    uploads: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = field(default_factory=list)
    seen: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    #: malicious clients in the graph, after the users (`admit_attackers`)
    attackers: int = 0
    #: GFed-PP's training interactions, of which the public users' build the graph (the server's)
    interactions: sp.csr_matrix | None = None
    _target: torch.Tensor | None = None
    _ptr: np.ndarray | None = None
    _live: torch.Tensor | None = None  # each staged row's weight in a captured step's pull

    @staticmethod
    def create_graph(graph: Any, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                     item_std: float, seed: int, train: sp.csr_matrix | None,
                     client_ids: np.ndarray | None = None, n_total: int | None = None) -> GraphState:
        kappa = lr_item * graph.reg * 2.0 / (n_items * graph.dim)
        if graph.gpfedrec and kappa >= 1.0:
            raise UnstableSetting(f"GPFedRec's MSE pull moves each row by {kappa:.3g} of its distance to "
                              "p_i a step (item lr x reg x 2 / (items x dim)), which overshoots: "
                              "lower --lr, --item-lr-scale or reg, or raise dim")
        base = FamilyState.create(graph.family, n_clients, n_items, lr=lr, lr_item=lr_item,
                                  item_std=item_std, seed=seed, client_ids=client_ids)
        # every client starts from the same model (client 0's draw), as the official code's
        # copies of one model: with private MLPs drawn independently, the item-row updates of
        # different clients point in unrelated directions and their mean cancels (measured:
        # validation HR@10 stays at chance, 0.09, after 17 rounds of GPFedRec on ML-100K)
        first = client_params(graph.family, list(base.private), np.zeros(1, np.int64), (seed, draws.INIT))
        base.private = {k: first[k].expand_as(v).clone() for k, v in base.private.items()}
        n_all = n_total if n_total is not None else n_clients
        public = public_users(n_all, graph.public_ratio, seed) if not graph.gpfedrec else np.ones(n_all, bool)
        node = client_ids is not None
        if node:  # a Flower node's clients: their flags; the graph is the server's
            public = public[np.asarray(client_ids)]
        if graph.gpfedrec or graph.ablation == "iei":
            dense = np.ones(n_clients, bool)
        elif graph.ablation == "upie" or graph.alpha == 0.0:
            dense = np.zeros(n_clients, bool)
        else:
            dense = public
        dense_of = np.full(n_clients, -1, np.int64)
        dense_of[dense] = np.arange(int(dense.sum()))
        table = base.items.expand(int(dense.sum()), *base.items.shape).clone() if dense.any() else None
        adjacency, shared = None, 0
        if not graph.gpfedrec and not node:
            if train is None:
                raise FedrecError("GFed-PP needs the public users' interactions (train matrix)")
            shared = int(train[np.flatnonzero(public)].nnz)
            if graph.ablation not in ("ugc", "iei") and public.any():
                adjacency = public_graph(train, public)
        out = GraphState(base.spec, base.items, base.shared, base.private, lr, lr_item,
                         PersonalRows(n_items, graph.dim), None, graph, table, dense_of, public,
                         adjacency, torch.ones(n_clients), shared)
        if train is not None and not graph.gpfedrec and not node:  # the public users' rows: what the server holds
            out.interactions = (sp.diags(public.astype(np.float32)) @ train).tocsr()
        return out

    @property
    def n_items(self) -> int:
        return int(self.items.shape[0])

    @property
    def kappa(self) -> float:
        """GPFedRec's per-step pull of every item row towards p_i (from the MSE over the table)."""
        return self.lr_item * self.graph.reg * 2.0 / (self.n_items * self.graph.dim)

    def lr_of(self, name: str) -> float:
        return self.lr * self.graph.user_lr_scale if name == "user" else self.lr

    # -- one round -------------------------------------------------------------------------

    def begin_round(self, r: int) -> Accumulator:
        """Run the server step on last round's uploads (Algorithm 1, lines 4-10), then start."""
        if self.pending:
            self._server_step()
        self.pending, self.seen, self.uploads = False, 0, []
        self.personal = PersonalRows(self.n_items, self.graph.dim)
        acc = Accumulator(torch.zeros(0), {})
        if r == 1:  # public users upload their interactions (item ids) once
            acc.bytes_up += self.shared_interactions * INDEX_BYTES
        return acc

    def _gather(self, cohort: CohortBatches) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        start, _, params = super()._gather(cohort)
        owner = np.repeat(cohort.clients, np.diff(cohort.row_ptr))
        items = torch.as_tensor(cohort.row_items)
        dense = self._dense_rows(owner, items)
        if self.graph.gpfedrec:
            self._target = dense[1]  # p_i's rows: the MSE target
        elif dense[0] is not None:
            start[dense[0]] = dense[1]
        self._ptr = np.asarray(cohort.row_ptr)  # on the host: a step reads it (no wait for the device)
        return start, start.clone(), params

    def _dense_rows(self, clients: np.ndarray, items: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Rows of the per-user tables at (client, item) pairs, for the pairs whose client has one."""
        if self.table is None:
            return None, torch.zeros((0, self.graph.dim))
        which = torch.as_tensor(self.dense_of[clients])
        has = which >= 0
        flat = self.table.view(-1, self.graph.dim)
        return has, flat.index_select(0, which[has] * self.n_items + items[has])

    def _apply_item_step(self, rows: torch.Tensor, idx: torch.Tensor, step_rows: torch.Tensor) -> None:
        """GPFedRec: the MSE pull moves every row of the active clients, then the BCE step."""
        if self._pulls and self._target is not None:
            if self._live is not None:  # a captured step (`_graphed_steps`): the active rows weigh 1
                n = rows.shape[0]
                rows.sub_((rows - self._target[:n]).mul_(self.kappa).mul_(self._live[:n]))
            else:
                assert self._ptr is not None
                end = int(self._ptr[idx.shape[0]])
                live = rows[:end]
                live.sub_((live - self._target[:end]).mul_(self.kappa))
        rows.index_add_(0, idx.reshape(-1), step_rows)

    @property
    def _pulls(self) -> bool:
        """GPFedRec's MSE pull towards p_i moves the active clients' rows each step."""
        return self.graph.gpfedrec and self.graph.reg > 0

    def _graphed_steps(self, graphs: StepGraphs, cohort: CohortBatches, params: dict[str, torch.Tensor],
                       rows: torch.Tensor, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                       live: torch.Tensor | None = None
                       ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The steps from graphs, with the pull's targets staged beside the rows and each step's
        active rows given weight 1 (the captured step pulls every staged row by its weight)."""
        if not (self._pulls and self._target is not None):
            return super()._graphed_steps(graphs, cohort, params, rows, steps)
        target = self._target
        self._target = graphs.stage("target", target, 1)
        self._live = graphs.stage("live", torch.zeros((rows.shape[0], 1), dtype=rows.dtype), 1)
        try:
            out = super()._graphed_steps(graphs, cohort, params, rows, steps, live=self._live)
        finally:
            self._target, self._live = target, None
        return out

    def _finish(self, cohort: CohortBatches, params: dict[str, torch.Tensor], start: torch.Tensor,
                rows: torch.Tensor, path: UploadPath, loss_sum: float,
                shared_sum: dict[str, torch.Tensor] | None = None) -> CohortUpload:
        """Keep the client's trained rows (its own model) and its pull factor; upload."""
        if path.dp_noise > 0:
            raise FedrecError("GPFedRec and GFed-PP use each client's table on its own, not a noisy "
                              "mean: use --ldp (Laplace noise on every upload), not --dp-noise")
        up = super()._finish(cohort, params, start, rows, path, loss_sum, shared_sum)
        self.personal.update(cohort.clients, cohort.row_items, cohort.row_ptr, rows)
        c = len(cohort.clients)
        if self.graph.gpfedrec:
            active = np.array([s.n_active for s in cohort.steps], np.int64)
            steps = np.bincount(active, minlength=c + 1)[::-1].cumsum()[::-1][1:]  # steps with > k active
            self.decay[torch.as_tensor(cohort.clients)] = torch.as_tensor(
                (1.0 - self.kappa) ** steps.astype(np.float64), dtype=torch.float32)
            up.bytes_up += c * INDEX_BYTES  # the step count
            up.bytes_down += int(len(cohort.row_items)) * self.graph.dim * FLOAT_BYTES  # p_i's rows
        fields = {k: getattr(up, k) for k in CohortUpload.__dataclass_fields__}
        self._target = None
        return GraphUpload(**fields, received=start + up.delta)

    def accumulate(self, acc: Accumulator, up: CohortUpload) -> None:
        """Keep each accepted client's received rows (the server needs every table, not a sum)."""
        assert isinstance(up, GraphUpload)
        counts = np.diff(up.cohort.row_ptr)
        keep = np.repeat(up.accepted.cpu().numpy(), counts)
        owner = np.repeat(up.cohort.clients, counts)[keep]
        self.uploads.append((owner, up.cohort.row_items[keep], up.received[torch.as_tensor(keep)]))
        self.seen += len(up.cohort.clients)
        acc.count(up)

    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None:
        """Record the round's uploads; the graph step runs when the next round begins."""
        n_clients = len(self.dense_of)
        if self.seen != n_clients:
            raise FedrecError(f"{self.graph.method} builds its graph over every client each round; "
                              f"run it with --clients-per-round 1 (got {self.seen} of {n_clients})")
        self.pending = True
        self.ldp = path.ldp
        self.noise_seed = int(torch.randint(2**62, (1,), generator=gen, device="cpu"))

    # -- attackers and defences ---------------------------------------------------------------

    def admit_attackers(self, n: int, attack: Any = None) -> None:
        """Give ``n`` malicious clients, ids after the users, a place in the graph as the server
        gives any client: a user of the neighbour graph with a table of its own under GPFedRec
        (and GFed-PP's ``iei``); under GFed-PP a private user (it shares no interactions; its
        start is q_g), or with ``public_attackers`` a public one that shares the interactions
        ``attack`` declares (`Attack.declared`), and so joins the graph of public users. An
        attacker claims no local steps, so GPFedRec's server rebuilds its untouched rows as q_g."""
        if n <= 0:
            return
        public = bool(self.graph.public_attackers and not self.graph.gpfedrec and attack is not None)
        self.attackers += n
        self.public = np.concatenate([self.public, np.full(n, public)])
        self.decay = torch.cat([self.decay, torch.ones(n, dtype=self.decay.dtype, device=self.decay.device)])
        if public:
            assert self.interactions is not None
            declared = attack.declared()
            self.interactions = sp.vstack([self.interactions, declared]).tocsr()
            self.shared_interactions += int(declared.nnz)
            if self.graph.ablation not in ("ugc", "iei"):
                self.adjacency = public_graph(self.interactions, self.public)
        dense = (self.graph.gpfedrec or self.graph.ablation == "iei"
                 or (public and self.graph.ablation != "upie" and self.graph.alpha > 0))
        start = int(self.table.shape[0]) if self.table is not None else 0
        self.dense_of = np.concatenate([self.dense_of, np.arange(start, start + n) if dense else np.full(n, -1)])
        if dense:
            fresh = self.items.expand(n, *self.items.shape).clone()
            self.table = fresh if self.table is None else torch.cat([self.table, fresh.to(self.table)])

    def receive_malicious(self, uploads: list[ClientUpload]) -> None:
        """The malicious clients' uploads (crafted row steps against q_g) as the tables they
        send: each one's start rows plus its crafted steps."""
        for u in uploads:
            owner = np.full(len(u.items), u.client, np.int64)
            items = np.asarray(u.items, np.int64)
            self.uploads.append((owner, items, self._train_start(owner, items) + u.tensors[ITEMS].to(self.items)))
        self.seen += len(uploads)

    def admit_uploads(self, security: Any, r: int) -> None:
        """Round ``r``'s uploads as the defence's rule admits them before the graph step: each
        client's rows are its start rows plus its steps, and the rule judges the steps row by
        row over the clients that sent each (`Security.admit`), against q_g."""
        owner, items, rows = self._flat_uploads()
        order = argsort_ints(owner)
        owner, items, rows = owner[order], items[order], rows[torch.as_tensor(order)]
        start = self._train_start(owner, items)
        bounds = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True]) if len(owner) else np.zeros(1, np.int64)
        steps = rows - start
        per_client = [ClientUpload(int(owner[a]), items[a:b], {ITEMS: steps[a:b]})
                      for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        kept = security.admit(per_client, self.items, r)
        admitted = torch.cat(kept).to(rows) if kept else rows
        self.uploads = [(owner, items, start + admitted)]

    def _train_start(self, owner: np.ndarray, items: np.ndarray) -> torch.Tensor:
        """The rows clients ``owner`` started the round's training from at ``items``: q_g's
        (GPFedRec; GFed-PP without a table), a GFed-PP client's own table's otherwise."""
        it = torch.as_tensor(items)
        start = self.items[it]
        if not self.graph.gpfedrec:
            has, rows = self._dense_rows(owner, it)
            if has is not None:
                start[has] = rows
        return start

    # -- the server step ---------------------------------------------------------------------

    def _server_step(self) -> None:
        start = time.perf_counter()
        self._graph_step()
        self.extra["server_seconds"] = time.perf_counter() - start

    def _graph_step(self) -> None:
        owner, items, rows = self._flat_uploads()
        order = argsort_ints(items)  # (stable; numpy's took 15% of a GPU round at ML-100K)
        owner, items, rows = owner[order], items[order], rows[torch.as_tensor(order)]
        m, d = self.n_items, self.graph.dim
        n = len(self.dense_of)
        width = max(1, BLOCK_BYTES // (n * d * FLOAT_BYTES))
        bounds = [(a, min(a + width, m)) for a in range(0, m, width)]
        at = np.searchsorted(items, [a for a, _ in bounds] + [m])
        blocks = [(a, b, slice(int(at[k]), int(at[k + 1]))) for k, (a, b) in enumerate(bounds)]

        def uploaded(k: int) -> torch.Tensor:
            a, b, s = blocks[k]
            q = self._base_block(a, b)
            q[torch.as_tensor(owner[s]), torch.as_tensor(items[s] - a)] = rows[s]
            if self.ldp > 0:
                gen = torch.Generator().manual_seed(self.noise_seed + k)
                e = here(torch.empty((2, *q.shape), device="cpu").exponential_(generator=gen))
                q += self.ldp * (e[0] - e[1])
            return q

        new_global = torch.empty_like(self.items)
        if self.graph.gpfedrec:
            # float64: the tables of one round differ in few rows, so their cosines sit within
            # ~1e-5 of each other and float32 sums (1e-7) would pick neighbours at random
            gram = Gram(n, self.items.device)
            for k in range(len(blocks)):
                gram.add(uploaded(k).view(n, -1).double())
            g, stats = neighbour_graph(gram.result(), self.graph.similarity, self.graph.threshold)
            self.extra.update(stats)
            if self.attackers:  # how far into the users' personalised tables the attackers reach
                users = n - self.attackers
                weight = g[:users, users:].sum(1)
                self.extra.update(attacked_users=float((weight > 0).float().mean()),
                                  attacker_weight=float(weight.mean()))
            assert self.table is not None
            for k, (a, b, _) in enumerate(blocks):
                x = uploaded(k).view(n, -1)
                for _ in range(self.graph.mp_layers):
                    x = g @ x
                self.table[:, a:b] = x.view(n, b - a, d)
                new_global[a:b] = x.view(n, b - a, d).mean(0)
            self.items = new_global
            return
        pub = torch.as_tensor(np.flatnonzero(self.public))
        dense_clients = torch.as_tensor(np.flatnonzero(self.dense_of >= 0))
        alpha = self.graph.alpha if self.graph.ablation != "upie" else 0.0
        for k, (a, b, _) in enumerate(blocks):
            q = uploaded(k)
            s = q
            if self.adjacency is not None:
                x = q.index_select(0, pub).view(len(pub), -1)
                for _ in range(self.graph.gcn_layers):
                    x = self.adjacency @ x
                s = q.clone()
                s[pub] = x.view(len(pub), b - a, d)
            new_global[a:b] = s.mean(0)
            if self.table is None:
                continue
            if self.graph.ablation == "iei":  # clients keep their own tables
                self.table[:, a:b] = q
            else:
                self.table[:, a:b] = alpha * s.index_select(0, dense_clients) + (1 - alpha) * new_global[a:b]
        self.items = new_global

    def _base_block(self, a: int, b: int) -> torch.Tensor:
        """Every user's starting table (as the server knows it) on items ``a:b``: ``(n, b-a, d)``."""
        n = len(self.dense_of)
        q = self.items[a:b].expand(n, b - a, self.graph.dim).clone()
        if self.table is not None:
            dense = torch.as_tensor(np.flatnonzero(self.dense_of >= 0))
            if self.graph.gpfedrec:  # untouched rows after the MSE pull: c q_g + (1 - c) p_i
                c = self.decay[:, None, None]
                q.mul_(c).add_(self.table[:, a:b] * (1 - c))
            else:
                q[dense] = self.table[:, a:b]
        return q

    def whole_tables(self) -> torch.Tensor:
        """Every client's table after its training, ``(n, items, dim)``: its start (as
        `_base_block` rebuilds it) with the rows it trained; what it uploads under LDP."""
        q = self._base_block(0, self.n_items)
        owner, items, rows = self._flat_uploads()
        q[torch.as_tensor(owner), torch.as_tensor(items)] = rows
        return q

    def _flat_uploads(self) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        if not self.uploads:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), torch.zeros((0, self.graph.dim))
        return (np.concatenate([u[0] for u in self.uploads]), np.concatenate([u[1] for u in self.uploads]),
                torch.cat([u[2] for u in self.uploads]))

    # -- records, checkpoints, evaluation ----------------------------------------------------

    def round_extra(self) -> dict[str, float]:
        """The server step at the start of this round: its seconds and, for GPFedRec, the graph
        it built (mean neighbours, their mean similarity and the others'; under an attack, the
        share of users with an attacker among their neighbours and the attackers' mean weight
        in a user's personalised table)."""
        return dict(self.extra)

    def run_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.graph.method}
        if not self.graph.gpfedrec:
            public = self.public[: len(self.public) - self.attackers]
            out.update(public_users=int(public.sum()), private_users=int((~public).sum()),
                       shared_interactions=self.shared_interactions)
            if self.adjacency is not None:
                out["graph_density"] = graph_nnz(self.adjacency) / max(int(self.public.sum()) ** 2, 1)
        return out

    def user_groups(self) -> dict[str, np.ndarray]:
        """GFed-PP's public and private users, whose test figures the engine reports apart."""
        if self.graph.gpfedrec:
            return {}
        public = self.public[: len(self.public) - self.attackers]
        return {"public": public.copy(), "private": ~public}

    def server_state_dict(self) -> dict[str, Any]:
        """The server of this family holds every client's uploaded rows and the graph's tables."""
        owner, items, rows = self._flat_uploads()
        return {**super().server_state_dict(), "table": self.table, "decay": self.decay,
                "pending": self.pending, "ldp": self.ldp, "noise_seed": self.noise_seed,
                "uploads": (owner, items, rows), "seen": self.seen}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        super().load_server_state_dict(blob)
        self.table, self.decay, self.pending = blob["table"], blob["decay"], blob["pending"]
        self.ldp, self.noise_seed, self.seen = blob["ldp"], blob["noise_seed"], blob["seen"]
        self.uploads = [blob["uploads"]]

    def _score_block(self, clients: np.ndarray, items: np.ndarray | None) -> torch.Tensor:
        """Each client scores with the table it trained: its starting table with its trained rows."""
        v = self._start_tables(clients) if items is None else self._start_rows(clients, items)
        self.personal.override(v, clients, items)
        c = torch.as_tensor(clients)
        return score(self.spec, {k: self.private[k][c] for k in self.spec.private_names()}, v)

    def _start_rows(self, clients: np.ndarray, items: np.ndarray) -> torch.Tensor:
        """Rows ``items`` (``(n, C)``) of each client's starting table, ``(n, C, dim)``."""
        width = items.shape[1]
        it = torch.as_tensor(items)
        v = self.items[it]
        if self.table is not None:
            owner = np.repeat(clients, width)
            has, rows = self._dense_rows(owner, it.reshape(-1))
            flat = v.view(-1, self.graph.dim)
            if self.graph.gpfedrec:
                c = self.decay[torch.as_tensor(owner)][:, None]
                flat.mul_(c).add_(rows * (1 - c))
            elif has is not None:
                flat[has] = rows
        return v

    def _start_tables(self, clients: np.ndarray) -> torch.Tensor:
        """The whole starting table of each of ``clients``, ``(n, items, dim)``: q_g, a dense
        table's rows where the client has one (GPFedRec: the MSE pull's mix of the two), read
        whole rather than gathered item by item (the same values as `_dense_rows`)."""
        v = self.items.expand(len(clients), *self.items.shape).clone()
        if self.table is None:
            return v
        which = torch.as_tensor(self.dense_of[clients])
        has = which >= 0
        if self.graph.gpfedrec:
            c = self.decay[torch.as_tensor(clients)][:, None, None]
            return v.mul_(c).add_(self.table[which] * (1 - c))
        v[has] = self.table[which[has]]
        return v
