"""The options of GPFedRec and GFed-PP (see `fedrec.federated.graph.state` for the methods)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.sparse as sp

from fedrec.federated.family.spec import FamilySpec
from fedrec.options import check, internal

if TYPE_CHECKING:
    from fedrec.federated.graph.state import GraphState

METHODS = ("gpfedrec", "gfedpp")
SIMILARITIES = ("cosine", "legacy-distance")
ABLATIONS = ("none", "iei", "ugc", "upie")


@dataclass(frozen=True)
class GraphSpec:
    """A GPFedRec or GFed-PP configuration (see the module docstring); each method's options
    (`fedrec.algorithms.graph`) are this class with the other method's fields `internal`."""

    method: str = internal("gfedpp")
    #: embedding size of the user vector and the item rows
    dim: int = 32
    layers: tuple[int, ...] = internal((32, 16, 8))
    #: learning rate of the private user vector as a multiple of --lr
    user_lr_scale: float = 79.0
    # GPFedRec's
    #: weight of the MSE pull of the local item table towards the personalised one
    reg: float = 1.0
    #: user graph from cosine similarity, or legacy-distance (the official code's cosine distance)
    similarity: str = "cosine"
    #: neighbours are users more similar than threshold x the mean similarity
    threshold: float = 1.0
    #: message-passing steps over the user graph that make the personalised tables
    mp_layers: int = 1
    # GFed-PP's
    #: share of users, drawn by seed, who share their interactions with the server
    public_ratio: float = 1.0
    #: weight of the graph's table in a public user's start (alpha s_i + (1 - alpha) q_g)
    alpha: float = 0.5
    #: graph-convolution steps over the user graph of public users' co-interactions
    gcn_layers: int = 1
    #: the part a variant turns off: none, iei, ugc or upie
    ablation: str = "none"
    #: under --attack, malicious clients declare themselves public and share forged
    #: interactions (a bandwagon profile with the targets), so they join the user graph
    public_attackers: bool = False

    def __post_init__(self) -> None:
        check(
            (self.method not in METHODS, f"unknown graph method '{self.method}'; known: {', '.join(METHODS)}"),
            (self.similarity not in SIMILARITIES, f"similarity must be one of {', '.join(SIMILARITIES)}"),
            (self.ablation not in ABLATIONS, f"ablation must be one of {', '.join(ABLATIONS)}"),
            (not (0.0 <= self.public_ratio <= 1.0), "public_ratio must be in [0, 1]"),
            (not (0.0 <= self.alpha <= 1.0), "alpha must be in [0, 1]"),
            (not (1 <= self.gcn_layers <= 4 and self.mp_layers >= 1), "gcn_layers must be in 1..4, mp_layers >= 1"),
            (not (self.reg >= 0 and self.user_lr_scale > 0), "reg must be >= 0 and user_lr_scale > 0"),
        )

    @property
    def family(self) -> FamilySpec:
        """The local model: private user vector and MLP score function (the item family's ``mlp``)."""
        return FamilySpec(score="mlp", private_score=True, dual=False, dim=self.dim, layers=self.layers)

    @property
    def bytes_per_sample(self) -> int:
        return self.family.bytes_per_sample

    @property
    def bytes_per_client(self) -> int:
        return self.family.bytes_per_client

    @property
    def gpfedrec(self) -> bool:
        return self.method == "gpfedrec"

    def algorithm(self, split: Any, cfg: Any, seed: int):  # type: ignore[no-untyped-def]
        """The federated algorithm the round driver trains (`fedrec.federated.family.algorithm`)."""
        from fedrec.federated.family.algorithm import CohortAlgorithm

        return CohortAlgorithm(self, split, cfg, seed)

    def create_state(self, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                     item_std: float, seed: int, train: sp.csr_matrix | None = None,
                     client_ids: np.ndarray | None = None, n_total: int | None = None) -> GraphState:
        """The state of every client (simulator, server), or of ``client_ids`` out of
        ``n_total`` (a Flower node: no graph, its clients' public flags)."""
        from fedrec.federated.graph.state import GraphState

        return GraphState.create_graph(self, n_clients, n_items, lr=lr, lr_item=lr_item,
                                       item_std=item_std, seed=seed, train=train,
                                       client_ids=client_ids, n_total=n_total)

    def sides(self) -> tuple[type, type]:
        """The client and server sides of this method's round in a deployment
        (`fedrec.federated.graph.sides`)."""
        from fedrec.federated.graph.sides import GraphClient, GraphServer

        return GraphClient, GraphServer

    #: why its server reads each client's upload, which a secure sum would hide: `--secagg` is
    #: refused, on Flower and by the privacy audit
    needs_each_upload: ClassVar[str] = "the graph step needs each client's table, not a secure sum"

    def flower_refusal(self, secure: bool) -> str | None:
        return self.needs_each_upload if secure else None
