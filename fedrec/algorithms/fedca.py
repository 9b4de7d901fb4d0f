"""FedCA (composite aggregation) on its two backbones; see `fedrec.federated.ca.state`.

Model options (``--set KEY=VALUE``): ``dim`` (16), ``aggregation`` (composite; fedavg: the
FedAvg mean of the aggregated clients), ``complementarity`` (0.3), ``similarity`` (0.3),
``aggregated`` (1.0 of a round's clients; the official code's 0.1), ``interpolation`` (0.5 of
its own model a client keeps; the official 0.9), ``principal`` (4 directions), ``layers``
(16/8, ncf) and ``weight_decay`` (1e-3, ncf).

Engine defaults (the official code's): Adam 1e-2, 10 local epochs, batches of 256, 4
negatives a positive, every client every round, 100 rounds; on the FCF backbone item rows start
N(0, 0.1²) (``--item-std``; the official nn.Embedding's 1 on the ncf backbone) and every round
of the budget runs (``--patience 0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.ca.spec import CASpec
from fedrec.options import Options


@dataclass(frozen=True)
class CAOptions(CASpec, Options):
    """`CASpec`'s fields, typed and checked by its own validation: the options are the spec."""


ENGINE: dict[str, Any] = {"lr": 1e-2, "rounds": 100, "local_epochs": 10, "batch_size": 256,
                          "negatives": 4, "clients_per_round": 1.0}
#: the FCF backbone's item rows start N(0, 0.1²), not nn.Embedding's N(0, 1): a row a client
#: has not trained keeps its start until the mixtures bring it others' steps, and at std 1 that
#: start outweighs them on sparse data (Lastfm-2K stays at chance; docs/fedca.md). From that
#: start the validation figure peaks early, dips for tens of rounds and then passes the peak
#: (ML-100K: 0.2229 at round 10, below it until round 40, 0.2486 at 83), so every round of
#: the budget runs (patience 0) and the best on validation is kept
FCF_ENGINE: dict[str, Any] = {**ENGINE, "item_std": 0.1, "patience": 0}
#: engine options of the item-embedding family's server that FedCA's whole-model clients do not read
IGNORES = ("lr_item", "item_lr_scale", "encoding", "memory_budget_mb", "dp_clip", "pad_items", "aggregation")


def _register(name: str, text: str, fixed: dict[str, Any], engine: dict[str, Any]) -> None:
    register(AlgorithmSpec(name, "federated", text, None, CAOptions, engine, fixed, ignores=IGNORES,
                           reads=("attacker_norm",), flower=True))


_register("fedca", "FedCA: each client keeps its whole model (FCF: sigmoid <u, q>); a share of "
          "each round's clients is aggregated, each with its own weights from model similarity "
          "and data complementarity (--set aggregation=fedavg for the plain mean)", {"backbone": "fcf"},
          FCF_ENGINE)
_register("fedca-avg", "FedCA's ablation without similarity or complementarity: each aggregated "
          "client takes the FedAvg mean of the aggregated clients' models", {"aggregation": "fedavg"},
          FCF_ENGINE)
_register("fedca-ncf", "FedCA on the FedNCF backbone (an MLP over the user vector and the item row, aggregated with the "
          "item table)", {"backbone": "ncf"}, ENGINE)
