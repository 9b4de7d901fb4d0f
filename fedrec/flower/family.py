"""The item-embedding family's roles on Flower (FedMF, FedNCF, FedRecon, PFedRec, MetaMF, FedRAP,
FedAvgM, FedAdam, ...): a node trains its clients with the simulator's `train_cohort` and
replies with sums of row deltas; the server folds the nodes' sums into the engine's
`Accumulator` and calls the state's `aggregate`. The message flow is in `fedrec.flower.roles`.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np
import torch

from fedrec.core.plan import round_plan
from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated.cohort import order_by_activity
from fedrec.federated.engine import client_negatives, train_cohort
from fedrec.federated.state import use_aggregation
from fedrec.flower.roles import (
    NodeData,
    Payload,
    ServerBase,
    check_deployable,
    fold_counts,
    log,
    node_users,
    pack_state,
    shown_ids,
    stage_metrics,
    unpack_state,
    wire_ids,
)
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord


class NodeRole:
    """A node: its clients' data and private state, trained with the simulator's functions."""

    def __init__(self, run: RunConfig, partition: int, partitions: int,
                 split: Split | None = None) -> None:
        self.run, self.cfg = run, run.federated
        split = split if split is not None else prepare_split(run)
        self.spec = check_deployable(run, split=split)
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        self.lr_item = self.cfg.item_lr(split.n_items)
        self.state = self.make_state()
        self.path = self.cfg.upload_path(self.lr_item)

    def make_state(self) -> Any:
        """The algorithm's state for this node's clients (private parameters drawn by id)."""
        state = self.spec.create_state(
            len(self.data.users), self.data.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=self.run.seed, train=self.data.train,
            client_ids=self.data.users)
        use_aggregation(state, self.cfg.aggregation)
        return state

    # private state: what the state declares its clients hold
    def private_state(self) -> bytes:
        return pack_state(self.state.client_state_dict())

    def load_private_state(self, raw: bytes) -> None:
        self.state.load_client_state_dict(unpack_state(raw))

    def hello(self, resume_round: int = 0) -> Payload:
        """Who this node is, and the rows it needs next (after ``resume_round`` on a resume)."""
        return {"clients": self.data.users, "n_clients": self.data.n_users,
                "n_items": self.data.n_items, **self._want(resume_round)}

    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients of round ``msg['round']`` from the rows sent; the reply
        holds the sum of their accepted row deltas on the rows they touched."""
        acc = self._train(msg)
        sent = acc.item_sum.abs().sum(1) > 0
        if acc.item_count is not None:  # a row sent with a zero delta still counts its senders
            sent |= acc.item_count > 0
        touched = torch.nonzero(sent).flatten()
        reply = {"items": wire_ids(touched.cpu().numpy()), "rows": acc.item_sum[touched].cpu().numpy(),
                 **self._counts(acc), **self._want(int(msg["round"]))}
        if acc.item_count is not None:  # under fedrec's item-row rules: each row's senders
            reply["senders"] = acc.item_count[touched].cpu().numpy().astype(np.int32)
        reply.update({f"shared.{k}": v.cpu().numpy() for k, v in acc.shared_sum.items()})
        return reply

    def train_secure(self, msg: Payload) -> tuple[list[np.ndarray], Payload]:
        """`train` for secure aggregation: the whole table of row-delta sums (to be masked)
        and the counts (sent in the clear)."""
        acc = self._train(msg)
        return [acc.item_sum.cpu().numpy()], self._counts(acc)

    def _train(self, msg: Payload) -> Any:
        r = int(msg["round"])
        st = self.state
        st.items[torch.as_tensor(msg["items"])] = torch.as_tensor(msg["rows"])
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        rows = order_by_activity(self.data.train, self.data.rows_of(np.asarray(msg["clients"])))
        acc = st.begin_round(r)
        train_cohort(st, self.spec, self.cfg, self.data.train, self.data.sampler, rows,
                     self.data.users[rows], self.run.seed, r, self.path, acc)
        if self.path.noisy:  # each client's LDP/DP noise is added here, before anything leaves
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.run.seed, r)
            # from the node's own entropy, never the run's seed: the server knows the seed, and
            # noise it could redraw it could subtract
            gen = torch.Generator().manual_seed(secrets.randbits(62))
            acc.item_sum += self.path.local_noise(acc.n, len(sampled), tuple(st.items.shape), gen)
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
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.run.seed, r)
            mine = sampled[np.isin(sampled, self.data.users)]
            if len(mine):
                rows = self.data.rows_of(mine)
                negs = client_negatives(self.cfg.negatives, self.data.train, self.data.sampler,
                                        rows, mine, self.run.seed, r)
                pos = self.data.train[rows].indices
                items = np.union1d(pos, negs.ravel() if negs is not None else [])
                return {"want_round": r, "want_items": wire_ids(items)}
        return {"want_round": 0, "want_items": np.zeros(0, np.int32)}

    def evaluate(self, msg: Payload) -> Payload:
        """Validation and test metrics of this node's clients under the table sent."""
        st = self.state
        table = torch.as_tensor(msg["table"])
        st.items = table
        if st.spec.dual:
            st.round_start_items = table  # the server sends the table dual clients score with
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        return stage_metrics(st.scores, self.data.valid, self.data.test, self.data.protocol)



