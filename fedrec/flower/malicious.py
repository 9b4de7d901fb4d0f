"""A malicious Flower node: the run's attacker, holding the clients beyond the data's users.

A malicious client is an ordinary client of the engine (`fedrec.security`): it downloads the
global table and shared weights, and uploads row deltas. On Flower the attacker is one more
node: it declares its clients (ids after the users) in its first answer, asks for the whole
table every round, and replies, like any node, with the sums of its clients' uploads made by
the same `fedrec.security.attacks.Attack` the simulator runs. It keeps the attack's state (the
approximated users, the rows each client sends) as its clients' private state. Its clients hold
no user, so it reports no evaluation figures. The server samples the declared clients beyond
the users as the simulator samples its malicious clients (`fedrec.core.plan.extra_sample`),
so an attacked deployment ends with the simulator's figures (tested). PersonalFR's and
FedAvg-AE's attacker is `AEMaliciousNode`, GPFedRec's and GFed-PP's `GraphMaliciousNode`,
FedPerGNN's `GNNMaliciousNode`, FedCA's `CAMaliciousNode`, FedDAE's `DAEMaliciousNode`, FedCIA's
`CIAMaliciousNode` (`malicious_node` picks the run's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrec.core.contract import row_senders
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig
from fedrec.federated.ca.spec import CASpec
from fedrec.federated.cia.spec import CIASpec
from fedrec.federated.dae.spec import DAESpec
from fedrec.federated.family.sides import per_client_payload
from fedrec.federated.graph.spec import GraphSpec
from fedrec.federated.perfedrec import add_to_clusters
from fedrec.federated.pergnn.spec import GNNSpec
from fedrec.federated.pergnn.state import item_rate, row_width
from fedrec.flower.roles import check_deployable, pack_state, unpack_state
from fedrec.protocols.protocol import Split
from fedrec.rounds.sides import Payload, wire_ids
from fedrec.security.adversary import Security


def malicious_node(run: RunConfig, split: Split) -> Any:
    """The attacker's node for ``run``: the item family's (`MaliciousNode`) or the rating
    autoencoders' (`AEMaliciousNode`); one `FedrecError` line where neither is built."""
    spec = check_deployable(run, split=split)
    if getattr(spec, "share", None) is not None:  # PersonalFR, FedAvg-AE
        return AEMaliciousNode(run, split, spec)
    if isinstance(spec, GraphSpec):  # GPFedRec, GFed-PP
        return GraphMaliciousNode(run, split, spec)
    if isinstance(spec, GNNSpec):  # FedPerGNN
        return GNNMaliciousNode(run, split, spec)
    if isinstance(spec, CASpec):  # FedCA
        return CAMaliciousNode(run, split, spec)
    if isinstance(spec, DAESpec):  # FedDAE
        return DAEMaliciousNode(run, split, spec)
    if isinstance(spec, CIASpec):  # FedCIA
        return CIAMaliciousNode(run, split, spec)
    return MaliciousNode(run, split)


class AttackerNode:
    """What every attacker's node does alike: its clients hold no user, so it reports no
    figures; its private state is the attack's (``security``: the run's
    `fedrec.security.adversary.Security`)."""

    security: Security

    def evaluate(self, msg: Payload) -> Payload:
        return {"valid.users": 0.0, "test.users": 0.0}  # its clients hold no user

    def private_state(self) -> bytes:
        return pack_state(self.security.attack.state() if self.security.attack else {})

    def load_private_state(self, raw: bytes) -> None:
        assert self.security.attack is not None
        self.security.attack.load_state(unpack_state(raw))

    def train_secure(self, msg: Payload) -> Any:
        raise FedrecError("secure aggregation with a malicious node is not wired")


