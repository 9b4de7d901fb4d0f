"""PersonalFR and FedAvg of the rating autoencoder on Flower: the node and server roles.

A client is a group of users (`AESpec.partition`, drawn from the run's seed); node i holds the
i-th block of client ids and builds an `AEState` for them alone (`client_ids=`: shuffles and
dropout are drawn by client id, so it trains them as the simulator does). Its first answer
sends, for each of its clients, the item ids the client rated (PersonalFR's partial
compression sends them once); a train message then carries the shared dense layers and the
decoder rows of the sampled clients' items only (with compression; without it, the whole
tables), and the reply the sums over the node's clients of their row deltas and dense layers.
The server applies Equation 5 as the simulator does: a row moves by the sum of its deltas over
the clients of the round (a client without the row counts as unchanged), dense layers become
the mean.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig
from fedrec.federated.autoencoder import AEState, apply_round
from fedrec.flower.roles import (
    NodeData,
    Payload,
    ServerBase,
    check_deployable,
    grouped_share,
    log,
    pack_state,
    stage_metrics,
    unpack_state,
    wire_ids,
)
from fedrec.models.autoencoder import ROW_TABLES, init_params
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord

COUNTS = ("n", "loss_sum", "client_batches", "bytes_up", "bytes_down", "macs", "macs_fedrec",
          "users_trained")


class AENode:
    """A node holding a block of autoencoder clients (groups of users)."""

    def __init__(self, run: RunConfig, partition: int, partitions: int, split: Split) -> None:
        self.run, self.cfg = run, run.federated
        self.spec = check_deployable(run, split=split)
        self.n_clients, self.clients, users, local = grouped_share(self.spec, split, run.seed,
                                                                   partition, partitions)
        view = SimpleNamespace(train=split.train[users], n_users=len(users), n_items=split.n_items,
                               protocol=split.protocol)
        self.state = AEState(self.spec, view, local, run.seed, client_ids=self.clients)  # type: ignore[arg-type]
        data = NodeData.of(split, users)
        self.valid, self.test, self.protocol = data.valid, data.test, split.protocol

    def private_state(self) -> bytes:
        return pack_state({"priv": self.state.priv})

    def load_private_state(self, raw: bytes) -> None:
        self.state.priv = unpack_state(raw)["priv"]

    def hello(self, resume_round: int = 0) -> Payload:
        st = self.state
        return {"clients": self.clients, "n_clients": self.n_clients, "n_items": st.n_items,
                "client_items": wire_ids(st.row_item), "client_ptr": st.row_ptr}

    def _local(self, clients: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(self.clients, clients)
        if len(clients) and (rows.max() >= len(self.clients) or (self.clients[rows] != clients).any()):
            raise FedrecError("the server asked a node to train clients it does not hold")
        return rows

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
        row deltas (on the rows they hold) and of their dense layers."""
        r, st = int(msg["round"]), self.state
        self._set_global(msg)
        cohort, _ = st.training_order(self._local(np.asarray(msg["clients"])), self.cfg)
        payload, items = st.download(cohort)
        upload, stats = st.local_update(cohort, payload, self.cfg, r)
        touched = np.unique(items)
        at = torch.as_tensor(np.searchsorted(touched, items))
        reply: Payload = {"items": wire_ids(touched)}
        for k, v in upload.items():
            if k in ROW_TABLES:
                delta = v - payload[k]
                reply[f"rows.{k}"] = torch.zeros((len(touched), *delta.shape[1:])).index_add_(0, at, delta).cpu().numpy()
            else:
                reply[f"dense.{k}"] = v.sum(0).cpu().numpy()
        up, down = st.round_bytes(cohort, first_round=False)  # item ids: in the first answer
        reply.update({"n": len(cohort), "loss_sum": stats["loss_sum"],
                      "client_batches": stats["client_batches"], "bytes_up": up, "bytes_down": down,
                      "macs": stats["macs"], "macs_fedrec": stats["macs_fedrec"],
                      "users_trained": stats["users_trained"]})
        return reply

    def evaluate(self, msg: Payload) -> Payload:
        self._set_global({**msg, "items": np.arange(self.state.n_items)})
        return stage_metrics(self.state.scores, self.valid, self.test, self.protocol)


