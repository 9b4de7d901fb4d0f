"""FedAdam: FedMF whose server applies Adam to the round's pseudo-gradient (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 2 with the Adam update).

``m <- b1 m + (1 - b1) d``, ``v <- b2 v + (1 - b2) d^2``, ``x <- x + server_lr m / (sqrt(v) + tau)``
with d = mean - current, v starting at tau^2 and no bias correction, as in the paper. ``tau`` (1e-3) is the
paper's adaptivity constant. Each coordinate then moves by at most about ``server_lr`` a round,
so the server step does not scale with the item rows' learning rate (a plain average's does). The optimiser is
`fedrec.federated.family.server_opt.Adam`, which ``--server-opt adam`` gives any member of the family;
FedYogi, the same with Yogi's second moment, is registered here too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.federated.family.server_opt import ServerOpt
from fedrec.federated.family.spec import FamilySpec
from fedrec.options import check, internal
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class FedAdamOptions(FamilyOptions):
    optimizer: str = internal("adam")
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

    def for_split(self, split: Split | None) -> FamilySpec:
        """FedMF with the adaptive server optimiser (``optimizer``) at these settings."""
        server = ServerOpt(self.optimizer, lr=self.server_lr, beta1=self.beta1, beta2=self.beta2, tau=self.tau)
        return replace(super().for_split(split), server=server)


@dataclass(frozen=True)
class FedYogiOptions(FedAdamOptions):
    """FedYogi: FedAdam's options, Yogi's second moment."""

    optimizer: str = internal("yogi")


#: `fedrec tune` also searches the server's step size, which bounds how far a coordinate moves a
#: round (a decade either side of the default)
SEARCH = {"server_lr": (1e-2, 1.0)}


register(AlgorithmSpec(
    "fedadam", "federated",
    "FedAdam: FedMF whose server applies Adam to the mean item update (--set server_lr=, beta1=, beta2=, tau=)",
    None, FedAdamOptions, samples(0.1), flower=True, paper=PAPERS_RULE, transfers=True,
    search=SEARCH,
))


register(AlgorithmSpec(
    "fedyogi", "federated",
    "FedYogi: FedMF whose server applies Yogi to the mean item update (--set server_lr=, beta1=, beta2=, tau=)",
    None, FedYogiOptions, samples(0.1), flower=True, paper=PAPERS_RULE, search=SEARCH,
))
