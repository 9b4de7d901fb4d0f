"""CoLR: FedMF whose item updates lie in a random rank-r subspace each round, so a client sends
r numbers an item row (`fedrec.federated.colr`).

Model options (``--set KEY=VALUE``): ``rank`` (4; ``rank`` = ``dim`` is FedMF itself) and
FedMF's own (``dim``, ``clip``). Engine defaults are FedMF's (fedrec's item-row rule, which
averages each row over the clients that sent it, as CoLR's server does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.errors import FedrecError
from fedrec.options import check


@dataclass(frozen=True)
class CoLROptions(FamilyOptions):
    """FedMF's options and the subspace's rank."""

    #: the rank of each round's subspace: the numbers an item row's upload takes
    rank: int = 4

    def validate(self) -> None:
        super().validate()
        check((self.rank < 1 or self.rank > self.dim, f"rank must be in 1..dim ({self.dim}); got {self.rank}"),
              (self.dual, "CoLR compresses FedMF's upload; PFedRec's dual personalisation is not part of it "
                          "(leave --set dual out)"))

    def configured(self, engine: Any) -> Any:
        if getattr(engine, "encoding", "rows") == "sparse":
            raise FedrecError("--encoding sparse: CoLR sends each row as its r coordinates, which are not "
                              "sparse; give --encoding rows (its default) or dense")
        return super().configured(engine)

    def state_type(self) -> type:
        from fedrec.federated.colr import CoLRState

        return CoLRState


#: engine options CoLR does not read (every upload lives in the round's coordinates: LDP and DP
#: noise are drawn on them, `CoLRState.noise_rows`; pseudo rows too, `fedrec.federated.engine.train_cohort`;
#: a crafted upload is projected onto them, `fedrec.security.adversary.Security.malicious_uploads`)
IGNORES: tuple[str, ...] = ()

register(AlgorithmSpec(
    "colr", "federated",
    "CoLR: FedMF whose item updates lie in a random rank-r subspace each round; uploads r numbers a row "
    "(--set rank=)",
    None, CoLROptions, samples(0.1), flower=True, ignores=IGNORES, paper=PAPERS_RULE,
    transfers=True,  # tuning on Lastfm-2K kept its defaults (docs/defaults.md, "The newer methods")
))
