"""Converting the run files and checkpoints older fedrec versions pickled (``torch.save``)
into `fedrec.tensorfile`'s format, once, for a user who trusts where they came from.

The pickle is read by PyTorch's restricted unpickler with `legacy_globals` only
(tensors, NumPy arrays and scalars): a pickle that asks for any other callable is refused
before anything in it runs. The tree it holds must then be what older fedrec wrote (a run
file's config, result and state; a checkpoint's round, fingerprint, state and history) and
be storable by `tensorfile.encode`; anything else is refused.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec import tensorfile
from fedrec.api import FORMAT as RUN_FORMAT
from fedrec.api import KIND as RUN_KIND
from fedrec.api import SHAPE as RUN_SHAPE
from fedrec.core import checkpoint
from fedrec.errors import FedrecError
from fedrec.files import check_writable
from fedrec.tensorfile import TensorFileError

#: the ``format`` entry of the pickled layouts: a run file's and a checkpoint's
OLD_RUN, OLD_CHECKPOINT = "fedrec-run/1", 2


def convert(src: str | Path, out: str | Path | None = None) -> tuple[Path, str]:
    """Write the pickled run file or checkpoint ``src`` in the safe format to ``out`` (default:
    in place of ``src``); returns the path written and what it is (``run file`` or
    ``checkpoint``). ``src`` is replaced only after it was read and converted in full."""
    src = Path(src)
    if src.is_dir():
        raise FedrecError(f"{src} is a folder; give the run file or checkpoint to convert")
    dst = check_writable(Path(out) if out is not None else src, "--out", overwrite=out is None,
                         replace="leave out --out to convert the file in its place, or choose another name")
    blob = read_legacy(src)
    kind, version, what = _layout(src, blob)
    if kind == RUN_KIND:  # what every reader of a run file needs, checked before it is written
        problem = tensorfile.entries_mismatch(RUN_SHAPE, {k: v for k, v in blob.items() if k != "format"})
        if problem is not None:
            raise FedrecError(f"{src}: not a run file of an older fedrec ({problem})")
    try:
        tensorfile.save(dst, {k: v for k, v in blob.items() if k != "format"}, kind, version)
    except TypeError as e:  # encoding fails before anything is written
        raise FedrecError(f"{src}: holds what no fedrec {what} holds ({e})") from None
    return dst, what


def _layout(src: Path, blob: Any) -> tuple[str, int, str]:
    if not isinstance(blob, dict):
        raise FedrecError(f"{src}: not a run file or checkpoint of an older fedrec (not a table)")
    if blob.get("format") == OLD_RUN and {"config", "result", "state"} <= set(blob):
        return RUN_KIND, RUN_FORMAT, "run file"
    if blob.get("format") == OLD_CHECKPOINT and {"round", "fingerprint", "state", "history"} <= set(blob):
        return checkpoint.KIND, checkpoint.FORMAT, "checkpoint"
    raise FedrecError(f"{src}: not a run file or checkpoint of an older fedrec (format "
                      f"{blob.get('format')!r})")


def legacy_globals() -> list[Any]:
    """What `read_legacy` lets PyTorch's restricted unpickler build besides tensors and
    containers: NumPy arrays and scalars of the dtype kinds `tensorfile.encode` stores
    (``bytes`` holds a scalar's value), under NumPy 2's module names and NumPy 1's (a file
    written under NumPy 1 names ``numpy.core``), and nothing else: no object arrays, no
    callable of any other module."""
    from numpy._core.multiarray import _reconstruct, scalar

    kinds = [type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDG"]
    numpy1 = [(_reconstruct, "numpy.core.multiarray._reconstruct"), (scalar, "numpy.core.multiarray.scalar")]
    return [_reconstruct, scalar, *numpy1, np.ndarray, np.dtype, bytes, *kinds]


def read_legacy(path: str | Path) -> Any:
    """A pickle an older fedrec wrote (``torch.save``), read with PyTorch's restricted
    unpickler (``weights_only=True``) allowing only `legacy_globals`: a pickle that asks
    for anything else (a function call, an object of another class) is refused, not run."""
    path = Path(path)
    head, size = tensorfile.sniff(path, "file")
    if tensorfile.looks_like_safetensors(head, size):
        raise TensorFileError(f"{path}: already in the safe format; nothing to convert")
    if not tensorfile.looks_like_pickle(head, size):
        raise TensorFileError(f"{path}: not a file an older fedrec wrote (not a pickle)")
    try:
        # quiet: PyTorch warns of a pickle protocol it did not write before it refuses the file
        with torch.serialization.safe_globals(legacy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        # torch's message: advice (to load it unrestricted, which is the point not to) around
        # one line from the restricted unpickler that names what the file asked for
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        said = next((ln for ln in lines if ln.startswith("WeightsUnpickler error:")), "")
        reason = said.replace("WeightsUnpickler error: ", "").split(" was not an allowed global")[0]
        if not reason:  # not what torch.save writes (a plain pickle, a damaged file)
            raise TensorFileError(f"{path}: cannot be read (damaged, or not written by torch.save: "
                                  f"{type(e).__name__})") from None
        raise TensorFileError(f"{path}: refused: it asks for more than tensors and arrays, or is "
                              f"damaged ({reason[:160]})") from None
