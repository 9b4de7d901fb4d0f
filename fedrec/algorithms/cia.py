"""FedCIA and the models it federates; see `fedrec.federated.cia.state`.

Model options (``--set KEY=VALUE``): ``backbone`` (mf, mlp, lightgcn, gfcf, or ``mixed`` for
thirds of MF, MLP and LightGCN), ``dims`` (several sizes, e.g. ``128/256/512``: thirds of the
clients each), ``aggregation`` (cia, waa, none), ``clients`` (100; 0 = one user per client),
``grouping`` (contiguous, as the official split, or random), ``layers`` (LightGCN, 3),
``finetune_steps`` (100), ``finetune_lr`` (0.1), ``finetune_loss`` (norm, mse),
``upload_rank`` (0 = dense), ``scope`` (all: the M x M similarity; local: only the items a
client has), and for GF-CF ``beta`` (60), ``ideal_weight`` (0.3),
``filter_rank`` (32), the official ML-100K values.

Training: BPR with one leak-free negative per positive (four for LightGCN), Adam lr 0.03, batch 4096, one local
epoch, early stopping after 10 rounds without a better validation F1@10, as the official code
(which uses Adam 0.1 with 512 dimensions; see docs/fedcia.md for what we chose and why).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.errors import FedrecError
from fedrec.federated.cia.spec import CIASpec
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class CIAOptions(CIASpec, Options):
    """`CIASpec`'s options and three of its own that `for_split` compiles into its ``models``;
    ``dims`` empty means ``dim`` for every client."""

    #: embedding size of every client's model
    dim: int = 64
    #: the clients' model: mf, mlp, lightgcn, gfcf, or mixed (thirds of mf, mlp and lightgcn)
    backbone: str = "mf"
    #: several embedding sizes (e.g. 128/256/512), one per share of the clients; empty: dim
    dims: tuple[int, ...] = ()

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"),
              (self.backbone == "mixed" and len(self.dims) > 1,
               "give either backbone=mixed or several dims, not both"))

    def for_split(self, split: Split | None) -> CIASpec:
        """The spec for ``split``: every (backbone, dim) pair the clients take in turn."""
        if split is not None and split.protocol.ranking == "rating":
            raise FedrecError("FedCIA's models rank items; use a ranking protocol (ratio-full)")
        backbones = ["mf", "mlp", "lightgcn"] if self.backbone == "mixed" else [self.backbone]
        return replace(self, models=tuple((b, d) for b in backbones for d in (self.dims or (self.dim,))))


@dataclass(frozen=True)
class StackedOptions(CIAOptions):
    """Grouped clients with a model each and, unless told, no aggregation."""

    #: cia (average item similarities), waa (average parameters) or none (independent models)
    aggregation: str = "none"


ENGINE: dict[str, Any] = {"lr": 0.03, "batch_size": 4096, "negatives": 1, "patience": 10,
                          "rounds": 200}
#: LightGCN clients train with 4 negatives per positive: chosen on validation F1@10 (ML-100K,
#: 100 clients; 1 negative: FedLightGCN 0.0775, FedCIA-LightGCN 0.0824, alone 0.0625; 4: 0.1025,
#: 0.1054, 0.0644), see docs/fedcia.md.
LIGHTGCN_ENGINE: dict[str, Any] = {"negatives": 4}


#: the item-family engine options FedCIA's whole-model clients do not read
IGNORES = ("lr_item", "item_lr_scale", "item_std", "encoding", "memory_budget_mb", "dp_clip", "aggregation")


def _register(name: str, text: str, fixed: dict[str, Any], engine: dict[str, Any] | None = None,
              options: type[CIAOptions] = CIAOptions) -> None:
    register(AlgorithmSpec(name, "federated", text, None, options,
                           {**ENGINE, **(engine or {})}, fixed, flower=fixed.get("clients") != 1,
                           ignores=IGNORES, reads=("attacker_norm",)))


_register("fedcia", "FedCIA: clients upload item similarities E Eᵀ (or GF-CF filters); the server "
          "averages them; each client fine-tunes its own item table towards the mean "
          "(--set backbone=mf|mlp|lightgcn|gfcf|mixed, dims=128/256/512, upload_rank=L)",
          {"aggregation": "cia"})
_register("fedcia-mf", "FedCIA with MF clients", {"aggregation": "cia", "backbone": "mf"})
_register("fedcia-lightgcn", "FedCIA with LightGCN clients", {"aggregation": "cia", "backbone": "lightgcn"},
          engine=LIGHTGCN_ENGINE)
_register("fedcia-gfcf", "FedCIA with parameter-free GF-CF clients: r_u F_k + beta r_u mean(F)",
          {"aggregation": "cia", "backbone": "gfcf"}, engine={"rounds": 1})
_register("fedlightgcn", "FedLightGCN: LightGCN clients, FedAvg of item tables by training size",
          {"aggregation": "waa", "backbone": "lightgcn"}, engine=LIGHTGCN_ENGINE)
_register("stacked", "grouped clients each with a whole model of their own and a chosen "
          "aggregation (--set aggregation=none|waa|cia): FedCIA's Table 3 and its "
          "no-aggregation columns; clients=1 is the centralised model", {}, options=StackedOptions)
_register("lightgcn", "LightGCN on all training data (one client, no aggregation)",
          {"aggregation": "none", "backbone": "lightgcn", "clients": 1}, engine=LIGHTGCN_ENGINE)
_register("gfcf", "GF-CF on all training data: the parameter-free graph filter (one client)",
          {"aggregation": "none", "backbone": "gfcf", "clients": 1}, engine={"rounds": 1})