class MaliciousNode(AttackerNode):
    """The attacker's node (see the module docstring)."""

    def __init__(self, run: RunConfig, split: Split) -> None:
        self.run, self.cfg = run, run.federated
        spec = check_deployable(run, split=split)
        self.model_spec = getattr(spec, "family", spec)  # FedRAP's head is a family member
        lr_item = self.cfg.item_lr(split.n_items)
        server = spec.create_state(0, split.n_items, lr=self.cfg.lr, lr_item=lr_item, item_std=self.cfg.item_std,
                                   seed=run.seed, client_ids=np.zeros(0, np.int64))
        if not getattr(server, "plain_average", False):
            raise FedrecError(f"'{run.algorithm}': --attack runs where the server averages item rows")
        #: PerFedRec: its attackers also send forged user vectors and join the clusters (`_forged`)
        self.forges = hasattr(server, "join_attackers")
        security = Security.build(self.cfg, split, lr_item, run.seed)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security = security
        server.observer = False  # not the server: a client objective's memo is none of its business
        self.server = server  # what the round's messages carry of a row (`wire_rows`)
        self.n_users, self.n_items = split.n_users, split.n_items

    def hello(self, resume_round: int = 0) -> Payload:
        sec = self.security
        return {"clients": np.arange(sec.n_benign, sec.n_benign + sec.n_malicious), "n_clients": self.n_users,
                "n_items": self.n_items, "extra_clients": sec.n_malicious, **self._want()}

    @staticmethod
    def _want() -> Payload:
        return {"want_round": 0, "want_items": np.zeros(0, np.int32)}  # 0: the whole table, every round

    def train(self, msg: Payload) -> Payload:
        r = int(msg["round"])
        items = np.asarray(msg["items"])
        if len(items) != self.n_items:
            raise FedrecError("a malicious node needs the whole table")
        table = torch.empty(self.n_items, np.asarray(msg["rows"]).shape[1])
        table[torch.as_tensor(items)] = torch.as_tensor(msg["rows"])
        shared = {k[len("shared."):]: torch.as_tensor(v) for k, v in msg.items() if k.startswith("shared.")}
        clients = np.asarray(msg["clients"], np.int64) - self.n_users
        self.server.begin_round(r)  # (CoLR: the round's subspace)
        sent, n_bytes = self.security.malicious_uploads(self.model_spec, table, shared, r, clients, wire=self.server)
        forged, vector_bytes = self._forged(msg, table, shared, r, clients, sent) if self.forges else ({}, 0)
        counts = {"n": len(sent), "rejected": 0, "loss_sum": 0.0, "client_batches": 0,
                  "bytes_up": n_bytes + vector_bytes, "bytes_down": n_bytes, **self._want(), **forged}
        if msg.get("per_client"):  # the server's robust rule looks at each client's upload
            ids = np.arange(self.n_users + self.security.n_malicious)  # the uploads name their ids
            return {**per_client_payload(sent, ids, shared), **counts}
        total, senders = torch.zeros_like(table), row_senders(sent, self.n_items)
        shared_sum = {k: torch.zeros_like(v) for k, v in shared.items()}
        for up in sent:
            total.index_add_(0, torch.as_tensor(up.items), up.tensors["items"])
            for k in shared_sum:
                shared_sum[k] += up.tensors[k]
        per_row = self.cfg.aggregation != "clients"  # fedrec's item-row rules divide a row by its senders
        touched = torch.nonzero((senders > 0) if per_row else (total.abs().sum(1) > 0)).flatten()
        return {"items": wire_ids(touched.cpu().numpy()), "rows": self.server.wire_rows(total[touched]).cpu().numpy(),
                **({"senders": senders[touched].cpu().numpy().astype(np.int32)} if per_row else {}),
                **{f"shared.{k}": v.cpu().numpy() for k, v in shared_sum.items()}, **counts}

    def _forged(self, msg: Payload, table: torch.Tensor, shared: dict[str, torch.Tensor], r: int,
                clients: np.ndarray, sent: list[Any]) -> tuple[Payload, int]:
        """What PerFedRec's attackers send beside their rows, as the simulator's do
        (`fedrec.federated.perfedrec.PerFedRecState.join_attackers`): the user vectors they
        forge (`Security.forged_users`), and each clustered attacker's crafted rows as a member's
        change of its cluster's table (``cluster_of``: the sampled clients' clusters, as the
        server sent them); the bytes of the vectors."""
        ids, users = self.security.forged_users(self.model_spec, table, shared, r, clients)
        m, width = self.n_items, table.shape[1]
        sums, senders = torch.zeros((self.server.clusters * m, width)), torch.zeros(self.server.clusters * m)
        add_to_clusters(np.asarray(msg["cluster_of"], np.int64), sent, m, sums, senders)
        keys = torch.nonzero(senders > 0).flatten()
        vectors = users["user"].to(torch.float32)
        return ({"cluster_keys": keys.cpu().numpy().astype(np.int64), "cluster_sums": sums[keys].cpu().numpy(),
                 "cluster_senders": senders[keys].cpu().numpy().astype(np.int32), "user_ids": wire_ids(ids),
                 "user_vectors": vectors.cpu().numpy()}, vectors.numel() * 4)


