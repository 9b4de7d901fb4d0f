"""PersonalFR and its baselines on the rating autoencoder; see `fedrec.federated.ae.state`.

Model options (``--set KEY=VALUE``): ``clients`` (100; 0 = one user per client), ``grouping``
(random, as the paper; or contiguous), ``hidden`` (``256/128``: encoder [n, 256, 128], decoder
[128, 256, n]), ``dropout`` (0.5), ``norm`` (GroupNorm + tanh, true), ``compression`` (send only
the rows of a client's items), ``optimizer`` (adam, sgd), ``momentum`` (0.9), ``nesterov``,
``weight_decay`` (default 5e-4 with SGD, 0 with Adam), ``clip`` (per-client gradient norm, 0).

Engine defaults (Table II and the official code): 800 rounds, a tenth of the clients a round,
5 local epochs, batches of 10 users, Adam 1e-3, no early stopping (the best validation round is
kept). The Joint model: one client, every user, batches of 500, one epoch a round. For one user
per client the paper uses SGD 0.1 with momentum 0.9 and weight decay 5e-4: ``--set
optimizer=sgd --lr 0.1`` (what `fedrec reproduce personalfr` runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.ae.spec import AESpec
from fedrec.options import Options


@dataclass(frozen=True)
class AEOptions(AESpec, Options):
    """`AESpec`'s fields, typed and checked by its own validation; ``share`` is set by each
    algorithm. The options are the run's model description."""


ENGINE: dict[str, Any] = {"lr": 1e-3, "rounds": 800, "clients_per_round": 0.1, "local_epochs": 5,
                          "batch_size": 10, "patience": 0}


def _register(name: str, text: str, fixed: dict[str, Any], engine: dict[str, Any] | None = None) -> None:
    register(AlgorithmSpec(name, "federated", text, None, AEOptions, {**ENGINE, **(engine or {})},
                           fixed, rankings=("rating", "rated"), flower=fixed.get("clients") != 1,
                           ignores=("negatives", "lr_item", "item_lr_scale", "item_std", "encoding",
                                    "memory_budget_mb", "dp_clip", "aggregation")))


_register("personalfr", "PersonalFR: rating autoencoder, private encoder per client, decoder "
          "averaged; only the rows of a client's items travel (partial compression)",
          {"share": "decoder"})
_register("fedavg-ae", "FedAvg of the whole rating autoencoder (PersonalFR's baseline; the whole "
          "model travels)", {"share": "all", "compression": False})
_register("ae", "the rating autoencoder trained on all users at once (PersonalFR's 'Joint')",
          {"share": "all", "clients": 1},
          engine={"clients_per_round": 1.0, "local_epochs": 1, "batch_size": 500})
