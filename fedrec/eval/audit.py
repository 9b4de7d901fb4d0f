"""The negative-frequency oracle: a scorer that learns nothing and reads the sampler's leak.

It ranks each candidate by how rarely it was drawn as the user's training negative over many
rounds. Under a leak-free policy every candidate is treated alike by the sampler, so the oracle
scores at chance (HR@10 = 0.10 with 100 candidates); under ``legacy-exclude-heldout`` the
held-out target is never drawn while the evaluation negatives are, and the oracle approaches a
perfect score — the effect behind published near-perfect figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrec.eval.evaluate import evaluate
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class OracleResult:
    """Oracle test metrics after each checkpoint round under one negative policy."""

    negatives: str
    rounds: tuple[int, ...]
    metrics: tuple[dict[str, float], ...]


def negative_frequency_oracle(
    split: Split,
    rounds: int = 100,
    negatives_per_positive: int = 4,
    seed: int = 0,
    checkpoints: tuple[int, ...] = (),
) -> OracleResult:
    """Draw training negatives for ``rounds`` rounds and score test candidates by -count."""
    rng = np.random.default_rng(seed)
    users, _, _ = split.train_pairs()
    n_items = split.n_items
    counts = np.zeros(split.n_users * n_items, dtype=np.int32)
    marks = sorted(set(checkpoints) | {rounds})
    results = []

    def scorer(u: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        table = counts.reshape(split.n_users, n_items)
        return -(table[u] if items is None else table[u[:, None], items]).astype(np.float64)

    for r in range(1, rounds + 1):
        drawn = split.sample_negatives(users, negatives_per_positive, rng)
        keys = (users[:, None] * n_items + drawn).ravel()
        counts += np.bincount(keys, minlength=counts.size).astype(np.int32)
        if r in marks:
            results.append(evaluate(scorer, split.test, split.protocol))
    return OracleResult(split.negatives, tuple(marks), tuple(results))
