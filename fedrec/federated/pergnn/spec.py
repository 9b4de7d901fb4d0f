"""FedPerGNN's options (see `fedrec.federated.pergnn.state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fedrec.errors import FedrecError
from fedrec.options import check
from fedrec.protocols.protocol import Split

if TYPE_CHECKING:
    from fedrec.federated.pergnn.state import GNNAlgorithm


#: when the third party expands a client's graph (`GNNSpec.expansion`)
EXPANSIONS = ("every-round", "once")


@dataclass(frozen=True)
class GNNSpec:
    """A FedPerGNN run (module docstring)."""

    #: size of the user and item vectors and of the graph layer
    dim: int = 32
    #: neighbouring users in a client's expanded graph (0: its items alone)
    neighbours: int = 20
    #: std of the user vectors' start (the item rows start at ``--item-std``)
    user_std: float = 0.1
    #: rounds trained on the clients' own items before the first expansion (the paper's T)
    warmup: int = 0
    #: ``every-round``: a client's neighbours are redrawn, with their latest vectors, each round
    #: it takes part; ``once``: drawn at its first round after the warm-up and kept, vectors
    #: included (the paper's Algorithm 1)
    expansion: str = "every-round"
    #: bound on the L2 norm of each client's graph-layer step (W and a together); None: unbounded,
    #: as ``--clip`` bounds only the item rows' steps. With ``--ldp`` it bounds what the noise
    #: hides of the layer (docs/fedpergnn.md, "Privacy")
    layer_clip: float | None = None
    #: bound on every entry of every uploaded step, item rows' and graph layer's (the paper's
    #: δ, which it applies to gradients; here to steps, after the rate); None: no entry bound
    entry_clip: float | None = None

    def __post_init__(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"),
              (self.neighbours < 0, f"neighbours must be >= 0 (got {self.neighbours})"),
              (self.user_std <= 0, "user_std must be > 0"),
              (self.warmup < 0, f"warmup must be >= 0 (got {self.warmup})"),
              (self.layer_clip is not None and self.layer_clip <= 0, "layer_clip must be > 0"),
              (self.entry_clip is not None and self.entry_clip <= 0, "entry_clip must be > 0"),
              (self.expansion not in EXPANSIONS,
               f"expansion must be one of {', '.join(EXPANSIONS)} (got {self.expansion!r})"),
              (self.expansion == "once" and self.warmup < 1 and self.neighbours > 0,
               "expansion=once needs warmup >= 1: before round 1 no user has published a vector, "
               "so a client expanded then would keep no neighbour"))

    def sides(self) -> tuple[type, type]:
        """The client and server sides of its round in a deployment (`fedrec.federated.pergnn.sides`)."""
        from fedrec.federated.pergnn.sides import GNNClient, GNNServer

        return GNNClient, GNNServer

    #: why its server reads each client's upload, which a secure sum would hide: `--secagg` is
    #: refused, on Flower and by the privacy audit
    needs_each_upload: ClassVar[str] = "its server relays each client's published user vector, which a secure sum would hide"

    def flower_refusal(self, secure: bool) -> str | None:
        return self.needs_each_upload if secure else None

    def algorithm(self, split: Split, cfg: Any, seed: int) -> GNNAlgorithm:
        if cfg.aggregation not in ("clients", "contributors"):
            raise FedrecError("FedPerGNN averages item rows over the round's clients (--aggregation clients) or "
                              "over the clients that sent each row (contributors)")
        from fedrec.federated.pergnn.state import GNNAlgorithm, GNNState

        return GNNAlgorithm(GNNState(self, split, cfg, seed), cfg)
