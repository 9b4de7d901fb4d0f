"""GPFedRec, GFed-PP and GFed-PP's ablations (Table 3); see `fedrec.federated.graph.state`.

Model options go through ``--set`` (``--set public_ratio=0.5 --set alpha=0.3``). Learning
rates follow the official GPFedRec code, which GFed-PP's paper builds on: MLP 0.1, user vector
0.1 x 79 = 7.9, item rows 0.1 x n_items x 80 (13,456 on ML-100K), batch 256, 4 negatives, one
local epoch, all clients every round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.graph.spec import GraphSpec
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class GraphOptions(Options):
    #: embedding size of the user vector and the item rows
    dim: int = 32
    #: learning rate of the private user vector as a multiple of --lr
    user_lr_scale: float = 79.0

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))


@dataclass(frozen=True)
class GPFedRecOptions(GraphOptions):
    """``reg``: weight of the MSE pull to the personalised table; ``similarity``, ``threshold``
    and ``mp_layers`` shape the user graph."""

    #: weight of the MSE pull of the local item table towards the personalised one
    reg: float = 1.0
    #: user graph from cosine similarity, or legacy-distance (the official code's cosine distance)
    similarity: str = "cosine"
    #: neighbours are users more similar than threshold x the mean similarity
    threshold: float = 1.0
    #: message-passing steps over the user graph that make the personalised tables
    mp_layers: int = 1


@dataclass(frozen=True)
class GFedPPOptions(GraphOptions):
    """``public_ratio`` of users who share their interactions; ``alpha`` mixes the graph's
    table into a public user's start; ``ablation`` (set by the variants) turns a part off."""

    #: share of users, drawn by seed, who share their interactions with the server
    public_ratio: float = 1.0
    #: weight of the graph's table in a public user's start (alpha s_i + (1 - alpha) q_g)
    alpha: float = 0.5
    #: graph-convolution steps over the user graph of public users' co-interactions
    gcn_layers: int = 1
    #: the part a variant turns off: none, iei, ugc or upie
    ablation: str = "none"


def _graph(method: str):  # type: ignore[no-untyped-def]
    def build(split: Split, o: GraphOptions) -> GraphSpec:
        return GraphSpec(method=method, **asdict(o))

    return build


ENGINE: dict[str, object] = {"lr": 0.1}

register(AlgorithmSpec(
    "gpfedrec", "federated",
    "GPFedRec: user graph from the cosine similarity of uploaded item tables; personalised tables "
    "regularise local training (--set similarity=legacy-distance: the official code's graph)",
    _graph("gpfedrec"), GPFedRecOptions, dict(ENGINE), flower=True,
))

VARIANTS = {
    "gfedpp": ("GFed-PP: public users' interactions build a user graph; public users start from "
               "alpha s_i + (1-alpha) q_g, private users from q_g", "none"),
    "gfedpp-no-iei": ("GFed-PP w/o IEI: clients keep their own item tables (no server initialisation)", "iei"),
    "gfedpp-no-ugc": ("GFed-PP w/o UGC: no user graph (S = Q)", "ugc"),
    "gfedpp-no-upie": ("GFed-PP w/o U-PIE: public users start from q_g too", "upie"),
}
for _name, (_text, _ablation) in VARIANTS.items():
    register(AlgorithmSpec(_name, "federated", _text, _graph("gfedpp"), GFedPPOptions, dict(ENGINE),
                           {"ablation": _ablation}, flower=True))
