"""FedCIA and the models it federates; see `fedrec.federated.cia`.

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

from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.errors import FedrecError
from fedrec.federated.cia import CIASpec
from fedrec.protocols.protocol import Split

OPTIONS = ("aggregation", "clients", "grouping", "layers", "finetune_steps", "finetune_lr",
           "finetune_loss", "upload_rank", "scope", "beta", "ideal_weight", "filter_rank")
ENGINE: dict[str, Any] = {"lr": 0.03, "batch_size": 4096, "negatives": 1, "patience": 10,
                          "rounds": 200}
#: LightGCN clients train with 4 negatives per positive: chosen on validation F1@10 (ML-100K,
#: 100 clients; 1 negative: FedLightGCN 0.0775, FedCIA-LightGCN 0.0824, alone 0.0625; 4: 0.1025,
#: 0.1054, 0.0644), see docs/fedcia.md.
LIGHTGCN_ENGINE: dict[str, Any] = {"negatives": 4}


def _models(backbone: str, dim: int, dims: Any) -> tuple[tuple[str, int], ...]:
    sizes = [int(x) for x in str(dims).replace(",", "/").split("/")] if dims not in (None, "") else [dim]
    backbones = ["mf", "mlp", "lightgcn"] if backbone == "mixed" else [backbone]
    if len(backbones) > 1 and len(sizes) > 1:
        raise FedrecError("give either backbone=mixed or several dims, not both")
    return tuple((b, d) for b in backbones for d in sizes)


def _build(fixed: dict[str, Any]):  # type: ignore[no-untyped-def]
    def build(split: Split, opts: dict[str, Any]) -> CIASpec:
        if opts.get("dual"):
            raise FedrecError("FedCIA models have no --dual variant")
        if split.protocol.ranking == "rating":
            raise FedrecError("FedCIA's models rank items; use a ranking protocol (ratio-full)")
        clash = sorted(k for k in fixed if k in opts and opts[k] != fixed[k])
        if clash:
            raise FedrecError(f"this algorithm fixes {', '.join(f'{k}={fixed[k]}' for k in clash)}")
        merged = {**opts, **fixed}
        kwargs: dict[str, Any] = {k: merged[k] for k in OPTIONS if k in merged}
        for k in ("clients", "layers", "finetune_steps", "upload_rank", "filter_rank"):
            if k in kwargs:
                kwargs[k] = int(kwargs[k])
        for k in ("finetune_lr", "beta", "ideal_weight"):
            if k in kwargs:
                kwargs[k] = float(kwargs[k])
        models = _models(str(merged.get("backbone", "mf")), int(merged["dim"]), merged.get("dims"))
        return CIASpec(models=models, **kwargs)

    return build


def _register(name: str, text: str, fixed: dict[str, Any], defaults: dict[str, Any] | None = None,
              engine: dict[str, Any] | None = None) -> None:
    register(AlgorithmSpec(name, "federated", text, _build(fixed),
                           {"dim": 64, "backbone": "mf", "clients": 100, **(defaults or {}), **fixed},
                           {**ENGINE, **(engine or {})}))


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
          "no-aggregation columns; clients=1 is the centralised model", {},
          defaults={"aggregation": "none"})
_register("lightgcn", "LightGCN on all training data (one client, no aggregation)",
          {"aggregation": "none", "backbone": "lightgcn", "clients": 1}, engine=LIGHTGCN_ENGINE)
_register("gfcf", "GF-CF on all training data: the parameter-free graph filter (one client)",
          {"aggregation": "none", "backbone": "gfcf", "clients": 1}, engine={"rounds": 1})
