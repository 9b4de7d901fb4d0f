"""Clients' post-tuned item rows (dual personalisation), kept as the blocks training made.

A dual client keeps the rows it trained in its latest round. Each trained chunk of a cohort
leaves one block (its clients, one sorted key per row, the rows) — memory proportional to the
rows clients touched (the rows, 4 bytes a row, and 8 more a row for the merged search index
an evaluation makes), never a table per client, nor anything
sized by the number of clients per block: a million clients in a thousand chunks a round
would otherwise hold gigabytes of lookup arrays. Each client points at the block holding its
latest rows, so a round's rows are kept without copying them; a block is dropped once no
client points at it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedrec.rounds.ragged import ranges


@dataclass
class _Block:
    clients: np.ndarray  # in storage order; client k holds rows ptr[k]:ptr[k+1]
    ptr: np.ndarray
    keys: np.ndarray  # rank * n_items + item, increasing (rank: the client's position); int32 if it fits
    rows: torch.Tensor

    def entries(self, n_items: int) -> tuple[np.ndarray, np.ndarray]:
        """(owner, item) of every row."""
        rank = np.repeat(np.arange(len(self.clients), dtype=np.int64), np.diff(self.ptr))
        return self.clients[rank], self.keys.astype(np.int64) - rank * n_items


@dataclass
class _Index:
    """Every live block merged: its keys as one increasing array, each block's ranks moved
    past the ranks before it, so that one search finds any client's rows (int64 on the rows'
    device: 8 bytes a row, kept from the first evaluation after an update to the next update);
    on a GPU its rows in one tensor as well (`PersonalRows._index`)."""

    bids: list[int]  # the blocks in merged order
    keys: torch.Tensor
    ptr: np.ndarray  # the client of rank k holds merged positions ptr[k]:ptr[k+1]
    starts: torch.Tensor  # block k holds merged positions starts[k]:starts[k+1]
    rank: np.ndarray  # each client's rank (-1: no rows)
    rows: torch.Tensor | None


class PersonalRows:
    """Latest post-tuned rows of each client; a client's new rows replace its old ones."""

    def __init__(self, n_items: int, width: int, merge_rows: bool | None = None) -> None:
        self.n_items = n_items
        self.width = width
        #: merge the blocks' rows for evaluation (`_index`); None: on a GPU, not on the CPU
        self.merge_rows = merge_rows
        self._blocks: dict[int, _Block] = {}
        self._live: dict[int, int] = {}  # block id -> how many clients point at it
        self._latest = np.zeros(0, np.int64)  # block id holding each client's rows, -1: none
        self._next = 0
        self._merged: _Index | None = None

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
        block = _Block(clients, np.asarray(row_ptr, np.int64), keys, rows)
        bid, self._next = self._next, self._next + 1
        self._merged = None
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

        Sampled items are found by one search of the merged keys (`_index`): an evaluation
        scores users in chunks, and a search a chunk and block (2,000 blocks times 977 chunks in
        a 10^6-user validation) was most of its time. Every item (full ranking): each client's
        rows go straight to their columns, one copy of the rows it holds, instead of a search
        for each of the ``n_items`` columns.
        """
        if not self._blocks:
            return
        index = self._index()
        clients = np.asarray(clients, np.int64)
        rank = np.full(len(clients), -1, np.int64)
        inside = clients < len(index.rank)
        rank[inside] = index.rank[clients[inside]]
        mine = np.flatnonzero(rank >= 0)
        mine = mine[np.argsort(rank[mine], kind="stable")]  # searched in key order: each client's
        rank = rank[mine]  # searches then land beside the one before (cache lines, not misses)
        if not len(mine) or not len(index.keys):
            return
        if items is None:
            start = index.ptr[rank]
            count = index.ptr[rank + 1] - start
            at = torch.as_tensor(ranges(start, count))  # the clients' rows, merged positions
            owner = torch.as_tensor(np.repeat(mine * self.n_items - rank * self.n_items, count))
            target = owner + index.keys[at]
        else:
            query = torch.as_tensor(rank)[:, None] * self.n_items + torch.as_tensor(items[mine])
            pos = torch.searchsorted(index.keys, query).clamp_(max=len(index.keys) - 1)
            k, col = (index.keys[pos] == query).nonzero(as_tuple=True)  # one wait a chunk on a GPU
            target, at = torch.as_tensor(mine)[k] * items.shape[1] + col, pos[k, col]
        if not len(at):
            return
        flat = v.view(-1, v.shape[-1])
        if index.rows is not None:
            flat[target] = index.rows[at]
            return
        block = torch.searchsorted(index.starts, at, right=True) - 1  # the rows stay in their blocks
        order = torch.argsort(block, stable=True)
        block, at, target = block[order].cpu().numpy(), at[order], target[order]
        cuts = np.flatnonzero(np.diff(block)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(block)], strict=True):
            b = int(block[lo])
            flat[target[lo:hi]] = self._blocks[index.bids[b]].rows[at[lo:hi] - int(index.starts[b])]

    def _index(self) -> _Index:
        """The live blocks merged for search, made once after each update.

        On a GPU (`merge_rows`) the blocks' rows move into one tensor too, so a chunk's rows are
        one gather rather than a launch a block. They move a block at a time, each block then
        holding a view of the merged tensor, so the merge never holds more than one block's
        rows twice. On the CPU the rows stay in their blocks: copying every row once a round
        costs more there than a gather a block."""
        if self._merged is None:
            bids = sorted(self._blocks)
            blocks = [self._blocks[b] for b in bids]
            base = np.cumsum([0] + [len(b.clients) for b in blocks])  # each block's first rank
            starts = np.cumsum([0] + [len(b.keys) for b in blocks])
            n = self.n_items
            keys = np.concatenate([b.keys.astype(np.int64) + base[k] * n for k, b in enumerate(blocks)])
            ptr = np.concatenate([b.ptr[:-1] + starts[k] for k, b in enumerate(blocks)] + [starts[-1:]])
            rank = np.full(len(self._latest), -1, np.int64)
            for k, (bid, b) in enumerate(zip(bids, blocks, strict=True)):
                latest = np.flatnonzero(self._latest[b.clients] == bid)
                rank[b.clients[latest]] = base[k] + latest
            like = blocks[0].rows
            rows = None
            if self.merge_rows or (self.merge_rows is None and like.device.type != "cpu"):
                rows = torch.empty((int(starts[-1]), self.width), dtype=like.dtype, device=like.device)
                for k, b in enumerate(blocks):
                    rows[starts[k] : starts[k + 1]] = b.rows
                    b.rows = rows[starts[k] : starts[k + 1]]
            self._merged = _Index(bids, torch.as_tensor(keys, device=like.device), ptr,
                                  torch.as_tensor(starts, device=like.device), rank, rows)
        return self._merged

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
        self._merged = None
        if len(owner):  # type: ignore[arg-type]
            order = np.lexsort((items, owner))  # type: ignore[arg-type]
            owner, items = owner[order], items[order]  # type: ignore[index]
            clients, starts = np.unique(owner, return_index=True)
            ptr = np.r_[starts, len(owner)]
            self.update(clients, items, ptr, rows[torch.as_tensor(order)])  # type: ignore[index]