class AEMaliciousNode(AttackerNode):
    """The attacker's node of PersonalFR and FedAvg-AE: clients after the partition's K, which
    download the whole decoder each round (``whole_table`` in its first answer) and send what
    the simulator's attackers send (`fedrec.federated.ae.algorithm.AEAlgorithm._guarded`):
    crafted output rows and biases against the dot product on them, every other row table's
    rows unchanged, and the dense layers as they came; summed, or each client's upload under a
    robust rule."""

    def __init__(self, run: RunConfig, split: Split, spec: Any) -> None:
        from fedrec.federated.family.spec import FamilySpec

        self.run, self.cfg = run, run.federated
        algorithm = spec.algorithm(split, self.cfg, run.seed)  # the partition's K and an Adam client's bound
        security = Security.build(self.cfg, split, algorithm.lr_item, run.seed, n_clients=algorithm.security_clients,
                                  step_bound=algorithm.step_bound)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security, self.n_items = security, split.n_items
        self.K = algorithm.state.K
        self.hidden = algorithm.state.hidden[0]
        self.tables = [k for k in ("dec.out", "dec.out.b", "enc.in") if k in algorithm.state.glob]
        self.model = FamilySpec(score="dot", private_score=False, dual=False, dim=self.hidden + 1)

    def hello(self, resume_round: int = 0) -> Payload:
        sec = self.security
        return {"clients": np.arange(self.K, self.K + sec.n_malicious), "n_clients": self.K,
                "n_items": self.n_items, "extra_clients": sec.n_malicious, "whole_table": 1,
                "client_items": np.zeros(0, np.int32), "client_ptr": np.zeros(sec.n_malicious + 1, np.int64)}

    def train(self, msg: Payload) -> Payload:
        r = int(msg["round"])
        if len(np.asarray(msg["items"])) != self.n_items:
            raise FedrecError("a malicious node needs the whole table")
        rows = {k: torch.as_tensor(msg[f"rows.{k}"]) for k in self.tables}
        dense = {k[len("dense."):]: torch.as_tensor(v) for k, v in msg.items() if k.startswith("dense.")}
        scoring = torch.cat([rows["dec.out"], rows["dec.out.b"][:, None]], 1)
        clients = np.asarray(msg["clients"], np.int64) - self.K
        sent, n_bytes = self.security.malicious_uploads(self.model, scoring, {}, r, clients)
        rest = rows["enc.in"].shape[1] if "enc.in" in rows else 0  # FedAvg's encoder rows go back as they came
        for u in sent:
            crafted = u.tensors["items"]
            u.tensors["items"] = torch.cat([crafted, crafted.new_zeros((len(crafted), rest))], 1)
            u.tensors.update({k: v.clone() for k, v in dense.items()})
        n_bytes += len(sent) * sum(v.numel() for v in dense.values()) * 4
        counts = {"n": len(sent), "loss_sum": 0.0, "client_batches": 0, "bytes_up": n_bytes, "bytes_down": n_bytes,
                  "macs": 0.0, "macs_fedrec": 0.0, "users_trained": 0.0}
        if msg.get("per_client"):  # the server's robust rule looks at each client's upload
            ids = np.arange(self.K + self.security.n_malicious)  # the uploads name their ids
            return {**per_client_payload(sent, ids, dense), **counts}
        total = torch.zeros(self.n_items, self.hidden + 1 + rest)
        for up in sent:
            total.index_add_(0, torch.as_tensor(up.items), up.tensors["items"])
        parts = {"dec.out": total[:, : self.hidden], "dec.out.b": total[:, self.hidden]}
        if rest:
            parts["enc.in"] = total[:, self.hidden + 1 :]
        return {"items": wire_ids(np.arange(self.n_items)),
                **{f"rows.{k}": v.cpu().numpy() for k, v in parts.items()},
                **{f"dense.{k}": (v * len(sent)).cpu().numpy() for k, v in dense.items()}, **counts}


