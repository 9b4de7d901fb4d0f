"""GPFedRec and GFed-PP on Flower: the server needs each client's table, and sends each its own.

* **Hello**: a GFed-PP node also sends its public users' interactions (item ids), as the paper's
  public users share theirs; the server builds the user graph from them (`public_graph`).
* **Train** (every client, every round): the server runs the deferred graph step of the last
  round (`GraphState.begin_round`) and sends each node q_g and, for each of its clients that has
  a personalised table, that table (GPFedRec: p_i, the MSE target; GFed-PP: a public user's
  start). The node trains its clients with the simulator's `train_cohort` and replies with each
  client's uploaded rows (client, item, row), and GPFedRec's pull factor of each client.
* **Server**: keeps every client's rows (`GraphState.uploads`) and aggregates as the simulator.
* **Evaluate**: the node scores each client with the table it trained (kept from the train
  message and its own trained rows), as the simulator does.

Nodes hold their clients' state exactly as the simulator does, so an in-process deployment ends
with the simulator's figures (tested). The personalised tables make the train messages large
(a table per client). Under `--ldp` each node adds the Laplace noise to its clients' whole
tables before they leave and the server adds none; the simulator draws the same noise in its
graph step (equal in distribution, tested).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.experiment import RunConfig
from fedrec.federated.cohort import order_by_activity
from fedrec.federated.engine import train_cohort
from fedrec.flower.family import NodeRole, ServerRole
from fedrec.flower.roles import (
    Payload,
    ServerBase,
    fold_counts,
    log,
    pack_state,
    unpack_state,
    wire_ids,
)
from fedrec.results import RoundRecord


class GraphNode(NodeRole):
    """A node of GPFedRec / GFed-PP: its clients' private models, trained from the tables sent."""

    def make_state(self) -> Any:
        """The state of this node's clients only, with their public flags out of all clients."""
        return self.spec.create_state(
            len(self.data.users), self.data.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=self.run.seed, client_ids=self.data.users,
            n_total=self.data.n_users)

    # a client keeps the table the server sent it and its pull factor (it trains from them and
    # scores with them): on a node they are the clients' state, though the simulator's state
    # counts them the server's (which also holds them)
    def private_state(self) -> bytes:
        return pack_state({**self.state.client_state_dict(), "table": self.state.table,
                           "decay": self.state.decay})

    def load_private_state(self, raw: bytes) -> None:
        blob = unpack_state(raw)
        self.state.table, self.state.decay = blob.pop("table"), blob.pop("decay")
        self.state.load_client_state_dict(blob)

    def hello(self, resume_round: int = 0) -> Payload:
        out = super().hello(resume_round)
        public = np.flatnonzero(self.state.public)
        rows = self.data.train[public]
        out.update(public_clients=wire_ids(self.data.users[public]),
                   public_ptr=rows.indptr.astype(np.int64), public_items=wire_ids(rows.indices))
        return out

    def _train(self, msg: Payload) -> Any:
        r = int(msg["round"])
        st = self.state
        st.items = torch.as_tensor(msg["rows"]).clone()
        tabled = np.searchsorted(self.data.users, np.asarray(msg["table_clients"], np.int64))
        if len(tabled):
            st.table[torch.as_tensor(st.dense_of[tabled])] = torch.as_tensor(msg["tables"])
        rows = order_by_activity(self.data.train, self.data.rows_of(np.asarray(msg["clients"])))
        acc = st.begin_round(r)
        train_cohort(st, self.spec, self.cfg, self.data.train, self.data.sampler, rows,
                     self.data.users[rows], self.run.seed, r, self.path, acc)
        return acc

    def train(self, msg: Payload) -> Payload:
        """Each trained client's uploaded rows, by client id, and GPFedRec's pull factors. Under
        ``--ldp`` each client uploads its whole table with Laplace noise drawn here (noise on
        its touched rows alone would reveal them): every (client, item) row."""
        acc = self._train(msg)
        owner, items, rows = self.state._flat_uploads()
        trained = np.unique(owner)
        if self.path.ldp > 0:
            tables = self.state.whole_tables()
            gen = torch.Generator().manual_seed(int(np.random.default_rng().integers(2**62)))
            e = torch.empty((2, *tables.shape), device="cpu").exponential_(generator=gen)
            tables += self.path.ldp * (e[0] - e[1])
            m = self.data.n_items
            owner, items = np.repeat(np.arange(len(tables)), m), np.tile(np.arange(m), len(tables))
            rows = tables.reshape(-1, tables.shape[-1])
        return {"owner": wire_ids(self.data.users[owner]), "items": wire_ids(items),
                "rows": rows.cpu().numpy(), "decay_clients": wire_ids(self.data.users[trained]),
                "decay": self.state.decay[torch.as_tensor(trained)].cpu().numpy(), **self._counts(acc)}


