"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020): FedMF
whose clients add a proximal term (mu / 2) ||w - w_round||² to their local loss, over what they
downloaded (item rows and shared weights), which holds their local steps near the round's model
when clients' data differ.

The term is `fedrec.federated.family.objective.Proximal`, taken as its exact proximal step (stable at
any item rate); ``--client-objective prox:mu=...`` gives it to any member of the item-embedding
family and MetaMF (PFedRec, FedNCF, ...). This module is the walkthrough of
docs/adding-an-algorithm.md: one file and one test.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.federated.family.objective import Proximal
from fedrec.federated.family.spec import FamilySpec
from fedrec.options import check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class FedProxOptions(FamilyOptions):
    #: the proximal term's weight (0: FedMF)
    mu: float = 0.01

    def validate(self) -> None:
        super().validate()
        check((not self.mu >= 0, "mu must be >= 0"))


#: `fedrec tune` also searches the term's weight: from next to FedMF to holding the local steps
#: at the round's model
SEARCH = {"mu": (1e-4, 1.0)}


def build(split: Split, o: FedProxOptions) -> FamilySpec:
    return FamilySpec(score="dot", private_score=o.dual, dual=o.dual, dim=o.dim, clip=o.clip,
                      objective=Proximal(mu=o.mu))


register(AlgorithmSpec(
    "fedprox", "federated",
    "FedProx: FedMF whose clients add the proximal term (mu / 2) ||w - w_round||² to their loss (--set mu=)",
    build, FedProxOptions, samples(0.1), flower=True, paper=PAPERS_RULE, search=SEARCH,
))