class GraphMaliciousNode(AttackerNode):
    """The attacker's node of GPFedRec and GFed-PP, whose server keeps each client's rows and
    builds its graph over every client (`fedrec.federated.graph.state.GraphState.admit_attackers`):
    its clients, after the users, are users of the graph. Each round it crafts its clients'
    steps against q_g as the simulator's attackers do and sends each client's rows as the server
    keeps them, the rows it started from plus the steps (q_g's; a GFed-PP client with a table
    of its own, its table's). Under GFed-PP's ``public_attackers`` its first answer declares
    their interactions, as a node's public users share theirs. It claims no local steps, so
    GPFedRec's server keeps its pull factor at 1."""

    def __init__(self, run: RunConfig, split: Split, spec: GraphSpec) -> None:
        self.run, self.cfg = run, run.federated
        lr_item = self.cfg.item_lr(split.n_items)
        # a node's state without clients: the clients' model (the attack's surrogate) and the wire
        self.state = spec.create_state(0, split.n_items, lr=self.cfg.lr, lr_item=lr_item, item_std=self.cfg.item_std,
                                       seed=run.seed, client_ids=np.zeros(0, np.int64), n_total=split.n_users)
        security = Security.build(self.cfg, split, lr_item, run.seed)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security = security
        self.gpfedrec = bool(spec.gpfedrec)
        self.public = bool(spec.public_attackers and not self.gpfedrec)
        self.n_users, self.n_items = split.n_users, split.n_items

    def hello(self, resume_round: int = 0) -> Payload:
        sec = self.security
        out: Payload = {"clients": np.arange(sec.n_benign, sec.n_benign + sec.n_malicious), "n_clients": self.n_users,
                        "n_items": self.n_items, "extra_clients": sec.n_malicious,
                        # none of its clients is one of the data's public users
                        "public_clients": np.zeros(0, np.int32), "public_ptr": np.zeros(1, np.int64),
                        "public_items": np.zeros(0, np.int32)}
        if self.public:
            assert sec.attack is not None
            declared = sec.attack.declared()
            out.update(declared_ptr=declared.indptr.astype(np.int64), declared_items=wire_ids(declared.indices))
        return out

    def train(self, msg: Payload) -> Payload:
        r = int(msg["round"])
        q = torch.as_tensor(msg["rows"])
        clients = np.asarray(msg["clients"], np.int64) - self.n_users
        sent, n_bytes = self.security.malicious_uploads(self.state.spec, q, self.state.shared, r, clients,
                                                        wire=self.state)
        tables = {} if self.gpfedrec else dict(zip(np.asarray(msg["table_clients"], np.int64).tolist(),
                                                   torch.as_tensor(msg["tables"]), strict=True))
        owner, items, rows = [], [], []
        for up in sent:
            it = torch.as_tensor(np.asarray(up.items, np.int64))
            start = tables[up.client][it] if up.client in tables else q[it]
            owner.append(np.full(len(up.items), up.client, np.int64))
            items.append(np.asarray(up.items, np.int64))
            rows.append(start + up.tensors["items"].to(q))
        width = q.shape[1]
        return {"owner": wire_ids(np.concatenate(owner) if owner else np.zeros(0, np.int64)),
                "items": wire_ids(np.concatenate(items) if items else np.zeros(0, np.int64)),
                "rows": (torch.cat(rows) if rows else torch.zeros((0, width))).cpu().numpy(),
                "decay_clients": np.zeros(0, np.int32), "decay": np.zeros(0, np.float32),
                "n": len(sent), "rejected": 0, "loss_sum": 0.0, "client_batches": 0,
                "bytes_up": n_bytes, "bytes_down": n_bytes}


