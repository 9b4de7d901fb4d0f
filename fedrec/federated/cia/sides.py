"""FedCIA's and its parameter-averaging baselines' round by side (see `fedrec.rounds.sides`).

A client is a group of users (`CIASpec.partition`, drawn from the run's seed); node i holds the
i-th block of client ids and builds a `CIAState` for them alone (``client_ids=``: initial
vectors, negatives and shuffles are keyed by client id, so it trains them as the simulator
does). Every client trains every round (the paper's Algorithm 1).

* **Train**: the node trains its clients and replies with the sum over them of what each
  uploads (`CIAState.client_sums`: similarities E_k E_kᵀ, their item-block counts under
  ``scope=local``, FedAvg's weighted parameters, GF-CF filters), noised on the node under
  ``--ldp`` (its own entropy), with their counts and byte costs.
* **Server**: adds the nodes' sums and runs the simulator's server step (`combine`: the mean,
  its eigendecomposition), which every later message carries as ``sync.*`` with its round.
* A node applies a ``sync`` it has not applied yet (`CIAState.apply`: each client fine-tunes
  towards the mean, or takes the average) before it trains or scores, and keeps the round it
  applied with its clients' models: the simulator applies it at the end of the round, and a
  node never trains or scores between that point and the next message.

A node's message to the server is the sum of its clients' uploads (as decoded by the server);
the byte counts are what each client sends, as in the simulator.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.errors import FedrecError
from fedrec.federated.cia.state import CIAState, combine
from fedrec.protocols.protocol import Split
from fedrec.rounds.sides import (
    COUNTS,
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    grouped_share,
    missing,
    stage_metrics,
)
from fedrec.rounds.upload import UploadPath


def _numpy(v: Any) -> Any:
    return v.cpu().numpy() if isinstance(v, torch.Tensor) else v


class CIAClient(ClientSide):
    """A node holding a block of FedCIA clients (groups of users) and their whole models."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.cfg = cfg
        self.n_clients, self.clients, users, local = grouped_share(spec, split, seed, partition, partitions)
        data = NodeData.of(split, users)
        self.state = CIAState(spec, data.train, data.sampler, local, seed, client_ids=self.clients)
        self.valid, self.test, self.protocol = data.valid, data.test, split.protocol
        self.applied = 0  # the last round whose server step this node's clients took

    def private_state(self) -> dict[str, Any]:
        return {**self.state.client_state(), "global_filter": self.state._global_filter, "applied": self.applied}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        self.state._global_filter, self.applied = blob.pop("global_filter"), blob.pop("applied")
        self.state.load_client_state(blob)

    def hello(self, resume_round: int = 0) -> Payload:
        return {"clients": self.clients, "n_clients": self.n_clients, "n_items": self.state.n_items}

    def _sync(self, msg: Payload) -> None:
        """Apply the server's last step if this node's clients have not taken it yet."""
        r = int(msg.get("sync_round", 0))
        if r > self.applied:
            self.state.apply({k[len("sync."):]: v for k, v in msg.items() if k.startswith("sync.")})
            self.applied = r

    def train(self, msg: Payload) -> Payload:
        """Train every client of the node; reply with the sums of their uploads and counts."""
        clients = np.asarray(msg["clients"], np.int64)
        if not np.array_equal(np.sort(clients), self.clients):
            raise FedrecError("FedCIA trains every client every round; the server sent a subset")
        self._sync(msg)
        loss, batches = self.state.train(self.cfg, int(msg["round"]))
        sums = self.state.client_sums(UploadPath(ldp=self.cfg.ldp), np.random.default_rng())
        reply = {f"sum.{k}": _numpy(v) for k, v in sums.items() if k not in COUNTS}
        return {**reply, "n": int(sums["n"]), "loss_sum": loss, "client_batches": batches,
                "bytes_up": int(sums["bytes_up"]), "bytes_down": int(sums["bytes_down"])}

    def evaluate(self, msg: Payload) -> Payload:
        self._sync(msg)
        return stage_metrics(self.state.scores, self.valid, self.test, self.protocol)


class CIAServer(ServerSide):
    """The server of FedCIA and its baselines: the sum of the nodes' uploads, `combine`."""

    #: why ``--defence`` is refused on Flower (the simulator runs it on FedCIA)
    rule_refusal: ClassVar[str] = ("--defence runs in the simulator (`fedrec run`); on Flower its nodes send "
                                   "their clients' summed similarities, not each client's upload")

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.n_items = spec, n_items
        self.max_rounds = 1 if spec.models[0][0] == "gfcf" else None  # GF-CF: one shot
        self.sync: dict[str, Any] = {}  # the last server step, sent with every message
        self.sync_round = 0
        self.keys: set[str] | None = None  # the upload's keys, fixed by the first good reply

    def _sync_payload(self) -> Payload:
        return {"sync_round": self.sync_round, **{f"sync.{k}": _numpy(v) for k, v in self.sync.items()}}

    def begin(self, r: int) -> None:
        self.sums: dict[str, Any] = {}
        self.totals = RoundTotals()
        self.n = 0

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        return {"round": r, "clients": clients, **self._sync_payload()}

    def fold(self, node: int, reply: Payload) -> None:
        for k, v in reply.items():
            if k.startswith("sum."):
                name = k[len("sum."):]
                v = np.asarray(v, np.float64)
                self.sums[name] = self.sums[name] + v if name in self.sums else v
        self.totals.add(reply)
        self.n += int(reply["n"])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        extra: dict[str, float] = {}
        if self.n > 0:
            self.sync, extra = combine(self.spec, {**self.sums, "n": self.n})
            self.sync_round = r
        self.totals.rejected = rejected
        self.totals.extra = {**extra, "clients": float(self.n)}
        return self.totals

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        problem = missing(reply, COUNTS)
        if problem:
            return problem
        keys = {k for k in reply if k.startswith("sum.")}
        if self.keys is not None and keys != self.keys:
            return f"uploads {sorted(keys)}, expected {sorted(self.keys)}"
        m = self.n_items
        for k in keys:
            v = np.asarray(reply[k])
            if not np.isfinite(v).all():
                return f"{k} holds non-finite values"
            if k in ("sum.similarity", "sum.count", "sum.filter") and v.shape != (m, m):
                return f"{k} has shape {v.shape}, expected ({m}, {m})"
        if int(reply["n"]) != len(clients) or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {len(clients)} sent, or a non-finite loss"
        self.keys = keys
        return None

    def evaluate_message(self) -> Payload:
        return self._sync_payload()

    def state_dict(self) -> dict[str, Any]:
        return {"sync": self.sync, "sync_round": self.sync_round}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.sync, self.sync_round = blob["sync"], blob["sync_round"]
