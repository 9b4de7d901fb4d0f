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
the byte counts are what each client sends, as in the simulator. Under a robust rule
(``--defence``), or with a malicious node's clients among the uploads (the plain mean then), the
server asks for each client's upload instead and aggregates its similarity rows by the rule
against the last average (round 1: the start's, which every honest node sums over its clients in
its first answer), as the simulator's `CIAAlgorithm` does. It sends the malicious node
(`fedrec.flower.malicious.CIAMaliciousNode`) that average, and reads its crafted rows as they
come, each row's change.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.contract import ClientUpload
from fedrec.errors import FedrecError
from fedrec.federated.cia.state import CIAState, combine, dense_upload
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.sides import bad_numbers, check_per_client, client_uploads
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


def averages_similarities(spec: Any, n_clients: int) -> bool:
    """Whether the server averages whole similarity matrices, whose rows a robust rule judges
    (`fedrec.federated.cia.state.CIAState.plain_average`, for the run's ``n_clients``)."""
    return spec.models[0][0] != "gfcf" and spec.aggregation == "cia" and spec.scope == "all" and n_clients > 1


def _stacked(keep: list[ClientUpload]) -> Payload:
    """Clients' uploads stacked by part (``up.similarity``, or ``up.p`` and ``up.lam``); rank-L
    uploads of models of different widths (a backbone narrower than L sends fewer pairs) are
    padded with zero pairs, which add nothing to the matrix they rebuild."""
    if "similarity" in keep[0].tensors:
        return {"up.similarity": torch.stack([u.tensors["similarity"] for u in keep]).cpu().numpy()}
    rank = max(len(u.tensors["lam"]) for u in keep)
    p = torch.stack([F.pad(u.tensors["p"], (0, rank - len(u.tensors["lam"]))) for u in keep])
    lam = torch.stack([F.pad(u.tensors["lam"], (0, rank - len(u.tensors["lam"]))) for u in keep])
    return {"up.p": p.cpu().numpy(), "up.lam": lam.cpu().numpy()}


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
        out: Payload = {"clients": self.clients, "n_clients": self.n_clients, "n_items": self.state.n_items}
        judged = self.cfg.defence is not None or self.cfg.attack is not None
        if judged and averages_similarities(self.state.spec, self.n_clients) and resume_round == 0:
            # what a server that judges each upload (a defence, or an attacker's clients among
            # the uploads) reads round 1's against: the start's E_k E_kᵀ, summed
            out["start_similarity"] = self.state.similarity_total().cpu().numpy()
        return out

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
        keep: list[ClientUpload] | None = [] if msg.get("per_client") else None
        sums = self.state.client_sums(UploadPath(ldp=self.cfg.ldp), np.random.default_rng(), keep)
        counts = {"n": int(sums["n"]), "loss_sum": loss, "client_batches": batches,
                  "bytes_up": int(sums["bytes_up"]), "bytes_down": int(sums["bytes_down"])}
        if keep is not None:  # a robust rule: each client's upload as sent, stacked by part
            return {"owner": np.array([u.client for u in keep], np.int64), **_stacked(keep), **counts}
        reply = {f"sum.{k}": _numpy(v) for k, v in sums.items() if k not in COUNTS}
        return {**reply, **counts}

    def evaluate(self, msg: Payload) -> Payload:
        self._sync(msg)
        return stage_metrics(self.state.scores, self.valid, self.test, self.protocol)


