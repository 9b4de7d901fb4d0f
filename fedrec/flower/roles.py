"""What the server and a node do with each message of a federated run, without Flower.

`fedrec.flower.app` wraps these two roles in a Flower ServerApp and ClientApp; tests also drive
them directly. Both run the simulator's own objects: a node builds the algorithm's state for the
clients it holds (`spec.create_state(..., client_ids=)`) and trains them with the simulator's
`train_cohort`; the server holds a state without clients and calls its `begin_round` and
`aggregate`. Every draw of a client is keyed by (seed, round, client id) and the server's by
(seed, round) (`fedrec.federated.draws`, `round_plan`), so a deployment makes the simulator's
draws and ends with its figures (up to the order of float sums).

A run, in messages (each a flat dict of numpy arrays and scalars, see `fedrec.flower.records`):

* ``hello`` (once): a node answers with its client ids, the catalogue size and the rows its
  clients need in the first round they take part in.
* ``train`` (a round, one exchange per node that holds a sampled client): the server sends the
  round, the node's sampled clients, the global rows those clients need and the shared weights;
  the node trains them, keeps their private state, and replies with the sum of its clients'
  accepted row deltas (only the rows they touched), shared-weight sums, counts, and the rows it
  will need in the next round one of its clients takes part in. The schedule is public (seeded),
  so the node knows that round; a node whose request is missing or stale gets the whole table.
* ``evaluate``: the server sends the whole table (ranking needs every row); each node scores its
  clients' validation and test sets and replies with their metrics and user counts. The server
  averages them, keeps validation for model selection and reads test only at the best
  validation round.

The server validates every reply (shapes, ids, finite values, counts) and drops a bad one with a
logged reason; a node that does not answer in time is logged as dropped and the round completes
with the others.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec import tensorfile
from fedrec.algorithms import get_algorithm
from fedrec.core.plan import round_plan
from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate
from fedrec.experiment import RunConfig
from fedrec.partition import Partition
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.protocol import EvalSet, Protocol, Split, get_protocol

log = logging.getLogger("fedrec.flower")

Payload = dict[str, Any]


def check_deployable(run: RunConfig, secure: bool = False, split: Split | None = None) -> Any:
    """The algorithm's spec (built for ``split``, or without data on the server), or a clear
    error for what the Flower app does not run yet."""
    alg = get_algorithm(run.algorithm)
    if alg.kind != "federated":
        raise FedrecError(f"'{run.algorithm}' is centralised: there is nothing to deploy")
    if not alg.flower:  # the papers' centralised baselines under federated names (tested)
        raise FedrecError(f"'{run.algorithm}' is a centralised baseline (one client or one server "
                          "holds every user): there is nothing to deploy; it runs in the simulator "
                          "only (`fedrec run`)")
    ranking = get_protocol(run.protocol).ranking
    if ranking not in alg.rankings:
        raise FedrecError(f"'{run.algorithm}' cannot be evaluated under protocol '{run.protocol}' "
                          f"({ranking}); see `fedrec protocols`")
    spec = alg.build(split, run.model)
    alg.check_engine(spec, run.federated)
    if split is None and ranking == "rating" and getattr(spec, "loss", None) == "bce":
        # the nodes' loss (`fedrec.federated.family.loss_for`), which a server without data
        # cannot read off a split: with it, the server's rows are the nodes' (the rating baseline's)
        spec = replace(spec, loss="mse")
    configured = getattr(spec, "configured", None)
    spec = configured(run.federated) if configured is not None else spec
    if run.federated.aggregation != "clients" and secure:
        raise FedrecError(f"secure aggregation sums the item tables alone, and --aggregation "
                          f"{run.federated.aggregation} divides each row by the clients that sent it (which it "
                          "hides): run it with --aggregation clients (the papers' rule)")
    if run.federated.defence is not None:
        raise FedrecError("--defence runs in the simulator only: Flower nodes send sums of their clients' "
                          "uploads, and a per-row robust rule needs each client's")
    refusal = spec.flower_refusal(secure)
    if refusal:
        raise FedrecError(f"'{run.algorithm}': {refusal}")
    return spec


def node_users(n_users: int, partition: int, partitions: int) -> np.ndarray:
    """The clients (users) a node holds: the ``partition``-th of ``partitions`` consecutive
    blocks of user ids."""
    if not 0 <= partition < partitions:
        raise FedrecError(f"partition-id {partition} is outside 0..{partitions - 1}")
    return np.array_split(np.arange(n_users), partitions)[partition]


# -- a node ----------------------------------------------------------------------------------


@dataclass
class NodeData:
    """A node's share of a split: its users' rows, renumbered 0..m-1 (``users[k]`` is row k)."""

    users: np.ndarray
    train: sp.csr_matrix
    sampler: ComplementSampler
    valid: EvalSet
    test: EvalSet
    protocol: Protocol
    n_users: int
    n_items: int

    @staticmethod
    def of(split: Split, users: np.ndarray) -> NodeData:
        return NodeData(users, split.train[users], split.sampler.subset(users),
                        _local_stage(split.valid, users, split.n_users),
                        _local_stage(split.test, users, split.n_users),
                        split.protocol, split.n_users, split.n_items)

    def rows_of(self, clients: np.ndarray) -> np.ndarray:
        """Local rows of global client ids (all must be this node's)."""
        rows = np.searchsorted(self.users, clients)
        if len(clients) and (rows.max() >= len(self.users) or (self.users[rows] != clients).any()):
            raise FedrecError("the server asked a node to train clients it does not hold")
        return rows


def grouped_share(spec: Any, split: Split, seed: int, partition: int, partitions: int
                  ) -> tuple[int, np.ndarray, np.ndarray, Partition]:
    """A node's share of grouped clients (FedCIA, the autoencoders): the number of clients in
    all, the ``partition``-th block of client ids, their users (sorted) and those users'
    clients renumbered 0..k-1 (a node without clients gets an empty one-client partition)."""
    everyone = spec.partition(split.n_users, seed)
    clients = node_users(everyone.n_clients, partition, partitions)
    users = np.sort(everyone.users_of(clients))
    local = Partition(np.searchsorted(clients, everyone.client_of_user[users]), max(len(clients), 1))
    return everyone.n_clients, clients, users, local


def _local_stage(stage: EvalSet, users: np.ndarray, n_users: int) -> EvalSet:
    pos = np.full(n_users, -1)
    pos[users] = np.arange(len(users))
    keep = pos[stage.users] >= 0
    fallback = stage.fallback
    return EvalSet(users=pos[stage.users[keep]], targets=stage.targets[users],
                   candidates=None if stage.candidates is None else stage.candidates[keep],
                   exclude=None if stage.exclude is None else stage.exclude[users],
                   fallback=None if fallback is None else replace(fallback, value=fallback.value[users]))


def stage_metrics(scorer: Any, valid: EvalSet, test: EvalSet, protocol: Protocol) -> Payload:
    """A node's validation and test metrics (``valid.*``, ``test.*``), each with its number of
    users and, for RMSE, of rated entries, so the server can average over all nodes."""
    out: Payload = {}
    for name, stage in (("valid", valid), ("test", test)):
        if not len(stage.users):  # a node whose clients hold no user of this stage
            out[f"{name}.users"] = 0.0
            continue
        for k, v in evaluate(scorer, stage, protocol).items():
            out[f"{name}.{k}"] = float(v)
        if protocol.ranking == "rating":
            out[f"{name}.entries"] = float(stage.targets[stage.users].nnz)
    return out


# -- the server ------------------------------------------------------------------------------


class ServerBase:
    """What every server shares: the nodes and the clients each holds (from their first
    answers), the clients of a round per node, dropped-node logging, selection on validation,
    test at the best validation round, checkpoints. Subclasses hold the model and implement
    `train_messages`, `finish_round`, `evaluate_message`, `model_state`, `load_model_state`."""

    #: the most rounds the method has use for (as `fedrec.core.Trainable.max_rounds`)
    max_rounds: int | None = None

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        self.run, self.cfg, self.secure = run, run.federated, secure
        self.spec = check_deployable(run, secure)
        self.protocol = get_protocol(run.protocol)
        if not hellos:
            raise FedrecError("no node answered the first message")
        sizes = {(int(h["n_clients"]), int(h["n_items"])) for h in hellos.values()}
        if len(sizes) != 1:
            raise FedrecError(f"nodes disagree on the data's size (clients, items): {sorted(sizes)}")
        self.n_clients, self.n_items = sizes.pop()
        self.node_ids = list(hellos)  # any ids (Flower's are 64-bit); owner holds positions
        # clients beyond the data's users (a malicious node's): sampled in a stratum of their own
        self.n_extra = sum(int(h.get("extra_clients", 0)) for h in hellos.values())
        self.owner = np.full(self.n_clients + self.n_extra, -1)
        for k, (node, h) in enumerate(hellos.items()):
            clients = np.asarray(h["clients"], np.int64)
            if (self.owner[clients] >= 0).any():
                raise FedrecError(f"node {node} claims clients another node holds")
            self.owner[clients] = k
        missing = int((self.owner[: self.n_clients] < 0).sum())
        if missing:
            log.warning("%d clients belong to no node that answered; they will not train", missing)
        self.sent: dict[int, np.ndarray] = {}
        self.gen: torch.Generator | None = None

    def round_clients(self, r: int) -> dict[int, np.ndarray]:
        """Round ``r``'s sampled clients (the simulator's `round_plan`) by the node holding them."""
        sampled, self.gen = round_plan(self.n_clients, self.cfg.clients_per_round, self.run.seed, r)
        if self.n_extra:
            from fedrec.security.adversary import extra_sample

            extra = extra_sample(self.n_extra, self.cfg.clients_per_round, self.run.seed, r) + self.n_clients
            sampled = np.concatenate([sampled, extra])
        sampled = sampled[self.owner[sampled] >= 0]
        self.sent = {self.node_ids[k]: sampled[self.owner[sampled] == k]
                     for k in np.unique(self.owner[sampled]).tolist()}
        return self.sent

    def answered(self, r: int, replies: dict[int, Payload]) -> tuple[list[tuple[int, np.ndarray, Payload]], list[int]]:
        """The (node, clients sent, reply) of the nodes that answered, and the silent nodes
        (logged)."""
        got, silent = [], []
        for node, clients in self.sent.items():
            if replies.get(node) is None:
                silent.append(node)
                log.warning("round %d: node %d did not answer (clients %s dropped)", r, node, shown_ids(clients))
            else:
                got.append((node, clients, replies[node]))
        return got, silent

    def model_state(self) -> dict[str, Any]:
        """What the server holds (its checkpointed state)."""
        raise NotImplementedError

    def load_model_state(self, blob: dict[str, Any]) -> None:
        raise NotImplementedError


def fold_counts(acc: Any, reply: Payload) -> None:
    """Add a node's counts (clients, rejected, bytes, loss, batches) to the round's `Accumulator`."""
    acc.n += int(reply["n"])
    acc.rejected += int(reply["rejected"])
    acc.bytes_up += int(reply["bytes_up"])
    acc.bytes_down += int(reply["bytes_down"])
    acc.loss_sum += float(reply["loss_sum"])
    acc.client_batches += int(reply["client_batches"])


def stage_of(payload: Payload, name: str) -> dict[str, float]:
    prefix = name + "."
    return {k[len(prefix):]: float(v) for k, v in payload.items() if k.startswith(prefix)}


def combine_metrics(parts: list[dict[str, float]], protocol: Protocol) -> dict[str, float]:
    """Per-node means (each with its ``users`` count) into the mean over all users, as
    `fedrec.eval.evaluate.evaluate` computes it on one machine (F1 from the overall P and R)."""
    parts = [p for p in parts if p.get("users", 0) > 0]
    if not parts:
        return {}
    total = sum(p["users"] for p in parts)
    out = {k: sum(p[k] * p["users"] for p in parts) / total for k in parts[0]
           if k not in ("users", "entries", "rmse")}
    if "rmse" in parts[0]:  # the root of the mean squared error over every rated entry
        entries = sum(p["entries"] for p in parts)
        out["rmse"] = math.sqrt(sum(p["rmse"] ** 2 * p["entries"] for p in parts) / max(entries, 1.0))
    for k in protocol.ks:
        if f"f1@{k}" in out:
            p, r = out[f"precision@{k}"], out[f"recall@{k}"]
            out[f"f1@{k}"] = 2 * p * r / (p + r) if p + r > 0 else 0.0
    out["users"] = float(total)
    return out


#: the layout of a node's private state (`fedrec.tensorfile`, kind ``node-state``)
NODE_STATE = 1


def pack_state(blob: dict[str, Any]) -> bytes:
    """A node's private state as bytes for its context and ``--client-state-dir``."""
    return tensorfile.dumps(blob, "node-state", NODE_STATE)


def unpack_state(raw: bytes, source: str = "the node's saved state") -> dict[str, Any]:
    """The state `pack_state` wrote; one line (`FedrecError`) for anything else."""
    blob = tensorfile.loads(raw, "node-state", NODE_STATE, source=source, what="node state",
                            legacy="Remove the --client-state-dir files of older fedrec runs")
    if not isinstance(blob, dict):
        raise FedrecError(f"{source}: not a node state (not a table)")
    return blob


def wire_ids(ids: np.ndarray) -> np.ndarray:
    """Ids as they travel: 4 bytes each (the byte counts assume so)."""
    return np.asarray(ids).astype(np.int32)


def shown_ids(clients: np.ndarray, show: int = 8) -> str:
    head = ", ".join(str(int(c)) for c in clients[:show])
    return head + (f", ... ({len(clients)} in all)" if len(clients) > show else "")


def wire(payload: Payload) -> Payload:
    """A message as it arrives: its own copies of the arrays (in one process a node must not
    share memory with the server's tensors, as it cannot across processes)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in payload.items()}
