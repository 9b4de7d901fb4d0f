"""The one place algorithms register by name.

An `AlgorithmSpec` says what kind of run an algorithm is (centralised now; federated
algorithms join with the engine) and how to build its model for a split. Adding an algorithm
means adding one module that calls `register` and one test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedrec.errors import UnknownNameError
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class AlgorithmSpec:
    """A named algorithm: ``build(split, options)`` returns its model.

    ``kind`` picks the trainer: ``centralised`` builds an ``nn.Module`` trained by
    `fedrec.train.centralised`; ``federated`` builds a `FamilySpec` run by the simulator.
    ``defaults`` hold model options and the learning rate the papers use; ``engine`` holds
    the federated engine options the algorithm runs with unless the user says otherwise
    (`fedrec.run.federated_config`). ``rankings`` are the protocol rankings its scores can
    be evaluated under (binarised rating vectors, ``rated``, need a model trained on them).
    ``flower``: the Flower app runs it (`fedrec.flower`).
    """

    name: str
    kind: str
    description: str
    build: Callable[[Split, dict[str, Any]], Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    rankings: tuple[str, ...] = ("sampled", "full", "rating")
    flower: bool = False


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm '{spec.name}' registered twice")
    ALGORITHMS[spec.name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, list(ALGORITHMS))
    return ALGORITHMS[name]


from fedrec.algorithms import ae as _ae  # noqa: E402,F401  (registers)
from fedrec.algorithms import centralised as _centralised  # noqa: E402,F401  (registers)
from fedrec.algorithms import cia as _cia  # noqa: E402,F401  (registers)
from fedrec.algorithms import federated as _federated  # noqa: E402,F401  (registers)
from fedrec.algorithms import graph as _graph  # noqa: E402,F401  (registers)
from fedrec.algorithms import metamf as _metamf  # noqa: E402,F401  (registers)
from fedrec.algorithms import rap as _rap  # noqa: E402,F401  (registers)
