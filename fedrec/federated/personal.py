"""Clients' post-tuned item rows (dual personalisation), kept as the blocks training made.

A dual client keeps the rows it trained in its latest round. Each trained chunk of a cohort
leaves one block (owners, items, rows) — memory proportional to the rows clients touched,
never a table per client — and each client points at the block holding its latest rows, so
a round's rows are kept without copying them. A block is dropped once no client points at it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class _Block:
    owner: np.ndarray
    items: np.ndarray
    rows: torch.Tensor
    keys: np.ndarray
    rank: np.ndarray  # rank[client] = its position in the block, -1 if absent


class PersonalRows:
    """Latest post-tuned rows of each client; a client's new rows replace its old ones."""

    def __init__(self, n_items: int, width: int) -> None:
        self.n_items = n_items
        self.width = width
        self._blocks: dict[int, _Block] = {}
        self._latest = np.zeros(0, np.int64)  # block id holding each client's rows, -1: none
        self._next = 0

    def update(self, clients: np.ndarray, row_items: np.ndarray, row_ptr: np.ndarray,
               rows: torch.Tensor) -> None:
        """Keep ``rows`` as the rows of ``clients`` (client k: ``row_ptr[k]:row_ptr[k+1]``)."""
        owner = np.repeat(clients, np.diff(row_ptr))
        # Entries are stored owner by owner with each owner's items sorted, so numbering the
        # owners in storage order makes ``rank * n_items + item`` increasing: sorted lookup
        # keys without a sort.
        rank_of = np.repeat(np.arange(len(clients)), np.diff(row_ptr))
        rank = np.full(int(clients.max(initial=-1)) + 1, -1, np.int64)
        rank[clients] = np.arange(len(clients))
        block = _Block(owner, row_items, rows, rank_of * self.n_items + row_items, rank)
        bid, self._next = self._next, self._next + 1
        self._blocks[bid] = block
        if len(self._latest) < len(rank):
            self._latest = np.concatenate([self._latest, np.full(len(rank) - len(self._latest), -1)])
        self._latest[clients] = bid
        live = set(np.unique(self._latest[self._latest >= 0]).tolist())
        for old in [b for b in self._blocks if b not in live]:
            del self._blocks[old]

    def override(self, v: torch.Tensor, clients: np.ndarray, items: np.ndarray) -> None:
        """Write each client's own rows into ``v`` (``(n, C, width)`` rows of ``items``)."""
        if not self._blocks:
            return
        which = np.full(len(clients), -1, np.int64)
        inside = clients < len(self._latest)
        which[inside] = self._latest[clients[inside]]
        flat = v.view(-1, v.shape[-1])
        width = items.shape[1]
        for bid, block in self._blocks.items():
            mine = np.flatnonzero(which == bid)
            if not len(mine):
                continue
            ranks = block.rank[clients[mine]]
            query = (ranks[:, None] * self.n_items + items[mine]).ravel()
            pos = np.searchsorted(block.keys, query).clip(max=len(block.keys) - 1)
            hit = np.flatnonzero(block.keys[pos] == query)
            if len(hit):
                target = (mine[:, None] * width + np.arange(width)).ravel()[hit]
                flat[torch.as_tensor(target)] = block.rows[torch.as_tensor(pos[hit])]

    def state(self) -> dict[str, object]:
        """All live entries, flattened (for checkpoints)."""
        parts = []
        for bid, block in self._blocks.items():
            owners = np.unique(block.owner)
            owners = owners[self._latest[owners] == bid]
            mask = np.isin(block.owner, owners)
            parts.append((block.owner[mask], block.items[mask], block.rows[torch.as_tensor(mask)]))
        if not parts:
            return {"owner": np.zeros(0, np.int64), "items": np.zeros(0, np.int64),
                    "rows": torch.zeros((0, self.width))}
        return {"owner": np.concatenate([p[0] for p in parts]),
                "items": np.concatenate([p[1] for p in parts]),
                "rows": torch.cat([p[2] for p in parts])}

    def load(self, blob: dict[str, object]) -> None:
        owner, items, rows = blob["owner"], blob["items"], blob["rows"]
        self._blocks, self._latest, self._next = {}, np.zeros(0, np.int64), 0
        if len(owner):  # type: ignore[arg-type]
            order = np.lexsort((items, owner))  # type: ignore[arg-type]
            owner, items = owner[order], items[order]  # type: ignore[index]
            clients, starts = np.unique(owner, return_index=True)
            ptr = np.r_[starts, len(owner)]
            self.update(clients, items, ptr, rows[torch.as_tensor(order)])  # type: ignore[index]
