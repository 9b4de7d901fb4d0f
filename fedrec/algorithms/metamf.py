"""MetaMF (Lin et al., SIGIR 2020); see `fedrec.federated.metamf`.

On ranking protocols it trains on implicit feedback (BCE, sampled negatives); on rating
protocols (``given-rating``: MetaMF's own Ciao split) it fits the observed ratings by squared
error, as its paper does.

Model options (``--set KEY=VALUE``): ``factors`` (width of the shared item table V, 8),
``memory`` (128) and ``hidden`` (512), the official code's sizes; ``--dim`` is the user
embedding and generated item vector (32); ``clip``, each client's gradient norm per step (0:
off; the official code clips at 5).

Learning rates: lr 0.3 for the user embedding, memory and hypernetwork, item rows at
0.3 x 30,000, and a 128 MB memory budget, chosen on validation HR@10 of ML-100K; the sweeps
behind them are in docs/learning-rates.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.family.spec import loss_for
from fedrec.federated.metamf import MetaMFSpec
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class MetaMFOptions(MetaMFSpec, Options):
    """`MetaMFSpec`'s options, which are its spec: ``dim`` (user embedding and generated item
    vector); ``factors``, ``memory``, ``hidden`` (the official code's sizes); ``clip`` (each
    client's gradient norm per step, 0: off). The split decides the loss (`for_split`)."""

    #: size of the private user embedding and of the generated item vectors
    dim: int = 32

    def validate(self) -> None:
        check((min(self.dim, self.factors, self.memory, self.hidden) < 1, "MetaMF's sizes must be >= 1"))

    def for_split(self, split: Split | None) -> MetaMFSpec:
        return replace(self, loss="bce" if split is None else loss_for(split))


ENGINE: dict[str, Any] = {"lr": 0.3, "item_lr_scale": 30000.0, "memory_budget_mb": 128.0}
#: under rating protocols (squared error on the ratings, no negatives): chosen on ML-100K's
#: ratio-rating validation RMSE (docs/learning-rates.md, "Ratings"); its score, generated per
#: user, takes no rating baseline
RATING_ENGINE: dict[str, Any] = {"lr": 0.01, "item_lr_scale": 1000.0, "item_std": 0.1, "negatives": 0,
                                 "aggregation": "clients", "rating_baseline": "none"}


register(AlgorithmSpec(
    "metamf", "federated",
    "MetaMF: private user embedding; memory and hypernetwork generating each user's item "
    "table and score MLP averaged; item table V (n_items x 8) averaged",
    None, MetaMFOptions, ENGINE, flower=True, rankings=("sampled", "full", "rating"),
    rating_engine=RATING_ENGINE,
))
