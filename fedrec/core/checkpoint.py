"""The one checkpoint format, and the one check that a resumed run is the run that wrote it.

A checkpoint holds the round it was written after, the algorithm's server and client state
(kept apart, `fedrec.core.contract.Trainable.state_dict`), the history and selection so far,
and the run's *fingerprint*: every option that shapes the figures (the algorithm and its
options, the data set and its preprocessing, the protocol, the seed, the engine options).
Resuming compares the fingerprint key by key and refuses any difference, so a checkpoint can
never be continued under another run's label. Only options that say how long to go on and
when to stop or save are free (`FREE`). A run always evaluates its last round, so a run resumed
past its old last round keeps that round's evaluation: with ``--eval-every`` > 1 it has one
evaluation more than an uninterrupted run (the same figures at every round both evaluated).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from fedrec import tensorfile
from fedrec.core.contract import Trainable
from fedrec.core.selection import TrainOutcome
from fedrec.errors import FedrecError
from fedrec.results import RoundRecord

#: the layout of a checkpoint's tree (`fedrec.tensorfile`); 2 was the last pickled one
FORMAT = 3
KIND = "checkpoint"
#: what to do with a checkpoint an older fedrec pickled
LEGACY = ("Drop --resume (or remove it) to train afresh, or, if you trust where it came from, "
          "convert it once: fedrec convert FILE")
#: options that may change on resume: how long to go on, and when to stop, evaluate or save
FREE = frozenset({"rounds", "epochs", "patience", "checkpoint_every", "data_dir",
                  "memory_budget_mb"})  # figures do not depend on the chunk size (tested)
#: the fingerprint's entry for the sha256 of the file the run's data were read from
#: (`fedrec.experiment.fingerprint`); a checkpoint written before it held one is not compared on it
DATA_SHA256 = "data_sha256"
#: the fingerprint's entry for the content digest of the events the run read
#: (`Interactions.content_digest`); where both sides hold it, it is compared instead of the file's
#: sha256, so that a copy of the data in another format resumes
DATA_CONTENT = "data_content"


def flatten(blob: Any, prefix: str = "", free: frozenset[str] = FREE) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``, leaving out ``free`` keys at any depth."""
    if not isinstance(blob, dict):
        return {prefix: blob}
    out: dict[str, Any] = {}
    for k, v in blob.items():
        if k in free:
            continue
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k), free))
    return out


def save(path: Path, r: int, algorithm: Trainable, out: TrainOutcome, fingerprint: dict[str, Any],
         best_state: dict[str, Any] | None = None, seconds: float = 0.0) -> None:
    """Write the run after round ``r`` atomically (a unique temporary file renamed into place);
    ``seconds``: its training time so far, over every process that worked on it."""
    blob = {
        "round": r, "fingerprint": fingerprint, "state": algorithm.state_dict(),
        "best_state": best_state, "history": [asdict(h) for h in out.history],
        "best_round": out.best_round, "valid_at_best": out.valid_at_best, "test": out.test,
        "extra": out.extra, "seconds": seconds, "resumed_at": out.resumed_at,
    }
    tensorfile.save(path, blob, KIND, FORMAT)


def peek(path: Path) -> dict[str, Any]:
    """A checkpoint's round and history (a list of `RoundRecord` fields), without loading its
    state into anything: a Flower server tells its nodes which round's client state to restore
    before it builds its role, and a resumed tuning trial re-reports its rounds to the pruner."""
    blob = read(path)
    return {"round": int(blob["round"]), "history": list(blob["history"])}


def read(path: Path, device: str | torch.device | None = None) -> dict[str, Any]:
    """A checkpoint's whole tree (`save`), its tensors on ``device``; one line for a file
    that is not a checkpoint of this fedrec, a damaged one or an older fedrec's pickle."""
    blob = tensorfile.load(path, KIND, FORMAT, what="checkpoint", device=device, legacy=LEGACY)
    problem = tensorfile.entries_mismatch(SHAPE, blob)
    if problem is None:
        problem = _history_problem(blob["history"])
    if problem is None and (blob["round"] < 0 or any(not isinstance(r, int) for r in blob["resumed_at"])):
        problem = "a negative round or a resumed round that is not a number"
    if problem is not None:
        raise FedrecError(f"{path}: not a fedrec checkpoint ({problem}); remove it or drop --resume")
    return blob


