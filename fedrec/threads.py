"""How many threads PyTorch computes with: one unless told otherwise.

PyTorch's default (one intra-op thread per core) collapses when another process competes for
a core: its OpenMP threads wait on each other. Measured on the 2-core development machine with
one competing CPU-bound process, identical figures in every case: PFedRec (ML-100K) 0.197 s a
round with 1 thread against 0.520 with 2 or the default; MF 0.926 s an epoch against 4.42 and
3.70. fedrec's engine vectorises over clients, so one thread keeps most of the speed on an idle
machine too (see the README). ``--threads N`` (or ``OMP_NUM_THREADS``) asks for more; 0 leaves
PyTorch's default.
"""

from __future__ import annotations

import os

from fedrec.errors import FedrecError


def choose(requested: int | None = None) -> int:
    """``requested`` if given (0: PyTorch's default), else ``OMP_NUM_THREADS``, else 1."""
    if requested is None:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if not env:
            return 1
        try:
            requested = int(env)
        except ValueError:
            raise FedrecError(f"OMP_NUM_THREADS={env!r} is not a whole number") from None
    if requested < 0:
        raise FedrecError(f"--threads must be >= 0 (got {requested}; 0: PyTorch's default)")
    return requested


def apply(requested: int | None = None) -> int:
    """Set PyTorch's intra-op threads by `choose`; returns the number in use."""
    import torch  # here: `fedrec data` and `--help` need no PyTorch

    n = choose(requested)
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()
