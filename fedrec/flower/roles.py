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

import io
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate
from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated import draws
from fedrec.federated.cohort import order_by_activity
from fedrec.federated.engine import client_negatives, round_plan, train_cohort
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.protocol import EvalSet, Protocol, Split, get_protocol
from fedrec.results import RoundRecord

log = logging.getLogger("fedrec.flower")

Payload = dict[str, Any]


def check_deployable(run: RunConfig, secure: bool = False, split: Split | None = None) -> Any:
    """The algorithm's spec (built for ``split``, or without data on the server), or a clear
    error for what the Flower app does not run yet."""
    alg = get_algorithm(run.algorithm)
    if alg.kind != "federated":
        raise FedrecError(f"'{run.algorithm}' is centralised: there is nothing to deploy")
    if not alg.flower:
        from fedrec.algorithms import ALGORITHMS

        names = ", ".join(n for n, a in ALGORITHMS.items() if a.flower)
        raise FedrecError(f"the Flower app runs {names} so far; '{run.algorithm}' runs in the "
                          "simulator only (`fedrec run`)")
    ranking = get_protocol(run.protocol).ranking
    if ranking not in alg.rankings:
        raise FedrecError(f"'{run.algorithm}' cannot be evaluated under protocol '{run.protocol}' "
                          f"({ranking}); see `fedrec protocols`")
    spec = alg.build(split, run.model)
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


def _local_stage(stage: EvalSet, users: np.ndarray, n_users: int) -> EvalSet:
    pos = np.full(n_users, -1)
    pos[users] = np.arange(len(users))
    keep = pos[stage.users] >= 0
    return EvalSet(users=pos[stage.users[keep]], targets=stage.targets[users],
                   candidates=None if stage.candidates is None else stage.candidates[keep],
                   exclude=None if stage.exclude is None else stage.exclude[users])


