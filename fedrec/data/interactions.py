"""The one in-memory form of a data set: parallel arrays of (user, item, rating, timestamp).

Every parser returns an `Interactions`; every later stage (preprocessing, splitting,
partitioning) consumes one. Ids are contiguous ``0..n-1``; the raw ids of the source file are
kept in ``user_ids``/``item_ids`` so that results can be written in the file's own terms.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Interactions:
    """A set of user-item events with contiguous integer ids.

    ``users``/``items`` are int64 indices into ``user_ids``/``item_ids`` (the raw ids, as
    strings or ints). ``ratings`` is float32 (1.0 for implicit data). ``timestamps`` is int64
    (seconds, or any monotone clock; the row order when the source has none).
    ``row_order`` is the 0-based position of each event in the source file, kept so that
    timestamp ties can be broken the way the source intended. ``clock`` says whether the
    timestamps are the source's: False when it has no time column, where a split "by time"
    would hold out whatever the file's row order puts last (`fedrec.protocols.split`).
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    user_ids: np.ndarray
    item_ids: np.ndarray
    row_order: np.ndarray = field(default=None)  # type: ignore[assignment]
    name: str = "interactions"
    implicit: bool = False
    #: where the events came from (file, origin, sha256; or the generator), for results files
    source: dict[str, Any] = field(default_factory=dict)
    #: the split a file fixes for each event (0 train, 1 validation, 2 test; FedCIA's
    #: published split), read by the ``given-*`` protocols; None for ordinary data
    given_split: np.ndarray | None = None
    #: whether ``timestamps`` come from the source (False: they are only the row order)
    clock: bool = True

    def __post_init__(self) -> None:
        n = len(self.users)
        if self.row_order is None:
            object.__setattr__(self, "row_order", np.arange(n, dtype=np.int64))
        for arr_name in ("items", "ratings", "timestamps", "row_order", "given_split"):
            if getattr(self, arr_name) is not None and len(getattr(self, arr_name)) != n:
                raise ValueError(f"Interactions.{arr_name} has {len(getattr(self, arr_name))} rows, expected {n}")

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def __len__(self) -> int:
        return len(self.users)

    @property
    def sparsity(self) -> float:
        """Share of empty cells in the user x item matrix (counting distinct pairs)."""
        cells = self.n_users * self.n_items
        if cells == 0:
            return 1.0
        pairs = len(np.unique(self.users * self.n_items + self.items))
        return 1.0 - pairs / cells

    def subset(self, mask: np.ndarray) -> Interactions:
        """Rows where ``mask`` holds, ids unchanged (call `remap` to make them contiguous again)."""
        return Interactions(
            users=self.users[mask],
            items=self.items[mask],
            ratings=self.ratings[mask],
            timestamps=self.timestamps[mask],
            user_ids=self.user_ids,
            item_ids=self.item_ids,
            row_order=self.row_order[mask],
            name=self.name,
            implicit=self.implicit,
            source=self.source,
            given_split=None if self.given_split is None else self.given_split[mask],
            clock=self.clock,
        )

    def content_digest(self) -> str:
        """A sha256 of the events as fedrec reads them, the same whatever file format held them.

        It covers, event by event in the source's row order, the raw user and item ids (as
        text, so a parser that reads them as numbers and one that keeps them as text agree; the
        numbering a parser gave them does not count), the ratings (as float32), the timestamps
        where the source has a clock (as the parser made them: whole seconds, or the ranks of
        times with fractions), and the split a file fixes; and whether the data are implicit. So
        GroupLens' ``u.data`` and RecBole's atomic copy of it give one digest, while a copy with
        other events, other values, or its rows in another order (ties in time are broken by row
        order) gives another. Being of the events as read, it is one for files a parser reads
        alike: an id written ``0196`` in a file whose parser reads ids as numbers and ``196``;
        times with fractions in the same order. A file's own sha256 tells copies apart by their
        bytes; this tells them apart by what a run reads (`fedrec.bench` compares it before it
        reuses a cell). Results files keep it, so its scheme is fixed (a test pins it): a change
        would make every recorded run read as a run of other data.
        """
        h = hashlib.sha256(b"fedrec-interactions-v1")
        order = np.argsort(self.row_order, kind="stable")
        h.update(np.array([len(self), self.implicit, self.clock, self.given_split is not None], "<i8").tobytes())
        for codes, raw in ((self.users, self.user_ids), (self.items, self.item_ids)):
            used = np.unique(codes)
            words = [str(w).encode() for w in np.asarray(raw, dtype=object)[used]]
            by_text = sorted(range(len(words)), key=words.__getitem__)
            rank = np.zeros(len(raw), np.int64)
            rank[used[by_text]] = np.arange(len(used))
            h.update(len(words).to_bytes(8, "little"))
            for i in by_text:  # each id length-prefixed: no separator can be forged
                h.update(len(words[i]).to_bytes(4, "little") + words[i])
            h.update(rank[codes[order]].astype("<i8").tobytes())
        h.update(self.ratings[order].astype("<f4").tobytes())
        if self.clock:
            h.update(self.timestamps[order].astype("<i8").tobytes())
        if self.given_split is not None:
            h.update(np.asarray(self.given_split)[order].astype("<i8").tobytes())
        return h.hexdigest()

    def to_csr(self, values: np.ndarray | None = None) -> sp.csr_matrix:
        """User x item CSR matrix (duplicates summed); ``values`` default to ratings."""
        data = self.ratings if values is None else values
        return sp.csr_matrix(
            (data.astype(np.float32), (self.users, self.items)), shape=(self.n_users, self.n_items)
        )

    @staticmethod
    def from_raw(
        raw_users: np.ndarray,
        raw_items: np.ndarray,
        ratings: np.ndarray | None = None,
        timestamps: np.ndarray | None = None,
        *,
        name: str = "interactions",
        implicit: bool = False,
    ) -> Interactions:
        """Build from raw id columns; ids are numbered in order of first appearance. Without
        ``timestamps`` the row order stands in for them and ``clock`` is False."""
        users, user_ids = _first_appearance_codes(np.asarray(raw_users))
        items, item_ids = _first_appearance_codes(np.asarray(raw_items))
        n = len(users)
        ratings = np.ones(n, np.float32) if ratings is None else np.asarray(ratings, np.float32)
        clock = timestamps is not None
        timestamps = np.arange(n, dtype=np.int64) if timestamps is None else np.asarray(timestamps, np.int64)
        return Interactions(users, items, ratings, timestamps, user_ids, item_ids, name=name,
                            implicit=implicit, clock=clock)


def _first_appearance_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..k-1 in order of first appearance (as the official implementations number ids)."""
    uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[inverse].astype(np.int64), uniq[order]
