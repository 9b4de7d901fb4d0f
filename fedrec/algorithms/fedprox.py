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

from dataclasses import dataclass, replace

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

    def for_split(self, split: Split | None) -> FamilySpec:
        """FedMF whose clients add the proximal term at weight ``mu``."""
        return replace(super().for_split(split), objective=Proximal(mu=self.mu))


#: `fedrec tune` also searches the term's weight: from next to FedMF to holding the local steps
#: at the round's model
SEARCH = {"mu": (1e-4, 1.0)}


register(AlgorithmSpec(
    "fedprox", "federated",
    "FedProx: FedMF whose clients add the proximal term (mu / 2) ||w - w_round||² to their loss (--set mu=)",
    None, FedProxOptions, samples(0.1), flower=True, paper=PAPERS_RULE, search=SEARCH,
))
