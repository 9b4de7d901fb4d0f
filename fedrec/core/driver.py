"""The one round driver: train → validate → select → test at the best round → checkpoint → stop.

Every run goes through `run_rounds`: the federated simulator (a `FederatedAlgorithm`, whose
round is plan → local update → uploads → aggregate) and the centralised trainer (one epoch a
round). Validation decides everything; the test set is scored only when validation improves,
with the state of that round, so the reported test figure is the one at the best validation
round and never chooses anything.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec import tensorfile
from fedrec.core import checkpoint as ckpt
from fedrec.core.contract import Trainable
from fedrec.core.selection import Selection, TrainOutcome
from fedrec.errors import Diverged, FedrecError
from fedrec.eval.metrics import NaNScores
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord

OnRound = Callable[[RoundRecord, int, dict[str, float]], None]


def run_rounds(
    algorithm: Trainable,
    split: Split | None,
    *,
    select: str | None = None,
    rounds: int,
    eval_every: int = 1,
    patience: int = 0,
    on_round: OnRound | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    fingerprint: dict[str, Any] | None = None,
    keep_best: bool = False,
    backoffs: int = 0,
) -> TrainOutcome:
    """Train ``algorithm`` for rounds ``1..rounds`` (at most its ``max_rounds``), or continue
    its checkpoint.

    ``keep_best``: leave ``algorithm`` in its state at the best validation round (a copy is
    kept at every improvement), as a trained model handed to a user must be; otherwise it ends
    in its last round's state. ``fingerprint``: the options that shape the figures, stored in
    checkpoints and compared on resume (`fedrec.core.checkpoint`). ``split`` is None where the
    trainer holds no data (a Flower server: its nodes evaluate); ``select`` then names the
    metric that selects the best round. ``backoffs``: on divergence (a loss or scores that are
    not finite, or a loss that explodes, `EXPLODING`), go back to the state of a best validation
    round (copied at most every `SNAPSHOT_EVERY` rounds; the initial state before one, and when
    the round diverges again; a large state is kept in a file, `BackoffStates`), halve the learning rates
    (`Trainable.scale_rates`) and train the round again, up to that many times in the run; each
    back-off is in the round's record (``extra["backoffs"]``, ``extra["rate_scale"]``) and the
    run's (``extra["backoffs"]``: the rounds, which a resumed run reads to take its rates back
    down). 0, or a trainer that cannot scale its rates, stops at the first divergence.
    """
    rounds = min(rounds, algorithm.max_rounds or rounds)
    began = time.perf_counter()
    out = TrainOutcome()
    first = 1
    best_state: dict[str, Any] | None = None
    path = Path(checkpoint) if checkpoint else None
    fingerprint = fingerprint or {}
    scale = 1.0
    if resume and path is not None and path.exists():
        last, best_state = ckpt.load(path, algorithm, out, fingerprint, rounds)
        first = last + 1
        halvings = len(out.extra.get("backoffs", []))
        if halvings and algorithm.scale_rates(0.5 ** halvings):  # the rates it had backed off to
            scale = 0.5 ** halvings
        if keep_best and best_state is None and out.best_round:
            raise FedrecError(f"{path}: the checkpoint holds no copy of the model of its best round "
                              f"({out.best_round}; it was written without keeping one, e.g. without "
                              "--save); resume without --save, or start again with it")
    selection = Selection(select or split.protocol.select, patience, out)
    if selection.should_stop:  # the checkpointed run had already stopped early
        first = rounds + 1
    groups = algorithm.user_groups()
    # the state a back-off goes back to: a best validation round's, copied at most every
    # `SNAPSHOT_EVERY` rounds (a round before a divergence can already be far off while finite),
    # the initial state before any
    # (on a resume, the best round's copy where the checkpoint kept one, else the state resumed);
    # a round that diverges again from there goes back to the first state (a run whose first
    # rounds exploded while finite has no good state since)
    # (one copy until the first snapshot: both names hold it, and a back-off loads a copy of it)
    kept = BackoffStates(path)
    try:
        good = initial = kept.keep(best_state or algorithm.state_dict(), "initial") if backoffs else None
        best_state = _rounds(algorithm, split, first=first, rounds=rounds, eval_every=eval_every,
                             selection=selection, out=out, groups=groups, on_round=on_round, path=path,
                             checkpoint_every=checkpoint_every, fingerprint=fingerprint, keep_best=keep_best,
                             backoffs=backoffs, began=began, scale=scale, kept=kept, good=good, initial=initial,
                             best_state=best_state)
    finally:
        kept.remove()
    out.extra = {**algorithm.run_extra(), **out.extra}
    if keep_best and best_state is not None:
        algorithm.load_state_dict(best_state)
    return out


def _rounds(algorithm: Trainable, split: Split | None, *, first: int, rounds: int, eval_every: int,
            selection: Selection, out: TrainOutcome, groups: Any, on_round: OnRound | None, path: Path | None,
            checkpoint_every: int, fingerprint: dict[str, Any], keep_best: bool, backoffs: int, began: float,
            scale: float, kept: BackoffStates, good: Kept | None, initial: Kept | None,
            best_state: dict[str, Any] | None) -> dict[str, Any] | None:
    """`run_rounds`' rounds ``first..rounds``; the state of the best round where ``keep_best``."""
    good_round = first - 1
    lowest = math.inf  # the lowest training loss so far: a back-off also catches a loss that explodes
    for r in range(first, rounds + 1):
        start = time.perf_counter()
        again = 0
        while True:
            try:
                record = _train_and_evaluate(algorithm, split, r, rounds, eval_every, selection, out, groups,
                                             lowest if backoffs else math.inf)
                break
            except Diverged as e:
                if good is None or len(out.extra.get("backoffs", [])) >= backoffs or not algorithm.scale_rates(0.5):
                    e.outcome = out  # the rounds before ``r``: the caller records a diverged run with them
                    raise
                algorithm.load_state_dict(kept.restore(good if not again else initial))
                scale, again = scale * 0.5, again + 1
                out.extra.setdefault("backoffs", []).append(r)
        if again:
            record.extra.update(backoffs=float(again), rate_scale=scale)
        lowest = min(lowest, record.loss)
        # each copy replaces one no longer needed: that one is let go first, so a state is held at
        # most live, initial, back-off and best (a large one's initial and back-off copies in
        # files: `BackoffStates`), and a round whose state is both the back-off's and the best
        # round's copies it once
        refresh = good is not None and out.best_round == r and r - good_round >= SNAPSHOT_EVERY
        if keep_best and out.best_round == r:
            best_state = None
        if refresh:
            kept.drop(good, initial)  # (``initial`` keeps the first state when ``good`` held it)
            good = None
            good, good_round = kept.keep(algorithm.state_dict(), "good"), r
        if keep_best and out.best_round == r:
            shared = refresh and good is not None and good.state is not None
            best_state = good.state if shared else copy.deepcopy(algorithm.state_dict())
        record.seconds = time.perf_counter() - start
        out.history.append(record)
        if on_round is not None:
            on_round(record, out.best_round, out.valid_at_best)
        if path is not None and checkpoint_every and r % checkpoint_every == 0:
            ckpt.save(path, r, algorithm, out, fingerprint, best_state,
                      seconds=out.earlier_seconds + time.perf_counter() - began)
        if selection.should_stop:
            break
    return best_state


