"""PersonalFR's and the rating autoencoder's round by side (see `fedrec.rounds.sides`).

A client is a group of users (`AESpec.partition`, drawn from the run's seed); node i holds the
i-th block of client ids and builds an `AEState` for them alone (`client_ids=`: shuffles and
dropout are drawn by client id, so it trains them as the simulator does). Its first answer
sends, for each of its clients, the item ids the client rated (PersonalFR's partial
compression sends them once); a train message then carries the shared dense layers and the
decoder rows of the sampled clients' items only (with compression; without it, the whole
tables), and the reply the sums over the node's clients of their row deltas and dense layers.
The server applies Equation 5 as the simulator does: a row moves by the sum of its deltas over
the clients of the round (a client without the row counts as unchanged), dense layers become
the mean. Under a robust rule (``--defence``) the server asks for each client's upload instead
(`AEState.client_uploads`) and applies Equation 5 to what the rule accepts, as the simulator's
`AEAlgorithm` does.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.federated.ae.state import AEState, apply_round, apply_row_sums, row_table_of
from fedrec.federated.family.sides import (
    bad_numbers,
    check_per_client,
    client_uploads,
    per_client_payload,
)
from fedrec.models.autoencoder import ROW_TABLES, init_params
from fedrec.protocols.protocol import Split
from fedrec.rounds.sides import (
    COUNTS,
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    bad_floats,
    bad_item_ids,
    grouped_share,
    local_rows,
    missing,
    stage_metrics,
    wire_ids,
)

#: what a reply counts beyond `COUNTS`: the multiply-adds the round took, and the users it trained
FIGURES = ("macs", "macs_fedrec", "users_trained")


class AEClient(ClientSide):
    """A node holding a block of autoencoder clients (groups of users)."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.spec, self.cfg = spec, cfg
        self.n_clients, self.clients, users, local = grouped_share(spec, split, seed, partition, partitions)
        view = SimpleNamespace(train=split.train[users], n_users=len(users), n_items=split.n_items,
                               protocol=split.protocol)
        self.state = AEState(spec, view, local, seed, client_ids=self.clients)  # type: ignore[arg-type]
        data = NodeData.of(split, users)
        self.valid, self.test, self.protocol = data.valid, data.test, split.protocol

    def private_state(self) -> dict[str, Any]:
        return {"priv": self.state.priv}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        self.state.priv = blob["priv"]

    def hello(self, resume_round: int = 0) -> Payload:
        st = self.state
        return {"clients": self.clients, "n_clients": self.n_clients, "n_items": st.n_items,
                "client_items": wire_ids(st.row_item), "client_ptr": st.row_ptr}

    def _set_global(self, msg: Payload) -> None:
        glob = self.state.glob
        items = torch.as_tensor(msg["items"]) if "items" in msg else None
        for k in glob:
            if k in ROW_TABLES:
                glob[k][items] = torch.as_tensor(msg[f"rows.{k}"])
            else:
                glob[k] = torch.as_tensor(msg[f"dense.{k}"])

    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients from the layers and rows sent; reply with the sums of their
        row deltas (on the rows they hold) and of their dense layers, or, when the server asks
        (``per_client``: a robust rule), each client's own upload as the simulator's security
        layer reads it (`AEState.client_uploads`) and the sum of their weight-decay factors."""
        r, st = int(msg["round"]), self.state
        self._set_global(msg)
        cohort, steps = st.training_order(local_rows(self.clients, np.asarray(msg["clients"])), self.cfg)
        payload, items = st.download(cohort)
        upload, stats = st.local_update(cohort, payload, self.cfg, r)
        up, down = st.round_bytes(cohort, first_round=False)  # item ids: in the first answer
        counts = {"n": len(cohort), "loss_sum": stats["loss_sum"], "client_batches": stats["client_batches"],
                  "bytes_up": up, "bytes_down": down, **{k: stats[k] for k in FIGURES}}
        if msg.get("per_client"):
            uploads, _ = st.client_uploads(cohort, items, upload, steps, self.cfg.lr)
            dense = {k: v for k, v in st.glob.items() if k not in ROW_TABLES}
            return {**per_client_payload(uploads, self.clients, dense), **counts}
        touched = np.unique(items)
        at = torch.as_tensor(np.searchsorted(touched, items))
        reply: Payload = {"items": wire_ids(touched)}
        for k, v in upload.items():
            if k in ROW_TABLES:
                delta = v - payload[k]
                reply[f"rows.{k}"] = torch.zeros((len(touched), *delta.shape[1:])).index_add_(0, at, delta).cpu().numpy()
            else:
                reply[f"dense.{k}"] = v.sum(0).cpu().numpy()
        reply.update(counts)
        return reply

    def evaluate(self, msg: Payload) -> Payload:
        self._set_global({**msg, "items": np.arange(self.state.n_items)})
        return stage_metrics(self.state.scores, self.valid, self.test, self.protocol)


class AEServer(ServerSide):
    """The server of the autoencoders: the shared layers, Equation 5 over the nodes' sums, or
    over each client's upload as a robust ``rule`` aggregates them."""

    #: it has a slot for a robust rule (``--defence``): the nodes then send each client's upload
    takes_rule: ClassVar[bool] = True
    #: the round's robust aggregation (`fedrec.security.adversary.Security`), plugged in by the
    #: deployment; None: the nodes' plain sums
    rule: Any = None
    #: its server averages the shared layers over the clients, whose output rows are an item
    #: table a rule can judge row by row (`fedrec.federated.ae.state.AEState.plain_average`)
    plain_average: ClassVar[bool] = True

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.n_items = spec, n_items
        init = init_params(n_items, spec.hidden, spec.norm, torch.Generator().manual_seed(seed))
        self.glob = {k: v for k, v in init.items() if not spec.private(k)}
        # each node's clients (in id order) and the item ids each rated, from their first answers
        self.items_of = {node: (np.sort(np.asarray(h["clients"], np.int64)), np.asarray(h["client_items"]),
                                np.asarray(h["client_ptr"])) for node, h in hellos.items() if not h.get("whole_table")}
        # a node that asks for the whole table each round (the attacker's: it crafts rows of every item)
        self.whole = {node for node, h in hellos.items() if h.get("whole_table")}

    def begin(self, r: int) -> None:
        self.sums = {k: torch.zeros_like(v) for k, v in self.glob.items()}
        self.totals = RoundTotals()
        self.figures = dict.fromkeys(FIGURES, 0.0)
        self.n = 0
        self.first = r == 1
        self.kept: list[Any] = []  # each client's upload, under a rule

    @property
    def dense(self) -> dict[str, torch.Tensor]:
        """The shared dense layers (a client's upload holds its copy of each)."""
        return {k: v for k, v in self.glob.items() if k not in ROW_TABLES}

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        if self.spec.compression and node not in self.whole:
            held, flat, ptr = self.items_of[node]
            local = np.searchsorted(held, clients)
            lengths = ptr[local + 1] - ptr[local]
            at = np.repeat(ptr[local] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
            items = np.unique(flat[at])
        else:
            items = np.arange(self.n_items)
        idx = torch.as_tensor(items)
        rows = {f"rows.{k}": v[idx].cpu().numpy() for k, v in self.glob.items() if k in ROW_TABLES}
        dense = {f"dense.{k}": v.cpu().numpy() for k, v in self.glob.items() if k not in ROW_TABLES}
        return {"round": r, "clients": wire_ids(clients), "items": wire_ids(items), **rows, **dense,
                **({"per_client": 1} if self.rule is not None else {})}

    def fold(self, node: int, reply: Payload) -> None:
        if self.rule is not None:
            self.kept.extend(client_uploads(reply, list(self.dense)))
            self._fold_counts(reply)
            return
        idx = torch.as_tensor(reply["items"])
        for k in self.glob:
            if k in ROW_TABLES:
                self.sums[k].index_add_(0, idx, torch.as_tensor(reply[f"rows.{k}"]))
            else:
                self.sums[k] += torch.as_tensor(reply[f"dense.{k}"])
        self._fold_counts(reply)

    def _fold_counts(self, reply: Payload) -> None:
        self.totals.add(reply)
        self.n += int(reply["n"])
        for k in FIGURES:
            self.figures[k] += float(reply[k])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        if self.rule is not None:  # as the simulator's `AEAlgorithm._guarded`
            table = row_table_of(self.glob)
            item_sum, dense_sum, n = self.rule.sums(self.kept, *table.shape, self.dense, table, r)
            if n:  # no weight decay of untrained rows: a deployment trains with Adam or compression
                apply_row_sums(self.glob, item_sum, dense_sum, n)
        elif self.n > 0:
            apply_round(self.glob, torch.arange(self.n_items), self.sums, self.n)
        if self.first and self.spec.compression:  # every client's item ids, sent in its first answer
            self.totals.bytes_up += 4 * sum(len(flat) for _, flat, _ in self.items_of.values())
        self.totals.rejected = rejected
        self.totals.extra = {**self.figures, "clients": float(self.n),
                             **(self.rule.last if self.rule is not None else {})}
        return self.totals

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        if self.rule is not None:
            return (missing(reply, FIGURES) or bad_numbers(reply, FIGURES) or check_per_client(
                reply, clients, self.n_items, row_table_of(self.glob).shape[1], self.dense, side_keys=()))
        keys = [f"{'rows' if k in ROW_TABLES else 'dense'}.{k}" for k in self.glob]
        problem = missing(reply, ["items", *COUNTS, *FIGURES, *keys])
        if problem:
            return problem
        items = np.asarray(reply["items"])
        problem = bad_item_ids(items, self.n_items)
        if problem:
            return problem
        for k, v in self.glob.items():
            got = np.asarray(reply[f"rows.{k}" if k in ROW_TABLES else f"dense.{k}"])
            want = (len(items), *v.shape[1:]) if k in ROW_TABLES else tuple(v.shape)
            problem = bad_floats(k, got, want)
            if problem:
                return problem
        if int(reply["n"]) != len(clients) or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {len(clients)} sent, or a non-finite loss"
        return None

    def evaluate_message(self) -> Payload:
        return {**{f"rows.{k}": v.cpu().numpy() for k, v in self.glob.items() if k in ROW_TABLES},
                **{f"dense.{k}": v.cpu().numpy() for k, v in self.glob.items() if k not in ROW_TABLES}}

    def state_dict(self) -> dict[str, Any]:
        return {"glob": self.glob}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.glob = blob["glob"]
