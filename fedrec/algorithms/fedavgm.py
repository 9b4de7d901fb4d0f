"""FedAvgM: FedMF with server momentum (Hsu et al. 2019; Reddi et al., ICLR 2021, Algorithm 2).

The server keeps a momentum buffer of the round's pseudo-gradient (mean - current) for the item
table: ``m <- momentum * m + (mean - x)``, then ``x <- x + server_lr * m``. With
``momentum=0`` and ``server_lr=1`` it is FedMF exactly. The default effective step
``server_lr / (1 - momentum) = 1`` is Hsu et al.'s advice (the mean's own step size).
This module is the walkthrough of docs/adding-an-algorithm.md: one file and one test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.federated.family import FamilySpec
from fedrec.federated.server_opt import ServerOptimizer
from fedrec.options import check
from fedrec.protocols.protocol import Split


class Momentum(ServerOptimizer):
    """Server SGD with momentum on the pseudo-gradient, one buffer per server tensor."""

    def __init__(self, server_lr: float, momentum: float) -> None:
        self.server_lr, self.momentum = server_lr, momentum
        self.buffers: dict[str, torch.Tensor] = {}

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        step = mean - current
        m = self.buffers.get(name)
        m = step if m is None else m.mul_(self.momentum).add_(step)
        self.buffers[name] = m
        return current + self.server_lr * m

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.buffers}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.buffers = {k: v.clone() for k, v in blob["buffers"].items()}


@dataclass(frozen=True)
class FedAvgMSpec(FamilySpec):
    server_lr: float = 0.1
    momentum: float = 0.9

    def server_optimizer(self) -> Momentum:
        return Momentum(self.server_lr, self.momentum)


@dataclass(frozen=True)
class FedAvgMOptions(FamilyOptions):
    #: the server's step size on the mean item update
    server_lr: float = 0.1
    #: the server's momentum on the mean item update (0: plain FedAvg)
    momentum: float = 0.9

    def validate(self) -> None:
        super().validate()
        check((self.server_lr <= 0, "server_lr must be > 0"),
              (not 0 <= self.momentum < 1, "momentum must be in [0, 1)"))


def build(split: Split, o: FedAvgMOptions) -> FedAvgMSpec:
    return FedAvgMSpec(score="dot", private_score=o.dual, dual=o.dual, dim=o.dim, clip=o.clip,
                       server_lr=o.server_lr, momentum=o.momentum)


register(AlgorithmSpec(
    "fedavgm", "federated",
    "FedAvgM: FedMF with server momentum on the mean item update (--set server_lr=, momentum=)",
    build, FedAvgMOptions, samples(0.1), flower=True, paper=PAPERS_RULE, transfers=True,
))
