"""What a run tells whoever watches it, round by round: `RoundNote`, small enough to cross a
process boundary (`fedrec.pool`'s workers send one per round), and the text a progress bar or a
log line shows of it (`fedrec.cli.run_progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RoundNote:
    """Round ``round`` of ``total`` of job ``job`` has ended (``unit``: ``round`` for a federated
    run, ``epoch`` for a centralised one): its loss and, on the metric that selects the model
    (``metric``), this round's validation figure (nan in a round that was not evaluated) and the
    best so far, at ``best_round``."""

    job: int
    round: int
    total: int
    loss: float
    metric: str = ""
    value: float = math.nan
    best: float = math.nan
    best_round: int = 0
    unit: str = "round"


OnRoundNote = Callable[[RoundNote], None]


def total_rounds(cfg: Any) -> int:
    """The rounds (federated) or epochs (centralised) ``cfg`` trains for."""
    return int(cfg.trainer.rounds)


def noting(job: int, cfg: Any, note: OnRoundNote) -> Callable[..., None]:
    """An ``on_round`` callback of `fedrec.experiment.run` for ``cfg`` that hands each round on
    to ``note`` as a `RoundNote`."""
    from fedrec.protocols.protocol import PROTOCOLS

    total = total_rounds(cfg)
    unit = "round" if cfg.trainer_field == "federated" else "epoch"
    metric = PROTOCOLS[cfg.protocol].select if cfg.protocol in PROTOCOLS else ""

    def on_round(record: Any, best_round: int, best_valid: dict[str, float]) -> None:
        note(RoundNote(job, int(record.round), total, float(record.loss), metric,
                       float(record.valid.get(metric, math.nan)), float(best_valid.get(metric, math.nan)),
                       int(best_round), unit))

    return on_round
