"""Clients' post-tuned item rows (dual personalisation), kept as the blocks training made.

A dual client keeps the rows it trained in its latest round. Each trained chunk of a cohort
leaves one block (its clients, one sorted key per row, the rows) — memory proportional to the
rows clients touched (the rows and 4 bytes a row), never a table per client, nor anything
sized by the number of clients per block: a million clients in a thousand chunks a round
would otherwise hold gigabytes of lookup arrays. Each client points at the block holding its
latest rows, so a round's rows are kept without copying them; a block is dropped once no
client points at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from fedrec.rounds.ragged import ranges


@dataclass
class _Block:
    clients: np.ndarray  # in storage order; client k holds rows ptr[k]:ptr[k+1]
    ptr: np.ndarray
    keys: np.ndarray  # rank * n_items + item, increasing (rank: the client's position); int32 if it fits
    rows: torch.Tensor
    by_id: np.ndarray  # argsort of clients, to find a client's rank by search

    @cached_property
    def sorted_ids(self) -> np.ndarray:
        """The block's client ids in increasing order (made once: a block may hold 10^6)."""
        return self.clients[self.by_id]

    def ranks(self, clients: np.ndarray) -> np.ndarray:
        """Each client's position in the block (-1 if absent)."""
        sorted_ids = self.sorted_ids
        pos = np.searchsorted(sorted_ids, clients).clip(max=len(sorted_ids) - 1)
        return np.where(sorted_ids[pos] == clients, self.by_id[pos], -1)

    def entries(self, n_items: int) -> tuple[np.ndarray, np.ndarray]:
        """(owner, item) of every row."""
        rank = np.repeat(np.arange(len(self.clients), dtype=np.int64), np.diff(self.ptr))
        return self.clients[rank], self.keys.astype(np.int64) - rank * n_items


class PersonalRows:
    """Latest post-tuned rows of each client; a client's new rows replace its old ones."""

    def __init__(self, n_items: int, width: int) -> None:
        self.n_items = n_items
        self.width = width
        self._blocks: dict[int, _Block] = {}
        self._live: dict[int, int] = {}  # block id -> how many clients point at it
        self._latest = np.zeros(0, np.int64)  # block id holding each client's rows, -1: none
        self._next = 0

    def update(self, clients: np.ndarray, row_items: np.ndarray, row_ptr: np.ndarray,
               rows: torch.Tensor) -> None:
        """Keep ``rows`` as the rows of ``clients`` (client k: ``row_ptr[k]:row_ptr[k+1]``)."""
        clients = np.asarray(clients, np.int64)
        # Entries are stored client by client with each client's items sorted, so numbering
        # the clients in storage order makes ``rank * n_items + item`` increasing: sorted
        # lookup keys without a sort.
        key_type = np.int32 if len(clients) * self.n_items < 2**31 else np.int64  # half the bytes
        rank_of = np.repeat(np.arange(len(clients), dtype=key_type), np.diff(row_ptr))
        keys = rank_of * key_type(self.n_items) + np.asarray(row_items).astype(key_type)
        block = _Block(clients, np.asarray(row_ptr, np.int64), keys, rows, np.argsort(clients, kind="stable"))
        bid, self._next = self._next, self._next + 1
        self._blocks[bid] = block
        if len(clients) and len(self._latest) <= clients.max():
            grow = int(clients.max()) + 1 - len(self._latest)
            self._latest = np.concatenate([self._latest, np.full(grow, -1, np.int64)])
        before = self._latest[clients]
        self._latest[clients] = bid
        self._live[bid] = len(clients)
        for old, leaving in zip(*np.unique(before[before >= 0], return_counts=True), strict=True):
            self._live[int(old)] -= int(leaving)
            if self._live[int(old)] == 0:
                del self._live[int(old)], self._blocks[int(old)]

    def override(self, v: torch.Tensor, clients: np.ndarray, items: np.ndarray | None) -> None:
        """Write each client's own rows into ``v`` (``(n, C, width)`` rows of ``items``; None:
        every item in order, ``C = n_items``).

        Every item is full-ranking evaluation: each client's rows then go straight to their
        columns, one copy of the rows it holds, instead of searching its keys for each of the
        ``n_items`` columns (which was most of a full-ranking evaluation's host time).
        """
        if not self._blocks:
            return
        clients = np.asarray(clients, np.int64)
        which = np.full(len(clients), -1, np.int64)
        inside = clients < len(self._latest)
        which[inside] = self._latest[clients[inside]]
        flat = v.view(-1, v.shape[-1])
        for bid in np.unique(which[which >= 0]).tolist():
            block = self._blocks[bid]
            mine = np.flatnonzero(which == bid)
            ranks = block.ranks(clients[mine])
            if items is None:
                start = block.ptr[ranks]
                count = block.ptr[ranks + 1] - start
                at = ranges(start, count)  # the clients' rows in the block
                rank = np.repeat(ranks, count)
                item = block.keys[at].astype(np.int64) - rank * self.n_items
                target = np.repeat(mine, count) * self.n_items + item
                flat[torch.as_tensor(target)] = block.rows[torch.as_tensor(at)]
                continue
            width = items.shape[1]
            query = (ranks[:, None] * self.n_items + items[mine]).ravel().astype(block.keys.dtype)
            pos = np.searchsorted(block.keys, query).clip(max=len(block.keys) - 1)
            hit = np.flatnonzero(block.keys[pos] == query)
            if len(hit):
                target = (mine[:, None] * width + np.arange(width)).ravel()[hit]
                flat[torch.as_tensor(target)] = block.rows[torch.as_tensor(pos[hit])]

    def state(self) -> dict[str, object]:
        """All live entries, flattened (for checkpoints)."""
        parts = []
        for bid, block in self._blocks.items():
            owner, items = block.entries(self.n_items)
            mask = self._latest[owner] == bid
            parts.append((owner[mask], items[mask], block.rows[torch.as_tensor(mask)]))
        if not parts:
            return {"owner": np.zeros(0, np.int64), "items": np.zeros(0, np.int64),
                    "rows": torch.zeros((0, self.width))}
        return {"owner": np.concatenate([p[0] for p in parts]),
                "items": np.concatenate([p[1] for p in parts]),
                "rows": torch.cat([p[2] for p in parts])}

    def load(self, blob: dict[str, object]) -> None:
        owner, items, rows = blob["owner"], blob["items"], blob["rows"]
        self._blocks, self._live, self._latest, self._next = {}, {}, np.zeros(0, np.int64), 0
        if len(owner):  # type: ignore[arg-type]
            order = np.lexsort((items, owner))  # type: ignore[arg-type]
            owner, items = owner[order], items[order]  # type: ignore[index]
            clients, starts = np.unique(owner, return_index=True)
            ptr = np.r_[starts, len(owner)]
            self.update(clients, items, ptr, rows[torch.as_tensor(order)])  # type: ignore[index]
