"""Which Flower roles run an algorithm, and a deployment in one process.

Each kind of spec runs on one pair of roles (`ROLES`): a node role that trains the clients it
holds and a server role that aggregates their uploads. The specs do not name their roles (the
methods sit beneath the deployment layer and import nothing of it); this module maps them.
`run_in_process` drives a server role and its nodes with the one round driver over an
in-process transport: the reference the Flower app is tested against.
"""

from __future__ import annotations

from typing import Any

from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated.ae_spec import AESpec
from fedrec.federated.cia_spec import CIASpec
from fedrec.federated.family import FamilySpec
from fedrec.federated.graph_spec import GraphSpec
from fedrec.federated.rap import RAPSpec
from fedrec.flower.autoencoder import AENode, AEServer
from fedrec.flower.cia import CIANode, CIAServer
from fedrec.flower.family import NodeRole, ServerRole
from fedrec.flower.graph import GraphNode, GraphServer
from fedrec.flower.roles import Payload, check_deployable, wire
from fedrec.protocols.protocol import Split

#: each kind of spec's (node role, server role), in the order they are matched: FedRAP and MetaMF
#: run on the item family's (their states are `FamilyState`s)
ROLES: tuple[tuple[type, tuple[type, type]], ...] = (
    (AESpec, (AENode, AEServer)),
    (CIASpec, (CIANode, CIAServer)),
    (GraphSpec, (GraphNode, GraphServer)),
    (RAPSpec, (NodeRole, ServerRole)),
    (FamilySpec, (NodeRole, ServerRole)),
)


def roles_of(spec: Any) -> tuple[type, type]:
    """The node and server roles that run ``spec``."""
    for kind, roles in ROLES:
        if isinstance(spec, kind):
            return roles
    raise TypeError(f"no Flower roles for {type(spec).__name__}")


def node_role(run: RunConfig, partition: int, partitions: int, split: Split) -> Any:
    """The node role that runs the run's algorithm (`roles_of`)."""
    node, _ = roles_of(check_deployable(run, split=split))
    return node(run, partition, partitions, split)


def server_role(run: RunConfig, hellos: dict[int, Payload], secure: bool = False) -> Any:
    """The server role that runs the run's algorithm (`roles_of`)."""
    _, server = roles_of(check_deployable(run, secure))
    return server(run, hellos, secure)


def run_in_process(run: RunConfig, partitions: int, split: Split | None = None,
                   fresh: bool = True) -> Any:
    """A deployment with ``partitions`` nodes, in one process (no Flower): the server role driven
    by the one round driver over an in-process transport. The reference the Flower app is tested
    against. With an ``--attack``, one more node is the attacker's (`fedrec.flower.malicious`).
    ``fresh``: every message is answered by a new node that loads only what the last
    one declared as its clients' state, as a ClientApp does. Returns the server role, with the
    run's outcome in ``out``."""
    from fedrec.core.driver import run_rounds
    from fedrec.flower.server import FlowerServer, InProcess

    split = split if split is not None else prepare_split(run)

    def make(i: int) -> Any:
        if i == partitions:  # the attacker's node, after the honest ones
            from fedrec.flower.malicious import MaliciousNode

            return MaliciousNode(run, split)
        return node_role(run, i, partitions, split)

    nodes = {i: make(i) for i in range(partitions + (run.federated.attack is not None))}
    role = server_role(run, {i: wire(n.hello()) for i, n in nodes.items()})
    rebuild = make if fresh else None
    server = FlowerServer(role, InProcess(nodes, rebuild), role.protocol, partitions)
    cfg = run.federated
    role.out = run_rounds(server, None, select=role.protocol.select, rounds=cfg.rounds,
                          eval_every=cfg.eval_every, patience=cfg.patience)
    return role