#: a state whose tensors (all on the CPU) hold more bytes than this is kept for a back-off in a
#: file, not as a copy in memory: it is read back only when a round diverges (FedDAE's state on
#: ML-100K is 2.9 GB: its run peaked at 10.5 GB with two such copies in memory, 4.9 GB without)
SPILL_BYTES = 1 << 28


@dataclass
class Kept:
    """A state a back-off can go back to: a copy in memory (``state``), or a file (``file``)."""

    state: dict[str, Any] | None = None
    file: Path | None = None


class BackoffStates:
    """Where a run keeps the states a back-off returns to (`SPILL_BYTES`): a large one in a file
    of a folder of the run's own (``.CHECKPOINT.backoff-PID-*`` beside its checkpoint, else
    ``fedrec-backoff-PID-*`` in the temporary folder), removed when the run ends or stops with
    an error; the folders a killed process left there (its process gone) are removed by the
    next run that keeps a state beside them. The file is the checkpoint's tensor format
    (`fedrec.tensorfile`). A state the file cannot hold, or a disk that refuses it, is copied in
    memory instead, as before."""

    def __init__(self, checkpoint: Path | None) -> None:
        self.checkpoint = checkpoint
        self.folder: Path | None = None
        self.warned = False

    def keep(self, state: dict[str, Any], role: str) -> Kept:
        """A copy of ``state`` as it is now (``role``: ``initial`` or ``good``, its file's name)."""
        if not _spills(state):
            return Kept(state=copy.deepcopy(state))
        try:
            file = self._folder() / role
            tensorfile.save(file, state, BACKOFF_KIND, 1)
        except (TypeError, ValueError, OSError, FedrecError) as e:
            if not self.warned:
                self.warned = True
                warnings.warn(f"a back-off state is kept in memory, not in a file ({type(e).__name__}: "
                              f"{str(e)[:120]})", stacklevel=2)
            return Kept(state=copy.deepcopy(state))
        return Kept(file=file)

    def restore(self, kept: Kept) -> dict[str, Any]:
        """A fresh copy of the state ``kept`` holds, for the algorithm to load."""
        if kept.file is None:
            return copy.deepcopy(kept.state)
        return tensorfile.load(kept.file, BACKOFF_KIND, 1, what="back-off state")

    def drop(self, kept: Kept | None, initial: Kept | None) -> None:
        """Let ``kept`` go (its file too), unless it is ``initial``, which the run keeps."""
        if kept is not None and kept is not initial and kept.file is not None:
            kept.file.unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the run's folder (the run has ended, or stopped with an error)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _folder(self) -> Path:
        """The run's own folder, made at its first file, once the folders of gone processes
        beside it are removed."""
        if self.folder is None:
            where = self.checkpoint.parent if self.checkpoint is not None else Path(tempfile.gettempdir())
            stem = f".{self.checkpoint.name}.backoff-" if self.checkpoint is not None else "fedrec-backoff-"
            where.mkdir(parents=True, exist_ok=True)
            for old in where.glob(".*.backoff-*" if self.checkpoint is not None else "fedrec-backoff-*"):
                pid = re.search(r"\.?backoff-(\d+)-", old.name)
                if old.is_dir() and pid is not None and not _alive(int(pid.group(1))):
                    shutil.rmtree(old, ignore_errors=True)
            self.folder = Path(tempfile.mkdtemp(prefix=f"{stem}{os.getpid()}-", dir=where))
        return self.folder


