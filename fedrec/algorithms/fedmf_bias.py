"""FedMF with a private per-user bias: logit = <u, q> + b_u, both u and b_u kept on the client.

A user's bias absorbs how much of the catalogue the user likes at all, so the dot product is
left to rank items (under a rating protocol, to fit each user's own level of ratings). It shows how a score function is added: one `ScoreFunction` (with its
closed-form gradients, so no autograd graph is built) registered under a name, and an
algorithm that uses it; the engine does not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.algorithms.federated import (
    PAPERS_RULE,
    RATING_ENGINE,
    RATING_PAPER,
    FamilyOptions,
    samples,
)
from fedrec.federated.family.scores import Dot, register_score
from fedrec.options import internal


class DotBias(Dot):
    """<u, q> + b_u, the bias starting like ``nn.Linear``'s (U(+-1/sqrt(d)))."""

    name = "dot-bias"

    def user_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {**super().user_shapes(spec), "user_bias": ()}

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return super().logits(spec, p, v) + p["user_bias"][:, None]

    def grad(self, spec: Any, name: str, p: dict[str, torch.Tensor], v: torch.Tensor,
             g: torch.Tensor) -> torch.Tensor:
        return g.sum(1) if name == "user_bias" else super().grad(spec, name, p, v, g)


register_score(DotBias())


@dataclass(frozen=True)
class FedMFBiasOptions(FamilyOptions):
    """FedMF's options; the score takes the private per-user bias."""

    score: str = internal("dot-bias")


register(AlgorithmSpec(
    "fedmf-bias", "federated",
    "FedMF with a private per-user bias (<u, q> + b_u, both on the client)",
    None, FedMFBiasOptions, samples(0.1), flower=True, paper=PAPERS_RULE, transfers=True,
    rankings=("sampled", "full", "rating"),
    rating_engine=RATING_ENGINE, rating_paper=RATING_PAPER,
))