class NodeRole:
    """A node: its clients' data and private state, trained with the simulator's functions."""

    def __init__(self, run: RunConfig, partition: int, partitions: int,
                 split: Split | None = None) -> None:
        self.run, self.cfg = run, run.federated
        split = split if split is not None else prepare_split(run)
        self.spec = check_deployable(run, split=split)
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        self.lr_item = self.cfg.item_lr(split.n_items)
        self.state = self.spec.create_state(
            len(self.data.users), split.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
            item_std=self.cfg.item_std, seed=run.seed, client_ids=self.data.users)
        self.path = self.cfg.upload_path(self.lr_item)

    # private state: what the state declares its clients hold
    def private_state(self) -> bytes:
        blob = self.state.client_state_dict()
        buf = io.BytesIO()
        torch.save(blob, buf)
        return buf.getvalue()

    def load_private_state(self, raw: bytes) -> None:
        blob = torch.load(io.BytesIO(raw), weights_only=False)
        self.state.load_client_state_dict(blob)

    def hello(self, resume_round: int = 0) -> Payload:
        """Who this node is, and the rows it needs next (after ``resume_round`` on a resume)."""
        return {"clients": self.data.users, "n_clients": self.data.n_users,
                "n_items": self.data.n_items, **self._want(resume_round)}

    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients of round ``msg['round']`` from the rows sent; the reply
        holds the sum of their accepted row deltas on the rows they touched."""
        acc = self._train(msg)
        touched = torch.nonzero(acc.item_sum.abs().sum(1) > 0).flatten()
        reply = {"items": wire_ids(touched.numpy()), "rows": acc.item_sum[touched].numpy(),
                 **self._counts(acc), **self._want(int(msg["round"]))}
        reply.update({f"shared.{k}": v.numpy() for k, v in acc.shared_sum.items()})
        return reply

    def train_secure(self, msg: Payload) -> tuple[list[np.ndarray], Payload]:
        """`train` for secure aggregation: the whole table of row-delta sums (to be masked)
        and the counts (sent in the clear)."""
        acc = self._train(msg)
        return [acc.item_sum.numpy()], self._counts(acc)

    def _train(self, msg: Payload) -> Any:
        r = int(msg["round"])
        st = self.state
        st.items[torch.as_tensor(msg["items"])] = torch.as_tensor(msg["rows"])
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        rows = order_by_activity(self.data.train, self.data.rows_of(np.asarray(msg["clients"])))
        acc = st.begin_round(r)
        train_cohort(st, self.spec, self.cfg, self.data.train, self.data.sampler, rows,
                     self.data.users[rows], self.run.seed, r, self.path, acc)
        if self.path.noisy:  # each client's LDP/DP noise is added here, before anything leaves
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.run.seed, r)
            key = draws.uniforms((self.run.seed, draws.LOCAL_NOISE, r), self.data.users[:1], 1)
            gen = torch.Generator().manual_seed(int(key[0] * 2**62))
            acc.item_sum += self.path.local_noise(acc.n, len(sampled), tuple(st.items.shape), gen)
        return acc

    @staticmethod
    def _counts(acc: Any) -> Payload:
        return {"n": acc.n, "rejected": acc.rejected, "loss_sum": float(acc.loss_sum),
                "client_batches": acc.client_batches, "bytes_up": acc.bytes_up,
                "bytes_down": acc.bytes_down}

    def _want(self, after: int) -> Payload:
        """The next round after ``after`` in which some of this node's clients take part, and
        the item rows they will touch then (their training items and that round's negatives)."""
        for r in range(after + 1, self.cfg.rounds + 1):
            sampled, _ = round_plan(self.data.n_users, self.cfg.clients_per_round, self.run.seed, r)
            mine = sampled[np.isin(sampled, self.data.users)]
            if len(mine):
                rows = self.data.rows_of(mine)
                negs = client_negatives(self.cfg.negatives, self.data.train, self.data.sampler,
                                        rows, mine, self.run.seed, r)
                pos = self.data.train[rows].indices
                items = np.union1d(pos, negs.ravel() if negs is not None else [])
                return {"want_round": r, "want_items": wire_ids(items)}
        return {"want_round": 0, "want_items": np.zeros(0, np.int32)}

    def evaluate(self, msg: Payload) -> Payload:
        """Validation and test metrics of this node's clients under the table sent."""
        st = self.state
        table = torch.as_tensor(msg["table"])
        st.items = table
        if st.spec.dual:
            st.round_start_items = table  # the server sends the table dual clients score with
        st.shared = {k: torch.as_tensor(msg[f"shared.{k}"]) for k in st.shared}
        return stage_metrics(st.scores, self.data.valid, self.data.test, self.data.protocol)


def stage_metrics(scorer: Any, valid: EvalSet, test: EvalSet, protocol: Protocol) -> Payload:
    """A node's validation and test metrics (``valid.*``, ``test.*``), each with its number of
    users and, for RMSE, of rated entries, so the server can average over all nodes."""
    out: Payload = {}
    for name, stage in (("valid", valid), ("test", test)):
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
        self.owner = np.full(self.n_clients, -1)
        for k, (node, h) in enumerate(hellos.items()):
            clients = np.asarray(h["clients"], np.int64)
            if (self.owner[clients] >= 0).any():
                raise FedrecError(f"node {node} claims clients another node holds")
            self.owner[clients] = k
        missing = int((self.owner < 0).sum())
        if missing:
            log.warning("%d clients belong to no node that answered; they will not train", missing)
        self.sent: dict[int, np.ndarray] = {}
        self.gen: torch.Generator | None = None

    def round_clients(self, r: int) -> dict[int, np.ndarray]:
        """Round ``r``'s sampled clients (the simulator's `round_plan`) by the node holding them."""
        sampled, self.gen = round_plan(self.n_clients, self.cfg.clients_per_round, self.run.seed, r)
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
                log.warning("round %d: node %d did not answer (clients %s dropped)", r, node, _ids(clients))
            else:
                got.append((node, clients, replies[node]))
        return got, silent

    def model_state(self) -> dict[str, Any]:
        """What the server holds (its checkpointed state)."""
        raise NotImplementedError

    def load_model_state(self, blob: dict[str, Any]) -> None:
        raise NotImplementedError


class ServerRole(ServerBase):
    """The server of the item-embedding family, MetaMF and FedRAP: the engine's state without
    clients; uploads are sums of row deltas (and of shared weights)."""

    def __init__(self, run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> None:
        """``secure``: uploads are summed by secure aggregation (`finish_secure_round`); nodes
        then get the whole table (asking for rows would tell which items their users train)."""
        super().__init__(run, hellos, secure)
        self.lr_item = self.cfg.item_lr(self.n_items)
        self.state = self.spec.create_state(0, self.n_items, lr=self.cfg.lr, lr_item=self.lr_item,
                                            item_std=self.cfg.item_std, seed=run.seed,
                                            client_ids=np.zeros(0, np.int64))
        # the nodes noise their clients' uploads (`NodeRole._train`); the server adds none
        self.path = self.cfg.upload_path(self.lr_item).noiseless
        self.want = {} if secure else {node: (int(h["want_round"]), np.asarray(h["want_items"]))
                                       for node, h in hellos.items()}
        self.acc: Any = None

    # -- a round ---------------------------------------------------------------------------

    def train_messages(self, r: int) -> dict[int, Payload]:
        """Round ``r``'s message to each node holding a sampled client."""
        self.acc = self.state.begin_round(r)
        shared = {f"shared.{k}": v.numpy() for k, v in self.state.shared.items()}
        messages = {}
        for node, clients in self.round_clients(r).items():
            want_round, items = self.want.get(node, (0, None))
            if want_round != r or items is None:  # no request for this round: the whole table
                items = np.arange(self.n_items)
            messages[node] = {"round": r, "clients": wire_ids(clients), "items": wire_ids(items),
                              "rows": self.state.items[torch.as_tensor(items)].numpy(), **shared}
        return messages

    def finish_round(self, r: int, replies: dict[int, Payload]) -> RoundRecord:
        """Fold the valid replies into the global state; log dropped nodes and bad uploads."""
        acc, bad = self.acc, 0
        got, dropped = self.answered(r, replies)
        for node, clients, reply in got:
            problem = self.check_upload(reply, len(clients))
            if problem:
                bad += 1
                acc.rejected += len(clients)
                log.warning("round %d: rejected the upload of node %d: %s", r, node, problem)
                continue
            acc.item_sum.index_add_(0, torch.as_tensor(reply["items"]), torch.as_tensor(reply["rows"]))
            for k in acc.shared_sum:
                acc.shared_sum[k] += torch.as_tensor(reply[f"shared.{k}"])
            acc.n += int(reply["n"])
            acc.rejected += int(reply["rejected"])
            acc.bytes_up += int(reply["bytes_up"])
            acc.bytes_down += int(reply["bytes_down"])
            acc.loss_sum += float(reply["loss_sum"])
            acc.client_batches += int(reply["client_batches"])
            self.want[node] = (int(reply["want_round"]), np.asarray(reply["want_items"]))
        self.state.aggregate(acc, self.path, self.gen)
        extra = {**self.state.round_extra(), "dropped_nodes": float(len(dropped)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in dropped)),
                 "rejected_nodes": float(bad)}
        return RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                           bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                           rejected_uploads=acc.rejected, extra=extra)

    def finish_secure_round(self, r: int, summed: list[np.ndarray] | None,
                            counts: dict[int, Payload]) -> RoundRecord:
        """Fold a securely aggregated sum (the nodes in ``counts`` took part) into the state."""
        acc = self.acc
        silent = [n for n in self.sent if n not in counts]
        for node in silent:
            log.warning("round %d: node %d did not complete secure aggregation (clients %s dropped)",
                        r, node, _ids(self.sent[node]))
        total = sum(len(self.sent[n]) for n in counts)
        n = sum(int(c["n"]) for c in counts.values())
        rejected = sum(int(c["rejected"]) for c in counts.values())
        if summed is None or not counts:
            log.warning("round %d: secure aggregation halted; the global state is unchanged", r)
        elif (n + rejected != total or summed[0].shape != tuple(acc.item_sum.shape)
              or not np.isfinite(summed[0]).all()):
            log.warning("round %d: rejected the secure sum (counts %d + %d for %d clients, shape %s)",
                        r, n, rejected, total, summed[0].shape)
            acc.rejected += total
        else:
            acc.item_sum += torch.as_tensor(summed[0], dtype=acc.item_sum.dtype)
            acc.n, acc.rejected = n, rejected
            for c in counts.values():
                acc.bytes_up += int(c["bytes_up"])
                acc.bytes_down += int(c["bytes_down"])
                acc.loss_sum += float(c["loss_sum"])
                acc.client_batches += int(c["client_batches"])
        self.state.aggregate(acc, self.path, self.gen)
        extra = {**self.state.round_extra(), "dropped_nodes": float(len(silent)),
                 "dropped_clients": float(sum(len(self.sent[n]) for n in silent)),
                 "rejected_nodes": 0.0, "secure_aggregation": 1.0}
        return RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                           bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                           rejected_uploads=acc.rejected, extra=extra)

    def check_upload(self, reply: Payload, n_clients: int) -> str | None:
        """Why a node's reply cannot be aggregated, or None."""
        width = self.state.items.shape[1]
        keys = ["items", "rows", "n", "rejected", "loss_sum", "client_batches", "want_round",
                "want_items", *(f"shared.{k}" for k in self.state.shared)]
        missing = [k for k in keys if k not in reply]
        if missing:
            return f"missing {', '.join(missing)}"
        items, rows = np.asarray(reply["items"]), np.asarray(reply["rows"])
        if items.ndim != 1 or items.dtype.kind not in "iu":
            return "item ids are not a 1-D integer array"
        if len(items) and (items.min() < 0 or items.max() >= self.n_items or len(np.unique(items)) != len(items)):
            return "item ids out of range or repeated"
        if rows.shape != (len(items), width) or rows.dtype != np.float32:
            return f"rows have shape {rows.shape} {rows.dtype}, expected ({len(items)}, {width}) float32"
        if not np.isfinite(rows).all():
            return "rows hold non-finite values"
        for k, v in self.state.shared.items():
            got = np.asarray(reply[f"shared.{k}"])
            if got.shape != tuple(v.shape) or not np.isfinite(got).all():
                return f"shared weight {k} has shape {got.shape} or non-finite values"
        n, rejected = int(reply["n"]), int(reply["rejected"])
        if n < 0 or rejected < 0 or n + rejected != n_clients:
            return f"counts n={n} rejected={rejected} do not add up to the {n_clients} clients sent"
        if not math.isfinite(float(reply["loss_sum"])):
            return "the training loss is not finite"
        return None

    # -- evaluation ------------------------------------------------------------------------

    def evaluate_message(self) -> Payload:
        st = self.state
        base = st.round_start_items if (st.spec.dual and st.round_start_items is not None) else st.items
        return {"table": base.numpy(), **{f"shared.{k}": v.numpy() for k, v in st.shared.items()}}

    def model_state(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_model_state(self, blob: dict[str, Any]) -> None:
        self.state.load_state_dict(blob)


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


def wire_ids(ids: np.ndarray) -> np.ndarray:
    """Ids as they travel: 4 bytes each (the byte counts assume so)."""
    return np.asarray(ids).astype(np.int32)


def _ids(clients: np.ndarray, show: int = 8) -> str:
    head = ", ".join(str(int(c)) for c in clients[:show])
    return head + (f", ... ({len(clients)} in all)" if len(clients) > show else "")


def node_role(run: RunConfig, partition: int, partitions: int, split: Split) -> Any:
    """The node role the run's algorithm declares (`NodeRole`, or `AENode` for the autoencoders)."""
    node, _ = check_deployable(run, split=split).flower_roles()
    return node(run, partition, partitions, split)


def server_role(run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> Any:
    """The server role the run's algorithm declares (`ServerRole`, or `AEServer`)."""
    _, server = check_deployable(run, secure).flower_roles()
    return server(run, hellos, secure)


def wire(payload: Payload) -> Payload:
    """A message as it arrives: its own copies of the arrays (in one process a node must not
    share memory with the server's tensors, as it cannot across processes)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in payload.items()}


def run_in_process(run: RunConfig, partitions: int, split: Split | None = None) -> Any:
    """A deployment with ``partitions`` nodes, in one process (no Flower): the server role driven
    by the one round driver over an in-process transport. The reference the Flower app is tested
    against. Returns the server role, with the run's outcome in ``out``."""
    from fedrec.core.driver import run_rounds
    from fedrec.flower.server import FlowerServer, InProcess

    split = split if split is not None else prepare_split(run)
    nodes = {i: node_role(run, i, partitions, split) for i in range(partitions)}
    role = server_role(run, {i: wire(n.hello()) for i, n in nodes.items()})
    server = FlowerServer(role, InProcess(nodes), role.protocol, partitions)
    cfg = run.federated
    role.out = run_rounds(server, None, select=role.protocol.select, rounds=cfg.rounds,
                          eval_every=cfg.eval_every, patience=cfg.patience)
    return role
