"""User-facing errors: the CLI prints their message (never a traceback) and exits non-zero."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FedrecError(Exception):
    """An error caused by the user's input or environment, with a message that says what and where."""


class DataFormatError(FedrecError):
    """A raw data file that cannot be parsed; names the file and, where known, the 1-based line."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # raised in a worker process (`fedrec.pool`, a grid's cells), it reaches the parent
        # pickled: the default would call __init__ with the message alone, which fails there
        return (type(self), (self.path, self.reason, self.line))


class UnstableSetting(FedrecError):
    """A setting the algorithm can tell would diverge before it trains a round (a step that
    overshoots by construction); `fedrec tune` redraws such a trial instead of spending its
    budget on it."""


class UnknownNameError(FedrecError):
    """An unknown data set, algorithm or protocol name; lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        from difflib import get_close_matches

        self.kind, self.name, self.known = kind, name, list(known)
        close = get_close_matches(str(name).lower(), [k.lower() for k in known], n=3, cutoff=0.6)
        named = {k.lower(): k for k in known}
        hint = f"did you mean {' or '.join(repr(named[c]) for c in close)}? " if close else ""
        super().__init__(f"unknown {kind} '{name}'; {hint}known: {', '.join(sorted(known))}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.name, self.known))  # as DataFormatError's


class Interrupted(FedrecError):
    """A run stopped by SIGINT or SIGTERM; the message says what was saved and how to go on."""

    exit_code = 130


class Diverged(FedrecError):
    """Training whose loss (or scores) stopped being finite in round ``round``.

    A diverged run is a result, not a crash: `fedrec.experiment.train` writes its results file
    (``status: "diverged"``, the rounds before it, the figures selected on validation until
    then) and raises this again with ``result``, the `fedrec.results.RunResult` it wrote, so a
    caller that loops over settings records it and goes on, while one that only knows
    `FedrecError` (a tuning trial, scored as the worst) still sees a failure. ``outcome`` is the
    driver's `TrainOutcome` up to the round before ``round``, set where the driver knew it.
    """

    def __init__(self, message: str, round: int = 0, result: Any = None) -> None:
        super().__init__(message)
        self.round = round
        self.result = result
        self.outcome: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # a worker process's divergence reaches its parent pickled (`fedrec.pool`); the default
        # would rebuild it from the message alone and lose the round and the result
        return (type(self), (str(self), self.round, self.result))
