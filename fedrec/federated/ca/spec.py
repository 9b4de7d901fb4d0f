"""The options of FedCA (composite aggregation; see `fedrec.federated.ca.state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fedrec.errors import FedrecError
from fedrec.federated.family.spec import FamilySpec
from fedrec.options import check
from fedrec.protocols.protocol import Split

if TYPE_CHECKING:
    from fedrec.federated.ca.state import CAAlgorithm

BACKBONES = ("fcf", "ncf")
AGGREGATIONS = ("composite", "fedavg")
USER_STARTS = ("common", "own")


@dataclass(frozen=True)
class CASpec:
    """A FedCA run (Zhang et al., "Beyond Similarity: Personalized Federated Recommendation with
    Composite Aggregation"). Defaults are the official code's but for how much a client takes
    from the others (``aggregated``, ``interpolation``): at the official 0.1 and 0.9 an item a
    client never trained keeps nearly its random start, and on a leak-free split FedCA ranks at
    chance level (docs/fedca.md)."""

    #: each client's model: fcf (sigmoid of <u, q>) or ncf (an MLP over the user vector and
    #: the item row)
    backbone: str = "fcf"
    #: embedding size of the user vector and the item rows
    dim: int = 16
    #: the ncf backbone's hidden layers (the official [2 dim, 16, 8, 1] tower)
    layers: tuple[int, ...] = (16, 8)
    #: composite (similarity and complementarity) or fedavg (every aggregated client gets the
    #: FedAvg mean of the aggregated clients: the ablation without either)
    aggregation: str = "composite"
    #: weight of complementarity (the cosine of the mean principal angle) in the weights
    complementarity: float = 0.3
    #: weight of model similarity in the weights
    similarity: float = 0.3
    #: share of a round's clients aggregated (the official code's agg_clients_ratio: 0.1)
    aggregated: float = 1.0
    #: share of its own model an aggregated client keeps when it takes the server's (the
    #: official code's: 0.9)
    interpolation: float = 0.5
    #: principal directions of a client's trained item rows (its complementarity signature)
    principal: int = 4
    #: L2 weight decay of the ncf tower's Adam steps (the official code's 1e-3)
    weight_decay: float = 1e-3
    #: where each client's user vector starts: common (one vector drawn from the seed, which
    #: every client copies, as in the official code) or own (a vector of its own, keyed by its
    #: id). A common start points every client's first pushes on its items one way, so the
    #: mixtures of their tables agree from the first round (docs/fedca.md)
    user_start: str = "common"

    def __post_init__(self) -> None:
        check(
            (self.backbone not in BACKBONES, f"backbone must be one of {', '.join(BACKBONES)}"),
            (self.aggregation not in AGGREGATIONS, f"aggregation must be one of {', '.join(AGGREGATIONS)}"),
            (self.user_start not in USER_STARTS, f"user_start must be one of {', '.join(USER_STARTS)}"),
            (self.dim < 1 or self.principal < 1, "dim and principal must be >= 1"),
            (not self.layers or min(self.layers) < 1, "layers needs one or more sizes >= 1"),
            (not 0 < self.aggregated <= 1, f"aggregated must be in (0, 1] (got {self.aggregated})"),
            (not 0 <= self.interpolation <= 1, f"interpolation must be in [0, 1] (got {self.interpolation})"),
            (self.complementarity < 0 or self.similarity < 0 or self.weight_decay < 0,
             "complementarity, similarity and weight_decay must be >= 0"),
        )

    @property
    def model(self) -> FamilySpec:
        """Each client's model as a member of the item-embedding family (its parameters' shapes
        and draws, its score and loss); every parameter of it is the client's own."""
        return FamilySpec(score="dot" if self.backbone == "fcf" else "mlp", private_score=True,
                          dim=self.dim, layers=self.layers)

    def sides(self) -> tuple[type, type]:
        """The client and server sides of its round in a deployment (`fedrec.federated.ca.sides`)."""
        from fedrec.federated.ca.sides import CAClient, CAServer

        return CAClient, CAServer

    #: why its server reads each client's upload, which a secure sum would hide: `--secagg` is
    #: refused, on Flower and by the privacy audit
    needs_each_upload: ClassVar[str] = "its server weighs each aggregated client's own model, not a secure sum"

    def flower_refusal(self, secure: bool) -> str | None:
        return self.needs_each_upload if secure else None

    def algorithm(self, split: Split, cfg: Any, seed: int) -> CAAlgorithm:
        """The federated algorithm the round driver trains."""
        if split.protocol.ranking == "rating":
            raise FedrecError("FedCA's models rank items; use a ranking protocol (loo-sampled, loo-full)")
        if cfg.ldp or cfg.dp_noise or cfg.clip is not None:
            raise FedrecError("FedCA's uploads take no noise or clipping options (--ldp, --dp-noise, --clip)")
        from fedrec.federated.ca.state import CAAlgorithm, CAState

        return CAAlgorithm(CAState(self, split, cfg, seed), cfg)
