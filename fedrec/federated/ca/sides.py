"""FedCA's round by side (see `fedrec.rounds.sides`).

A client is one user with a whole model of its own; node i holds the i-th block of users and
builds a `CAState` for them alone (``client_ids=``: negatives, shuffles and user vectors are
drawn by user id, so it trains them as the simulator does). Its first answer names the
clients without a training item (they never train, so they are never aggregated).

The server chooses a round's aggregated clients before it sends anything: the simulator's draw
from the round's fresh generator over the sampled clients that train. A train message tells a
node which of its sampled clients are aggregated; the node trains its sampled clients and
replies with the aggregated ones' uploads (table, tower, principal basis, training size). The
server weighs them (`fedrec.federated.ca.state.mix_weights`) and computes each one's new model
(`mixtures`). Those wait on the server until the node's next message (a train message, or the
evaluation's, which is therefore one per node): the node applies them before anything else, so
each client's model is the simulator's whenever it trains or is scored.

An attacker's node (`fedrec.flower.malicious.CAMaliciousNode`) declares clients beyond the
users; the server aggregates them at the users' share, as the simulator aggregates its
malicious clients (`fedrec.federated.ca.state.aggregated_attackers`), and they take their
mixtures as any aggregated client does.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.errors import FedrecError
from fedrec.federated.ca.state import (
    CAState,
    admit_tables,
    aggregated_attackers,
    common_start,
    mix_weights,
    mixtures,
)
from fedrec.protocols.protocol import Split
from fedrec.rounds.sides import (
    COUNTS,
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    local_rows,
    missing,
    node_users,
    stage_metrics,
    wire_ids,
)

#: the arrays of an aggregated client's upload besides its tower
UPLOAD = ("tables", "bases", "samples")


class CAClient(ClientSide):
    """A node holding a block of FedCA's clients (one user each)."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.spec, self.cfg = spec, cfg
        self.n_clients = split.n_users
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        self.state = CAState(spec, self.data.view(), cfg, seed, client_ids=self.data.users)  # type: ignore[arg-type]
        self.received = np.zeros(len(self.data.users), bool)  # has downloaded the start

    def private_state(self) -> dict[str, Any]:
        st = self.state
        return {"tables": st.tables, "params": st.params, "received": torch.as_tensor(self.received)}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        self.state.tables, self.state.params = blob["tables"], blob["params"]
        self.received = np.asarray(blob["received"], bool)

    def hello(self, resume_round: int = 0) -> Payload:
        idle = self.data.users[np.diff(self.data.train.indptr) == 0]
        return {"clients": self.data.users, "n_clients": self.n_clients, "n_items": self.data.n_items,
                "idle": wire_ids(idle)}

    def _take_mixtures(self, msg: Payload) -> None:
        take_mixtures(self.state, self.data.users, msg)

    def train(self, msg: Payload) -> Payload:
        """Train the sampled clients; reply with the aggregated ones' uploads."""
        st = self.state
        self._take_mixtures(msg)
        rows = local_rows(self.data.users, np.asarray(msg["clients"], np.int64))
        loss, batches, trained = st.train(rows, self.cfg, int(msg["round"]))
        cohort = np.array(sorted(trained), np.int64)
        members = local_rows(self.data.users, np.asarray(msg["members"], np.int64))
        if not np.isin(members, cohort).all():
            raise FedrecError("the server asked a node to aggregate a client that did not train")
        new = cohort[~self.received[cohort]]
        self.received[new] = True
        per = st.floats_per_model
        reply: Payload = {"members": wire_ids(self.data.users[members]), "n": len(cohort), "loss_sum": loss,
                          "client_batches": batches,
                          "bytes_up": len(members) * (per + self.spec.principal * self.spec.dim) * 4,
                          "bytes_down": len(new) * per * 4}  # the members' downloads: the server's count
        up = st.uploads(members, trained) if len(members) else None
        return {**reply, **upload_arrays(self.spec, self.data.n_items, up)}

    def evaluate(self, msg: Payload) -> Payload:
        self._take_mixtures(msg)
        return stage_metrics(self.state.scores, self.data.valid, self.data.test, self.data.protocol)


