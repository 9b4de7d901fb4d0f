"""FedAdam: FedMF whose server applies Adam to the round's pseudo-gradient (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 2 with the Adam update).

``m <- b1 m + (1 - b1) d``, ``v <- b2 v + (1 - b2) d^2``, ``x <- x + server_lr m / (sqrt(v) + tau)``
with d = mean - current, v starting at tau^2 and no bias correction, as in the paper. ``tau`` (1e-3) is the
paper's adaptivity constant. Each coordinate then moves by at most about ``server_lr`` a round,
so the server step no longer scales with the item rows' learning rate.
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


class Adam(ServerOptimizer):
    """Server Adam on the pseudo-gradient, moments per server tensor."""

    def __init__(self, server_lr: float, beta1: float, beta2: float, tau: float) -> None:
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        d = mean - current
        # Algorithm 2 starts v at tau^2 or more, so the first step is bounded by server_lr
        m, v = self.moments.get(name, (torch.zeros_like(d), torch.full_like(d, self.tau**2)))
        m = m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
        v = v.mul_(self.beta2).addcmul_(d, d, value=1 - self.beta2)
        self.moments[name] = (m, v)
        return current + self.server_lr * m / (v.sqrt() + self.tau)

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.moments = {k: (m.clone(), v.clone()) for k, (m, v) in blob["moments"].items()}


@dataclass(frozen=True)
class FedAdamSpec(FamilySpec):
    server_lr: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def server_optimizer(self) -> Adam:
        return Adam(self.server_lr, self.beta1, self.beta2, self.tau)


@dataclass(frozen=True)
class FedAdamOptions(FamilyOptions):
    #: the server's Adam step size on the mean item update
    server_lr: float = 0.1
    #: decay of the server's first-moment (mean) estimate
    beta1: float = 0.9
    #: decay of the server's second-moment (variance) estimate
    beta2: float = 0.99
    #: adaptivity constant added to the square root of the second moment (Adam's epsilon)
    tau: float = 1e-3

    def validate(self) -> None:
        super().validate()
        check((self.server_lr <= 0 or self.tau <= 0, "server_lr and tau must be > 0"),
              (not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1), "beta1 and beta2 must be in [0, 1)"))


def build(split: Split, o: FedAdamOptions) -> FedAdamSpec:
    return FedAdamSpec(score="dot", private_score=o.dual, dual=o.dual, dim=o.dim, clip=o.clip,
                       server_lr=o.server_lr, beta1=o.beta1, beta2=o.beta2, tau=o.tau)


register(AlgorithmSpec(
    "fedadam", "federated",
    "FedAdam: FedMF whose server applies Adam to the mean item update (--set server_lr=, beta1=, beta2=, tau=)",
    build, FedAdamOptions, samples(0.1), flower=True, paper=PAPERS_RULE, transfers=True,
))
