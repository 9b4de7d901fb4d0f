"""The generic node and server of a deployment: any method's round by side, without Flower.

`fedrec.flower.app` wraps these two in a Flower ClientApp and ServerApp; tests also drive them
directly. Each method says what its node and its server do (its `fedrec.rounds.sides` pair,
``spec.sides()``); what is the same for every method is here: the run's options and the check
that it can be deployed, which node holds which client, the round's sampled clients by node
(the simulator's `round_plan`, so a deployment makes the simulator's draws), the nodes that did not
answer and the replies that fail their method's check (logged, left out of the round), the round's
record, and each node's private state as bytes between messages.

The server validates every reply and drops a bad one with a logged reason; a node that does not
answer in time is logged as dropped and the round completes with the others.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fedrec import tensorfile
from fedrec.algorithms import get_algorithm
from fedrec.core.plan import round_plan
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, prepare_split
from fedrec.protocols.protocol import Protocol, Split, get_protocol, with_cutoffs
from fedrec.results import RoundRecord
from fedrec.rounds.sides import Payload

if TYPE_CHECKING:
    import torch

log = logging.getLogger("fedrec.flower")


def check_deployable(run: RunConfig, secure: bool = False, split: Split | None = None) -> Any:
    """The algorithm's spec (built for ``split``, or without data on the server), or a clear
    error for what the Flower app does not run yet."""
    alg = get_algorithm(run.algorithm)
    if alg.kind != "federated":
        raise FedrecError(f"'{run.algorithm}' is centralised: there is nothing to deploy")
    if not alg.flower:  # the papers' centralised baselines under federated names (tested)
        why = getattr(alg.options, "not_deployed", None)  # a federated method the app does not run
        if why:
            raise FedrecError(f"'{run.algorithm}' runs in the simulator only (`fedrec run`): {why}")
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
        # the nodes' loss (`fedrec.federated.family.spec.loss_for`), which a server without data
        # cannot read off a split: with it, the server's rows are the nodes' (the rating baseline's)
        spec = replace(spec, loss="mse")
    configured = getattr(spec, "configured", None)
    spec = configured(run.federated) if configured is not None else spec
    if run.federated.defence is not None and secure:
        raise FedrecError("--defence looks at each client's upload, and secure aggregation shows the server "
                          "only their sum: run one or the other")
    if run.federated.defence is not None and not getattr(spec.sides()[1], "takes_rule", False):
        from fedrec.security.adversary import PLAIN_AVERAGE

        why = getattr(spec.sides()[1], "rule_refusal", None)  # a method the simulator defends
        raise FedrecError(f"'{run.algorithm}': {why}" if why else
                          f"--defence runs on {PLAIN_AVERAGE}, not on '{run.algorithm}'")
    if run.federated.defence is not None and (run.federated.dp_noise > 0 or run.federated.ldp > 0):
        raise FedrecError("--defence aggregates each client's upload; with --ldp/--dp-noise the nodes "
                          "noise their clients' sum, so the two do not combine yet")
    refusal = spec.flower_refusal(secure)
    if refusal:
        raise FedrecError(f"'{run.algorithm}': {refusal}")
    return spec


# -- the node ---------------------------------------------------------------------------------


class Node:
    """A node: its method's client side for the clients of partition ``partition`` of
    ``partitions`` (read from ``split``, or from the run's data)."""

    def __init__(self, run: RunConfig, partition: int, partitions: int, split: Split | None = None) -> None:
        split = split if split is not None else prepare_split(run)
        spec = check_deployable(run, split=split)
        client_side, _ = spec.sides()
        self.side = client_side(spec, run.federated, run.seed, split, partition, partitions)

    def hello(self, resume_round: int = 0) -> Payload:
        return self.side.hello(resume_round)

    def train(self, msg: Payload) -> Payload:
        return self.side.train(msg)

    def train_secure(self, msg: Payload) -> tuple[list[np.ndarray], Payload]:
        return self.side.train_secure(msg)

    def evaluate(self, msg: Payload) -> Payload:
        return self.side.evaluate(msg)

    def private_state(self) -> bytes:
        """Its clients' private state as bytes, for its context and ``--client-state-dir``."""
        return pack_state(self.side.private_state())

    def load_private_state(self, raw: bytes) -> None:
        self.side.load_private_state(unpack_state(raw))


# -- the server -------------------------------------------------------------------------------


class Server:
    """The server: its method's server side, the nodes and the clients each holds (from their
    first answers), the clients of a round per node, dropped and rejected nodes, the round's
    record."""

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        """``secure``: uploads are summed by secure aggregation (`finish_secure_round`)."""
        self.run, self.cfg, self.secure = run, run.federated, secure
        self.spec = check_deployable(run, secure)
        self.protocol = with_cutoffs(get_protocol(run.protocol), run.ks)  # as the nodes' splits
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
        _, server_side = self.spec.sides()
        self.side = server_side(self.spec, self.cfg, run.seed, hellos, self.n_clients, self.n_items, secure)
        self.max_rounds = self.side.max_rounds
        if self.cfg.defence is not None or (self.n_extra and getattr(server_side, "judges_extra_clients", False)):
            self._plug_defence()

    def _plug_defence(self) -> None:
        """The run's robust rule in the server side's ``rule`` slot, where its server plainly
        averages item rows or admits each client's rows (as the simulator's
        `fedrec.security.adversary.attach` requires); without ``--defence``, the plain mean, for
        a server that reads an attacker's clients' uploads client by client
        (``judges_extra_clients``: FedCIA's, as its simulator's attacked round does)."""
        from fedrec.security.adversary import PLAIN_AVERAGE, Security

        state = getattr(self.side, "state", self.side)  # FedCA's server side admits the tables itself
        if not (getattr(state, "plain_average", False) or hasattr(state, "admit_uploads")):  # (FedRAP-D: no C)
            raise FedrecError(f"--defence runs on {PLAIN_AVERAGE}, not on '{self.run.algorithm}'")
        self.side.rule = Security.defence(self.cfg, self.n_clients, self.n_extra, self.n_items, self.run.seed)

    def round_clients(self, r: int) -> dict[int, np.ndarray]:
        """Round ``r``'s sampled clients (the simulator's `round_plan`) by the node holding them."""
        sampled, self.gen = round_plan(self.n_clients, self.cfg.clients_per_round, self.run.seed, r)
        if self.n_extra:
            from fedrec.core.plan import extra_sample

            extra = extra_sample(self.n_extra, self.cfg.clients_per_round, self.run.seed, r) + self.n_clients
            sampled = np.concatenate([sampled, extra])
        sampled = sampled[self.owner[sampled] >= 0]
        self.sent = {self.node_ids[k]: sampled[self.owner[sampled] == k]
                     for k in np.unique(self.owner[sampled]).tolist()}
        return self.sent

    def train_messages(self, r: int) -> dict[int, Payload]:
        """Round ``r``'s message to each node holding a sampled client."""
        self.side.begin(r)
        return {node: self.side.message(r, node, clients) for node, clients in self.round_clients(r).items()}

    def finish_round(self, r: int, replies: dict[int, Payload]) -> RoundRecord:
        """Fold the valid replies into the global model; log dropped nodes and bad uploads."""
        got, dropped = [], []
        for node, clients in self.sent.items():
            if replies.get(node) is None:
                dropped.append(node)
                log.warning("round %d: node %d did not answer (clients %s dropped)", r, node, shown_ids(clients))
            else:
                got.append((node, clients, replies[node]))
        bad = rejected = 0
        for node, clients, reply in got:
            problem = self.side.check(reply, clients)
            if problem:
                bad, rejected = bad + 1, rejected + len(clients)
                log.warning("round %d: rejected the upload of node %d: %s", r, node, problem)
                continue
            self.side.fold(node, reply)
        totals = self.side.finish(r, rejected, self.gen)
        return self._record(r, totals, dropped, {"rejected_nodes": float(bad)})

    def finish_secure_round(self, r: int, summed: list[np.ndarray] | None,
                            counts: dict[int, Payload]) -> RoundRecord:
        """Fold a securely aggregated sum (the nodes in ``counts`` took part) into the model."""
        silent = [n for n in self.sent if n not in counts]
        for node in silent:
            log.warning("round %d: node %d did not complete secure aggregation (clients %s dropped)",
                        r, node, shown_ids(self.sent[node]))
        problem = self.side.fold_secure(summed, counts, sum(len(self.sent[n]) for n in counts))
        if problem:
            log.warning("round %d: %s", r, problem)
        totals = self.side.finish(r, 0, self.gen)
        return self._record(r, totals, silent, {"rejected_nodes": 0.0, "secure_aggregation": 1.0})

    def _record(self, r: int, totals: Any, dropped: list[int], extra: dict[str, float]) -> RoundRecord:
        extra = {**totals.extra, "dropped_nodes": float(len(dropped)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in dropped)), **extra}
        return RoundRecord(round=r, loss=totals.loss_sum / max(totals.client_batches, 1), seconds=0.0,
                           bytes_up=int(totals.bytes_up), bytes_down=int(totals.bytes_down),
                           rejected_uploads=int(totals.rejected), extra=extra)

    def evaluate_messages(self, nodes: list[int]) -> dict[int, Payload]:
        return self.side.evaluate_messages(nodes)

    def model_state(self) -> dict[str, Any]:
        """What the server holds (its checkpointed state)."""
        return self.side.state_dict()

    def load_model_state(self, blob: dict[str, Any]) -> None:
        self.side.load_state_dict(blob)


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


def shown_ids(clients: np.ndarray, show: int = 8) -> str:
    head = ", ".join(str(int(c)) for c in clients[:show])
    return head + (f", ... ({len(clients)} in all)" if len(clients) > show else "")


def wire(payload: Payload) -> Payload:
    """A message as it arrives: its own copies of the arrays (in one process a node must not
    share memory with the server's tensors, as it cannot across processes)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in payload.items()}
