"""MetaMF (Lin et al., SIGIR 2020) on implicit feedback; see `fedrec.federated.metamf`.

Model options (``--set KEY=VALUE``): ``factors`` (width of the shared item table V, 8),
``memory`` (128) and ``hidden`` (512), the official code's sizes; ``--dim`` is the user
embedding and generated item vector (32).

Learning rates (plain SGD; ``lr`` for the user embedding, memory and hypernetwork, ``lr x
item_lr_scale`` for the rows of V), chosen on validation HR@10 of ML-100K (loo-sampled,
leak-free negatives, seed 0; test figures not looked at):

* with the official code's N(0, 1) users and zero-initialised generated weights, lr 0.1 and
  0.3 diverge in round 1 (item rows at 10 to 1,000), and lr 0.01 and 0.03 stay at chance for
  10 rounds (item rows at 30 to 1,000; 3,000 diverges). `fedrec.federated.metamf` explains the
  initialisation that fixed this;
* with it, 10 rounds (lr x item_lr_scale: HR@10): 0.1 x 1,000: 0.17, 0.1 x 10,000: 0.40,
  0.1 x 100,000: 0.44, 0.03 x 10,000: 0.32, 0.3 x 10,000: 0.44, 0.3 x 30,000: 0.45,
  1.0 x 3,000: 0.44; 0.3 x 100,000 and 1.0 x 10,000 diverge, and 0.5 x 20,000 left a client
  non-finite within 10 rounds. All plateau near 0.44 (popularity) until the user models
  separate, after about 15 rounds;
* best of 40 rounds: 0.3 x 10,000: 0.572, 0.1 x 100,000: 0.558, 0.3 x 30,000: 0.610,
  0.3 x 60,000: 0.616, 0.4 x 30,000: 0.618.

The default is lr 0.3 x 30,000 (item rows at 9,000): as good as its neighbours within noise,
and three times below the item rate that diverges. That rate is ML-100K's: on a smaller
catalogue each row is hit more often a batch (synthetic 150 users x 400 items diverges at 9,000
and learns at 900).

A cohort chunk holds one copy of the shared weights per client (see `MetaMFSpec`), so the
engine's memory budget is 128 MB by default (ML-100K, one thread: 4.3 s a round at 32 MB,
3.2 s at 128 MB, 3.1 s at 512 MB; peak memory grew by 19, 129 and 440 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.metamf import MetaMFSpec
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class MetaMFOptions(Options):
    """``dim``: user embedding and generated item vector; ``factors``, ``memory``, ``hidden``:
    the official code's sizes."""

    dim: int = 32
    factors: int = 8
    memory: int = 128
    hidden: int = 512

    def validate(self) -> None:
        check((min(self.dim, self.factors, self.memory, self.hidden) < 1, "MetaMF's sizes must be >= 1"))


ENGINE: dict[str, Any] = {"lr": 0.3, "item_lr_scale": 30000.0, "memory_budget_mb": 128.0}


def build(split: Split, o: MetaMFOptions) -> MetaMFSpec:
    smallest = 1  # without a split (a Flower server, which never trains) chunks are moot
    if split is not None:
        positives = np.diff(split.train.indptr)
        smallest = int(positives[positives > 0].min()) if (positives > 0).any() else 1
    return MetaMFSpec(dim=o.dim, factors=o.factors, memory=o.memory, hidden=o.hidden,
                      min_client_samples=5 * smallest)


register(AlgorithmSpec(
    "metamf", "federated",
    "MetaMF: private user embedding; memory and hypernetwork generating each user's item "
    "table and score MLP averaged; item table V (n_items x 8) averaged",
    build, MetaMFOptions, ENGINE, flower=True,
))