def take_mixtures(state: CAState, held: np.ndarray, msg: Payload) -> None:
    """Write the new models the server computed for a node's aggregated clients into
    ``state``, whose rows are the clients ``held`` (sorted run ids)."""
    if "mixed.clients" not in msg:
        return
    rows = torch.as_tensor(local_rows(held, np.asarray(msg["mixed.clients"], np.int64)))
    state.tables[rows] = torch.as_tensor(msg["mixed.tables"])
    for k in state.model.score_shapes():
        state.params[k][rows] = torch.as_tensor(msg[f"mixed.score.{k}"])


def upload_arrays(spec: Any, n_items: int, up: dict[str, torch.Tensor] | None) -> Payload:
    """The aggregated clients' uploads (`CAState.uploads`; None: no client aggregated) as a
    reply's arrays, training sizes as whole numbers."""
    shapes = expected_shapes(spec, n_items)
    out = {k: up[k].cpu().numpy() if up is not None else np.zeros((0, *shapes[k]), np.float32) for k in shapes}
    out["samples"] = np.asarray(out["samples"], np.int64)
    return out


def expected_shapes(spec: Any, n_items: int) -> dict[str, tuple[int, ...]]:
    """The shape of one aggregated client's upload arrays, by key."""
    return {"tables": (n_items, spec.dim), "bases": (spec.principal, spec.dim), "samples": (),
            **{f"score.{k}": tuple(v) for k, v in spec.model.score_shapes().items()}}


