"""Model selection on validation only, shared by the centralised loop and the federated engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedrec.results import RoundRecord


def lower_is_better(metric: str) -> bool:
    return metric.startswith("rmse") or metric.startswith("mae")


@dataclass
class TrainOutcome:
    """History of a run and its test figures at the round with the best validation figure."""

    history: list[RoundRecord] = field(default_factory=list)
    best_round: int = 0
    valid_at_best: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: rounds after which the run was continued from a checkpoint (empty: one uninterrupted run)
    resumed_at: list[int] = field(default_factory=list)
    #: training seconds of the earlier processes of a resumed run
    earlier_seconds: float = 0.0


class Selection:
    """Keeps the best validation round of ``outcome`` and counts evaluations since it.

    `observe` returns True when a round improves on the best (the caller then keeps its model
    or scores the test set); test figures never take part in the choice.
    """

    def __init__(self, metric: str, patience: int, outcome: TrainOutcome) -> None:
        self.metric = metric
        self.patience = patience
        self.outcome = outcome
        self.sign = -1.0 if lower_is_better(metric) else 1.0
        self.best = self.sign * outcome.valid_at_best[metric] if outcome.valid_at_best else -np.inf
        evaluated = [h.round for h in outcome.history if metric in h.valid]
        self.stale = sum(1 for r in evaluated if r > outcome.best_round)

    def observe(self, round_: int, valid: dict[str, float]) -> bool:
        value = self.sign * valid[self.metric]
        if value > self.best:
            self.best, self.stale = value, 0
            self.outcome.best_round, self.outcome.valid_at_best = round_, dict(valid)
            return True
        self.stale += 1
        return False

    @property
    def should_stop(self) -> bool:
        return bool(self.patience) and self.stale >= self.patience
