"""GPFedRec's and GFed-PP's round by side: the server needs each client's table, and sends each its
own (see `fedrec.rounds.sides`).

* **Hello**: a GFed-PP node also sends its public users' interactions (item ids), as the paper's
  public users share theirs; the server builds the user graph from them (`public_graph`).
* **Train** (every client, every round): the server runs the deferred graph step of the last
  round (`GraphState.begin_round`) and sends each node q_g and, for each of its clients that has
  a personalised table, that table (GPFedRec: p_i, the MSE target; GFed-PP: a public user's
  start). The node trains its clients with the simulator's `train_cohort` and replies with each
  client's uploaded rows (client, item, row), and GPFedRec's pull factor of each client.
* **Server**: keeps every client's rows (`GraphState.uploads`) and aggregates as the simulator;
  under ``--defence`` the rule admits each client's rows first (`GraphState.admit_uploads`). A
  malicious node's clients (``extra_clients`` in its first answer) join the graph as the
  simulator's attackers (`GraphState.admit_attackers`; `fedrec.flower.malicious.GraphMaliciousNode`).
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
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.errors import FedrecError
from fedrec.federated.engine import train_cohort
from fedrec.federated.family.sides import FamilyClient, FamilyServer, _fold_counts
from fedrec.rounds.cohort import order_by_activity
from fedrec.rounds.sides import Payload, RoundTotals, missing, wire_ids


class GraphClient(FamilyClient):
    """A node of GPFedRec / GFed-PP: its clients' private models, trained from the tables sent."""

    def make_state(self) -> Any:
        """The state of this node's clients only, with their public flags out of all clients."""
        return self.spec.create_state(
            len(self.data.users), self.data.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=self.seed, client_ids=self.data.users,
            n_total=self.data.n_users)

    # a client keeps the table the server sent it and its pull factor (it trains from them and
    # scores with them): on a node they are the clients' state, though the simulator's state
    # counts them the server's (which also holds them)
    def private_state(self) -> dict[str, Any]:
        return {**self.state.client_state_dict(), "table": self.state.table, "decay": self.state.decay}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
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
                     self.data.users[rows], self.seed, r, self.path, acc)
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