class CAServer(ServerSide):
    """FedCA's server: the common start, the round's aggregated clients, and the new models
    waiting for their nodes."""

    #: its nodes send each aggregated client's table, which a robust rule admits before the
    #: weights (`fedrec.federated.ca.state.admit_tables`, against the server's copy of each)
    takes_rule: ClassVar[bool] = True
    #: the run's defence (`fedrec.flower.roles.Server`); None: the tables as sent
    rule: Any = None

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.cfg, self.seed, self.n_clients, self.n_items = spec, cfg, seed, n_clients, n_items
        self.start, _ = common_start(n_items, spec.dim, cfg.item_std, seed)
        self.shapes = expected_shapes(spec, n_items)
        #: clients beyond the users (a malicious node's), aggregated as the simulator's attackers
        self.n_extra = sum(int(h.get("extra_clients", 0)) for h in hellos.values())
        self.idle = np.zeros(n_clients, bool)
        self.held = {node: np.asarray(h["clients"], np.int64) for node, h in hellos.items()}
        for h in hellos.values():
            self.idle[np.asarray(h["idle"], np.int64)] = True
        self.per = n_items * spec.dim + sum(math.prod(s) for s in spec.model.score_shapes().values())
        self.pending: dict[int, dict[str, torch.Tensor]] = {}  # client -> its new model, not yet sent
        #: under a defence, the server's copy of each client's table (the common start until it
        #: mixes one), which the rule judges a client's steps against
        self.known: torch.Tensor | None = None

    def admit_uploads(self, members: np.ndarray, up: dict[str, torch.Tensor], r: int) -> None:
        """The aggregated clients' tables as the defence's rule admits them (`admit_tables`)."""
        if self.known is None:
            self.known = self.start.expand(self.n_clients + self.n_extra, *self.start.shape).clone()
        admit_tables(self.rule, members, up, self.known, r)

    def begin(self, r: int) -> None:
        from fedrec.core.plan import round_plan

        sampled, _ = round_plan(self.n_clients, self.cfg.clients_per_round, self.seed, r)
        cohort = sampled[~self.idle[sampled]]
        n_agg = int(len(cohort) * self.spec.aggregated)
        rng = np.random.default_rng([self.seed, r])  # the simulator's `RoundPlan.rng`
        self.members = np.sort(rng.choice(cohort, n_agg, replace=False)) if n_agg else cohort[:0]
        if self.n_extra:  # the sampled clients beyond the users, at the users' share
            from fedrec.core.plan import extra_sample

            extra = extra_sample(self.n_extra, self.cfg.clients_per_round, self.seed, r)
            bad = aggregated_attackers(extra, self.spec.aggregated, self.seed, r) + self.n_clients
            self.members = np.concatenate([self.members, bad])
        self.totals = RoundTotals()
        self.ups: list[Payload] = []
        self.n = 0

    def _deliver(self, node: int) -> Payload:
        """The new models waiting for ``node``'s clients (then no longer waiting)."""
        waiting = np.fromiter(self.pending, np.int64, len(self.pending))
        mine = np.sort(waiting[np.isin(waiting, self.held[node])]).tolist()
        if not mine:
            return {}
        models = [self.pending.pop(c) for c in mine]
        return {"mixed.clients": wire_ids(np.asarray(mine)),
                **{f"mixed.{k}": torch.stack([m[k] for m in models]).cpu().numpy() for k in models[0]}}

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        return {"round": r, "clients": wire_ids(clients),
                "members": wire_ids(self.members[np.isin(self.members, clients)]), **self._deliver(node)}

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        keys = (*UPLOAD, *(k for k in self.shapes if k.startswith("score.")))
        problem = missing(reply, ["members", *COUNTS, *keys])
        if problem:
            return problem
        members = np.asarray(reply["members"])
        if members.dtype.kind not in "iu" or not np.array_equal(members, self.members[np.isin(self.members, clients)]):
            return "the aggregated clients are not those the server chose"
        for k in keys:
            got = np.asarray(reply[k])
            want = (len(members), *self.shapes[k])
            kind = "iu" if k == "samples" else "f"
            if got.shape != want or got.dtype.kind not in kind or not np.isfinite(got).all():
                return f"{k} has shape {got.shape} {got.dtype} or non-finite values, expected {want}"
        if (np.asarray(reply["samples"]) < 1).any():
            return "an aggregated client with no training sample"
        if not 0 <= int(reply["n"]) <= len(clients) or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {len(clients)} sent, or a non-finite loss"
        return None

    def fold(self, node: int, reply: Payload) -> None:
        self.ups.append(reply)
        self.totals.add(reply)
        self.n += int(reply["n"])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        self.totals.rejected = rejected
        members = np.concatenate([np.asarray(u["members"], np.int64) for u in self.ups] or [np.zeros(0, np.int64)])
        honest = int((members < self.n_clients).sum())
        self.totals.extra = {"aggregated": float(honest)}
        if len(members):
            order = np.argsort(members, kind="stable")  # the simulator's: members by id
            keys = (*UPLOAD, *(k for k in self.shapes if k.startswith("score.")))
            up = {k: torch.as_tensor(np.concatenate([np.asarray(u[k]) for u in self.ups])[order]) for k in keys}
            up["samples"] = up["samples"].to(torch.float64)
            if self.rule is not None:
                self.admit_uploads(members[order], up, r)
            w = mix_weights(self.spec, up, self.start)
            new = mixtures(self.spec, up, w)
            for j, c in enumerate(members[order].tolist()):
                self.pending[c] = {k: v[j] for k, v in new.items()}
            if self.known is not None:
                self.known[torch.as_tensor(members[order])] = new["tables"]
            self.totals.bytes_down += len(members) * self.per * 4
            self.totals.extra["self_weight"] = float(torch.diagonal(w[:honest, :honest]).mean()) if honest else 0.0
            if len(members) > honest and honest:  # the attackers' mean share of an honest client's mixture
                self.totals.extra["attacker_weight"] = float(w[:honest, honest:].sum(1).mean())
        if self.rule is not None:
            self.totals.extra.update(self.rule.last)
        return self.totals

    def evaluate_message(self) -> Payload:
        return {}

    def evaluate_messages(self, nodes: list[int]) -> dict[int, Payload]:
        """Each node's waiting new models (every client is scored with its own model)."""
        return {node: self._deliver(node) for node in nodes}

    def state_dict(self) -> dict[str, Any]:
        clients = sorted(self.pending)
        keys = list(self.pending[clients[0]]) if clients else []
        return {"start": self.start, "pending.clients": torch.as_tensor(clients, dtype=torch.int64),
                **{f"pending.{k}": torch.stack([self.pending[c][k] for c in clients]) for k in keys},
                **({"known": self.known} if self.known is not None else {})}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.start, self.known = blob["start"], blob.get("known")
        clients = [int(c) for c in blob["pending.clients"]]
        keys = [k.removeprefix("pending.") for k in blob if k.startswith("pending.") and k != "pending.clients"]
        self.pending = {c: {k: blob[f"pending.{k}"][j] for k in keys} for j, c in enumerate(clients)}
