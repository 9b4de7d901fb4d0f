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
        self.owner = np.zeros(0, np.int64)
        self.items = np.zeros(0, np.int64)
        self.rows = torch.zeros((0, width))
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def update(self, clients: np.ndarray, row_items: np.ndarray, row_ptr: np.ndarray,
               rows: torch.Tensor) -> None:
        """Replace the entries of ``clients`` by their rows (client k: ``row_ptr[k]:row_ptr[k+1]``)."""
        keep = ~np.isin(self.owner, clients)
        owner = np.repeat(clients, np.diff(row_ptr))
        if keep.any():
            self.owner = np.concatenate([self.owner[keep], owner])
            self.items = np.concatenate([self.items[keep], row_items])
            self.rows = torch.cat([self.rows[torch.as_tensor(keep)], rows])
        else:
            self.owner, self.items, self.rows = owner, row_items.copy(), rows
        self._sorted = None

    def override(self, v: torch.Tensor, clients: np.ndarray, items: np.ndarray) -> None:
        """Write each client's own rows into ``v`` (``(n, C, width)`` rows of ``items``)."""
        if not len(self.owner):
            return
        if self._sorted is None:
            keys = self.owner * self.n_items + self.items
            order = np.argsort(keys, kind="stable")
            self._sorted = (keys[order], order)
        keys, order = self._sorted
        query = (clients[:, None] * self.n_items + items).ravel()
        pos = np.searchsorted(keys, query).clip(max=len(keys) - 1)
        hit = np.flatnonzero(keys[pos] == query)
        if len(hit):
            flat = v.view(-1, v.shape[-1])
            flat[torch.as_tensor(hit)] = self.rows[torch.as_tensor(order[pos[hit]])]

    def state(self) -> dict[str, object]:
        return {"owner": self.owner, "items": self.items, "rows": self.rows}

    def load(self, blob: dict[str, object]) -> None:
        self.owner, self.items, self.rows = blob["owner"], blob["items"], blob["rows"]  # type: ignore[assignment]
        self._sorted = None
