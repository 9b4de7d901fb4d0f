"""GPFedRec, GFed-PP and GFed-PP's ablations (Table 3); see `fedrec.federated.graph.state`.

Model options go through ``--set`` (``--set public_ratio=0.5 --set alpha=0.3``). Learning
rates follow the official GPFedRec code, which GFed-PP's paper builds on: MLP 0.1, user vector
0.1 x 79 = 7.9, item rows 0.1 x n_items x 80 (13,456 on ML-100K), batch 256, 4 negatives, one
local epoch, all clients every round.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.graph.spec import GraphSpec
from fedrec.options import Options, check, internal


@dataclass(frozen=True)
class GPFedRecOptions(GraphSpec, Options):
    """GPFedRec: ``reg`` weighs the MSE pull to the personalised table; ``similarity``,
    ``threshold`` and ``mp_layers`` shape the user graph (`GraphSpec`'s fields)."""

    method: str = internal("gpfedrec")
    public_ratio: float = internal(1.0)
    alpha: float = internal(0.5)
    gcn_layers: int = internal(1)
    ablation: str = internal("none")
    public_attackers: bool = internal(False)

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))


@dataclass(frozen=True)
class GFedPPOptions(GraphSpec, Options):
    """GFed-PP: ``public_ratio`` of users who share their interactions; ``alpha`` mixes the
    graph's table into a public user's start; ``ablation`` (set by the variants) turns a part
    off (`GraphSpec`'s fields)."""

    method: str = internal("gfedpp")
    reg: float = internal(1.0)
    similarity: str = internal("cosine")
    threshold: float = internal(1.0)
    mp_layers: int = internal(1)

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))


ENGINE: dict[str, object] = {"lr": 0.1}

register(AlgorithmSpec(
    "gpfedrec", "federated",
    "GPFedRec: user graph from the cosine similarity of uploaded item tables; personalised tables "
    "regularise local training (--set similarity=legacy-distance: the official code's graph)",
    None, GPFedRecOptions, dict(ENGINE), flower=True,
))

VARIANTS = {
    "gfedpp": ("GFed-PP: public users' interactions build a user graph; public users start from "
               "alpha s_i + (1-alpha) q_g, private users from q_g", "none"),
    "gfedpp-no-iei": ("GFed-PP w/o IEI: clients keep their own item tables (no server initialisation)", "iei"),
    "gfedpp-no-ugc": ("GFed-PP w/o UGC: no user graph (S = Q)", "ugc"),
    "gfedpp-no-upie": ("GFed-PP w/o U-PIE: public users start from q_g too", "upie"),
}
for _name, (_text, _ablation) in VARIANTS.items():
    register(AlgorithmSpec(_name, "federated", _text, None, GFedPPOptions, dict(ENGINE),
                           {"ablation": _ablation}, flower=True))
