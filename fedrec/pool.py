"""Runs kept by file, run side by side in worker processes (`fedrec bench`, `fedrec reproduce`).

A job is a `RunConfig` and the path its results JSON is written to (atomically, at the end). A
worker runs one job at a time with one PyTorch thread: on a shared machine two processes of
several threads each collapse (`fedrec.threads`), while N one-thread processes on N cores run
at nearly full speed each. Workers are spawned, not forked, so none inherits the parent's torch
state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any


def _run_job(cfg: Any, path: str, checkpoint_every: int) -> None:
    """Worker: one run, one thread; its checkpoint (if any) removed once the result is written."""
    from fedrec import threads
    from fedrec.experiment import run_resumable

    threads.apply(1)
    run_resumable(cfg, path, checkpoint_every)


def run_files(jobs: Sequence[tuple[Any, str | Path]], workers: int,
              checkpoint_every: int = 0) -> Iterator[tuple[int, str | None]]:
    """Run every ``(config, results path)`` job on up to ``workers`` processes; yield each job's
    index as it finishes, with ``None`` or, for a job that failed, its reason (first line). One
    failed job does not end the others."""
    import multiprocessing

    if not jobs:
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=context) as pool:
        futures = {pool.submit(_run_job, cfg, str(path), checkpoint_every): i for i, (cfg, path) in enumerate(jobs)}
        for future in as_completed(futures):
            try:
                future.result()
                yield futures[future], None
            except Exception as e:  # reported to the caller, which keeps going
                yield futures[future], (str(e).splitlines() or [type(e).__name__])[0]