class GNNMaliciousNode(AttackerNode):
    """The attacker's node of FedPerGNN: clients after the users, which download the item table
    and the graph layer as any client does and send what the simulator's attackers send
    (`fedrec.federated.pergnn.state.GNNAlgorithm.local_update`): item-row steps crafted against
    a dot product on the global rows, no graph-layer step (a zero one where a robust rule reads
    each client's), and no user vector to publish; summed with each row's senders, or each
    client's upload under a rule."""

    def __init__(self, run: RunConfig, split: Split, spec: GNNSpec) -> None:
        from fedrec.federated.family.spec import FamilySpec

        self.run, self.cfg = run, run.federated
        security = Security.build(self.cfg, split, item_rate(self.cfg), run.seed, whole_batch=True)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security, self.n_users, self.n_items = security, split.n_users, split.n_items
        self.dim, self.width = spec.dim, row_width(spec, split, self.cfg)
        self.model = FamilySpec(score="dot", private_score=False, dual=False, dim=self.width)

    def hello(self, resume_round: int = 0) -> Payload:
        sec = self.security
        return {"clients": np.arange(self.n_users, self.n_users + sec.n_malicious), "n_clients": self.n_users,
                "n_items": self.n_items, "extra_clients": sec.n_malicious, "row_width": self.width}

    def train(self, msg: Payload) -> Payload:
        table = torch.as_tensor(msg["items"])
        if table.shape != (self.n_items, self.width):
            raise FedrecError("a malicious node needs the whole item table")
        clients = np.asarray(msg["clients"], np.int64) - self.n_users
        sent, n_bytes = self.security.malicious_uploads(self.model, table, {}, int(msg["round"]), clients)
        layer = {"w": torch.zeros((self.dim, self.dim)), "a": torch.zeros(2 * self.dim)}
        counts = {"published": np.zeros((0, self.dim), np.float32), "n": len(sent), "loss_sum": 0.0,
                  "client_batches": 0, "bytes_up": n_bytes, "bytes_down": n_bytes}
        if msg.get("per_client"):  # the server's robust rule looks at each client's upload
            for u in sent:
                u.tensors.update({k: v.clone() for k, v in layer.items()})
            return {**per_client_payload(sent, np.arange(self.n_users + self.security.n_malicious), layer,
                                         width=self.width), **counts}
        total, senders = torch.zeros_like(table), torch.zeros(self.n_items)
        for up in sent:
            at = torch.as_tensor(np.asarray(up.items, np.int64))
            total.index_add_(0, at, up.tensors["items"].to(total))
            senders.index_add_(0, at, torch.ones(len(at)))
        touched = torch.nonzero(senders > 0).flatten()
        return {"items": wire_ids(touched.cpu().numpy()), "rows": total[touched].cpu().numpy(),
                "senders": senders[touched].cpu().numpy().astype(np.int32),
                **{k: v.cpu().numpy() for k, v in layer.items()}, **counts}


def own_norm_only(run: RunConfig) -> None:
    """Refuse, in one line, a deployment whose simulator gives its attackers the round's honest
    step norm (``--attacker-norm honest``), which a node cannot see."""
    if run.federated.attacker_norm != "own":
        raise FedrecError(f"'{run.algorithm}': its simulator's attackers are given the round's honest row norm, "
                          "which a malicious node cannot see; deploy with --attacker-norm own (the attack's own "
                          "estimate), and compare with a simulator run that sets it too")


