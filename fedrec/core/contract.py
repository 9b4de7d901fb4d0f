"""What the round driver needs of an algorithm: the typed contract every method implements.

Two levels:

* `Trainable` — anything the driver trains round by round: ``train_round`` (one round, or one
  epoch of a centralised model), ``scores`` for evaluation and recommendation, and its state
  as two separate dicts, the server's and the clients'. Keeping them apart is what lets a
  Flower node keep exactly its clients' part (declared, never guessed from a deny-list) and a
  checkpoint hold both.
* `FederatedAlgorithm` — a federated round spelled out as docs/engine.md's steps: the driver's
  `RoundPlan` (sampled clients and the server's generators) goes to ``begin_round``, then
  ``local_update`` trains the sampled clients and returns their `Uploads`, and ``aggregate``
  turns the uploads into the new server state. Its ``train_round`` is written once here.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedrec.core.device import settle
from fedrec.errors import Diverged
from fedrec.results import RoundRecord


@dataclass
class RoundPlan:
    """The server's draws of a round (`fedrec.core.plan.round_plan`).

    ``clients``: the sampled client ids, sorted. ``server_gen``: the generator of the server's
    own noise (DP). ``rng``: a generator seeded by (seed, round) for the simulator's draws that
    are not a client's own (FedCIA's upload noise, drawn in one pass); it is fresh, so using it
    does not shift any other draw.
    """

    round: int
    clients: np.ndarray
    server_gen: torch.Generator
    rng: np.random.Generator


@dataclass
class ClientUpload:
    """One client's upload in a round: the items its row tensors are about (one row each), its
    tensors by name (row tables first dimension = ``items``; dense layers whole), and whether
    the server accepted it."""

    client: int
    items: np.ndarray
    tensors: dict[str, torch.Tensor]
    accepted: bool = True


def row_senders(uploads: list[ClientUpload], n_items: int) -> torch.Tensor:
    """How many of ``uploads`` sent each of the ``n_items`` item rows (on the host), the
    divisor of a server that averages each row over its senders."""
    items = [np.asarray(u.items, np.int64) for u in uploads]
    return torch.as_tensor(np.bincount(np.concatenate([np.zeros(0, np.int64), *items]), minlength=n_items),
                           dtype=torch.float32, device="cpu")


@dataclass
class Uploads:
    """What the clients of a round sent, and what it cost.

    ``payload`` is the algorithm's own form of the uploads: running sums folded chunk by chunk
    (memory proportional to the rows the clients touched; the simulator's fast path), or the
    per-client uploads when something has to look at each one. ``per_client`` holds each
    client's `ClientUpload` when the algorithm was asked to keep them (see
    `FederatedAlgorithm.keep_uploads`), else None.
    """

    payload: Any = None
    per_client: list[ClientUpload] | None = None
    rejected: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    loss_sum: float = 0.0
    client_batches: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def loss(self) -> float:
        """Mean training loss over the clients' minibatches."""
        return self.loss_sum / max(self.client_batches, 1)