class GraphServer(ServerRole):
    """The server of GPFedRec / GFed-PP: every client's rows, the graph step, each client's table."""

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        ServerBase.__init__(self, run, hellos, secure)
        self.lr_item = self.cfg.item_lr(self.n_items)
        self.state = self.spec.create_state(
            self.n_clients, self.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=run.seed, train=self._public_interactions(hellos))
        self.path = self.cfg.upload_path(self.lr_item).noiseless  # the nodes noise the uploads
        self.want, self.acc = {}, None

    def _public_interactions(self, hellos: dict[int, Payload]) -> sp.csr_matrix:
        """The public users' interactions the nodes sent, as rows of an all-users matrix."""
        users, items = [], []
        for h in hellos.values():
            ptr = np.asarray(h["public_ptr"], np.int64)
            users.append(np.repeat(np.asarray(h["public_clients"], np.int64), np.diff(ptr)))
            items.append(np.asarray(h["public_items"], np.int64))
        u, i = np.concatenate(users), np.concatenate(items)
        return sp.csr_matrix((np.ones(len(u), np.float32), (u, i)), shape=(self.n_clients, self.n_items))

    def train_messages(self, r: int) -> dict[int, Payload]:
        self.acc = self.state.begin_round(r)  # last round's graph step
        st, messages = self.state, {}
        for node, clients in self.round_clients(r).items():
            tabled = clients[st.dense_of[clients] >= 0] if st.table is not None else clients[:0]
            tables = (st.table[torch.as_tensor(st.dense_of[tabled])].cpu().numpy() if len(tabled)
                      else np.zeros((0, self.n_items, st.graph.dim), np.float32))
            messages[node] = {"round": r, "clients": wire_ids(clients), "rows": st.items.cpu().numpy(),
                              "table_clients": wire_ids(tabled), "tables": tables}
        return messages

    def finish_round(self, r: int, replies: dict[int, Payload]) -> RoundRecord:
        acc, st, bad = self.acc, self.state, 0
        got, dropped = self.answered(r, replies)
        for node, clients, reply in got:
            problem = self.check_upload(reply, len(clients)) or self._check_owners(reply, clients)
            if problem:
                bad += 1
                acc.rejected += len(clients)
                log.warning("round %d: rejected the upload of node %d: %s", r, node, problem)
                continue
            st.uploads.append((np.asarray(reply["owner"], np.int64), np.asarray(reply["items"], np.int64),
                               torch.as_tensor(reply["rows"])))
            st.seen += len(clients)
            st.decay[torch.as_tensor(np.asarray(reply["decay_clients"], np.int64))] = torch.as_tensor(reply["decay"])
            fold_counts(acc, reply)
        st.aggregate(acc, self.path, self.gen)
        extra = {**st.round_extra(), "dropped_nodes": float(len(dropped)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in dropped)),
                 "rejected_nodes": float(bad)}
        return RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                           bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                           rejected_uploads=acc.rejected, extra=extra)

    def check_upload(self, reply: Payload, n_clients: int) -> str | None:
        keys = ["owner", "items", "rows", "decay_clients", "decay", "n", "rejected", "loss_sum",
                "client_batches"]
        missing = [k for k in keys if k not in reply]
        if missing:
            return f"missing {', '.join(missing)}"
        owner, items, rows = (np.asarray(reply[k]) for k in ("owner", "items", "rows"))
        if owner.shape != items.shape or rows.shape != (len(items), self.state.graph.dim):
            return f"rows have shape {rows.shape} for {len(items)} (client, item) pairs"
        if len(items) and (items.min() < 0 or items.max() >= self.n_items
                           or owner.min() < 0 or owner.max() >= self.n_clients):
            return "client or item ids out of range"
        if not np.isfinite(rows).all() or not math.isfinite(float(reply["loss_sum"])):
            return "rows or loss hold non-finite values"
        if int(reply["n"]) + int(reply["rejected"]) != n_clients:
            return "counts do not add up to the clients sent"
        return None

    def _check_owners(self, reply: Payload, clients: np.ndarray) -> str | None:
        """A node speaks only for the clients it was sent, with pull factors in [0, 1]."""
        owner, decay_clients = np.asarray(reply["owner"]), np.asarray(reply["decay_clients"])
        decay = np.asarray(reply["decay"])
        if not (np.isin(owner, clients).all() and np.isin(decay_clients, clients).all()):
            return "rows or pull factors for clients the node was not sent"
        if decay.shape != decay_clients.shape or not ((decay >= 0) & (decay <= 1)).all():
            return f"pull factors have shape {decay.shape} or lie outside [0, 1]"
        return None

    def evaluate_message(self) -> Payload:
        return {"table": self.state.items.cpu().numpy()}



