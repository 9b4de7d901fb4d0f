"""The options of FedDAE (gated dual-encoder VAE; see `fedrec.federated.dae.state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedrec.errors import FedrecError
from fedrec.options import check
from fedrec.protocols.protocol import Split

if TYPE_CHECKING:
    from fedrec.federated.dae.state import DAEAlgorithm

ENCODERS = ("dual", "global", "local")


@dataclass(frozen=True)
class DAESpec:
    """A FedDAE run (Li, Long, Zhou, Jiang and Zhang, "Personalized Federated Collaborative
    Filtering: A Variational AutoEncoder Approach", AAAI 2025). Defaults: the official code's
    sizes and rates, its README's weight decay (1e-5; its parser's default is 1e-8), with the
    widths fixed rather than derived from ``latent``."""

    #: the encoders: dual (a global and a private one, mixed by a private gate: FedDAE), global
    #: (the shared one alone) or local (the private one alone; the decoder is still shared)
    encoders: str = "dual"
    #: size of the latent code z
    latent: int = 256
    #: the encoders' hidden widths (the decoder mirrors them)
    hidden: tuple[int, ...] = (768, 512)
    #: width of the gate's hidden layer
    gate_hidden: int = 256
    #: dropout on the encoders' input and on the gate's hidden layer
    dropout: float = 0.5
    #: weight of the KL term, times tanh(round / 10) (the official code multiplies it into
    #: itself each round from round 0, so its weight is 0 from the first round on: beta=0)
    beta: float = 1.0
    #: L2 weight decay of the clients' and the server's Adam steps
    weight_decay: float = 1e-5

    def __post_init__(self) -> None:
        check(
            (self.encoders not in ENCODERS, f"encoders must be one of {', '.join(ENCODERS)}"),
            (self.latent < 1 or self.gate_hidden < 1 or not self.hidden or min(self.hidden) < 1,
             "latent, gate_hidden and every hidden width must be >= 1"),
            (not 0 <= self.dropout < 1, f"dropout must be in [0, 1) (got {self.dropout})"),
            (self.beta < 0 or self.weight_decay < 0, "beta and weight_decay must be >= 0"),
        )

    def sides(self) -> tuple[type, type]:
        """The client and server sides of its round in a deployment (`fedrec.federated.dae.sides`)."""
        from fedrec.federated.dae.sides import DAEClient, DAEServer

        return DAEClient, DAEServer

    def flower_refusal(self, secure: bool) -> str | None:
        if secure:
            return ("secure aggregation sums item tables only; FedDAE's clients send gradients of "
                    "every layer of its encoder and decoder")
        return None

    def algorithm(self, split: Split, cfg: Any, seed: int) -> DAEAlgorithm:
        """The federated algorithm the round driver trains."""
        if split.protocol.ranking == "rating":
            raise FedrecError("FedDAE ranks items from a user's bag of items; use a ranking protocol")
        if cfg.ldp or cfg.dp_noise or cfg.clip is not None:
            raise FedrecError("FedDAE's uploads take no noise or clipping options (--ldp, --dp-noise, --clip)")
        from fedrec.federated.dae.state import DAEAlgorithm, DAEState

        return DAEAlgorithm(DAEState(self, split, seed), cfg)
