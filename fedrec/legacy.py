"""Converting the run files and checkpoints older fedrec versions pickled (``torch.save``)
into `fedrec.tensorfile`'s format, once, for a user who trusts where they came from.

The pickle is read by PyTorch's restricted unpickler with `tensorfile.legacy_globals` only
(tensors, NumPy arrays and scalars): a pickle that asks for any other callable is refused
before anything in it runs. The tree it holds must then be what older fedrec wrote (a run
file's config, result and state; a checkpoint's round, fingerprint, state and history) and
be storable by `tensorfile.encode`; anything else is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedrec import tensorfile
from fedrec.api import FORMAT as RUN_FORMAT
from fedrec.api import KIND as RUN_KIND
from fedrec.core import checkpoint
from fedrec.errors import FedrecError
from fedrec.files import check_writable

#: the ``format`` entry of the pickled layouts: a run file's and a checkpoint's
OLD_RUN, OLD_CHECKPOINT = "fedrec-run/1", 2


def convert(src: str | Path, out: str | Path | None = None) -> tuple[Path, str]:
    """Write the pickled run file or checkpoint ``src`` in the safe format to ``out`` (default:
    in place of ``src``); returns the path written and what it is (``run file`` or
    ``checkpoint``). ``src`` is replaced only after it was read and converted in full."""
    src = Path(src)
    dst = check_writable(Path(out) if out is not None else src, "--out")
    blob = tensorfile.read_legacy(src)
    kind, version, what = _layout(src, blob)
    tree = {k: v for k, v in blob.items() if k != "format"}
    try:
        tensorfile.encode(tree)
    except TypeError as e:
        raise FedrecError(f"{src}: holds what no fedrec {what} holds ({e})") from None
    tensorfile.save(dst, tree, kind, version)
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
