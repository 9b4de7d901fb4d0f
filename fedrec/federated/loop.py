"""The round loop shared by simulators whose state runs whole rounds itself (FedCIA's client
stacks, the autoencoders of PersonalFR): seed each round, run it, evaluate on validation,
test at the best validation round, checkpoint, stop early.

A state implements ``run_round(r, cfg, rng) -> RoundRecord`` (loss, bytes, extras; the loop
times it), ``scores(users, items)`` (a `fedrec.eval.evaluate.Scorer`), ``state_dict()`` /
``load_state_dict()`` and ``run_extra()`` (what the results' ``extra`` reports).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord
from fedrec.train.selection import Selection, TrainOutcome


def simulate_rounds(spec: Any, state: Any, split: Split, cfg: Any, seed: int, rounds: int,
                    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None,
                    checkpoint: str | Path | None, resume: bool) -> TrainOutcome:
    """Run rounds ``1..rounds`` of ``state`` (or continue a checkpoint); see the module docstring.

    All randomness of round r comes from ``np.random.default_rng([seed, r])``, so a resumed run
    replays what an uninterrupted one would have done.
    """
    from fedrec.federated.engine import _load, _save  # the engine's checkpoint format

    ckpt = Path(checkpoint) if checkpoint else None
    out = TrainOutcome()
    first = 1
    if resume and ckpt is not None and ckpt.exists():
        first = _load(ckpt, state, out, spec, cfg) + 1
    selection = Selection(split.protocol.select, cfg.patience, out)
    for r in range(first, rounds + 1):
        start = time.perf_counter()
        record = state.run_round(r, cfg, np.random.default_rng([seed, r]))
        if not math.isfinite(record.loss):
            raise FedrecError(f"training diverged in round {r} (the loss is not finite); lower --lr")
        if r % cfg.eval_every == 0 or r == rounds:
            record.valid = evaluate(state.scores, split.valid, split.protocol)
            if selection.observe(r, record.valid):
                out.test = evaluate(state.scores, split.test, split.protocol)
        record.seconds = time.perf_counter() - start
        out.history.append(record)
        if on_round is not None:
            on_round(record, out.best_round, out.valid_at_best)
        if ckpt is not None and cfg.checkpoint_every and r % cfg.checkpoint_every == 0:
            _save(ckpt, r, state, out, spec, cfg)
        if selection.should_stop:
            break
    out.extra = {**state.run_extra(), **out.extra}
    return out
