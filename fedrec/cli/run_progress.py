"""Progress of runs that go on side by side (`fedrec reproduce`, `fedrec bench`): one bar per run
in progress, at the round it has reached, beside the bar of the whole batch.

A run of hours (GPFedRec on Lastfm-2K) otherwise shows nothing until it ends. Without a terminal
(a log file under nohup or CI) each run writes a line at its first and last round, every tenth
of its rounds and at least every 30 seconds; `fedrec run` logs its one run by the same rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from fedrec.progress import RoundNote

LOG_SECONDS = 30.0


def batch_progress(console: Console | None, disable: bool = False) -> Progress:
    """The bars: a description, the bar, done of total, a status text and the time spent."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                    console=console, disable=disable)


def status(note: RoundNote) -> str:
    """``loss 0.41  valid ndcg@10 0.3012  best 0.3107 @ 40`` (the validation part once evaluated)."""
    text = f"loss {note.loss:.4f}"
    if note.metric and not math.isnan(note.best):
        now = "" if math.isnan(note.value) else f" {note.value:.4f}"
        text += f"  valid {note.metric}{now}  best {note.best:.4f} @ {note.best_round}"
    return text


class RunBars:
    """One bar per run in progress, keyed by whatever names the run (a planned run and seed, a
    grid cell); ``log`` (with no terminal) receives the lines instead, prefixed by the label
    when it has one."""

    def __init__(self, progress: Progress, log: Callable[[str], None] | None = None,
                 log_seconds: float = LOG_SECONDS) -> None:
        self.progress, self.log, self.log_seconds = progress, log, log_seconds
        self.tasks: dict[Hashable, TaskID] = {}
        self.logged: dict[Hashable, float] = {}

    def note(self, key: Hashable, label: str, note: RoundNote) -> None:
        """Run ``key`` (shown as ``label``) has ended round ``note.round``."""
        text = status(note)
        if self.log is not None:
            now = time.monotonic()
            every = math.ceil(note.total / 10)
            if (note.round in (1, note.total) or note.round % every == 0
                    or now - self.logged.get(key, now) >= self.log_seconds):
                where = f"{note.unit} {note.round}/{note.total}"
                self.log(f"{label}: {where}  {text}" if label else f"{where}  {text}")
                self.logged[key] = now
            self.logged.setdefault(key, now)
            return
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"  {label}", total=note.total, status="")
        self.progress.update(self.tasks[key], completed=note.round, status=text)

    def end(self, key: Hashable) -> None:
        """Run ``key`` has ended (or failed): its bar goes."""
        self.logged.pop(key, None)
        task = self.tasks.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)

    def end_all(self) -> None:
        """Every run has ended (runs one after another: the next one starts)."""
        for key in list(self.tasks):
            self.end(key)