class CIAServer(ServerSide):
    """The server of FedCIA and its baselines: the sum of the nodes' uploads, `combine`; under
    a robust ``rule``, each client's similarity rows aggregated by it, as the simulator's
    `CIAAlgorithm` does."""

    #: it has a slot for a robust rule (``--defence``): the nodes then send each client's upload
    takes_rule: ClassVar[bool] = True
    #: the round's robust aggregation (`fedrec.security.adversary.Security`), plugged in by the
    #: deployment; None: the nodes' plain sums
    rule: Any = None
    #: a malicious node's clients are read client by client, as the simulator's attacked round
    #: reads them (`fedrec.federated.cia.algorithm.CIAAlgorithm._defended`): the deployment plugs
    #: the plain mean into ``rule`` when no defence is asked
    judges_extra_clients: ClassVar[bool] = True

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.n_items, self.n_clients = spec, n_items, n_clients
        self.max_rounds = 1 if spec.models[0][0] == "gfcf" else None  # GF-CF: one shot
        self.sync: dict[str, Any] = {}  # the last server step, sent with every message
        self.sync_round = 0
        self.keys: set[str] | None = None  # the upload's keys, fixed by the first good reply
        # under a rule: the last average the clients' rows are judged against (round 1: the
        # start's, which every honest node sums over its clients in its first answer)
        self.global_similarity: torch.Tensor | None = None
        #: the malicious nodes (those declaring clients beyond the users): their messages carry
        #: the last average, which their clients craft rows against
        self.extra_nodes = {node for node, h in hellos.items() if int(h.get("extra_clients", 0))}
        honest = {node: h for node, h in hellos.items() if node not in self.extra_nodes}
        if honest and all("start_similarity" in h for h in honest.values()):
            total = np.zeros((n_items, n_items))
            for node, h in honest.items():
                start = np.asarray(h["start_similarity"])
                if start.shape != (n_items, n_items) or start.dtype.kind != "f" or not np.isfinite(start).all():
                    raise FedrecError(f"node {node} sent a start similarity of shape {start.shape} {start.dtype} "
                                      f"or non-finite values, expected ({n_items}, {n_items}) floats")
                total += start
            self.global_similarity = (torch.as_tensor(total) / n_clients).float()

    @property
    def plain_average(self) -> bool:
        """Whether the server averages whole similarity matrices, whose rows a rule can judge."""
        return averages_similarities(self.spec, self.n_clients)

    def _sync_payload(self) -> Payload:
        return {"sync_round": self.sync_round, **{f"sync.{k}": _numpy(v) for k, v in self.sync.items()}}

    def begin(self, r: int) -> None:
        self.sums: dict[str, Any] = {}
        self.totals = RoundTotals()
        self.n = 0
        self.kept: list[ClientUpload] = []  # honest clients' uploads, as sent
        self.crafted: list[ClientUpload] = []  # a malicious node's: each row's change

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        out = {"round": r, "clients": clients, **self._sync_payload(),
               **({"per_client": 1} if self.rule is not None else {})}
        if node in self.extra_nodes:
            out["average"] = self._average().cpu().numpy()
        return out

    def _average(self) -> torch.Tensor:
        """The last average the uploads are judged against, or one clear line."""
        if self.global_similarity is None:
            raise FedrecError("a defended or attacked FedCIA deployment judges uploads against the last average, "
                              "which this server lacks (a checkpoint of a plain run, or nodes that sent no start "
                              "similarity): start the run afresh")
        return self.global_similarity

    def fold(self, node: int, reply: Payload) -> None:
        if self.rule is not None and "ptr" in reply:  # a malicious node's crafted rows
            self.crafted.extend(client_uploads(reply, []))
            self.totals.add(reply)
            self.n += int(reply["n"])
            return
        if self.rule is not None:
            parts = {k[len("up."):]: np.asarray(v) for k, v in reply.items() if k.startswith("up.")}
            everything = np.arange(self.n_items)
            self.kept.extend(ClientUpload(int(c), everything, {k: torch.as_tensor(v[i]) for k, v in parts.items()})
                             for i, c in enumerate(np.asarray(reply["owner"]).tolist()))
            self.totals.add(reply)
            self.n += int(reply["n"])
            return
        for k, v in reply.items():
            if k.startswith("sum."):
                name = k[len("sum."):]
                v = np.asarray(v, np.float64)
                self.sums[name] = self.sums[name] + v if name in self.sums else v
        self.totals.add(reply)
        self.n += int(reply["n"])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        extra: dict[str, float] = {}
        if self.rule is not None and (self.kept or self.crafted):  # as the simulator's `CIAAlgorithm._defended`
            prev = self._average()
            benign = [ClientUpload(u.client, u.items, {ITEMS: dense_upload(u) - prev}) for u in self.kept]
            item_sum, _, n = self.rule.sums(benign + self.crafted, self.n_items, self.n_items, {}, prev, r)
            if n:
                self.global_similarity = prev + item_sum / n
            self.sync, extra = combine(self.spec, {"n": 1, "similarity": self.global_similarity.double(),
                                                   "bytes_up": 0, "bytes_down": 0})
            self.sync_round = r
            extra = {**extra, **self.rule.last}
        elif self.n > 0:
            self.sync, extra = combine(self.spec, {**self.sums, "n": self.n})
            self.sync_round = r
        self.totals.rejected = rejected
        self.totals.extra = {**extra, "clients": float(self.n)}
        return self.totals

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        problem = missing(reply, COUNTS)
        if problem:
            return problem
        if self.rule is not None and "ptr" in reply:  # a malicious node's: M-wide rows, no shared weight
            if np.asarray(clients).min(initial=self.n_clients) < self.n_clients:
                return "crafted rows from clients among the users (only declared extra clients send them)"
            return check_per_client(reply, clients, self.n_items, self.n_items, {}, side_keys=())
        if self.rule is not None:
            return self._check_per_client(reply, clients)
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

    def _check_per_client(self, reply: Payload, clients: np.ndarray) -> str | None:
        """Why each client's upload cannot be folded, or None: one dense similarity (M, M) or
        one rank-L eigen-upload (M, L) and (L,) for each client sent, finite."""
        owner, m = np.asarray(reply.get("owner", [])), self.n_items
        if owner.ndim != 1 or owner.dtype.kind not in "iu" or sorted(owner.tolist()) != sorted(np.asarray(clients).tolist()):
            return "uploads are not one for each client sent"
        parts = {k: np.asarray(v) for k, v in reply.items() if k.startswith("up.")}
        if set(parts) not in ({"up.similarity"}, {"up.p", "up.lam"}):
            return f"uploads {sorted(parts)}, expected up.similarity or up.p and up.lam"
        if any(v.dtype.kind != "f" for v in parts.values()) or bad_numbers(reply, COUNTS):
            return "uploads or counts are not numbers"
        c = len(owner)
        shapes = {k: v.shape for k, v in parts.items()}
        if "up.similarity" in parts:
            ok = shapes["up.similarity"] == (c, m, m)
        else:
            rank = shapes["up.lam"][-1] if len(shapes["up.lam"]) == 2 else -1
            ok = shapes["up.lam"] == (c, rank) and shapes["up.p"] == (c, m, rank)
        if not ok or not all(np.isfinite(v).all() for v in parts.values()):
            return f"uploads have shapes {shapes} or non-finite values"
        if int(reply["n"]) != c or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {c} sent, or a non-finite loss"
        return None

    def evaluate_message(self) -> Payload:
        return self._sync_payload()

    def state_dict(self) -> dict[str, Any]:
        return {"sync": self.sync, "sync_round": self.sync_round, "global_similarity": self.global_similarity}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.sync, self.sync_round = blob["sync"], blob["sync_round"]
        self.global_similarity = blob.get("global_similarity")