class GraphServer(FamilyServer):
    """The server of GPFedRec / GFed-PP: every client's rows, the graph step, each client's table."""

    #: its nodes send each client's rows, which a robust rule admits before the graph step
    takes_rule: ClassVar[bool] = True

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.cfg, self.n_items, self.n_clients = spec, cfg, n_items, n_clients
        self.lr_item = cfg.item_lr(n_items)
        self.state = spec.create_state(n_clients, n_items, lr=cfg.lr, lr_item=self.lr_item,
                                       item_std=cfg.item_std, seed=seed, train=_public_interactions(hellos, n_clients, n_items))
        # a malicious node's clients, after the users, join the graph as the simulator's attackers do
        extra = sum(int(h.get("extra_clients", 0)) for h in hellos.values())
        self.state.admit_attackers(extra, _Declared.of(hellos, extra, n_items))
        self.path = cfg.upload_path(self.lr_item).noiseless  # the nodes noise the uploads
        self.want, self.acc = {}, None

    def begin(self, r: int) -> None:
        self.acc = self.state.begin_round(r)  # last round's graph step

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        st = self.state
        tabled = clients[st.dense_of[clients] >= 0] if st.table is not None else clients[:0]
        tables = (st.table[torch.as_tensor(st.dense_of[tabled])].cpu().numpy() if len(tabled)
                  else np.zeros((0, self.n_items, st.graph.dim), np.float32))
        return {"round": r, "clients": wire_ids(clients), "rows": st.items.cpu().numpy(),
                "table_clients": wire_ids(tabled), "tables": tables}

    def fold(self, node: int, reply: Payload) -> None:
        st = self.state
        st.uploads.append((np.asarray(reply["owner"], np.int64), np.asarray(reply["items"], np.int64),
                           torch.as_tensor(reply["rows"])))
        st.seen += int(reply["n"]) + int(reply["rejected"])
        st.decay[torch.as_tensor(np.asarray(reply["decay_clients"], np.int64))] = torch.as_tensor(reply["decay"])
        _fold_counts(self.acc, reply)

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        acc = self.acc
        acc.rejected += rejected
        if self.rule is not None:  # the simulator's defended round (`GraphState.admit_uploads`)
            self.state.admit_uploads(self.rule, r)
        self.state.aggregate(acc, self.path, gen)
        return RoundTotals(acc.loss_sum, acc.client_batches, acc.bytes_up, acc.bytes_down, acc.rejected,
                           {**self.state.round_extra(), **(self.rule.last if self.rule is not None else {})})

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        problem = missing(reply, ["owner", "items", "rows", "decay_clients", "decay", "n", "rejected",
                                  "loss_sum", "client_batches"])
        if problem:
            return problem
        owner, items, rows = (np.asarray(reply[k]) for k in ("owner", "items", "rows"))
        if owner.shape != items.shape or rows.shape != (len(items), self.state.graph.dim):
            return f"rows have shape {rows.shape} for {len(items)} (client, item) pairs"
        if len(items) and (items.min() < 0 or items.max() >= self.n_items
                           or owner.min() < 0 or owner.max() >= len(self.state.dense_of)):
            return "client or item ids out of range"
        if not np.isfinite(rows).all() or not math.isfinite(float(reply["loss_sum"])):
            return "rows or loss hold non-finite values"
        if int(reply["n"]) + int(reply["rejected"]) != len(clients):
            return "counts do not add up to the clients sent"
        # a node speaks only for the clients it was sent, with pull factors in [0, 1]
        decay_clients, decay = np.asarray(reply["decay_clients"]), np.asarray(reply["decay"])
        if not (np.isin(owner, clients).all() and np.isin(decay_clients, clients).all()):
            return "rows or pull factors for clients the node was not sent"
        if decay.shape != decay_clients.shape or not ((decay >= 0) & (decay <= 1)).all():
            return f"pull factors have shape {decay.shape} or lie outside [0, 1]"
        return None

    def evaluate_message(self) -> Payload:
        return {"table": self.state.items.cpu().numpy()}


def _public_interactions(hellos: dict[int, Payload], n_clients: int, n_items: int) -> sp.csr_matrix:
    """The public users' interactions the nodes sent, as rows of an all-users matrix."""
    users, items = [], []
    for h in hellos.values():
        ptr = np.asarray(h["public_ptr"], np.int64)
        users.append(np.repeat(np.asarray(h["public_clients"], np.int64), np.diff(ptr)))
        items.append(np.asarray(h["public_items"], np.int64))
    u, i = np.concatenate(users), np.concatenate(items)
    return sp.csr_matrix((np.ones(len(u), np.float32), (u, i)), shape=(n_clients, n_items))


class _Declared:
    """The interactions a malicious node declared for its clients (``declared_*`` in its first
    answer, under GFed-PP's ``public_attackers``), where `GraphState.admit_attackers` reads an
    attack's (`fedrec.security.attacks.Attack.declared`)."""

    def __init__(self, matrix: sp.csr_matrix) -> None:
        self.matrix = matrix

    def declared(self) -> sp.csr_matrix:
        return self.matrix

    @staticmethod
    def of(hellos: dict[int, Payload], extra: int, n_items: int) -> _Declared | None:
        """The declared interactions of the ``extra`` clients beyond the users, or None where no
        node declared any; one `FedrecError` line where they do not fit."""
        for node, h in hellos.items():
            if "declared_ptr" not in h:
                continue
            ptr, items = np.asarray(h["declared_ptr"]), np.asarray(h["declared_items"])
            if (ptr.shape != (extra + 1,) or ptr.dtype.kind not in "iu" or items.ndim != 1
                    or items.dtype.kind not in "iu" or ptr[0] != 0 or (np.diff(ptr) < 0).any()
                    or ptr[-1] != len(items) or (len(items) and (items.min() < 0 or items.max() >= n_items))):
                raise FedrecError(f"node {node} declared interactions that are not one row of item ids "
                                  f"for each of the {extra} clients beyond the users")
            return _Declared(sp.csr_matrix((np.ones(len(items), np.float32), items.astype(np.int64),
                                            ptr.astype(np.int64)), shape=(extra, n_items)))
        return None
