"""The item-embedding family's round by side (FedMF, FedNCF, FedRecon, PFedRec, MetaMF, FedRAP, and
every server optimiser and client objective): see `fedrec.rounds.sides`.

* **Client**: the node's state holds its clients' private parameters and a copy of the global
  rows; a train message carries the round's sampled clients, the global rows they need and the
  shared weights. The node trains them with the simulator's `train_cohort` and replies with the
  sum of their accepted row deltas on the rows they touched (and, under fedrec's item-row rules,
  how many clients sent each row), the shared weights' sums, and the rows it will need in the
  next round one of its clients takes part in: the schedule is public (seeded), so the node knows
  that round. Under ``--ldp``/``--dp-noise`` the node noises the sum before it leaves.
* **Server**: the state without clients; it folds the replies into the engine's `Accumulator` and
  calls the state's own `aggregate`. A node whose request is missing or stale gets the whole
  table; under secure aggregation every node gets the whole table (asking for rows would tell
  which items its users train) and the server receives only the masked sum (of the rows' changes
  and, under fedrec's item-row rules, of each row's senders).
* **A robust rule** (``--defence``) looks at each client's upload: the server side's ``rule``
  slot (`fedrec.security.adversary.Security`, plugged in by the deployment) asks the nodes for
  their clients' uploads one by one (``per_client``), and the rule's sums replace the plain ones,
  as in the simulator.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.core.contract import ClientUpload
from fedrec.core.plan import round_plan
from fedrec.federated.engine import client_negatives, train_cohort
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.state import use_aggregation
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import order_by_activity
from fedrec.rounds.sides import (
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    missing,
    node_users,
    stage_metrics,
    wire_ids,
)

#: a train message's keys of what the client objective kept of the server's table (`FamilyState.memo`)
MEMO = "memo."
#: the parts of it a node's clients read: Regula's popular items (not the table it measures from)
SENT_MEMO = ("popular",)


class FamilyClient(ClientSide):
    """A node of the family: its clients' data and private state."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.spec, self.cfg, self.seed = spec, cfg, seed
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        self.lr_item = cfg.item_lr(split.n_items)
        self.state = self.make_state()
        self.path = cfg.upload_path(self.lr_item)
        # its clients' pseudo rows (--pad-items) from the node's own entropy: keyed by the run's
        # seed, which the server knows, the server could redraw them and strip them off
        self.pad_seed = secrets.randbits(62) if cfg.pad_items else None

    def make_state(self) -> Any:
        """The algorithm's state for this node's clients (private parameters drawn by id)."""
        state = self.spec.create_state(
            len(self.data.users), self.data.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=self.seed, train=self.data.train,
            client_ids=self.data.users)
        use_aggregation(state, self.cfg.aggregation)
        state.observer = False  # the server sees the table; a train message carries what the term keeps
        return state

    def private_state(self) -> dict[str, Any]:
        return self.state.client_state_dict()

    def load_private_state(self, blob: dict[str, Any]) -> None:
        self.state.load_client_state_dict(blob)

    def hello(self, resume_round: int = 0) -> Payload:
        return {"clients": self.data.users, "n_clients": self.data.n_users,
                "n_items": self.data.n_items, **self._want(resume_round)}

    def train(self, msg: Payload) -> Payload:
        """The sum of the sampled clients' accepted row deltas on the rows they touched; or, when
        the server asks (``per_client``: a robust rule), each client's own upload."""
        if msg.get("per_client"):
            kept: list[Any] = []
            acc = self._train(msg, kept)
            return {**per_client_payload([u for chunk in kept for u in chunk.per_client()], self.data.users,
                                         self.state.shared),
                    **self._counts(acc), **self._want(int(msg["round"]))}
        acc = self._train(msg)
        sent = acc.item_sum.abs().sum(1) > 0
        if acc.item_count is not None:  # a row sent with a zero delta still counts its senders
            sent |= acc.item_count > 0
        touched = torch.nonzero(sent).flatten()
        reply = {"items": wire_ids(touched.cpu().numpy()),
                 "rows": self.state.wire_rows(acc.item_sum[touched]).cpu().numpy(),
                 **self._counts(acc), **self._want(int(msg["round"]))}
        if acc.item_count is not None:  # under fedrec's item-row rules: each row's senders
            reply["senders"] = acc.item_count[touched].cpu().numpy().astype(np.int32)
        reply.update({f"shared.{k}": v.cpu().numpy() for k, v in acc.shared_sum.items()})
        return reply

    def train_secure(self, msg: Payload) -> tuple[list[np.ndarray], Payload]:
        """`train` for secure aggregation: the whole table of row-delta sums and, under fedrec's
        item-row rules, how many of the node's clients sent each row (both masked: the server
        learns each row's senders over the round, not a node's), and the counts (in the clear)."""
        acc = self._train(msg)
        vectors = [self.state.wire_rows(acc.item_sum).cpu().numpy()]
        if acc.item_count is not None:
            vectors.append(acc.item_count.cpu().numpy())
        return vectors, self._counts(acc)

    def _train(self, msg: Payload, keep: list[Any] | None = None) -> Any:
        r = int(msg["round"])
        st = self.state
        st.items[torch.as_tensor(msg["items"])] = torch.as_tensor(msg["rows"])
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        rows = order_by_activity(self.data.train, self.data.rows_of(np.asarray(msg["clients"])))
        acc = st.begin_round(r)
        st.memo = {k[len(MEMO):]: torch.as_tensor(v) for k, v in msg.items() if k.startswith(MEMO)}
        train_cohort(st, self.spec, self.cfg, self.data.train, self.data.sampler, rows,
                     self.data.users[rows], self.seed, r, self.path, acc, keep=keep, pad_seed=self.pad_seed)
        if self.path.noisy:  # each client's LDP/DP noise is added here, before anything leaves
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.seed, r)
            # from the node's own entropy, never the run's seed: the server knows the seed, and
            # noise it could redraw it could subtract
            gen = torch.Generator().manual_seed(secrets.randbits(62))
            acc.item_sum += st.noise_rows(acc.n, len(sampled), self.path, gen)
        return acc

    @staticmethod
    def _counts(acc: Any) -> Payload:
        return {"n": acc.n, "rejected": acc.rejected, "loss_sum": float(acc.loss_sum),
                "client_batches": acc.client_batches, "bytes_up": acc.bytes_up,
                "bytes_down": acc.bytes_down}

    def _want(self, after: int) -> Payload:
        """The next round after ``after`` in which some of this node's clients take part, and
        the item rows they will touch then (their training items and that round's negatives)."""
        for r in range(after + 1, self.cfg.rounds + 1):
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.seed, r)
            mine = sampled[np.isin(sampled, self.data.users)]
            if len(mine):
                rows = self.data.rows_of(mine)
                negs = client_negatives(self.cfg.negatives, self.data.train, self.data.sampler,
                                        rows, mine, self.seed, r)
                pos = self.data.train[rows].indices
                items = np.union1d(pos, negs.ravel() if negs is not None else [])
                return {"want_round": r, "want_items": wire_ids(items)}
        return {"want_round": 0, "want_items": np.zeros(0, np.int32)}

    def evaluate(self, msg: Payload) -> Payload:
        st = self.state
        table = torch.as_tensor(msg["table"])
        st.items = table
        if st.spec.dual:
            st.round_start_items = table  # the server sends the table dual clients score with
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        return stage_metrics(st.scores, self.data.valid, self.data.test, self.data.protocol)


