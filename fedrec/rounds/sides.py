"""A round by side: what a node holding some clients does, and what the server does.

The simulator trains a whole cohort in one process (`fedrec.federated.family.algorithm`); a deployment
splits the same round between nodes, each holding a block of clients, and a server holding no
client. Each method family says what its two sides do, beside its state, as a `ClientSide` and a
`ServerSide`; a spec names its pair (``spec.sides()``). Both sides call the simulator's own steps
(a family's client step trains the node's sampled clients with the simulator's kernels, and its
server step is the state's own aggregation), so a deployment makes the simulator's draws and ends
with its figures up to the order of float sums. What the sides add is what crossing a network
needs: the messages, the checks on what arrives, and what a node fetches ahead.

The transport (`fedrec.flower`) is the same for every method: it samples a round's clients,
sends each node its message, checks and folds the replies through the server side, logs the nodes
that did not answer or sent a bad upload, and keeps each node's private state between messages.
Messages are flat dicts of numpy arrays and scalars (`Payload`).

A run, in messages:

* ``hello`` (once): a node answers with its client ids, the number of clients and items, and
  what its method's server needs before the first round.
* ``train`` (a round, one exchange per node holding a sampled client): the server side's message
  for those clients; the node trains them, keeps their private state, and replies with its
  clients' uploads, summed where the method allows, and its counts (`COUNTS`).
* ``evaluate``: the server side's model; each node scores its clients' validation and test sets
  and replies with their metrics and user counts (`stage_metrics`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate
from fedrec.partition import Partition
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.protocol import EvalSet, Protocol, Split

Payload = dict[str, Any]

#: what every train reply counts besides the method's uploads
COUNTS = ("n", "loss_sum", "client_batches", "bytes_up", "bytes_down")


class ClientSide(ABC):
    """A node: the clients it holds and their private state. A subclass is built as
    ``Side(spec, cfg, seed, split, partition, partitions)``: the method's spec and engine options,
    the run's seed, the data set's split (a node reads its own copy) and which of ``partitions``
    blocks of clients it holds."""

    @abstractmethod
    def hello(self, resume_round: int = 0) -> Payload:
        """Who this node is (``clients``, ``n_clients``, ``n_items``) and what the server needs
        before its first round (after ``resume_round`` on a resume)."""

    @abstractmethod
    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients of round ``msg['round']``; their uploads and `COUNTS`."""

    @abstractmethod
    def evaluate(self, msg: Payload) -> Payload:
        """Validation and test metrics of this node's clients under the model sent."""

    @abstractmethod
    def private_state(self) -> dict[str, Any]:
        """What the node's clients keep between messages (tensors and numbers)."""

    @abstractmethod
    def load_private_state(self, blob: dict[str, Any]) -> None:
        """Take back what `private_state` gave."""


@dataclass
class RoundTotals:
    """A round's figures, as the server side sums them from the replies it folded."""

    loss_sum: float = 0.0
    client_batches: float = 0.0
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    rejected: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, reply: Payload) -> None:
        self.loss_sum += float(reply["loss_sum"])
        self.client_batches += float(reply["client_batches"])
        self.bytes_up += float(reply["bytes_up"])
        self.bytes_down += float(reply["bytes_down"])


class ServerSide(ABC):
    """The server: the global model. A subclass is built as ``Side(spec, cfg, seed, hellos,
    n_clients, n_items, secure)``, from the nodes' first answers (``hellos``) and whether their
    uploads are summed by secure aggregation.

    A round is `begin` → `message` for each node holding a sampled client → `check` and `fold`
    for each reply that arrived → `finish`."""

    #: the most rounds the method has use for (as `fedrec.core.Trainable.max_rounds`)
    max_rounds: int | None = None

    def begin(self, r: int) -> None:  # noqa: B027  (a side with nothing to start keeps it)
        """Start round ``r`` (before its messages)."""

    @abstractmethod
    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        """Round ``r``'s message to ``node`` for its sampled ``clients``."""

    @abstractmethod
    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        """Why a node's reply for ``clients`` cannot be folded, or None."""

    @abstractmethod
    def fold(self, node: int, reply: Payload) -> None:
        """Add a checked reply to the round."""

    @abstractmethod
    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        """Aggregate the folded replies (``rejected``: clients whose node's reply was not folded;
        ``gen``: the round's server generator, `fedrec.core.plan.round_plan`)."""

    @abstractmethod
    def evaluate_message(self) -> Payload:
        """The model every node scores its clients with."""

    def evaluate_messages(self, nodes: list[int]) -> dict[int, Payload]:
        """The evaluation message to each of ``nodes``: `evaluate_message` to every one, unless
        a method's nodes each need their own (FedCA's clients' new models)."""
        message = self.evaluate_message()
        return dict.fromkeys(nodes, message)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What the server holds (its checkpointed state)."""

    @abstractmethod
    def load_state_dict(self, blob: dict[str, Any]) -> None:
        """Take back what `state_dict` gave."""


def missing(reply: Payload, keys: Any) -> str | None:
    """The problem of a reply without some of ``keys``, or None."""
    gone = [k for k in keys if k not in reply]
    return f"missing {', '.join(gone)}" if gone else None


def bad_item_ids(items: np.ndarray, n_items: int) -> str | None:
    """The problem of a reply's item ids unless they are unique integers in 0..n_items-1."""
    if items.ndim != 1 or items.dtype.kind not in "iu" or (len(items) and (
            items.min() < 0 or items.max() >= n_items or len(np.unique(items)) != len(items))):
        return "item ids are not unique integers in range"
    return None


def bad_floats(name: str, got: np.ndarray, want: tuple[int, ...]) -> str | None:
    """The problem of a reply's float32 array ``name`` unless it has shape ``want`` and is finite."""
    if got.shape != want or got.dtype != np.float32 or not np.isfinite(got).all():
        return f"{name} has shape {got.shape} {got.dtype} or non-finite values, expected {want} float32"
    return None


# -- a node's data ---------------------------------------------------------------------------


def node_users(n_users: int, partition: int, partitions: int) -> np.ndarray:
    """The clients (users) a node holds: the ``partition``-th of ``partitions`` consecutive
    blocks of user ids."""
    if not 0 <= partition < partitions:
        raise FedrecError(f"partition-id {partition} is outside 0..{partitions - 1}")
    return np.array_split(np.arange(n_users), partitions)[partition]


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
        return local_rows(self.users, clients)

    def view(self) -> SimpleNamespace:
        """The node's share as the split a method's state reads (rows: the node's users)."""
        return SimpleNamespace(train=self.train, sampler=self.sampler, n_users=len(self.users),
                               n_items=self.n_items, protocol=self.protocol)


def local_rows(held: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """Positions in the sorted ``held`` of ``clients`` (all must be held)."""
    rows = np.searchsorted(held, clients)
    if len(clients) and (rows.max() >= len(held) or (held[rows] != clients).any()):
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


def wire_ids(ids: np.ndarray) -> np.ndarray:
    """Ids as they travel: 4 bytes each (the byte counts assume so)."""
    return np.asarray(ids).astype(np.int32)
