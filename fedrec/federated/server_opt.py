"""How the server applies a round's aggregate: the server-optimiser hook of Reddi et al.,
"Adaptive Federated Optimization" (ICLR 2021), Algorithm 2.

The clients' uploads are averaged into a mean model; a server optimiser turns the pseudo-
gradient (mean - current) into the server's step. `ServerOptimizer` is FedAvg: the new server
state is the mean itself. FedAvgM and FedAdam (`fedrec.algorithms.fedavgm`,
`fedrec.algorithms.fedadam`) override `update`; any item-family spec returns its optimiser from
``server_optimizer()``.
"""

from __future__ import annotations

from typing import Any

import torch


class ServerOptimizer:
    """FedAvg: the server takes the mean of the accepted clients' models."""

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The new value of server tensor ``name`` given its ``current`` value and the round's
        ``mean`` of the clients' values."""
        return mean

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        """Restore the optimiser's buffers (none for FedAvg)."""