class FamilyServer(ServerSide):
    """The family's server: the engine's state without clients; uploads are sums of row deltas
    (and of shared weights), or each client's upload under a robust ``rule``."""

    #: it has a slot for a robust rule: its server plainly averages item rows
    takes_rule: ClassVar[bool] = True
    #: the round's robust aggregation (an object with `fedrec.security.adversary.Security`'s
    #: ``sums`` and ``last``), plugged in by the deployment; None: the plain sums
    rule: Any = None

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        for_clients = getattr(spec, "for_clients", None)  # a client objective's participation-derived settings
        spec = for_clients(n_clients, cfg.clients_per_round) if for_clients is not None else spec
        self.spec, self.cfg, self.n_items, self.n_clients = spec, cfg, n_items, n_clients
        self.lr_item = cfg.item_lr(n_items)
        self.state = spec.create_state(0, n_items, lr=cfg.lr, lr_item=self.lr_item, item_std=cfg.item_std,
                                       seed=seed, client_ids=np.zeros(0, np.int64))
        use_aggregation(self.state, cfg.aggregation)
        # the nodes noise their clients' uploads (`FamilyClient._train`); the server adds none
        self.path = cfg.upload_path(self.lr_item).noiseless
        self.want = {} if secure else {node: (int(h["want_round"]), np.asarray(h["want_items"]))
                                       for node, h in hellos.items()}
        self.acc: Any = None

    def begin(self, r: int) -> None:
        self.acc = self.state.begin_round(r)
        self.kept: list[ClientUpload] = []

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        want_round, items = self.want.get(node, (0, None))
        if want_round != r or items is None:  # no request for this round: the whole table
            items = np.arange(self.n_items)
        memo = {MEMO + k: v.cpu().numpy() for k, v in self.state.memo.items() if k in SENT_MEMO}
        if MEMO + "popular" in memo:  # Regula's popular rows travel with the ones asked for
            items = np.union1d(items, memo[MEMO + "popular"])
        return {"round": r, "clients": wire_ids(clients), "items": wire_ids(items),
                "rows": self.state.items[torch.as_tensor(items)].cpu().numpy(),
                **{f"shared.{k}": v.cpu().numpy() for k, v in self.state.shared.items()}, **memo,
                **({"per_client": 1} if self.rule is not None else {})}

    def fold(self, node: int, reply: Payload) -> None:
        acc = self.acc
        if self.rule is not None:  # each client's upload, for the rule
            # (the rule's sums count each row's senders among the uploads they hold: `finish`)
            self.kept.extend(client_uploads(reply, list(self.state.shared)))
            _fold_counts(acc, reply)
            self.want[node] = (int(reply["want_round"]), np.asarray(reply["want_items"]))
            return
        acc.item_sum.index_add_(0, torch.as_tensor(reply["items"]),
                                self.state.unwire_rows(torch.as_tensor(reply["rows"])))
        if acc.item_count is not None:
            acc.item_count.index_add_(0, torch.as_tensor(reply["items"]),
                                      torch.as_tensor(reply["senders"], dtype=acc.item_count.dtype))
        for k in acc.shared_sum:
            acc.shared_sum[k] += torch.as_tensor(reply[f"shared.{k}"])
        _fold_counts(acc, reply)
        self.want[node] = (int(reply["want_round"]), np.asarray(reply["want_items"]))

    def fold_secure(self, summed: list[np.ndarray] | None, counts: dict[int, Payload], total: int) -> str | None:
        """Fold a securely aggregated sum (the nodes in ``counts`` took part, holding ``total``
        of the round's clients); why it was not folded, or None."""
        acc = self.acc
        n = sum(int(c["n"]) for c in counts.values())
        rejected = sum(int(c["rejected"]) for c in counts.values())
        if summed is None or not counts:
            return "secure aggregation halted; the global state is unchanged"
        shapes = [(self.n_items, self.state.wire_width)] + ([(self.n_items,)] if acc.item_count is not None else [])
        if (n + rejected != total or [v.shape for v in summed] != shapes
                or not all(np.isfinite(v).all() for v in summed)):
            acc.rejected += total
            return (f"rejected the secure sum (counts {n} + {rejected} for {total} clients, shapes "
                    f"{[v.shape for v in summed]})")
        if acc.item_count is not None:  # whole senders, quantised by SecAgg+ far below one half
            senders = np.rint(summed[1])
            if (np.abs(summed[1] - senders).max(initial=0.0) > 0.25 or senders.min(initial=0.0) < 0
                    or senders.max(initial=0.0) > n):
                acc.rejected += total
                return f"rejected the secure sum (row sender counts outside 0..{n} or not whole)"
            acc.item_count += torch.as_tensor(senders, dtype=acc.item_count.dtype)
        acc.item_sum += self.state.unwire_rows(torch.as_tensor(summed[0], dtype=acc.item_sum.dtype))
        for c in counts.values():
            _fold_counts(acc, c)
        return None

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        acc = self.acc
        acc.rejected += rejected
        if self.rule is not None:
            acc.item_sum, acc.shared_sum, acc.n = self.rule.sums(self.kept, *self.state.items.shape,
                                                                 self.state.shared, self.state.items, r,
                                                                 self.state.server_optimizer.row_step(ITEMS),
                                                                 senders=acc.item_count)
            guard = getattr(self.state, "guard_clusters", None)  # PerFedRec: its cluster tables too
            if guard is not None:
                guard(self.kept, self.rule.rule, (self.state.seed, r), benign=self.n_clients)
        self.state.aggregate(acc, self.path, gen)
        extra = {**self.state.round_extra(), **(self.rule.last if self.rule is not None else {})}
        return RoundTotals(acc.loss_sum, acc.client_batches, acc.bytes_up, acc.bytes_down, acc.rejected, extra)

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        if self.rule is not None:
            return check_per_client(reply, clients, self.n_items, self.state.items.shape[1], self.state.shared)
        n_clients = len(clients)
        width = self.state.wire_width
        problem = missing(reply, ["items", "rows", "n", "rejected", "loss_sum", "client_batches", "want_round",
                                  "want_items", *(f"shared.{k}" for k in self.state.shared)])
        if problem:
            return problem
        items, rows = np.asarray(reply["items"]), np.asarray(reply["rows"])
        if items.ndim != 1 or items.dtype.kind not in "iu":
            return "item ids are not a 1-D integer array"
        if len(items) and (items.min() < 0 or items.max() >= self.n_items or len(np.unique(items)) != len(items)):
            return "item ids out of range or repeated"
        if rows.shape != (len(items), width) or rows.dtype != np.float32:
            return f"rows have shape {rows.shape} {rows.dtype}, expected ({len(items)}, {width}) float32"
        if self.state.per_row:
            senders = np.asarray(reply.get("senders", np.zeros(0)))
            if (senders.shape != (len(items),) or senders.dtype.kind not in "iu"
                    or (len(senders) and (senders.min() < 0 or senders.max() > n_clients))):
                return f"senders must be one count in 0..{n_clients} for each row sent"
        if not np.isfinite(rows).all():
            return "rows hold non-finite values"
        for k, v in self.state.shared.items():
            got = np.asarray(reply[f"shared.{k}"])
            if got.shape != tuple(v.shape) or not np.isfinite(got).all():
                return f"shared weight {k} has shape {got.shape} or non-finite values"
        n, rejected = int(reply["n"]), int(reply["rejected"])
        if n < 0 or rejected < 0 or n + rejected != n_clients:
            return f"counts n={n} rejected={rejected} do not add up to the {n_clients} clients sent"
        if not math.isfinite(float(reply["loss_sum"])):
            return "the training loss is not finite"
        return None

    def evaluate_message(self) -> Payload:
        st = self.state
        base = st.round_start_items if (st.spec.dual and st.round_start_items is not None) else st.items
        return {"table": base.cpu().numpy(), **{f"shared.{k}": v.cpu().numpy() for k, v in st.shared.items()}}

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.load_state_dict(blob)


