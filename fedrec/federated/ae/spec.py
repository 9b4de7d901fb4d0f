"""The options of the rating autoencoders: PersonalFR, FedAvg of the autoencoder, the Joint
model (see `fedrec.federated.ae.state` for the method)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedrec.errors import FedrecError
from fedrec.options import check
from fedrec.partition import GROUPINGS, Partition, clients_of
from fedrec.protocols.protocol import Split

SHARES = ("decoder", "all")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class AESpec:
    """An autoencoder run; ``clients`` = 0 is one user per client, 1 the Joint model.

    ``weight_decay`` None means the paper's 5e-4 with SGD and none with Adam. ``clip`` bounds
    the gradient norm of each client's step (0: no clipping; the official code clips at 1).
    """

    #: what the server averages: decoder (PersonalFR: encoders stay private) or all (FedAvg)
    share: str = "decoder"
    #: clients the users are grouped into (0: one user per client, 1: the Joint model)
    clients: int = 100
    #: how users are grouped into clients: random (seeded) or contiguous blocks of ids
    grouping: str = "random"
    #: the encoder's layer widths (the decoder mirrors them)
    hidden: tuple[int, ...] = (256, 128)
    #: dropout on the code (the encoder's output)
    dropout: float = 0.5
    #: GroupNorm after every hidden layer
    norm: bool = True
    #: partial compression: only the rows of a client's items travel
    compression: bool = True
    #: the clients' optimiser: adam or sgd
    optimizer: str = "adam"
    #: SGD's momentum
    momentum: float = 0.9
    #: SGD with Nesterov momentum
    nesterov: bool = True
    #: L2 weight decay (none: 5e-4 with SGD, 0 with Adam)
    weight_decay: float | None = None
    #: L2 bound on each client's gradient of a step (0: no clipping)
    clip: float = 0.0
    #: explicit ratings fitted beneath each user's training mean (computed on the client):
    #: the encoder reads and the decoder predicts a rating less it, and the decoder's output
    #: bias is the item half of the baseline (fedrec's default for ratings, ``--rating-baseline``)
    baseline: bool = False

    def __post_init__(self) -> None:
        check(
            (self.share not in SHARES, f"share must be one of {SHARES}"),
            (self.optimizer not in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}"),
            (self.grouping not in GROUPINGS, f"grouping must be one of {GROUPINGS}"),
            (self.clients < 0, "clients must be >= 0 (0: one user per client)"),
            (len(self.hidden) < 2 or min(self.hidden) < 1, "hidden needs two or more sizes >= 1"),
            (not 0 <= self.dropout < 1, "dropout must be in [0, 1)"),
            (self.clip < 0 or self.decay < 0, "clip and weight_decay must be >= 0"),
            (self.optimizer == "adam" and self.decay > 0 and not self.compression,
             "Adam with weight decay moves rows a client never trained; use compression or SGD"),
        )

    def configured(self, engine: Any) -> AESpec:
        """This spec under the engine's options: with the rating baseline where asked for."""
        wanted = getattr(engine, "rating_baseline", "none") != "none"
        return replace(self, baseline=True) if wanted and not self.baseline else self

    @property
    def decay(self) -> float:
        if self.weight_decay is None:
            return 5e-4 if self.optimizer == "sgd" else 0.0
        return self.weight_decay

    def private(self, name: str) -> bool:
        """Whether a parameter stays on the client (PersonalFR: the encoder)."""
        return self.share == "decoder" and name.startswith("enc.")

    def partition(self, n_users: int, seed: int) -> Partition:
        return clients_of(n_users, self.clients, self.grouping, seed)

    def sides(self) -> tuple[type, type]:
        """The client and server sides of this method's round in a deployment
        (`fedrec.rounds.sides`)."""
        from fedrec.federated.ae.sides import AEClient, AEServer

        return AEClient, AEServer

    def flower_refusal(self, secure: bool) -> str | None:
        if self.clients == 1:
            return "the Joint autoencoder (one client) has nothing to federate"
        if self.optimizer == "sgd" and self.decay > 0 and not self.compression:
            return ("the Flower app does not send the whole decoder with weight decay (rows a "
                    "client never trained would decay); use compression or Adam")
        if secure:
            return "secure aggregation sums item tables only; the autoencoders average shared weights"
        return None

    def algorithm(self, split: Split, cfg: Any, seed: int) -> Any:
        """The federated algorithm the round driver trains."""
        if cfg.ldp or cfg.dp_noise or cfg.clip is not None:
            raise FedrecError("the autoencoder runs take no upload noise or clipping options")
        if cfg.pad_items:
            raise FedrecError("the autoencoder runs take no --pad-items: a client's pseudo rows of the decoder "
                              "are not built")
        from fedrec.federated.ae.algorithm import AEAlgorithm
        from fedrec.federated.ae.state import AEState

        spec = self.configured(cfg)
        return AEAlgorithm(AEState(spec, split, spec.partition(split.n_users, seed), seed), cfg)
