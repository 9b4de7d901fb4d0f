"""Clients' post-tuned item rows (dual personalisation), in flat arrays.

A dual client keeps the rows it trained in its latest round. They are stored as one flat
table of (owner, item, row) entries — memory proportional to the rows clients touched, never
a table per client — and looked up for evaluation with one sorted-key search.
"""

from __future__ import annotations

import numpy as np
import torch


class PersonalRows:
    """Latest post-tuned rows of each client; a client's new rows replace its old ones."""

    def __init__(self, n_items: int, width: int) -> None:
        self.n_items = n_items
        self._owner = np.zeros(0, np.int64)
        self._items = np.zeros(0, np.int64)
        self._rows = torch.zeros((0, width))
        self._pending: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # (keys, rank), see `_keys`

    def update(self, clients: np.ndarray, row_items: np.ndarray, row_ptr: np.ndarray,
               rows: torch.Tensor) -> None:
        """Replace the entries of ``clients`` by their rows (client k: ``row_ptr[k]:row_ptr[k+1]``).

        Updates are queued and merged in one pass when the rows are next read, so a round
        trained in many chunks costs one merge, not one per chunk.
        """
        self._pending.append((np.repeat(clients, np.diff(row_ptr)), row_items, rows))
        self._sorted = None

    def _merge(self) -> None:
        if not self._pending:
            return
        new_owner = np.concatenate([p[0] for p in self._pending])
        keep = ~np.isin(self._owner, new_owner)
        self._owner = np.concatenate([self._owner[keep], new_owner])
        self._items = np.concatenate([self._items[keep], *(p[1] for p in self._pending)])
        self._rows = torch.cat([self._rows[torch.as_tensor(keep)], *(p[2] for p in self._pending)])
        self._pending = []

    @property
    def owner(self) -> np.ndarray:
        self._merge()
        return self._owner

    @property
    def items(self) -> np.ndarray:
        self._merge()
        return self._items

    @property
    def rows(self) -> torch.Tensor:
        self._merge()
        return self._rows

    def override(self, v: torch.Tensor, clients: np.ndarray, items: np.ndarray) -> None:
        """Write each client's own rows into ``v`` (``(n, C, width)`` rows of ``items``)."""
        if not len(self.owner):
            return
        keys, rank = self._keys()
        r = np.full(len(clients), -1, np.int64)  # -1: no rows; its queries are negative, never hit
        inside = clients < len(rank)
        r[inside] = rank[clients[inside]]
        query = (r[:, None] * self.n_items + items).ravel()
        pos = np.searchsorted(keys, query).clip(max=len(keys) - 1)
        hit = np.flatnonzero(keys[pos] == query)
        if len(hit):
            flat = v.view(-1, v.shape[-1])
            flat[torch.as_tensor(hit)] = self.rows[torch.as_tensor(pos[hit])]

    def _keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted lookup keys without a sort: entries are stored owner by owner (each owner's
        items sorted), so numbering owners in storage order makes ``rank * n_items + item``
        increasing. ``rank`` is -1 for clients with no rows."""
        if self._sorted is None:
            starts = np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]])
            rank = np.full(int(self.owner.max()) + 1, -1, np.int64)
            rank[self.owner[starts]] = np.arange(len(starts))
            self._sorted = (rank[self.owner] * self.n_items + self.items, rank)
        keys, rank = self._sorted
        return keys, rank

    def state(self) -> dict[str, object]:
        return {"owner": self.owner, "items": self.items, "rows": self.rows}

    def load(self, blob: dict[str, object]) -> None:
        self._owner, self._items, self._rows = blob["owner"], blob["items"], blob["rows"]  # type: ignore[assignment]
        self._pending, self._sorted = [], None