def _fold_counts(acc: Any, reply: Payload) -> None:
    """Add a node's counts (clients, rejected, bytes, loss, batches) to the round's `Accumulator`."""
    acc.n += int(reply["n"])
    acc.rejected += int(reply["rejected"])
    acc.bytes_up += int(reply["bytes_up"])
    acc.bytes_down += int(reply["bytes_down"])
    acc.loss_sum += float(reply["loss_sum"])
    acc.client_batches += int(reply["client_batches"])


def per_client_payload(uploads: list[ClientUpload], ids: np.ndarray, shared: dict[str, torch.Tensor],
                       width: int | None = None) -> Payload:
    """Clients' own uploads as one message: each client's id (``ids`` maps an upload's client, a
    row of the sender's state, to its id), whether it was accepted, its rows between ``ptr``
    entries, and its shared weights stacked. ``width``: a row's, which a message without an
    upload still states (default: the first upload's rows')."""
    counts = [len(u.items) for u in uploads]
    if width is None:
        width = uploads[0].tensors[ITEMS].shape[1] if uploads else 0
    return {"owner": wire_ids(np.asarray(ids)[[u.client for u in uploads]]),
            "accepted": np.array([u.accepted for u in uploads], np.int8),
            "ptr": np.r_[0, np.cumsum(counts)].astype(np.int64),
            "items": wire_ids(np.concatenate([u.items for u in uploads]) if uploads else np.zeros(0)),
            "rows": (torch.cat([u.tensors[ITEMS] for u in uploads]).cpu().numpy() if uploads
                     else np.zeros((0, width), np.float32)),
            **{f"shared.{k}": (torch.stack([u.tensors[k] for u in uploads]).cpu().numpy() if uploads
                               else np.zeros((0, *v.shape), np.float32)) for k, v in shared.items()}}


