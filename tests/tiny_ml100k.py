"""A tiny ML-100K-shaped copy of 40 users x 12 ratings, in GroupLens' and RecBole's formats, with
one rating editable: the tests of cached runs checked against the events they read write it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_rng = np.random.default_rng(0)
#: (user, item, rating, time), GroupLens' ids
ROWS = [(u, i, int(_rng.integers(1, 6)), 880000000 + 1000 * u + k)
        for u in range(1, 41) for k, i in enumerate(_rng.choice(np.arange(1, 201), 12, replace=False))]


def _lines(edited: bool) -> str:
    return "".join(f"{u}\t{i}\t{5 if edited and n == 0 else r}\t{t}\n" for n, (u, i, r, t) in enumerate(ROWS))


def write_u_data(folder: Path, edited: bool = False) -> Path:
    """GroupLens' ``u.data`` in ``folder`` (made if needed); ``edited``: the first rating set to 5,
    other events."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.data").write_text(_lines(edited))
    return folder / "u.data"


def write_atomic(folder: Path) -> Path:
    """The same events as `write_u_data`'s, as RecBole's atomic ``ml-100k.inter``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ml-100k.inter"
    path.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + _lines(False))
    return path
