"""FedDAE's round by side (see `fedrec.rounds.sides`).

A client is one user; node i holds the i-th block of users and builds a `DAEState` for them
alone (``client_ids=``: dropout and the codes' noise are drawn by user id, so it trains them as
the simulator does). Its first answer sends, for each of its clients, the item ids of its bag:
a client downloads, and sends the gradient of, only its items' rows of the global encoder's
first layer (what the simulator counts, and what its uploads reveal). A train message carries
the global decoder and deeper encoder layers whole and the first layer's rows of the sampled
clients' items; the reply sums the node's clients' accumulated gradients (the first layer on
the rows they touched). The server takes the simulator's Adam step on the mean over the round's
clients (`fedrec.federated.dae.state.server_step`). Under a robust rule (``--defence``) the
server asks for each client's upload instead, as steps (`DAEState.client_uploads`), and takes
the step on what the rule accepts, as the simulator's `DAEAlgorithm` does. An attacker's node
(`fedrec.flower.malicious.DAEMaliciousNode`) declares clients beyond the users with empty bags.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.federated.dae.state import FIRST, DAEState, TableView, initial_parts, server_step
from fedrec.federated.family.sides import check_per_client, client_uploads, per_client_payload
from fedrec.protocols.protocol import Split
from fedrec.rounds.ragged import ranges
from fedrec.rounds.sides import (
    COUNTS,
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    bad_floats,
    bad_item_ids,
    local_rows,
    missing,
    node_users,
    stage_metrics,
    wire_ids,
)


class DAEClient(ClientSide):
    """A node holding a block of FedDAE's clients (one user each)."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.spec, self.cfg = spec, cfg
        self.n_clients = split.n_users
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        self.state = DAEState(spec, self.data.view(), seed, client_ids=self.data.users)  # type: ignore[arg-type]

    def private_state(self) -> dict[str, Any]:
        return {"priv": self.state.priv}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        self.state.priv = blob["priv"]

    def hello(self, resume_round: int = 0) -> Payload:
        train = self.data.train
        return {"clients": self.data.users, "n_clients": self.n_clients, "n_items": train.shape[1],
                "client_items": wire_ids(train.indices), "client_ptr": train.indptr.astype(np.int64)}

    def _set_global(self, msg: Payload) -> None:
        for k, v in self.state.glob.items():
            if k == FIRST:
                v[torch.as_tensor(msg["items"], dtype=torch.int64)] = torch.as_tensor(msg[f"rows.{k}"])
            else:
                self.state.glob[k] = torch.as_tensor(msg[f"dense.{k}"])

    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients from the parts sent; reply with the sums of their
        accumulated gradients (the first layer's on the rows of their items), or, when the
        server asks (``per_client``: a robust rule), each client's own upload as the simulator's
        security layer reads it (`DAEState.client_uploads`: steps, not gradients)."""
        st = self.state
        self._set_global(msg)
        rows = local_rows(self.data.users, np.asarray(msg["clients"], np.int64))
        kept: list[Any] | None = [] if msg.get("per_client") else None
        sums, loss, n = st.train(rows, self.cfg, int(msg["round"]), kept)
        trained = rows[np.diff(self.data.train.indptr)[rows] > 0]
        floats = st.payload_floats(trained)
        counts = {"n": n, "loss_sum": loss, "client_batches": n * self.cfg.local_epochs,
                  "bytes_up": 4 * floats, "bytes_down": 4 * floats}
        if kept is not None:
            dense = {k: st.glob[k] for k in st.dense_keys()}
            ids = np.arange(self.n_clients)  # a kept upload names its client by the run's id already
            return {**per_client_payload(st.client_uploads(kept, self.cfg.lr), ids, dense,
                                         width=st.row_table().shape[1]), **counts}
        touched = np.unique(self.data.train[trained].indices)
        reply: Payload = {"items": wire_ids(touched)}
        for k, g in sums.items():
            if k == FIRST:
                reply[f"rows.{k}"] = g[torch.as_tensor(touched, dtype=torch.int64)].cpu().numpy()
            else:
                reply[f"dense.{k}"] = g.cpu().numpy()
        reply.update(counts)
        return reply

    def evaluate(self, msg: Payload) -> Payload:
        self._set_global({**msg, "items": np.arange(self.data.n_items)})
        return stage_metrics(self.state.scores, self.data.valid, self.data.test, self.data.protocol)


class DAEServer(TableView, ServerSide):
    """FedDAE's server: the global encoder and decoder and its Adam state; under a robust
    ``rule`` it aggregates each client's upload as the simulator's `DAEAlgorithm` does."""

    #: it has a slot for a robust rule (``--defence``): the nodes then send each client's upload
    takes_rule: ClassVar[bool] = True
    #: the round's robust aggregation (`fedrec.security.adversary.Security`), plugged in by the
    #: deployment; None: the nodes' plain sums
    rule: Any = None

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.cfg, self.n_items = spec, cfg, n_items
        self.glob, _ = initial_parts(spec, n_items, seed)
        self.moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in self.glob.items()}
        self.steps = 0
        # each node's clients (in id order) and their bags' item ids, from their first answers
        self.items_of = {node: (np.asarray(h["clients"], np.int64), np.asarray(h["client_items"], np.int64),
                                np.asarray(h["client_ptr"], np.int64)) for node, h in hellos.items()}

    def begin(self, r: int) -> None:
        self.sums = {k: torch.zeros_like(v) for k, v in self.glob.items()}
        self.totals = RoundTotals()
        self.n = 0
        self.kept: list[Any] = []  # each client's upload, under a rule

    def _items(self, node: int, clients: np.ndarray) -> np.ndarray:
        held, flat, ptr = self.items_of[node]
        at = local_rows(held, clients)
        return np.unique(flat[ranges(ptr[at], ptr[at + 1] - ptr[at])])

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        out: Payload = {"round": r, "clients": wire_ids(clients)}
        for k, v in self.glob.items():
            if k == FIRST:
                items = self._items(node, clients)
                out["items"] = wire_ids(items)
                out[f"rows.{k}"] = v[torch.as_tensor(items)].cpu().numpy()
            else:
                out[f"dense.{k}"] = v.cpu().numpy()
        if self.rule is not None:
            out["per_client"] = 1
        return out

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        if self.rule is not None:
            table = self.row_table()
            return check_per_client(reply, clients, table.shape[0], table.shape[1],  # (users with no item: none)
                                    {k: self.glob[k] for k in self.dense_keys()}, side_keys=(), every_client=False)
        keys = [f"{'rows' if k == FIRST else 'dense'}.{k}" for k in self.glob]
        problem = missing(reply, ["items", *COUNTS, *keys])
        if problem:
            return problem
        items = np.asarray(reply["items"])
        problem = bad_item_ids(items, self.n_items)
        if problem:
            return problem
        for k, v in self.glob.items():
            got = np.asarray(reply[f"rows.{k}" if k == FIRST else f"dense.{k}"])
            want = (len(items), *v.shape[1:]) if k == FIRST else tuple(v.shape)
            problem = bad_floats(k, got, want)
            if problem:
                return problem
        if not 0 <= int(reply["n"]) <= len(clients) or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {len(clients)} sent, or a non-finite loss"
        return None

    def fold(self, node: int, reply: Payload) -> None:
        if self.rule is not None:
            self.kept.extend(client_uploads(reply, self.dense_keys()))
            self.totals.add(reply)
            self.n += int(reply["n"])
            return
        for k, s in self.sums.items():
            if k == FIRST:
                s.index_add_(0, torch.as_tensor(reply["items"], dtype=torch.int64), torch.as_tensor(reply[f"rows.{k}"]))
            else:
                s += torch.as_tensor(reply[f"dense.{k}"])
        self.totals.add(reply)
        self.n += int(reply["n"])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        sums, n = self.sums, self.n
        if self.rule is not None:  # as the simulator's `DAEAlgorithm._secured`
            table = self.row_table()
            item_sum, dense_sum, n = self.rule.sums(self.kept, *table.shape,
                                                    {k: self.glob[k] for k in self.dense_keys()}, table, r,
                                                    self.adam_rows(self.moments, self.steps, self.cfg.lr))
            sums = self.gradient_sums(item_sum, dense_sum, self.cfg.lr)
        self.steps = server_step(self.glob, self.moments, self.steps, sums, n, self.cfg.lr, self.spec.weight_decay)
        self.totals.rejected = rejected
        self.totals.extra = {"clients": float(self.n), **(self.rule.last if self.rule is not None else {})}
        return self.totals

    def evaluate_message(self) -> Payload:
        return {f"{'rows' if k == FIRST else 'dense'}.{k}": v.cpu().numpy() for k, v in self.glob.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"glob": self.glob, "moments": self.moments, "steps": self.steps}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.glob, self.moments, self.steps = blob["glob"], blob["moments"], int(blob["steps"])