def client_uploads(reply: Payload, shared: list[str]) -> list[ClientUpload]:
    """The clients' uploads of a `per_client_payload` message."""
    ptr, items, rows = np.asarray(reply["ptr"]), np.asarray(reply["items"], np.int64), np.asarray(reply["rows"])
    owner, accepted = np.asarray(reply["owner"], np.int64), np.asarray(reply["accepted"])
    stacked = {k: np.asarray(reply[f"shared.{k}"]) for k in shared}
    return [ClientUpload(int(owner[k]), items[ptr[k]:ptr[k + 1]],
                         {ITEMS: torch.as_tensor(rows[ptr[k]:ptr[k + 1]]),
                          **{n: torch.as_tensor(v[k]) for n, v in stacked.items()}}, bool(accepted[k]))
            for k in range(len(owner))]


def bad_numbers(reply: Payload, keys: list[str] | tuple[str, ...]) -> str | None:
    """Why one of ``keys`` is not one finite real number in ``reply`` (a count or a figure that
    the server folds), or None."""
    for k in keys:
        v = np.asarray(reply[k])
        if v.shape != () or v.dtype.kind not in "biuf" or not np.isfinite(v):
            return f"{k} is not one finite number"
    return None


def check_per_client(reply: Payload, clients: np.ndarray, n_items: int, width: int,
                     shared: dict[str, torch.Tensor],
                     side_keys: tuple[str, ...] = ("rejected", "want_round", "want_items"),
                     every_client: bool = True) -> str | None:
    """Why a `per_client_payload` reply for ``clients`` cannot be folded, or None; ``side_keys``:
    what else the method's replies carry (the family's: its rejected count and the rows a node
    wants next); ``every_client``: each client sent must upload (FedDAE's clients without a
    training item do not). A client's rows name each item once: a rule counts a row's uploads,
    so a repeated item would be several votes."""
    numbers = ["n", "loss_sum", "client_batches", "bytes_up", "bytes_down", *(k for k in ("rejected",) if k in side_keys)]
    problem = missing(reply, ["owner", "accepted", "ptr", "items", "rows", *numbers, *side_keys,
                              *(f"shared.{k}" for k in shared)]) or bad_numbers(reply, numbers)
    if problem:
        return problem
    owner, ptr = np.asarray(reply["owner"]), np.asarray(reply["ptr"])
    items, rows = np.asarray(reply["items"]), np.asarray(reply["rows"])
    if owner.ndim != 1 or owner.dtype.kind not in "iu" or not np.isin(owner, clients).all() \
            or len(np.unique(owner)) != len(owner) or (every_client and len(owner) != len(clients)):
        return "uploads are not one for each client sent"
    if (ptr.shape != (len(owner) + 1,) or ptr.dtype.kind not in "iu" or ptr[0] != 0 or (np.diff(ptr) < 0).any()
            or ptr[-1] != len(items) or np.asarray(reply["accepted"]).shape != owner.shape):
        return "row pointers or accepted flags do not match the uploads"
    if items.ndim != 1 or items.dtype.kind not in "iu" or (len(items) and (items.min() < 0 or items.max() >= n_items)):
        return "item ids out of range"
    keys = np.repeat(np.arange(len(owner), dtype=np.int64), np.diff(ptr)) * n_items + items
    if len(np.unique(keys)) != len(keys):
        return "an upload names an item twice"
    if rows.shape != (len(items), width) or rows.dtype != np.float32 or not np.isfinite(rows).all():
        return f"rows have shape {rows.shape} {rows.dtype} or non-finite values"
    for k, v in shared.items():
        got = np.asarray(reply[f"shared.{k}"])
        if got.shape != (len(owner), *v.shape) or not np.isfinite(got).all():
            return f"shared weight {k} has shape {got.shape} or non-finite values"
    rejected = int(reply.get("rejected", 0))
    if int(reply["n"]) + rejected != (len(clients) if every_client else len(owner)):
        return "counts do not add up to the clients sent"
    return None