class Trainable(ABC):
    """Anything the round driver trains (see the module docstring)."""

    #: what to lower when the loss stops being finite (said in the error)
    divergence_hint: str = "lower --lr"
    #: the most rounds the method has use for (GF-CF, computed once: 1); None = any
    max_rounds: int | None = None

    @abstractmethod
    def train_round(self, r: int) -> RoundRecord:
        """Train round (or epoch) ``r`` (1-based); its record without validation figures."""

    @abstractmethod
    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        """Scores ``(len(users), C)`` of ``items`` (``(len(users), C)``; None = every item),
        each user under its own state (`fedrec.eval.evaluate.Scorer`)."""

    @abstractmethod
    def server_state_dict(self) -> dict[str, Any]:
        """What the server holds (global tables, shared weights, server optimiser state)."""

    @abstractmethod
    def client_state_dict(self) -> dict[str, Any]:
        """What the clients hold privately (never sent to the server)."""

    @abstractmethod
    def load_server_state_dict(self, blob: dict[str, Any]) -> None: ...

    @abstractmethod
    def load_client_state_dict(self, blob: dict[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """Server and client state, kept apart; and, in an attacked run, what the attacker
        carries from round to round (``security.attack``, `fedrec.security.attacks.Attack.state`),
        so a run resumed from a checkpoint goes on as if never stopped, whichever method."""
        out = {"server": self.server_state_dict(), "clients": self.client_state_dict()}
        attack = self._attack()
        if attack is not None:
            out["attack"] = attack.state()
        return out

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.load_server_state_dict(blob["server"])
        self.load_client_state_dict(blob["clients"])
        attack = self._attack()
        if attack is not None and "attack" in blob:
            attack.load_state(blob["attack"])

    def _attack(self) -> Any:
        """The run's attack, where a security layer is plugged into this algorithm; else None."""
        security = getattr(self, "security", None)
        return getattr(security, "attack", None)

    def scale_rates(self, factor: float) -> bool:
        """Multiply the learning rates by ``factor`` (the driver's back-off after a divergence);
        False where the trainer cannot, and the run then stops at its divergence."""
        return False

    def user_groups(self) -> dict[str, np.ndarray]:
        """Groups of users whose test figures are reported apart (GFed-PP: public, private)."""
        return {}

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        """Figures of ``stage`` (``valid`` or ``test``) of ``split``, of all users or of those
        where ``users`` (a boolean mask) holds. A Flower server overrides it: its nodes score
        their own clients and it combines their figures."""
        from fedrec.core.device import eval_chunk_users
        from fedrec.eval.evaluate import evaluate, restrict

        data = getattr(split, stage)
        width = data.candidates.shape[1] if split.protocol.ranking == "sampled" else split.n_items
        return evaluate(self.scores, data if users is None else restrict(data, users), split.protocol,
                        chunk_users=eval_chunk_users(width))

    def run_extra(self) -> dict[str, Any]:
        """Algorithm-specific figures for the results JSON."""
        return {}


class FederatedAlgorithm(Trainable):
    """A federated algorithm: a round is plan → begin_round → local_update → aggregate.

    Subclasses hold ``n_clients``, ``seed`` and ``clients_per_round`` (the driver's sampling)
    and implement the three steps; ``round_extra`` adds figures to the round's record.
    """

    n_clients: int
    seed: int
    clients_per_round: float = 1.0
    #: keep each client's upload in `Uploads.per_client` (robust aggregation, audits)
    keep_uploads: bool = False
    #: called with each round's uploads and plan before aggregation (privacy audits)
    observers: tuple[Any, ...] = ()

    def plan(self, r: int) -> RoundPlan:
        """Round ``r``'s server draws: sampled clients, the server's noise generator."""
        from fedrec.core.plan import round_plan

        clients, gen = round_plan(self.n_clients, self.clients_per_round, self.seed, r)
        return RoundPlan(r, clients, gen, np.random.default_rng([self.seed, r]))

    def begin_round(self, plan: RoundPlan) -> None:
        """Prepare the server for round ``plan.round`` (curricula, deferred server steps)."""

    @abstractmethod
    def local_update(self, plan: RoundPlan) -> Uploads:
        """Send each sampled client what it needs, train it, keep its private state; return
        the round's uploads."""

    @abstractmethod
    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        """Fold the round's uploads into the server state."""

    def round_extra(self) -> dict[str, float]:
        """Algorithm-specific figures for the round's record."""
        return {}

    def train_round(self, r: int) -> RoundRecord:
        """One round; its record's ``extra`` says how long the clients' side (``train_seconds``:
        the server's preparation, broadcast, local updates, uploads) and the server's
        aggregation (``aggregate_seconds``) took."""
        start = time.perf_counter()
        plan = self.plan(r)
        self.begin_round(plan)
        uploads = self.local_update(plan)
        if not math.isfinite(uploads.loss_sum):
            raise Diverged(f"training diverged in round {r} (the loss is not finite); "
                           f"{self.divergence_hint}", r)
        for watch in self.observers:
            watch(uploads, plan)
        settle()
        trained = time.perf_counter()
        self.aggregate(uploads, plan)
        settle()
        timing = {"train_seconds": trained - start, "aggregate_seconds": time.perf_counter() - trained}
        return RoundRecord(round=r, loss=uploads.loss, seconds=0.0, bytes_up=uploads.bytes_up,
                           bytes_down=uploads.bytes_down, rejected_uploads=uploads.rejected,
                           extra={**uploads.extra, **self.round_extra(), **timing})