#: the kind of a back-off state's file (`fedrec.tensorfile`): not a checkpoint, so not resumed
BACKOFF_KIND = "backoff-state"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _spills(state: Any) -> bool:
    """Whether ``state`` is kept in a file: its tensors and arrays hold over `SPILL_BYTES`, and
    every tensor is on the CPU (a file reads back onto one device)."""
    size, cpu = 0, True

    def walk(x: Any) -> None:
        nonlocal size, cpu
        if isinstance(x, torch.Tensor):
            size += x.numel() * x.element_size()
            cpu = cpu and x.device.type == "cpu"
        elif isinstance(x, np.ndarray):
            size += x.nbytes
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(state)
    return cpu and size > SPILL_BYTES


#: the state a back-off returns to is copied at a best validation round at most this often: a
#: copy at every improvement took a third of a PFedRec round on ML-100K (its clients' post-tuned
#: rows included); so a back-off returns to a best round at most this many rounds before the best
SNAPSHOT_EVERY = 5
#: a round's loss this many times the lowest so far (and above 1) has exploded: with back-offs on,
#: it is a divergence too, before it turns non-finite (a healthy run's loss falls from its first
#: round, and a BCE loss at chance is 0.69)
EXPLODING = 1000.0


def _train_and_evaluate(algorithm: Trainable, split: Split | None, r: int, rounds: int, eval_every: int,
                        selection: Selection, out: TrainOutcome, groups: dict[str, Any],
                        lowest: float = math.inf) -> RoundRecord:
    """Round ``r``: train, then validate and (when validation improves) test. A loss or scores
    that are not finite raise `Diverged`, with ``out`` as the rounds before left it: a round
    whose test scores turn NaN after its validation improved does not become the best one. So
    does a loss `EXPLODING` times ``lowest`` (the lowest of the rounds before, given where a
    back-off can follow)."""
    record = algorithm.train_round(r)
    if not math.isfinite(record.loss):
        raise Diverged(f"training diverged in round {r} (the loss is not finite); "
                       f"{algorithm.divergence_hint}", r)
    if math.isfinite(lowest) and record.loss > EXPLODING * max(lowest, 1.0):
        raise Diverged(f"training diverged in round {r} (its loss {record.loss:.3g} is over {EXPLODING:g} times "
                       f"the lowest before, {lowest:.3g}); {algorithm.divergence_hint}", r)
    if r % eval_every == 0 or r == rounds:
        evaluating = time.perf_counter()
        before = (out.best_round, out.valid_at_best, out.test, dict(out.extra), selection.best, selection.stale)
        try:
            record.valid = algorithm.evaluate("valid", split)
            if record.valid and selection.observe(r, record.valid):
                out.test = algorithm.evaluate("test", split)
                if groups:
                    out.extra["test_groups"] = {name: algorithm.evaluate("test", split, mask)
                                                for name, mask in groups.items() if mask.any()}
        except NaNScores:
            out.best_round, out.valid_at_best, out.test, out.extra, selection.best, selection.stale = before
            raise Diverged(f"training diverged in round {r} (its scores are NaN, its loss finite); "
                           f"{algorithm.divergence_hint}", r) from None
        record.extra["eval_seconds"] = time.perf_counter() - evaluating
    return record
