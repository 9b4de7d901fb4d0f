"""GPFedRec, GFed-PP and GFed-PP's ablations (Table 3); see `fedrec.federated.graph`.

Model options go through ``--set`` (``--set public_ratio=0.5 --set alpha=0.3``). Learning
rates follow the official GPFedRec code, which GFed-PP's paper builds on: MLP 0.1, user vector
0.1 x 79 = 7.9, item rows 0.1 x n_items x 80 (13,456 on ML-100K), batch 256, 4 negatives, one
local epoch, all clients every round.
"""

from __future__ import annotations

from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.errors import FedrecError
from fedrec.federated.graph import GraphSpec
from fedrec.protocols.protocol import Split

GPFEDREC_OPTIONS = ("reg", "similarity", "threshold", "mp_layers", "user_lr_scale")
GFEDPP_OPTIONS = ("public_ratio", "alpha", "gcn_layers", "user_lr_scale")


def _graph(method: str, options: tuple[str, ...], **fixed: Any):  # type: ignore[no-untyped-def]
    def build(split: Split, opts: dict[str, Any]) -> GraphSpec:
        clash = sorted(k for k in fixed if k in opts and opts[k] != fixed[k])
        if clash:
            raise FedrecError(f"this variant fixes {', '.join(f'{k}={fixed[k]}' for k in clash)}")
        chosen: dict[str, Any] = {k: opts[k] for k in options if k in opts}
        for k in ("threshold", "reg", "public_ratio", "alpha", "user_lr_scale"):
            if k in chosen:
                chosen[k] = float(chosen[k])
        for k in ("mp_layers", "gcn_layers"):
            if k in chosen:
                chosen[k] = int(chosen[k])
        return GraphSpec(method=method, dim=int(opts["dim"]), **chosen, **fixed)

    return build


register(AlgorithmSpec(
    "gpfedrec", "federated",
    "GPFedRec: user graph from the cosine similarity of uploaded item tables; personalised tables "
    "regularise local training (--set similarity=legacy-distance: the official code's graph)",
    _graph("gpfedrec", GPFEDREC_OPTIONS),
    {"dim": 32, "lr": 0.1, "reg": 1.0, "similarity": "cosine", "threshold": 1.0, "mp_layers": 1},
))
GFEDPP_DEFAULTS: dict[str, Any] = {"dim": 32, "lr": 0.1, "public_ratio": 1.0, "alpha": 0.5, "gcn_layers": 1}
VARIANTS = {
    "gfedpp": ("GFed-PP: public users' interactions build a user graph; public users start from "
               "alpha s_i + (1-alpha) q_g, private users from q_g", "none"),
    "gfedpp-no-iei": ("GFed-PP w/o IEI: clients keep their own item tables (no server initialisation)", "iei"),
    "gfedpp-no-ugc": ("GFed-PP w/o UGC: no user graph (S = Q)", "ugc"),
    "gfedpp-no-upie": ("GFed-PP w/o U-PIE: public users start from q_g too", "upie"),
}
for _name, (_text, _ablation) in VARIANTS.items():
    register(AlgorithmSpec(_name, "federated", _text, _graph("gfedpp", GFEDPP_OPTIONS, ablation=_ablation),
                           dict(GFEDPP_DEFAULTS)))
