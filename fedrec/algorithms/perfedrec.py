"""PerFedRec: FedMF with the users clustered by their vectors on the server, a table a cluster,
and each client scoring with the mean of the global, its cluster's and its own model
(`fedrec.federated.perfedrec`).

Model options (``--set KEY=VALUE``): ``clusters`` (5, the official code's) and FedMF's own
(``dim``, ``clip``). Engine defaults are FedMF's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import PAPERS_RULE, FamilyOptions, samples
from fedrec.options import check


@dataclass(frozen=True)
class PerFedRecOptions(FamilyOptions):
    """FedMF's options and the number of clusters."""

    #: the clusters the server groups the users into (k-means over their vectors)
    clusters: int = 5

    def validate(self) -> None:
        super().validate()
        check((self.clusters < 1, f"clusters must be >= 1 (got {self.clusters})"),
              (self.dual, "PerFedRec personalises through its clusters and the client's own rows; PFedRec's "
                          "dual personalisation is not part of it (leave --set dual out)"))

    def state_type(self) -> type:
        from fedrec.federated.perfedrec import PerFedRecState

        return PerFedRecState

    def sides(self) -> tuple[type, type]:
        """On Flower: the family's sides, with the clusters' rows and the users' vectors."""
        from fedrec.federated.perfedrec import PerFedRecClient, PerFedRecServer

        return PerFedRecClient, PerFedRecServer

    #: why its server reads each client's upload, which a secure sum would hide: `--secagg` is
    #: refused, on Flower and by the privacy audit
    needs_each_upload: ClassVar[str] = ("its server clusters the users by the vectors they send and keeps a "
                                        "table a cluster; secure aggregation shows it only one sum")

    def flower_refusal(self, secure: bool) -> str | None:
        if secure:
            return self.needs_each_upload
        return super().flower_refusal(secure)


#: engine options its uploads do not carry: noise and pseudo rows are not drawn for the user
#: vector it sends (attacks and robust rules act on the global table, `fedrec.federated.perfedrec`)
IGNORES = ("ldp", "dp_noise", "dp_clip", "pad_items")

register(AlgorithmSpec(
    "perfedrec", "federated",
    "PerFedRec: FedMF whose server clusters the users by their vectors (a table a cluster); a client "
    "scores with the mean of the global, its cluster's and its own model (--set clusters=)",
    None, PerFedRecOptions, samples(0.1), ignores=IGNORES, flower=True, paper=PAPERS_RULE,
    transfers=True,  # no tuned setting beat its defaults on test (docs/defaults.md, "The newer methods")
))