class ServerRole(ServerBase):
    """The server of the item-embedding family, MetaMF and FedRAP: the engine's state without
    clients; uploads are sums of row deltas (and of shared weights)."""

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        """``secure``: uploads are summed by secure aggregation (`finish_secure_round`); nodes
        then get the whole table (asking for rows would tell which items their users train)."""
        super().__init__(run, hellos, secure)
        self.lr_item = self.cfg.item_lr(self.n_items)
        self.state = self.spec.create_state(0, self.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
                                            item_std=self.cfg.item_std, seed=run.seed,
                                            client_ids=np.zeros(0, np.int64))
        use_aggregation(self.state, self.cfg.aggregation)
        # the nodes noise their clients' uploads (`NodeRole._train`); the server adds none
        self.path = self.cfg.upload_path(self.lr_item).noiseless
        self.want = {} if secure else {node: (int(h["want_round"]), np.asarray(h["want_items"]))
                                       for node, h in hellos.items()}
        self.acc: Any = None

    # -- a round ---------------------------------------------------------------------------

    def train_messages(self, r: int) -> dict[int, Payload]:
        """Round ``r``'s message to each node holding a sampled client."""
        self.acc = self.state.begin_round(r)
        shared = {f"shared.{k}": v.cpu().numpy() for k, v in self.state.shared.items()}
        messages = {}
        for node, clients in self.round_clients(r).items():
            want_round, items = self.want.get(node, (0, None))
            if want_round != r or items is None:  # no request for this round: the whole table
                items = np.arange(self.n_items)
            messages[node] = {"round": r, "clients": wire_ids(clients), "items": wire_ids(items),
                              "rows": self.state.items[torch.as_tensor(items)].cpu().numpy(), **shared}
        return messages

    def finish_round(self, r: int, replies: dict[int, Payload]) -> RoundRecord:
        """Fold the valid replies into the global state; log dropped nodes and bad uploads."""
        acc, bad = self.acc, 0
        got, dropped = self.answered(r, replies)
        for node, clients, reply in got:
            problem = self.check_upload(reply, len(clients))
            if problem:
                bad += 1
                acc.rejected += len(clients)
                log.warning("round %d: rejected the upload of node %d: %s", r, node, problem)
                continue
            acc.item_sum.index_add_(0, torch.as_tensor(reply["items"]), torch.as_tensor(reply["rows"]))
            if acc.item_count is not None:
                acc.item_count.index_add_(0, torch.as_tensor(reply["items"]),
                                          torch.as_tensor(reply["senders"], dtype=acc.item_count.dtype))
            for k in acc.shared_sum:
                acc.shared_sum[k] += torch.as_tensor(reply[f"shared.{k}"])
            fold_counts(acc, reply)
            self.want[node] = (int(reply["want_round"]), np.asarray(reply["want_items"]))
        self.state.aggregate(acc, self.path, self.gen)
        extra = {**self.state.round_extra(), "dropped_nodes": float(len(dropped)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in dropped)),
                 "rejected_nodes": float(bad)}
        return RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                           bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                           rejected_uploads=acc.rejected, extra=extra)

    def finish_secure_round(self, r: int, summed: list[np.ndarray] | None,
                            counts: dict[int, Payload]) -> RoundRecord:
        """Fold a securely aggregated sum (the nodes in ``counts`` took part) into the state."""
        acc = self.acc
        silent = [n for n in self.sent if n not in counts]
        for node in silent:
            log.warning("round %d: node %d did not complete secure aggregation (clients %s dropped)",
                        r, node, shown_ids(self.sent[node]))
        total = sum(len(self.sent[n]) for n in counts)
        n = sum(int(c["n"]) for c in counts.values())
        rejected = sum(int(c["rejected"]) for c in counts.values())
        if summed is None or not counts:
            log.warning("round %d: secure aggregation halted; the global state is unchanged", r)
        elif (n + rejected != total or summed[0].shape != tuple(acc.item_sum.shape)
              or not np.isfinite(summed[0]).all()):
            log.warning("round %d: rejected the secure sum (counts %d + %d for %d clients, shape %s)",
                        r, n, rejected, total, summed[0].shape)
            acc.rejected += total
        else:
            acc.item_sum += torch.as_tensor(summed[0], dtype=acc.item_sum.dtype)
            acc.n, acc.rejected = n, rejected
            for c in counts.values():
                acc.bytes_up += int(c["bytes_up"])
                acc.bytes_down += int(c["bytes_down"])
                acc.loss_sum += float(c["loss_sum"])
                acc.client_batches += int(c["client_batches"])
        self.state.aggregate(acc, self.path, self.gen)
        extra = {**self.state.round_extra(), "dropped_nodes": float(len(silent)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in silent)),
                 "rejected_nodes": 0.0, "secure_aggregation": 1.0}
        return RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                           bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                           rejected_uploads=acc.rejected, extra=extra)

    def check_upload(self, reply: Payload, n_clients: int) -> str | None:
        """Why a node's reply cannot be aggregated, or None."""
        width = self.state.items.shape[1]
        keys = ["items", "rows", "n", "rejected", "loss_sum", "client_batches", "want_round",
                "want_items", *(f"shared.{k}" for k in self.state.shared)]
        missing = [k for k in keys if k not in reply]
        if missing:
            return f"missing {', '.join(missing)}"
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

    # -- evaluation ------------------------------------------------------------------------

    def evaluate_message(self) -> Payload:
        st = self.state
        base = st.round_start_items if (st.spec.dual and st.round_start_items is not None) else st.items
        return {"table": base.cpu().numpy(), **{f"shared.{k}": v.cpu().numpy() for k, v in st.shared.items()}}

    def model_state(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_model_state(self, blob: dict[str, Any]) -> None:
        self.state.load_state_dict(blob)