class CAMaliciousNode(AttackerNode):
    """The attacker's node of FedCA, whose clients each keep a model of their own and join the
    aggregation at the users' share (`fedrec.federated.ca.state.CAAlgorithm`). It holds its
    clients' models, started as the simulator starts its attackers' (`CAState.admit_attackers`),
    writes the mixtures the server computed for them before anything else (as an honest node
    does), and for the clients the server aggregates sends what the simulator's attackers send
    (`fedrec.federated.ca.state.attacker_uploads`): table plus crafted rows, basis, claimed
    training size and tower. The simulator can give its attackers the round's honest row norm
    and training size, which no node sees; a deployment's attacker runs ``--attacker-norm own``
    (the attack's own estimate and the users' median training size), and so does the simulator
    run it equals."""

    def __init__(self, run: RunConfig, split: Split, spec: CASpec) -> None:
        from types import SimpleNamespace

        from fedrec.federated.ca.state import CAState, step_bound, typical_size

        self.run, self.cfg, self.spec = run, run.federated, spec
        own_norm_only(run)
        security = Security.build(self.cfg, split, float(self.cfg.lr), run.seed,
                                  step_bound=step_bound(split.train, self.cfg))
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security, self.n_users, self.n_items = security, split.n_users, split.n_items
        # a state without users, then its attackers' models (ids after the users)
        empty = SimpleNamespace(train=split.train[:0], sampler=None, n_users=0, n_items=split.n_items,
                                protocol=split.protocol)
        self.state = CAState(spec, empty, self.cfg, run.seed, client_ids=np.zeros(0, np.int64))  # type: ignore[arg-type]
        self.state.admit_attackers(security.n_malicious, first=split.n_users)
        self.clients = np.arange(split.n_users, split.n_users + security.n_malicious)
        self.claim = typical_size(split.train)

    def hello(self, resume_round: int = 0) -> Payload:
        return {"clients": self.clients, "n_clients": self.n_users, "n_items": self.n_items,
                "extra_clients": self.security.n_malicious, "idle": np.zeros(0, np.int32)}

    def private_state(self) -> bytes:
        attack = self.security.attack
        assert attack is not None
        return pack_state({"attack": attack.state(), "tables": self.state.tables, "params": self.state.params})

    def load_private_state(self, raw: bytes) -> None:
        blob = unpack_state(raw)
        assert self.security.attack is not None
        self.security.attack.load_state(blob["attack"])
        self.state.tables, self.state.params = blob["tables"], blob["params"]

    def train(self, msg: Payload) -> Payload:
        from fedrec.federated.ca.sides import take_mixtures, upload_arrays
        from fedrec.federated.ca.state import attacker_uploads

        st, spec = self.state, self.spec
        take_mixtures(st, self.clients, msg)
        members = np.asarray(msg["members"], np.int64)
        up = (attacker_uploads(self.security, spec, st.tables, st.params, members - self.n_users,
                               int(msg["round"]), None, self.claim) if len(members) else None)
        return {"members": wire_ids(members), "n": len(members), "loss_sum": 0.0, "client_batches": 0,
                "bytes_up": len(members) * (st.floats_per_model + spec.principal * spec.dim) * 4,
                "bytes_down": 0, **upload_arrays(spec, self.n_items, up)}  # (the server counts their downloads)

    def evaluate(self, msg: Payload) -> Payload:
        from fedrec.federated.ca.sides import take_mixtures

        take_mixtures(self.state, self.clients, msg)  # a mixture waits for the node's next message
        return super().evaluate(msg)


class DAEMaliciousNode(AttackerNode):
    """The attacker's node of FedDAE: clients after the users, with empty bags (no first-layer
    rows to download or send), which download the decoder and the dense encoder layers as any
    client does and send what the simulator's attackers send
    (`fedrec.federated.dae.state.attacker_uploads`): crafted output rows as gradients, zero
    gradients of every other part; summed, or each client's upload (as steps) under a robust
    rule. Like FedCA's, it runs ``--attacker-norm own``: the simulator's attackers can be given
    the round's honest bag-row norm, which no node sees."""

    def __init__(self, run: RunConfig, split: Split, spec: DAESpec) -> None:
        from fedrec.federated.dae.state import TableView, initial_parts

        self.run, self.cfg = run, run.federated
        own_norm_only(run)
        security = Security.build(self.cfg, split, float(self.cfg.lr), run.seed)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security, self.n_users, self.n_items = security, split.n_users, split.n_items
        view = TableView()  # the global parts, as each train message sends them
        view.glob, view.spec, view.n_items = initial_parts(spec, split.n_items, run.seed)[0], spec, split.n_items
        self.view = view

    def hello(self, resume_round: int = 0) -> Payload:
        n = self.security.n_malicious
        return {"clients": np.arange(self.n_users, self.n_users + n), "n_clients": self.n_users,
                "n_items": self.n_items, "extra_clients": n, "client_items": np.zeros(0, np.int32),
                "client_ptr": np.zeros(n + 1, np.int64)}

    def train(self, msg: Payload) -> Payload:
        from fedrec.federated.dae.state import FIRST, attacker_bytes, attacker_uploads, crafted_sums

        view = self.view
        if len(np.asarray(msg["items"])):
            raise FedrecError("the server sent first-layer rows to clients without a bag")
        for k in view.glob:
            if k != FIRST:
                view.glob[k] = torch.as_tensor(msg[f"dense.{k}"])
        clients = np.asarray(msg["clients"], np.int64) - self.n_users
        bad = attacker_uploads(self.security, view, int(msg["round"]), None, clients)
        n_bytes = attacker_bytes(view, len(bad))
        counts = {"n": len(bad), "loss_sum": 0.0, "client_batches": 0, "bytes_up": n_bytes, "bytes_down": n_bytes}
        if msg.get("per_client"):  # the server's robust rule looks at each client's upload
            dense = {k: view.glob[k] for k in view.dense_keys()}
            ids = np.arange(self.n_users + self.security.n_malicious)  # the uploads name their ids
            return {**per_client_payload(bad, ids, dense, width=view.row_table().shape[1]), **counts}
        sums = crafted_sums(view, bad, float(self.cfg.lr))
        reply: Payload = {"items": np.zeros(0, np.int32)}
        for k, g in sums.items():
            reply[f"rows.{k}" if k == FIRST else f"dense.{k}"] = (g[:0] if k == FIRST else g).cpu().numpy()
        return {**reply, **counts}


