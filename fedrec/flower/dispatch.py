"""A deployment in one process: the reference the Flower app is tested against.

`run_in_process` drives the generic server (`fedrec.flower.roles.Server`) and its nodes with
the one round driver over an in-process transport.
"""

from __future__ import annotations

from typing import Any

from fedrec.experiment import RunConfig, prepare_split
from fedrec.flower.roles import Node, Server, wire
from fedrec.protocols.protocol import Split


def run_in_process(run: RunConfig, partitions: int, split: Split | None = None,
                   fresh: bool = True) -> Any:
    """A deployment with ``partitions`` nodes, in one process (no Flower): the server driven
    by the one round driver over an in-process transport. The reference the Flower app is tested
    against. With an ``--attack``, one more node is the attacker's (`fedrec.flower.malicious`).
    ``fresh``: every message is answered by a new node that loads only what the last
    one declared as its clients' state, as a ClientApp does. Returns the server, with the
    run's outcome in ``out``."""
    from fedrec.core.driver import run_rounds
    from fedrec.flower.server import FlowerServer, InProcess

    split = split if split is not None else prepare_split(run)

    def make(i: int) -> Any:
        if i == partitions:  # the attacker's node, after the honest ones
            from fedrec.flower.malicious import malicious_node

            return malicious_node(run, split)
        return Node(run, i, partitions, split)

    nodes = {i: make(i) for i in range(partitions + (run.federated.attack is not None))}
    role = Server(run, {i: wire(n.hello()) for i, n in nodes.items()})
    rebuild = make if fresh else None
    server = FlowerServer(role, InProcess(nodes, rebuild), role.protocol, partitions)
    cfg = run.federated
    role.out = run_rounds(server, None, select=role.protocol.select, rounds=cfg.rounds,
                          eval_every=cfg.eval_every, patience=cfg.patience)
    return role
