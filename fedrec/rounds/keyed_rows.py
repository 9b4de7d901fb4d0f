"""Rows stored only for the keys that were written: FedRAP's private item views D_i.

A client's D_i starts at zero and a row changes only when the client trains that item, so
the rows never touched are zero and need no storage. Keys are ``client * n_items + item``
(int64). Rows are appended in the order keys first appear, so storing a key never moves a
row; the keys live in a few sorted runs beside their rows' slots, merged like a binary counter
(a run is merged into the one before it once that one is at most twice its size). Storing the
keys of a chunk of clients thus costs amortised O(log n) a key instead of the O(n) of inserting
into one sorted array (which made FedRAP's early rounds at ML-1M scale 40% slower), and a
lookup is one ``searchsorted`` a run (at most log2 of the number of chunks that added keys). Memory is 144 bytes a touched (client, item) at width 32 (a dense table costs
128 bytes for every pair): far less on sparse data (Ciao: 0.3% of its 775 million pairs
are ever rated), slightly more where clients end up touching nearly every item.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrec.rounds.ragged import ranges


class KeyedRows:
    """A zero-default table of ``width``-wide rows addressed by int64 keys."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted keys, their rows' slots)
        self._rows = torch.zeros((0, width))
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

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key, -1 where the key was never stored."""
        keys = np.asarray(keys, np.int64)
        out = np.full(keys.shape, -1, np.int64)
        for run_keys, run_slots in self._runs:
            pos = np.searchsorted(run_keys, keys).clip(max=len(run_keys) - 1)
            hit = run_keys[pos] == keys
            out[hit] = run_slots[pos[hit]]
        return out

    def _add_run(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Add sorted new ``keys``, merging runs while the last is at least half the one before."""
        self._runs.append((keys, slots))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (a_keys, a_slots), (b_keys, b_slots) = self._runs[-2], self._runs.pop()
            merged = np.concatenate([a_keys, b_keys])
            order = np.argsort(merged, kind="stable")  # two sorted runs: timsort merges them in O(n)
            self._runs[-1] = (merged[order], np.concatenate([a_slots, b_slots])[order])

    def slots(self, keys: np.ndarray) -> torch.Tensor:
        """The slot of each key, storing a zero row for each key not yet stored."""
        keys = np.asarray(keys, np.int64)
        out = self.find(keys)
        missing = out < 0
        if missing.any():
            new = np.unique(keys[missing])
            new_slots = np.arange(self._used, self._used + len(new), dtype=np.int64)
            self._reserve(self._used + len(new))
            self._used += len(new)
            self._add_run(new, new_slots)
            out[missing] = new_slots[np.searchsorted(new, keys[missing])]
        return torch.as_tensor(out)

    def get(self, keys: np.ndarray) -> torch.Tensor:
        """The rows of ``keys`` (any shape; zero rows for keys never stored), ``keys.shape + (width,)``."""
        keys = np.asarray(keys, np.int64)
        found = self.find(keys.ravel())
        out = torch.zeros((found.size, self.width), dtype=self._rows.dtype)
        hit = np.flatnonzero(found >= 0)
        if len(hit):
            out[torch.as_tensor(hit)] = self._rows.index_select(0, torch.as_tensor(found[hit]))
        return out.view(*keys.shape, self.width)

    def block(self, owners: np.ndarray, span: int) -> torch.Tensor:
        """``get`` of every key of each owner, ``(len(owners), span, width)``: the keys
        ``owner * span + j`` for ``j < span`` (FedRAP's D_i over every item), found as one
        range of each sorted run an owner instead of a search for each of its ``span`` keys."""
        owners = np.asarray(owners, np.int64)
        out = torch.zeros((len(owners) * span, self.width), dtype=self._rows.dtype)
        for run_keys, run_slots in self._runs:
            lo = np.searchsorted(run_keys, owners * span)
            count = np.searchsorted(run_keys, (owners + 1) * span) - lo
            at = ranges(lo, count)  # the owners' places in the run
            target = np.repeat(np.arange(len(owners)), count) * span + run_keys[at] % span
            if len(at):
                out[torch.as_tensor(target)] = self._rows.index_select(0, torch.as_tensor(run_slots[at]))
        return out.view(len(owners), span, self.width)

    def put(self, keys: np.ndarray, values: torch.Tensor) -> None:
        """Store ``values`` (``(len(keys), width)``) as the rows of ``keys`` (distinct)."""
        slots = self.slots(keys)  # first: storing new keys may reallocate the rows
        self._rows.index_copy_(0, slots, values)

    def _reserve(self, n: int) -> None:
        """Room for ``n`` rows, growing by half again so appends are amortised O(1)."""
        if n <= self._rows.shape[0]:
            return
        grown = torch.zeros((max(n, self._rows.shape[0] * 3 // 2), self.width), dtype=self._rows.dtype)
        grown[: self._used] = self._rows[: self._used]
        self._rows = grown

    # -- checkpoints ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Keys (sorted) and their rows in key order: independent of the order keys arrived."""
        keys = np.concatenate([k for k, _ in self._runs] or [np.zeros(0, np.int64)])
        slots = np.concatenate([s for _, s in self._runs] or [np.zeros(0, np.int64)])
        order = np.argsort(keys, kind="stable")
        return {"keys": torch.as_tensor(keys[order]),
                "rows": self._rows.index_select(0, torch.as_tensor(slots[order]))}

    @classmethod
    def from_state(cls, blob: dict[str, Any]) -> KeyedRows:
        rows = blob["rows"]
        store = cls(int(rows.shape[1]))
        keys = blob["keys"].cpu().numpy().astype(np.int64)
        if len(keys):
            store._runs = [(keys, np.arange(len(keys), dtype=np.int64))]
        store._rows = rows.clone()
        store._used = len(keys)
        return store