class AEServer(ServerBase):
    """The server of the autoencoders: the shared layers, Equation 5 over the nodes' sums."""

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        super().__init__(run, hellos, secure)
        init = init_params(self.n_items, self.spec.hidden, self.spec.norm,
                           torch.Generator().manual_seed(run.seed))
        self.glob = {k: v for k, v in init.items() if not self.spec.private(k)}
        self.items_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for node, h in hellos.items():
            ptr = np.asarray(h["client_ptr"])
            self.items_of[node] = (np.asarray(h["client_items"]), ptr)

    def train_messages(self, r: int) -> dict[int, Payload]:
        messages = {}
        dense = {f"dense.{k}": v.cpu().numpy() for k, v in self.glob.items() if k not in ROW_TABLES}
        for node, clients in self.round_clients(r).items():
            if self.spec.compression:
                flat, ptr = self.items_of[node]
                local = np.searchsorted(self._node_clients(node), clients)
                lengths = ptr[local + 1] - ptr[local]
                at = np.repeat(ptr[local] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
                items = np.unique(flat[at])
            else:
                items = np.arange(self.n_items)
            idx = torch.as_tensor(items)
            rows = {f"rows.{k}": v[idx].cpu().numpy() for k, v in self.glob.items() if k in ROW_TABLES}
            messages[node] = {"round": r, "clients": wire_ids(clients), "items": wire_ids(items), **rows, **dense}
        return messages

    def _node_clients(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.owner == self.node_ids.index(node))

    def finish_round(self, r: int, replies: dict[int, Payload]) -> RoundRecord:
        got, silent = self.answered(r, replies)
        sums = {k: torch.zeros_like(v) for k, v in self.glob.items()}
        totals = dict.fromkeys(COUNTS, 0.0)
        rejected = bad = 0
        for node, clients, reply in got:
            problem = self.check_upload(reply, len(clients))
            if problem:
                rejected, bad = rejected + len(clients), bad + 1
                log.warning("round %d: rejected the upload of node %d: %s", r, node, problem)
                continue
            idx = torch.as_tensor(reply["items"])
            for k in self.glob:
                if k in ROW_TABLES:
                    sums[k].index_add_(0, idx, torch.as_tensor(reply[f"rows.{k}"]))
                else:
                    sums[k] += torch.as_tensor(reply[f"dense.{k}"])
            for k in COUNTS:
                totals[k] += float(reply[k])
        n = totals["n"]
        if n > 0:
            apply_round(self.glob, torch.arange(self.n_items), sums, int(n))
        extra = {"macs": totals["macs"], "macs_fedrec": totals["macs_fedrec"],
                 "users_trained": totals["users_trained"], "clients": n,
                 "dropped_nodes": float(len(silent)),
                 "dropped_clients": float(sum(len(self.sent[s]) for s in silent)),
                 "rejected_nodes": float(bad)}
        if r == 1 and self.spec.compression:  # every client's item ids, sent in its first answer
            totals["bytes_up"] += 4 * sum(len(flat) for flat, _ in self.items_of.values())
        return RoundRecord(round=r, loss=totals["loss_sum"] / max(totals["client_batches"], 1.0),
                           seconds=0.0, bytes_up=int(totals["bytes_up"]),
                           bytes_down=int(totals["bytes_down"]), rejected_uploads=rejected,
                           extra=extra)

    def check_upload(self, reply: Payload, n_clients: int) -> str | None:
        missing = [k for k in ("items", *COUNTS) if k not in reply]
        missing += [f"{'rows' if k in ROW_TABLES else 'dense'}.{k}" for k in self.glob
                    if f"{'rows' if k in ROW_TABLES else 'dense'}.{k}" not in reply]
        if missing:
            return f"missing {', '.join(missing)}"
        items = np.asarray(reply["items"])
        if items.ndim != 1 or items.dtype.kind not in "iu" or (len(items) and (
                items.min() < 0 or items.max() >= self.n_items or len(np.unique(items)) != len(items))):
            return "item ids are not unique integers in range"
        for k, v in self.glob.items():
            got = np.asarray(reply[f"rows.{k}" if k in ROW_TABLES else f"dense.{k}"])
            want = (len(items), *v.shape[1:]) if k in ROW_TABLES else tuple(v.shape)
            if got.shape != want or got.dtype != np.float32 or not np.isfinite(got).all():
                return f"{k} has shape {got.shape} {got.dtype} or non-finite values, expected {want} float32"
        if int(reply["n"]) != n_clients or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {n_clients} sent, or a non-finite loss"
        return None

    def evaluate_message(self) -> Payload:
        return {**{f"rows.{k}": v.cpu().numpy() for k, v in self.glob.items() if k in ROW_TABLES},
                **{f"dense.{k}": v.cpu().numpy() for k, v in self.glob.items() if k not in ROW_TABLES}}

    def model_state(self) -> dict[str, Any]:
        return {"glob": self.glob}

    def load_model_state(self, blob: dict[str, Any]) -> None:
        self.glob = blob["glob"]
