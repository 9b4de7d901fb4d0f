"""Runs kept by file, run side by side in worker processes (`fedrec bench`, `fedrec reproduce`).

A job is a `RunConfig` and the path its results JSON is written to (atomically, at the end). A
worker runs one job at a time with one PyTorch thread: on a shared machine two processes of
several threads each collapse (`fedrec.threads`), while N one-thread processes on N cores run
at nearly full speed each. Workers are spawned, not forked, so none inherits the parent's torch
state. Each worker reports every round (epoch) it ends through a queue, so that a run of hours
shows where it is (`fedrec.progress.RoundNote`), not only when it ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from fedrec.progress import OnRoundNote, noting

#: how often the parent looks for round notes while it waits for jobs to end (seconds)
POLL_SECONDS = 0.25
#: how often a worker checks that the process that started it is still there (seconds)
PARENT_CHECK_SECONDS = 1.0
_notes: Any = None  # a worker's end of its parent's note queue (`_start_worker`)


def _start_worker(notes: Any, parent: int, setup: Callable[..., None] | None = None,
                  setup_args: tuple[Any, ...] = ()) -> None:
    """Set up a worker process: where its runs' notes go, its end with ``parent``, and what its
    jobs share (``setup(*setup_args)``, e.g. a tuning search's split, sent once per worker)."""
    global _notes
    _notes = notes
    _exit_with(parent)
    if setup is not None:
        setup(*setup_args)


def round_notes(job: int, cfg: Any) -> Callable[..., None] | None:
    """In a worker: the ``on_round`` callback that sends job ``job``'s rounds to the parent's
    ``on_round`` (None where the parent asked for none)."""
    return None if _notes is None else noting(job, cfg, _notes.put)


def _exit_with(parent: int) -> None:
    """End this worker soon after ``parent`` has gone. A parent killed alone (``kill PID``, not
    its process group as Ctrl-C does) leaves its workers orphaned, and each would train its run
    to the end, hours later, and write a result nobody waits for, beside the runs a restarted
    parent starts on the same files."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="fedrec-parent-watch", daemon=True).start()


def _run_job(job: int, cfg: Any, path: str, checkpoint_every: int) -> None:
    """Worker: one run, one thread; its checkpoint (if any) removed once the result is written."""
    from fedrec import threads
    from fedrec.experiment import run_resumable

    threads.apply(1)
    run_resumable(cfg, path, checkpoint_every, on_round=round_notes(job, cfg))


class WorkerPool:
    """Up to ``workers`` spawned processes of one PyTorch thread each (their jobs call
    `fedrec.threads.apply`), whose jobs' round notes reach ``on_round`` in this process through
    `drain`. As a context manager it ends its running jobs at once when the block is left by an
    exception (`_stop`), and waits for them otherwise."""

    def __init__(self, workers: int, on_round: OnRoundNote | None = None,
                 setup: Callable[..., None] | None = None, setup_args: tuple[Any, ...] = ()) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        # a SimpleQueue writes to its pipe as put() is called (a Queue would hand the note to a
        # feeder thread), so a job's notes are all in the pipe before its result is sent
        self.notes = context.SimpleQueue() if on_round is not None else None
        self.on_round = on_round
        self.executor = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context,
                                            initializer=_start_worker,
                                            initargs=(self.notes, os.getpid(), setup, setup_args))

    def drain(self) -> None:
        """Hand the round notes the workers have sent so far to ``on_round``."""
        while self.notes is not None and self.on_round is not None and not self.notes.empty():
            self.on_round(self.notes.get())

    def wait(self, futures: set[Future[Any]]) -> tuple[set[Future[Any]], set[Future[Any]]]:
        """Wait for the first of ``futures`` to end (or a poll's time), passing notes on."""
        done, pending = wait(futures, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
        self.drain()
        return done, pending

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is None:
            self.executor.shutdown(wait=True)
        else:
            _stop(self.executor)


def run_files(jobs: Sequence[tuple[Any, str | Path]], workers: int, checkpoint_every: int = 0,
              on_round: OnRoundNote | None = None) -> Iterator[tuple[int, str | None]]:
    """Run every ``(config, results path)`` job on up to ``workers`` processes; yield each job's
    index as it finishes, with ``None`` or, for a job that failed, its reason (first line). One
    failed job does not end the others. ``on_round`` is called in this process with each
    job's `RoundNote`s, in order, all before the job is yielded."""
    if not jobs:
        return
    # left early (GeneratorExit at a yield, a caller's exception), the pool ends its running jobs
    with WorkerPool(min(workers, len(jobs)), on_round) as pool:
        futures = {pool.executor.submit(_run_job, i, cfg, str(path), checkpoint_every): i
                   for i, (cfg, path) in enumerate(jobs)}
        pending = set(futures)
        while pending:
            done, pending = pool.wait(pending)
            for future in done:
                try:
                    future.result()
                    yield futures[future], None
                except Exception as e:  # reported to the caller, which keeps going
                    yield futures[future], (str(e).splitlines() or [type(e).__name__])[0]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Left early (an exception in a callback, Ctrl-C, a caller that stops reading): end the
    running runs now rather than waiting hours for them (their checkpoints let them go on
    later), and drop the queued ones. Waiting would also hang for good once nobody drains the
    notes: a worker blocks on a full pipe. ProcessPoolExecutor has no public way to end its
    workers before Python 3.14 (``terminate_workers``), hence its process table."""
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
