"""The one engine: every run, centralised or federated, goes through one round driver.

The data path, in the order the code runs it::

    Split ──> Algorithm (contract.py) ──> driver.run_rounds ──> TrainOutcome ──> RunResult
               │                           │  per round: plan (plan.py: sampled clients and
               │                           │  the server's generators) → begin_round →
               │                           │  local_update → Uploads → aggregate → record →
               │                           │  validate / select / test at the best round →
               │                           │  checkpoint (checkpoint.py) → early stop
               └ server state and client state are declared apart (what a Flower node keeps)

`contract.Trainable` is what the driver needs of anything it trains (a centralised model
trains one "round" per epoch); `contract.FederatedAlgorithm` spells a federated round out as
the steps of docs/engine.md and is what every federated method implements.
"""

from fedrec.core.contract import FederatedAlgorithm, RoundPlan, Trainable, Uploads
from fedrec.core.driver import run_rounds

__all__ = ["FederatedAlgorithm", "RoundPlan", "Trainable", "Uploads", "run_rounds"]
