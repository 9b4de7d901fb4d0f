"""FedAvgM: FedMF with server momentum (Hsu et al. 2019; Reddi et al., ICLR 2021, Algorithm 2).

The server keeps a momentum buffer of the round's pseudo-gradient (mean - current) for the item
table: ``m <- momentum * m + (mean - x)``, then ``x <- x + server_lr * m``. With
``momentum=0`` and ``server_lr=1`` it is FedMF exactly. The default effective step
``server_lr / (1 - momentum) = 1`` is Hsu et al.'s advice (the mean's own step size). The
optimiser is `fedrec.federated.family.server_opt.Momentum`, which ``--server-opt avgm`` gives any
member of the family.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.federated.family.server_opt import ServerOpt
from fedrec.federated.family.spec import FamilySpec
from fedrec.options import check
from fedrec.protocols.protocol import Split


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

    def for_split(self, split: Split | None) -> FamilySpec:
        """FedMF with server momentum at these settings."""
        return replace(super().for_split(split), server=ServerOpt("avgm", lr=self.server_lr, momentum=self.momentum))


register(AlgorithmSpec(
    "fedavgm", "federated",
    "FedAvgM: FedMF with server momentum on the mean item update (--set server_lr=, momentum=)",
    None, FedAvgMOptions, samples(0.1), flower=True, paper=PAPERS_RULE, transfers=True,
    search={"server_lr": (1e-2, 1.0)},  # `fedrec tune` also searches the server's step (a decade around it)
))