#: the kind of each entry `save` writes (`tensorfile.mismatch` compares a file with it)
SHAPE: dict[str, Any] = {"round": 0, "fingerprint": {}, "state": {}, "history": [], "best_round": 0,
                         "valid_at_best": {}, "test": {}, "extra": {}, "seconds": 0.0, "resumed_at": []}


def _history_problem(history: list[Any]) -> str | None:
    """Why ``history`` cannot be read as `RoundRecord` s, or None."""
    for h in history:
        try:
            RoundRecord(**h)
        except TypeError as e:
            return f"history: {e}"
    return None


def peek_round(path: Path) -> int:
    """The round a checkpoint was written after (`peek`)."""
    return int(peek(path)["round"])


def load_state(algorithm: Trainable, state: Any, refusal: str, advice: str = "") -> None:
    """Load ``state`` (read from a file) into ``algorithm`` once it has the kind of state the
    algorithm builds itself (`tensorfile.mismatch`); else one `FedrecError`, ``refusal (why)advice``."""
    problem = tensorfile.mismatch(algorithm.state_dict(), state, "state")
    if problem is None:
        try:
            algorithm.load_state_dict(state)
            return
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            problem = f"{type(e).__name__}: {str(e)[:120]}"
    raise FedrecError(f"{refusal} ({problem}){advice}")


def load(path: Path, algorithm: Trainable, out: TrainOutcome, fingerprint: dict[str, Any],
         rounds: int) -> tuple[int, dict[str, Any] | None]:
    """Continue from ``path``: check it, load the state into ``algorithm`` and the history into
    ``out``; returns the round it was written after and the state at the best round (if kept)."""
    # read onto the run's device (`fedrec.core.device.on`), whichever device wrote it, so that a
    # checkpoint of another device is refused below by its fingerprint's `device`, not by the read
    blob = read(path, torch.get_default_device())
    mine, theirs = flatten(fingerprint), flatten(blob["fingerprint"])
    if DATA_CONTENT in mine and DATA_CONTENT in theirs:  # the same events, whichever file held them
        mine.pop(DATA_SHA256, None), theirs.pop(DATA_SHA256, None)
    else:  # written before checkpoints held the events' digest: the file's sha256, where it has one
        mine.pop(DATA_CONTENT, None), theirs.pop(DATA_CONTENT, None)
        if DATA_SHA256 not in theirs:  # written before checkpoints held their data's sha256
            mine.pop(DATA_SHA256, None)
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if changed:
        shown = ", ".join(f"{k} (checkpoint {theirs.get(k)!r}, now {mine.get(k)!r})" for k in changed[:4])
        raise FedrecError(f"{path}: checkpoint was written with other options: {shown}; resume "
                          "with the same options, or remove it")
    if blob["round"] > rounds:
        raise FedrecError(f"{path}: checkpoint is at round {blob['round']}, past the {rounds} "
                          "rounds asked for; ask for at least as many rounds")
    if blob.get("best_state") is not None and (problem := tensorfile.mismatch(
            algorithm.state_dict(), blob["best_state"], "best_state")):
        raise FedrecError(f"{path}: its best state does not fit this run ({problem}); remove it or drop --resume")
    load_state(algorithm, blob["state"], f"{path}: its state does not fit this run", "; remove it or drop --resume")
    out.history = [RoundRecord(**h) for h in blob["history"]]
    out.best_round, out.valid_at_best, out.test = blob["best_round"], blob["valid_at_best"], blob["test"]
    out.extra = blob["extra"]
    out.resumed_at = [*blob["resumed_at"], int(blob["round"])]
    out.earlier_seconds = float(blob["seconds"])
    return int(blob["round"]), blob.get("best_state")
