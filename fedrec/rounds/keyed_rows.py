"""Rows stored only for the keys that were written: FedRAP's private item views D_i.

A client's D_i starts at zero and a row changes only when the client trains that item, so
the rows never touched are zero and need no storage. Keys are ``client * n_items + item``
(int64). Rows are appended in the order keys first appear, so storing a key never moves a
row; the keys live in a few sorted runs beside their rows' slots, merged like a binary counter
(a run is merged into the one before it once that one is at most twice its size). Storing the
keys of a chunk of clients thus costs amortised O(log n) a key instead of the O(n) of inserting
into one sorted array (which made FedRAP's early rounds at ML-1M scale 40% slower), and a
lookup is one ``searchsorted`` a run (at most log2 of the number of chunks that added keys).
Memory is 144 bytes a touched (client, item) at width 32 (a dense table costs 128 bytes for
every pair): far less on sparse data (Ciao: 0.3% of its 775 million pairs are ever rated),
slightly more where clients end up touching nearly every item.

Keys, runs and rows are torch tensors on the rows' device (the run's), so on a GPU a chunk's
lookups and inserts are device sorts and searches rather than host ones on keys copied back and
forth (numpy's search and hashing were half of a FedRAP round at ML-1M size on an H200).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class KeyedRows:
    """A zero-default table of ``width``-wide rows addressed by int64 keys."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._rows = torch.zeros((0, width))
        self._runs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (sorted keys, their rows' slots)
        self._used = 0

    def __len__(self) -> int:
        return self._used

    @property
    def rows(self) -> torch.Tensor:
        """The stored rows (a view; row ``slots(keys)[i]`` belongs to ``keys[i]``)."""
        return self._rows[: self._used]

    @property
    def nbytes(self) -> int:
        """Bytes held for the stored keys (capacity not yet used is not counted)."""
        return self._used * (self.width * self._rows.element_size() + 16)

    def _keys(self, keys: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``keys`` as int64 on the rows' device."""
        return torch.as_tensor(keys, dtype=torch.int64, device=self._rows.device)

    def find(self, keys: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The slot of each key, -1 where the key was never stored."""
        keys = self._keys(keys).contiguous()
        out = torch.full(keys.shape, -1, dtype=torch.int64, device=keys.device)
        for run_keys, run_slots in self._runs:
            pos = torch.searchsorted(run_keys, keys).clamp_(max=len(run_keys) - 1)
            out = torch.where(run_keys[pos] == keys, run_slots[pos], out)
        return out

    def _add_run(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Add sorted new ``keys``, merging runs while the last is at least half the one before."""
        self._runs.append((keys, slots))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (a_keys, a_slots), (b_keys, b_slots) = self._runs[-2], self._runs.pop()
            merged, order = torch.sort(torch.cat([a_keys, b_keys]), stable=True)
            self._runs[-1] = (merged, torch.cat([a_slots, b_slots])[order])

    def slots(self, keys: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The slot of each key, storing a zero row for each key not yet stored."""
        keys = self._keys(keys)
        out = self.find(keys)
        missing = torch.nonzero(out < 0).flatten()
        if len(missing):
            lost = keys[missing]
            new = torch.unique(lost)  # sorted
            new_slots = torch.arange(self._used, self._used + len(new), device=keys.device)
            self._reserve(self._used + len(new))
            self._used += len(new)
            self._add_run(new, new_slots)
            out[missing] = new_slots[torch.searchsorted(new, lost)]
        return out

    def get(self, keys: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The rows of ``keys`` (any shape; zero rows for keys never stored), ``keys.shape + (width,)``."""
        keys = self._keys(keys)
        found = self.find(keys.reshape(-1))
        out = torch.zeros((len(found), self.width), dtype=self._rows.dtype, device=keys.device)
        hit = torch.nonzero(found >= 0).flatten()
        if len(hit):
            out[hit] = self._rows.index_select(0, found[hit])
        return out.view(*keys.shape, self.width)

    def block(self, owners: np.ndarray | torch.Tensor, span: int) -> torch.Tensor:
        """``get`` of every key of each owner, ``(len(owners), span, width)``: the keys
        ``owner * span + j`` for ``j < span`` (FedRAP's D_i over every item), found as one
        range of each sorted run an owner instead of a search for each of its ``span`` keys."""
        owners = self._keys(owners)
        out = torch.zeros((len(owners) * span, self.width), dtype=self._rows.dtype, device=owners.device)
        for run_keys, run_slots in self._runs:
            lo = torch.searchsorted(run_keys, owners * span)
            count = torch.searchsorted(run_keys, (owners + 1) * span) - lo
            total = int(count.sum())
            if not total:
                continue
            # the owners' places in the run: lo[o] + 0 .. count[o] - 1, owner by owner
            owner = torch.repeat_interleave(torch.arange(len(owners), device=owners.device), count,
                                            output_size=total)
            at = lo[owner] + torch.arange(total, device=owners.device) - (torch.cumsum(count, 0) - count)[owner]
            out[owner * span + run_keys[at] % span] = self._rows.index_select(0, run_slots[at])
        return out.view(len(owners), span, self.width)

    def put(self, keys: np.ndarray | torch.Tensor, values: torch.Tensor) -> None:
        """Store ``values`` (``(len(keys), width)``) as the rows of ``keys`` (distinct)."""
        slots = self.slots(keys)  # first: storing new keys may reallocate the rows
        self._rows.index_copy_(0, slots, values.to(self._rows.device))

    def _reserve(self, n: int) -> None:
        """Room for ``n`` rows, growing by half again so appends are amortised O(1)."""
        if n <= self._rows.shape[0]:
            return
        grown = torch.zeros((max(n, self._rows.shape[0] * 3 // 2), self.width), dtype=self._rows.dtype,
                            device=self._rows.device)
        grown[: self._used] = self._rows[: self._used]
        self._rows = grown

    # -- checkpoints ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Keys (sorted) and their rows in key order: independent of the order keys arrived."""
        empty = torch.zeros(0, dtype=torch.int64, device=self._rows.device)
        keys = torch.cat([k for k, _ in self._runs] or [empty])
        slots = torch.cat([s for _, s in self._runs] or [empty])
        keys, order = torch.sort(keys, stable=True)
        return {"keys": keys, "rows": self._rows.index_select(0, slots[order])}

    @classmethod
    def from_state(cls, blob: dict[str, Any]) -> KeyedRows:
        rows = blob["rows"]
        store = cls(int(rows.shape[1]))
        store._rows = rows.clone()
        keys = store._keys(blob["keys"])
        if len(keys):
            store._runs = [(keys, torch.arange(len(keys), device=keys.device))]
        store._used = len(keys)
        return store
