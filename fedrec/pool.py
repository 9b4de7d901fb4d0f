"""Runs kept by file, run side by side in worker processes (`fedrec bench`, `fedrec reproduce`).

A job is a `RunConfig` and the path its results JSON is written to (atomically, at the end). A
worker runs one job at a time with one PyTorch thread: on a shared machine two processes of
several threads each collapse (`fedrec.threads`), while N one-thread processes on N cores run
at nearly full speed each. Workers are spawned, not forked, so none inherits the parent's torch
state. Each worker reports every round (epoch) it ends through a queue, so that a run of hours
shows where it is (`fedrec.progress.RoundNote`), not only when it ends.
"""

from __future__ import annotations

import queue as queues
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from fedrec.progress import OnRoundNote, noting

#: how often the parent looks for round notes while it waits for jobs to end (seconds)
POLL_SECONDS = 0.25


def _run_job(job: int, cfg: Any, path: str, checkpoint_every: int, notes: Any) -> None:
    """Worker: one run, one thread; its checkpoint (if any) removed once the result is written."""
    from fedrec import threads
    from fedrec.experiment import run_resumable

    threads.apply(1)
    on_round = None if notes is None else noting(job, cfg, notes.put)
    run_resumable(cfg, path, checkpoint_every, on_round=on_round)


def run_files(jobs: Sequence[tuple[Any, str | Path]], workers: int, checkpoint_every: int = 0,
              on_round: OnRoundNote | None = None) -> Iterator[tuple[int, str | None]]:
    """Run every ``(config, results path)`` job on up to ``workers`` processes; yield each job's
    index as it finishes, with ``None`` or, for a job that failed, its reason (first line). One
    failed job does not end the others. ``on_round`` is called in this process with each
    job's `RoundNote`s, in order, all before the job is yielded."""
    import multiprocessing

    if not jobs:
        return
    context = multiprocessing.get_context("spawn")
    with context.Manager() if on_round is not None else nullcontext() as manager:
        # a manager's queue: a worker's put has reached it when the put returns, so every note
        # of a job is there before the job is seen to end
        notes = manager.Queue() if manager is not None else None

        def drain() -> None:
            while notes is not None and on_round is not None:
                try:
                    on_round(notes.get_nowait())
                except queues.Empty:
                    return

        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=context) as pool:
            futures = {pool.submit(_run_job, i, cfg, str(path), checkpoint_every, notes): i
                       for i, (cfg, path) in enumerate(jobs)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    try:
                        future.result()
                        yield futures[future], None
                    except Exception as e:  # reported to the caller, which keeps going
                        yield futures[future], (str(e).splitlines() or [type(e).__name__])[0]

