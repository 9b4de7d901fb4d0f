"""The options of FedCIA and its parameter-averaging baselines (see `fedrec.federated.cia.state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedrec.errors import FedrecError
from fedrec.federated.cia.stack import BACKBONES
from fedrec.options import check, internal
from fedrec.partition import GROUPINGS, Partition, clients_of
from fedrec.protocols.protocol import Split

if TYPE_CHECKING:
    from fedrec.federated.cia.algorithm import CIAAlgorithm

AGGREGATIONS = ("cia", "waa", "none")
#: the attacks whose crafted rows go at a row budget, which FedCIA's similarity rows can carry
#: (`fedrec.federated.cia.algorithm.CIAAlgorithm`; the others train fake users by SGD steps)
SIMILARITY_ATTACKS = ("fedrecattack", "pipattack", "pieck-ipe", "pieck-uea", "poisonfrs")
FINETUNE_LOSSES = ("norm", "mse")
SCOPES = ("all", "local")


@dataclass(frozen=True)
class CIASpec:
    """A FedCIA-style run. ``models`` lists (backbone, dim) pairs; client c uses
    ``models[c % len(models)]`` (several pairs: the heterogeneous runs of Section 6.6).
    ``clients`` = 0 means one user per client."""

    models: tuple[tuple[str, int], ...] = internal((("mf", 64),))
    #: cia (average item similarities), waa (average parameters) or none (independent models)
    aggregation: str = "cia"
    #: clients the users are grouped into (0: one user per client)
    clients: int = 100
    #: how users are grouped: contiguous blocks of ids (the official split) or random
    grouping: str = "contiguous"
    #: LightGCN's propagation layers
    layers: int = 3
    tower: tuple[int, ...] = internal((64, 32, 16, 8))
    init_std: float = internal(0.1)
    #: gradient steps a client fine-tunes its item table towards the averaged similarity
    finetune_steps: int = 100
    #: step size of that fine-tune
    finetune_lr: float = 0.1
    #: the fine-tune's loss: norm (the official code's Frobenius norm) or mse (the paper's)
    finetune_loss: str = "norm"
    #: rank of the uploaded similarity's eigendecomposition (0: the dense matrix travels)
    upload_rank: int = 0
    #: all (the whole item-item similarity) or local (only the items a client has)
    scope: str = "all"
    #: GF-CF: weight of the averaged filter in a user's scores
    beta: float = 60.0
    #: GF-CF: weight of the ideal low-pass filter
    ideal_weight: float = 0.3
    #: GF-CF: singular vectors kept by the ideal low-pass filter
    filter_rank: int = 32

    def __post_init__(self) -> None:
        check(
            (self.aggregation not in AGGREGATIONS, f"aggregation must be one of {AGGREGATIONS}"),
            (self.grouping not in GROUPINGS, f"grouping must be one of {GROUPINGS}"),
            (self.finetune_loss not in FINETUNE_LOSSES, f"finetune_loss must be one of {FINETUNE_LOSSES}"),
            (self.scope not in SCOPES, f"scope must be one of {SCOPES}"),
            (not self.models, "at least one (backbone, dim) is needed"),
            (any(b not in (*BACKBONES, "gfcf") for b, _ in self.models),
             f"backbones are {', '.join((*BACKBONES, 'gfcf'))}"),
            (any(d < 1 for _, d in self.models), "dims must be >= 1"),
            (self.clients < 0, "clients must be >= 0 (0: one user per client)"),
            (self.upload_rank < 0 or self.finetune_steps < 0 or self.layers < 0,
             "upload_rank, finetune_steps and layers must be >= 0"),
            (any(b == "gfcf" for b, _ in self.models) and len(self.models) > 1,
             "GF-CF cannot be mixed with parameter models in one run"),
        )

    def partition(self, n_users: int, seed: int) -> Partition:
        return clients_of(n_users, self.clients, self.grouping, seed)

    def sides(self) -> tuple[type, type]:
        """The client and server sides of this method's round in a deployment
        (`fedrec.rounds.sides`)."""
        from fedrec.federated.cia.sides import CIAClient, CIAServer

        return CIAClient, CIAServer

    def flower_refusal(self, secure: bool) -> str | None:
        if self.clients == 1:
            return "one client has nothing to federate"
        if secure:
            return "secure aggregation sums item tables only; FedCIA sums similarities or whole models"
        return None

    def check_run(self, cfg: Any) -> None:
        """Refuse, in one line, the engine options FedCIA's round does not take (the simulator's
        and a malicious Flower node's)."""
        if cfg.clients_per_round != 1.0:
            raise FedrecError("FedCIA runs train every client every round (--clients-per-round 1)")
        if cfg.ldp > 0 and (self.aggregation == "none" or self.clients == 1):
            # one client, or models that never meet: nothing travels for the noise to protect
            raise FedrecError("--ldp noises uploads, and this run uploads nothing "
                              f"({'aggregation none' if self.aggregation == 'none' else 'one client holds every user'})")
        if cfg.dp_noise > 0 or cfg.clip is not None:
            raise FedrecError("FedCIA's uploads take Laplace LDP (--ldp) only")
        if cfg.pad_items:
            raise FedrecError("FedCIA takes no --pad-items: a client uploads every item's similarities")
        if (cfg.attack is not None or cfg.defence is not None) and (self.aggregation == "none" or self.clients == 1):
            raise FedrecError("--attack and --defence need a server that mixes the clients' uploads, and this run "
                              "has none (" + ("aggregation none" if self.aggregation == "none" else
                                              "one client holds every user") + ")")
        if cfg.attack is not None and cfg.attack not in SIMILARITY_ATTACKS:
            raise FedrecError(f"FedCIA's malicious clients craft similarity rows at a row budget: --attack "
                              f"{', '.join(SIMILARITY_ATTACKS)}")

    def algorithm(self, split: Split, cfg: Any, seed: int) -> CIAAlgorithm:
        """The federated algorithm the round driver trains."""
        self.check_run(cfg)
        from fedrec.federated.cia.algorithm import CIAAlgorithm
        from fedrec.federated.cia.state import CIAState

        state = CIAState(self, split.train, split.sampler, self.partition(split.n_users, seed), seed)
        return CIAAlgorithm(state, cfg, seed)
