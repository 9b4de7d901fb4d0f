"""The run's device: every tensor an algorithm creates lives there.

Algorithms are written device-generic rather than passing a device to each call: a factory call
without ``device=`` follows PyTorch's default device, which a run sets for its duration with
`on(device)` (PyTorch's ``torch.device`` context manager; a CPU run sets nothing and pays no
overhead). Three rules keep the code so, checked over the whole package by
``tests/test_device.py``:

* no ``torch.from_numpy`` outside the data layer (it always makes a CPU tensor): ``torch.as_tensor``
  follows the default device (and shares memory on the CPU as ``from_numpy`` does);
* a tensor leaves for numpy with ``.cpu().numpy()`` (a no-op on the CPU);
* seeded draws are made on the CPU (``device="cpu"`` with a CPU generator) and moved with
  `here`, so a seed gives the same values on every device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils._device import DeviceContext

from fedrec.errors import FedrecError


def parse(device: str) -> str:
    """``device`` if it names a device fedrec runs on, present on this machine or not (a bench
    report names the GPU that ran its cells); else one clear error."""
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise FedrecError(f"--device {device} is not a device name (cpu, cuda, cuda:1, ...)") from e
    if kind not in ("cpu", "cuda"):
        raise FedrecError(f"--device {device}: fedrec runs on cpu or cuda")
    return device


def check(device: str) -> str:
    """``device`` if this machine has it, else one clear error."""
    if torch.device(parse(device)).type == "cuda" and not torch.cuda.is_available():
        raise FedrecError(f"--device {device} was asked for, but this PyTorch build sees no CUDA device")
    return device


def resolve(device: str) -> str:
    """``device`` checked (`check`), with ``auto`` read as cuda when PyTorch sees one, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return check(device)


class _RunDevice(DeviceContext):
    """PyTorch's default-device mode (what ``with torch.device(...)`` enters), except that a
    numpy array made a CUDA tensor by ``torch.as_tensor`` is staged in pinned host memory and
    copied without waiting. From pageable memory PyTorch's copy waits for the device to finish
    everything queued before it returns, so each array a round moves in (a step's index block,
    a client's ids) stalled the host until the GPU caught up (a PersonalFR round on ML-100K:
    233 copies and 207 waits, its kernels busy 1% of the time, H200 profile). The pinned block
    is not reused before its copy is done (PyTorch's caching host allocator records the copy),
    and the array is copied to the pinned block first, so changing it afterwards changes
    nothing."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.as_tensor and args and isinstance(args[0], np.ndarray):
            kwargs = kwargs or {}
            target = torch.device(kwargs.get("device") or self.device)
            if target.type == "cuda" and len(args) == 1 and set(kwargs) <= {"device", "dtype"}:
                host = torch.as_tensor(args[0], dtype=kwargs.get("dtype"), device="cpu")
                return host.pin_memory().to(target, non_blocking=True)
        return super().__torch_function__(func, types, args, kwargs)


@contextmanager
def on(device: str) -> Iterator[None]:
    """Make ``device`` the default device of tensor factories for the block (`_RunDevice`)."""
    if torch.device(device).type == "cpu":
        yield
        return
    with _RunDevice(device):
        yield


def here(t: torch.Tensor) -> torch.Tensor:
    """A CPU draw moved to the run's device (the default device: see `on`)."""
    return t.to(torch.get_default_device())


def settle() -> None:
    """Wait for the work queued on the run's device, so a host clock read next measures it
    (CUDA kernels run asynchronously); nothing to wait for on the CPU."""
    dev = torch.get_default_device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def eval_chunk_users(width: int) -> int:
    """How many users an evaluation scores at once with ``width`` candidate items each: 1,024
    on the CPU, whose caches favour small blocks; on a GPU up to 2^25 scores (128 MB of
    float32), so that a 10^6-user validation is tens of launches and host steps rather than
    a thousand chunks' worth, each waiting for the device."""
    if torch.get_default_device().type != "cuda":
        return 1024
    return max(1024, (1 << 25) // max(1, width))


def score_cells() -> int:
    """Item-row cells (users x items x row width) a state scores in one block: 2^22 on the CPU,
    2^28 (1 GB of float32) on a GPU (see `eval_chunk_users`)."""
    return 1 << 28 if torch.get_default_device().type == "cuda" else 1 << 22