class CIAMaliciousNode(AttackerNode):
    """The attacker's node of FedCIA: clients after the partition's, which send what the
    simulator's attackers send (`fedrec.federated.cia.algorithm.attacker_uploads`): rows crafted
    against the last average, which the server sends this node with every train message, as
    each row's change (under ``upload_rank`` L, the rank-L upload nearest them, read the same
    way); the server reads them client by client, by the defence's rule or the plain mean. Its
    row budget is its cover client's (`fedrec.federated.cia.cover.CoverClient`, which takes
    every server step as an honest client does): it runs ``--attacker-norm own``, since the
    simulator's attackers can be given the round's honest similarity change, which no node
    sees."""

    def __init__(self, run: RunConfig, split: Split, spec: CIASpec) -> None:
        from fedrec.federated.cia.cover import CoverClient
        from fedrec.federated.cia.sides import averages_similarities

        self.run, self.cfg, self.spec = run, run.federated, spec
        own_norm_only(run)
        spec.check_run(self.cfg)  # the attacks and options the simulator takes
        n_clients = spec.partition(split.n_users, run.seed).n_clients
        if not averages_similarities(spec, n_clients):
            raise FedrecError(f"'{run.algorithm}': --attack runs where the server averages whole similarity matrices")
        security = Security.build(self.cfg, split, float(self.cfg.lr), run.seed, n_clients=n_clients)
        if security is None or security.attack is None:
            raise FedrecError("a malicious node needs an --attack")
        self.security, self.n_clients, self.n_items = security, n_clients, split.n_items
        self.cover = CoverClient(spec, split.n_items, security.attack.cover_items(), n_clients, run.seed)

    def hello(self, resume_round: int = 0) -> Payload:
        n = self.security.n_malicious
        return {"clients": np.arange(self.n_clients, self.n_clients + n), "n_clients": self.n_clients,
                "n_items": self.n_items, "extra_clients": n}

    def private_state(self) -> bytes:
        attack = self.security.attack
        assert attack is not None
        return pack_state({"attack": attack.state(), "cover": self.cover.state_dict()})

    def load_private_state(self, raw: bytes) -> None:
        blob = unpack_state(raw)
        assert self.security.attack is not None
        self.security.attack.load_state(blob["attack"])
        self.cover.load_state_dict(blob["cover"])

    def _sync(self, msg: Payload) -> None:
        """The cover client takes the server's last step, as an honest node's clients do."""
        step = {k[len("sync."):]: v for k, v in msg.items() if k.startswith("sync.")}
        self.cover.take(step, int(msg.get("sync_round", 0)))

    def train(self, msg: Payload) -> Payload:
        from fedrec.federated.cia.algorithm import attacker_floats, attacker_uploads

        self._sync(msg)
        r = int(msg["round"])
        prev = torch.as_tensor(np.asarray(msg["average"], np.float32))
        if prev.shape != (self.n_items, self.n_items):
            raise FedrecError(f"the server sent an average of shape {tuple(prev.shape)}, expected "
                              f"({self.n_items}, {self.n_items})")
        clients = np.asarray(msg["clients"], np.int64) - self.n_clients
        norm = self.cover.budget(self.cfg, prev, r)
        bad = attacker_uploads(self.security, self.spec, prev, r, clients, norm)
        n_bytes = len(bad) * attacker_floats(self.spec, self.n_items) * 4
        ids = np.arange(self.n_clients + self.security.n_malicious)  # the uploads name their ids
        return {**per_client_payload(bad, ids, {}, width=self.n_items), "n": len(bad), "loss_sum": 0.0,
                "client_batches": 0, "bytes_up": n_bytes, "bytes_down": n_bytes}

    def evaluate(self, msg: Payload) -> Payload:
        self._sync(msg)
        return super().evaluate(msg)
