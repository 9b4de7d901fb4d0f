"""Preprocessing stages: pure, vectorised functions from `Interactions` to `Interactions`.

The published methods differ in how they clean a data set (implicit threshold, duplicate
handling, k-core, re-numbering), and those choices move the numbers. Each stage is therefore a
separate function, and `PreprocessConfig` records exactly which were applied so that a result
can say what data it was computed on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError, UnknownNameError

DEDUP_POLICIES = ("first", "last", "max", "mean", "error", "keep")


def to_implicit(x: Interactions, threshold: float | None = None) -> Interactions:
    """Keep rows with ``rating >= threshold`` (all rows when None) and set every rating to 1.0.

    Implicit-feedback methods treat any kept event as a positive; the threshold is how papers
    turn explicit ratings into positives (e.g. ``>= 4`` on MovieLens).
    """
    kept = x if threshold is None else x.subset(x.ratings >= threshold)
    return dataclasses.replace(kept, ratings=np.ones(len(kept), np.float32), implicit=True)


def deduplicate(x: Interactions, policy: str = "last") -> Interactions:
    """Keep one row per (user, item) pair.

    ``first``/``last``: the earliest/latest event by timestamp, then source row order.
    ``max``: the highest rating (ties: the latest event). ``mean``: the latest event carrying the
    mean rating of the pair. ``error``: raise `FedrecError` naming a duplicate pair by raw ids.
    ``keep``: no change. Surviving rows stay in their original relative order.
    """
    if policy not in DEDUP_POLICIES:
        raise UnknownNameError("dedup policy", policy, list(DEDUP_POLICIES))
    if policy == "keep" or len(x) == 0:
        return x
    key = x.users * np.int64(x.n_items) + x.items
    if policy == "max":
        order = np.lexsort((x.row_order, x.timestamps, x.ratings, key))
    else:
        order = np.lexsort((x.row_order, x.timestamps, key))
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    if policy == "error":
        if len(starts) < len(x):
            _raise_duplicate(x, order, starts)
        return x
    ends = np.r_[starts[1:], len(x)]
    pick = order[starts] if policy == "first" else order[ends - 1]
    ratings = None
    if policy == "mean":
        sums = np.add.reduceat(x.ratings[order].astype(np.float64), starts)
        ratings = (sums / (ends - starts)).astype(np.float32)
    keep_order = np.argsort(pick, kind="stable")
    out = x.subset(pick[keep_order])
    if ratings is not None:
        out = dataclasses.replace(out, ratings=ratings[keep_order])
    return out


def _raise_duplicate(x: Interactions, order: np.ndarray, starts: np.ndarray) -> None:
    """Name the duplicate pair that occurs first in the source, so the user can find it."""
    sizes = np.diff(np.r_[starts, len(x)])
    dup_groups = np.flatnonzero(sizes > 1)
    first_rows = np.minimum.reduceat(x.row_order[order], starts)[dup_groups]
    g = dup_groups[np.argmin(first_rows)]
    row = order[starts[g]]
    user = _plain(x.user_ids[x.users[row]])
    item = _plain(x.item_ids[x.items[row]])
    raise FedrecError(
        f"{x.name}: user {user!r} and item {item!r} occur together {int(sizes[g])} times "
        f"({len(dup_groups)} duplicate (user, item) pairs in all); choose a dedup policy other "
        f"than 'error' ({', '.join(p for p in DEDUP_POLICIES if p != 'error')})"
    )


def _plain(value: object) -> object:
    """A numpy scalar as the Python value, so messages show ``'u1'`` rather than ``np.str_('u1')``."""
    return value.item() if isinstance(value, np.generic) else value


def k_core(
    x: Interactions, min_user: int = 0, min_item: int = 0, iterative: bool = True
) -> Interactions:
    """Drop rows of users with < ``min_user`` rows and items with < ``min_item`` rows.

    Iterative: repeat until every remaining user and item meets its threshold (removing an
    item can push a user below it). Otherwise a single pass, with both counts taken on the
    input, as PersonalFR does for Anime. Ids are not renumbered; call `remap` after.
    """
    if min_user < 0 or min_item < 0:
        raise FedrecError(
            f"k-core thresholds must be >= 0, got min_user={min_user}, min_item={min_item}"
        )
    keep = np.ones(len(x), dtype=bool)
    while True:
        users, items = x.users[keep], x.items[keep]
        user_ok = np.bincount(users, minlength=x.n_users) >= min_user
        item_ok = np.bincount(items, minlength=x.n_items) >= min_item
        row_ok = user_ok[users] & item_ok[items]
        if row_ok.all():
            break
        keep[np.flatnonzero(keep)[~row_ok]] = False
        if not iterative:
            break
    return x if keep.all() else x.subset(keep)


def remap(x: Interactions) -> Interactions:
    """Renumber users and items to ``0..n-1`` over those that still have rows.

    The relative order of the old ids is kept, and ``user_ids``/``item_ids`` keep the raw ids
    of the survivors, so results can still be reported in the source's terms.
    """
    users, user_ids = _compact(x.users, x.user_ids)
    items, item_ids = _compact(x.items, x.item_ids)
    return dataclasses.replace(x, users=users, items=items, user_ids=user_ids, item_ids=item_ids)


def _compact(codes: np.ndarray, raw_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New contiguous codes for the used subset of ``raw_ids``, order-preserving."""
    used = np.zeros(len(raw_ids), dtype=bool)
    used[codes] = True
    new_code = np.cumsum(used, dtype=np.int64) - 1
    return new_code[codes], raw_ids[used]


