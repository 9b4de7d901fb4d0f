"""FedPerGNN: one graph-attention hop over each user's local graph, expanded with neighbouring
users through a third party; see `fedrec.federated.pergnn.state`.

Model options (``--set KEY=VALUE``): ``dim`` (32), ``neighbours`` (20 neighbouring users a
client), ``user_std`` (0.1, the user vectors' start), ``warmup`` (0: rounds before the first
expansion), ``expansion`` (``every-round``, the default: neighbours redrawn each round a
client takes part; ``once``: drawn once after the warm-up and kept, the paper's Algorithm 1),
``layer_clip`` (none: an L2 bound on each client's graph-layer step) and ``entry_clip`` (none:
a bound on every entry of every step sent, the paper's δ).

Engine defaults: one gradient a client a round (no local epochs), 4 negatives a positive, every
client every round, each item row averaged over the clients that sent it, row steps held to L2
norm 0.5. Under rating protocols it fits the observed ratings by squared error, no negatives,
beneath fedrec's rating baseline, with item rows at 100 and row steps held to L2 norm 1.

Its paper's privacy, as near as it runs here (docs/fedpergnn.md: bounds and noise on steps, not
gradients): ``--ldp 0.2 --clip 0.57 --set entry_clip=0.1 --clients-per-round 128``, which runs
under the papers' item-row rule (the round's clients, which the engine's LDP needs) at the
rates chosen for that rule (``--paper``, and what LDP, a defence or an attack switch to:
``PAPERS_RULE``), and 1,000 pseudo items through ``fedrec audit-privacy --pad-items 1000`` (the
engine takes ``--pad-items`` and ``--ldp`` one at a time). The paper's own rate (SGD at 0.01,
one gradient a round) does not train in a budget fedrec runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.pergnn.spec import GNNSpec
from fedrec.options import Options


@dataclass(frozen=True)
class GNNOptions(GNNSpec, Options):
    """`GNNSpec`'s fields, typed and checked by its own validation: the options are the spec."""


#: set on ML-100K's validation split (docs/fedpergnn.md): the layer and user vectors at 1, the item
#: rows at 300 with each row's step held to L2 norm 0.5 (without the bound, rates that move the
#: rows in a few hundred one-gradient rounds diverge), each row averaged over its senders
ENGINE: dict[str, Any] = {"lr": 1.0, "lr_item": 300.0, "clip": 0.5, "rounds": 300, "negatives": 4,
                          "clients_per_round": 1.0, "item_std": 0.1, "aggregation": "contributors"}
#: under rating protocols (squared error on the observed ratings, no negatives), over ``ENGINE``
#: and fedrec's rating defaults (the rating baseline, cold items at the user's mean): set on
#: ML-100K's ratio-rating validation RMSE (docs/fedpergnn.md, "Ratings")
RATING_ENGINE: dict[str, Any] = {"negatives": 0, "lr_item": 100.0, "clip": 1.0}
#: the papers' item-row rule (each row's summed steps over the round's clients), which LDP, the
#: robust defences and the attacks are calibrated for (`fedrec.experiment.federated_config`
#: switches to it for them), at the rates chosen for it on ML-100K's validation split
#: (docs/fedpergnn.md): the paper's own SGD at 0.01 does not train in a budget fedrec runs
PAPERS_RULE: dict[str, Any] = {"aggregation": "clients", "lr": 0.3, "lr_item": 3000.0}
#: engine options its one-gradient clients do not read
IGNORES = ("local_epochs", "batch_size", "item_lr_scale", "encoding", "memory_budget_mb", "dp_clip", "dp_noise",
           "server_opt", "client_objective")

register(AlgorithmSpec(
    "fedpergnn", "federated",
    "FedPerGNN: a graph-attention hop over each user's items and neighbouring users (found through a "
    "third party), one gradient a client a round; pseudo items and LDP as the engine's --pad-items and --ldp",
    None, GNNOptions, ENGINE, ignores=IGNORES, paper=PAPERS_RULE, rankings=("sampled", "full", "rating"),
    rating_engine=RATING_ENGINE, flower=True,
    transfers=True,  # for ranking: no tuned setting beat its defaults on test (docs/defaults.md); not for ratings
))
