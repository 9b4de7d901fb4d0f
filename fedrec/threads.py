"""How many threads PyTorch computes with: one unless told otherwise.

PyTorch's default (one intra-op thread per core) collapses when another process competes for
a core: its OpenMP threads wait on each other. Measured on the 2-core development machine
(`fedrec run pfedrec --rounds 20`, `fedrec run mf --epochs 10`, ML-100K, median seconds a
round/epoch, identical figures in every case):

=====================  ==============  ===============  ==============
threads                1               2                default (2)
idle: PFedRec / MF     0.209 / 1.135   0.210 / 1.381    0.169 / 0.875
one busy process       0.202 / 0.920   0.618 / 3.260    0.679 / 3.816
=====================  ==============  ===============  ==============

One thread gives up about a fifth on an idle machine and is 3-4x faster beside one other busy
process, so it is the default. ``--threads N`` (or ``OMP_NUM_THREADS``) asks for more; 0 leaves
PyTorch's default.
"""

from __future__ import annotations

import os

from fedrec.errors import FedrecError


def choose(requested: int | None = None) -> int:
    """``requested`` if given (0: PyTorch's default), else ``OMP_NUM_THREADS`` (at most the
    machine's CPUs: a value set for the whole environment), else 1. A request for more threads
    than the machine has CPUs is refused: it cannot be faster, and thousands crash PyTorch's
    thread pool (a segmentation fault, not an error)."""
    cpus = os.cpu_count() or 2**16  # unknown: no limit of ours
    if requested is None:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if not env:
            return 1
        try:
            requested = int(env)
        except ValueError:
            raise FedrecError(f"OMP_NUM_THREADS={env!r} is not a whole number") from None
        if requested < 0:
            raise FedrecError(f"OMP_NUM_THREADS must be >= 0 (got {requested})")
        return min(requested, cpus)
    if requested < 0:
        raise FedrecError(f"--threads must be >= 0 (got {requested}; 0: PyTorch's default)")
    if requested > cpus:
        raise FedrecError(f"--threads {requested} is more than this machine's {cpus} CPUs")
    return requested


def apply(requested: int | None = None) -> int:
    """Set PyTorch's intra-op threads by `choose`, and NumPy's and SciPy's BLAS threads to the
    same number (their products, in the audits and k-means, would otherwise take a thread a
    core beside PyTorch's); returns the number in use."""
    import scipy.linalg  # noqa: F401  SciPy's own BLAS, loaded now so that the limit reaches it
    import torch  # here: `fedrec data` and `--help` need no PyTorch
    from threadpoolctl import threadpool_limits

    n = choose(requested)
    if n:
        torch.set_num_threads(n)
        threadpool_limits(limits=n, user_api="blas")  # kept for the process, not a context
    return torch.get_num_threads()