@dataclass(frozen=True)
class PreprocessConfig:
    """Which cleaning steps to apply; `preprocess` runs dedup -> implicit -> k-core -> remap."""

    implicit: bool = True
    threshold: float | None = None
    dedup: str = "last"
    min_user: int = 0
    min_item: int = 0
    iterative_core: bool = True
    max_users: int | None = None

    def __post_init__(self) -> None:
        if self.max_users is not None and self.max_users < 1:
            raise FedrecError(f"max_users must be >= 1, got {self.max_users}")
        if self.dedup not in DEDUP_POLICIES:
            raise UnknownNameError("dedup policy", self.dedup, list(DEDUP_POLICIES))
        if self.min_user < 0 or self.min_item < 0:
            raise FedrecError(
                f"k-core thresholds must be >= 0, got min_user={self.min_user}, min_item={self.min_item}"
            )
        if self.threshold is not None and not self.implicit:
            raise FedrecError("a rating threshold only applies to implicit data; set implicit=True")

    def describe(self) -> str:
        """One line naming every step applied, for logs and result metadata."""
        parts = [f"dedup={self.dedup}"]
        if self.implicit:
            parts.append(
                "implicit (all ratings)"
                if self.threshold is None
                else f"implicit (rating >= {self.threshold:g})"
            )
        else:
            parts.append("explicit ratings")
        if self.min_user > 0 or self.min_item > 0:
            mode = "iterative" if self.iterative_core else "one pass"
            parts.append(f"k-core user>={self.min_user} item>={self.min_item} ({mode})")
        else:
            parts.append("no k-core")
        if self.max_users is not None:
            parts.append(f"first {self.max_users} users")
        parts.append("remap")
        return "; ".join(parts)


def preprocess(x: Interactions, config: PreprocessConfig) -> Interactions:
    """Apply dedup -> implicit -> k-core -> first users -> remap, as configured.

    Dedup comes first so that k-core counts distinct pairs, and k-core after the implicit
    threshold so that it counts only the events that will be used. ``max_users`` then keeps
    the users with the lowest numbers among those left: the first to appear in the data
    (PersonalFR's "first 6,000 users" of Anime).
    """
    out = deduplicate(x, config.dedup)
    if config.implicit:
        out = to_implicit(out, config.threshold)
    if config.min_user > 0 or config.min_item > 0:
        out = k_core(out, config.min_user, config.min_item, config.iterative_core)
    if config.max_users is not None:
        present = np.flatnonzero(np.bincount(out.users, minlength=out.n_users))
        if len(present) > config.max_users:
            out = out.subset(out.users <= present[config.max_users - 1])
    return remap(out)


def stats(x: Interactions) -> dict[str, float | int]:
    """Summary numbers of a data set (sizes, sparsity as a fraction, ratings, activity)."""
    per_user = np.bincount(x.users, minlength=x.n_users)
    has_rows = len(x) > 0
    has_users = x.n_users > 0
    return {
        "users": x.n_users,
        "items": x.n_items,
        "interactions": len(x),
        "sparsity": float(x.sparsity),
        "rating_min": float(x.ratings.min()) if has_rows else float("nan"),
        "rating_max": float(x.ratings.max()) if has_rows else float("nan"),
        "rating_mean": float(x.ratings.mean(dtype=np.float64)) if has_rows else float("nan"),
        "per_user_min": int(per_user.min()) if has_users else 0,
        "per_user_median": float(np.median(per_user)) if has_users else 0.0,
        "per_user_max": int(per_user.max()) if has_users else 0,
    }
