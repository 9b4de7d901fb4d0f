"""A deployment's server as the one round driver's `Trainable`: Flower is a transport.

`FlowerServer` wraps a server (`fedrec.flower.roles.Server`) and a transport that carries its
messages to the nodes: `InProcess` (the nodes' roles called in this process, with copies of
every message, as a deployment has no shared memory) or, in `fedrec.flower.app`, Flower's grid.
A round is the role's train messages → the nodes' replies → the role's aggregation; evaluation
asks every node that answered the round to score its own clients and combines their figures.
Selection, test at the best validation round, checkpoints, resume and early stopping are the
driver's (`fedrec.core.run_rounds`), exactly as in the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from fedrec.core.contract import Trainable
from fedrec.errors import FedrecError
from fedrec.flower.roles import combine_metrics, stage_of, wire
from fedrec.results import RoundRecord
from fedrec.rounds.sides import Payload


class Transport(Protocol):
    """Carries messages to nodes and brings back the replies of those that answered."""

    def exchange(self, kind: str, payloads: dict[int, Payload], r: int) -> dict[int, Payload]: ...


class InProcess:
    """The nodes' roles, called in this process (`fedrec.flower.dispatch.run_in_process`).

    With ``rebuild`` (node index -> a new node), every message is answered by a new node that
    loads what the last one kept (``private_state``), as a deployment's ClientApp, a fresh
    process per message, does from Flower's context: state a node forgets to declare is lost
    here as it would be there.
    """

    def __init__(self, nodes: dict[int, Any], rebuild: Callable[[int], Any] | None = None) -> None:
        self.nodes, self.rebuild = nodes, rebuild
        self.kept: dict[int, bytes] = {}

    def exchange(self, kind: str, payloads: dict[int, Payload], r: int) -> dict[int, Payload]:
        out = {}
        for i, m in payloads.items():
            node = self.nodes[i]
            if self.rebuild is not None:
                node = self.rebuild(i)
                if i in self.kept:
                    node.load_private_state(self.kept[i])
            out[i] = wire(getattr(node, kind)(wire(m)))
            if self.rebuild is not None:
                self.kept[i] = node.private_state()
        return out


def array_bytes(payload: Payload) -> int:
    """What a message's arrays hold, in bytes."""
    return sum(v.nbytes for v in payload.values() if hasattr(v, "nbytes"))


class FlowerServer(Trainable):
    """A server role driven round by round over ``transport`` (see the module docstring).

    ``secure_sum(messages, r)``: the SecAgg+ exchange (the sum of the nodes' vectors and their
    clear counts), used instead of a plain exchange when given.
    """

    def __init__(self, role: Any, transport: Transport, protocol: Any, n_nodes: int,
                 secure_sum: Callable[[dict[int, Payload], int], tuple[Any, dict[int, Payload]]] | None = None
                 ) -> None:
        self.role, self.transport, self.protocol = role, transport, protocol
        self.max_rounds = role.max_rounds
        self.n_nodes, self.secure_sum = n_nodes, secure_sum
        self._silent: set[int] = set()
        self._record: RoundRecord | None = None
        self._round = 0
        self._evaluated: dict[int, Payload] = {}

    def train_round(self, r: int) -> RoundRecord:
        messages = self.role.train_messages(r)
        if self.secure_sum is not None:
            summed, replies = self.secure_sum(messages, r)
            record = self.role.finish_secure_round(r, summed, replies)
        else:
            replies = self.transport.exchange("train", messages, r)
            record = self.role.finish_round(r, replies)
            # what the messages' arrays really held (the records count the algorithm's bytes)
            record.extra["message_bytes_down"] = float(sum(map(array_bytes, messages.values())))
            record.extra["message_bytes_up"] = float(sum(map(array_bytes, replies.values())))
        self._silent = set(messages) - set(replies)  # no need to wait for them twice
        self._record, self._round = record, r
        return record

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        """Validation asks the nodes (their replies hold test figures too); test reads the same
        replies, so it is taken at the round validation chose."""
        if users is not None:
            raise FedrecError("a Flower server reports no groups of users apart")
        if stage == "valid":
            ask = self.role.evaluate_messages([n for n in self.role.node_ids if n not in self._silent])
            self._evaluated = self.transport.exchange("evaluate", ask, self._round)
            if self._record is not None:
                self._record.extra["evaluate_bytes_down"] = float(sum(map(array_bytes, ask.values())))
        return combine_metrics([stage_of(p, stage) for p in self._evaluated.values()], self.protocol)

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        raise FedrecError("a Flower server holds no client state: its nodes score their clients")

    def server_state_dict(self) -> dict[str, Any]:
        return {"role": self.role.model_state(), "rounds_done": self._round}

    def client_state_dict(self) -> dict[str, Any]:
        return {}  # the nodes keep theirs (Flower's context, and on disk for a resumed run)

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.role.load_model_state(blob["role"])
        self._round = int(blob["rounds_done"])

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        pass

    def run_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": "flower", "nodes": self.n_nodes}
        cfg = self.role.cfg
        if cfg.dp_noise > 0:  # the nodes added the Gaussian noise; the accounting is the server's
            # (against the server itself, a node's reply holds only its share of the noise:
            # the figure holds for what sees only the round's sum, e.g. under --secagg)
            from fedrec.federated.engine import privacy_spent

            out["privacy"] = privacy_spent(cfg, self.role.n_clients, self._round)
        return out
