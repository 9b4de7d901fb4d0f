"""A chunk's draws and lockstep layout built with torch on the run's device.

On a GPU, building a cohort's layout in numpy on the host and copying it over is most of a round:
the kernels of PFedRec's round at ML-1M size are busy 59 ms of about a second (H200 profile,
`docs/scale.md`). The layout is integer hashing (`fedrec.rounds.draws`), gathers, cumulative
sums and stable sorts, all of which torch runs on the device; this module makes the same draws and
the same layout as `fedrec.federated.engine.client_draws` and `fedrec.rounds.cohort.build_cohort`
with torch, element for element (a test compares them on the CPU, and the `gpu` tests on CUDA), so
every figure stays the same. Only per-client arrays and the cohort's (client, item) rows come back
to the host; the per-sample arrays (negatives, shuffle keys, the steps' slots) stay on the device.

The CPU keeps the numpy layout (`use_device_layout`): there the copies cost nothing and numpy's
layout is as fast.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.protocols.negatives import ComplementSampler
from fedrec.rounds import draws
from fedrec.rounds.cohort import CohortBatches, Step
from fedrec.rounds.ragged import index_counts

# SplitMix64's constants as the int64 holding the same bits: torch's int64 arithmetic wraps as
# numpy's uint64 does, and the shifts are made logical with a mask
_GOLDEN = int(np.uint64(draws._GOLDEN).astype(np.int64))
_C1 = int(np.uint64(draws._C1).astype(np.int64))
_C2 = int(np.uint64(draws._C2).astype(np.int64))


def use_device_layout(state: Any) -> bool:
    """Whether a chunk of ``state``'s clients is laid out on the run's device: on a GPU, for a
    state that reads its steps as tensors (`FamilyState.device_steps`)."""
    return torch.get_default_device().type == "cuda" and getattr(state, "device_steps", False)


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` on int64 is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """`fedrec.rounds.draws._mix` on int64 tensors."""
    z = (z ^ _srl(z, 30)) * _C1
    z = (z ^ _srl(z, 27)) * _C2
    return z ^ _srl(z, 31)


def uniforms(key: tuple[int, ...], clients: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """`fedrec.rounds.draws.uniforms` on the device of ``clients`` (int64 ids) and ``counts``."""
    k = int(draws._key(key).astype(np.int64)[0])
    base = _mix(clients * _GOLDEN + k)
    total = int(counts.sum())
    first = torch.cumsum(counts, 0) - counts
    pos = torch.arange(total, device=clients.device) - torch.repeat_interleave(first, counts, output_size=total)
    z = _mix(torch.repeat_interleave(base, counts, output_size=total) + (pos + 1) * _C1)
    return _srl(z, 11).double() * (1.0 / (1 << 53))


class DeviceSampler:
    """A `ComplementSampler`'s arrays on a device, for `sample_at` there (the same draws)."""

    def __init__(self, sampler: ComplementSampler, device: torch.device) -> None:
        def put(a: np.ndarray | None, dtype: type = np.int64) -> torch.Tensor | None:
            return None if a is None else torch.as_tensor(np.asarray(a, dtype), device=device)

        self.n_allowed = put(sampler.n_allowed)
        self.indptr = put(sampler.indptr)
        self.stride = sampler._stride
        # the table keeps its compact width (int16 below 32,768 items); a gather widens it
        table = sampler._table
        self.table = None if table is None else put(table, table.dtype)
        self.table_ptr = put(sampler._table_ptr)
        self.keys = None if self.table is not None else put(sampler._keys)

    @staticmethod
    def of(sampler: ComplementSampler, device: torch.device) -> DeviceSampler:
        """The sampler's device arrays, made once per sampler and device."""
        cache: dict[torch.device, DeviceSampler] = sampler.__dict__.setdefault("_on_device", {})
        if device not in cache:
            cache[device] = DeviceSampler(sampler, device)
        return cache[device]

    def sample_at(self, users: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """`ComplementSampler.sample_at` (the caller has checked `ComplementSampler.require_allowed`)."""
        r = (u * self.n_allowed[users][:, None].double()).long()
        if self.table is not None:
            return self.table[self.table_ptr[users][:, None] + r].long()
        q = users[:, None] * self.stride + r
        assert self.keys is not None and self.indptr is not None
        return r + torch.searchsorted(self.keys, q, right=True) - self.indptr[users][:, None]


class DeviceStep(Step):
    """A `Step` whose slots are tensors on the device, with its blocks built there."""

    @cached_property
    def _blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        owner, slot = self.flat_owner, self.flat_slot
        device = owner.device
        shape = (self.n_active, self.batch_size)
        rows = torch.zeros(shape, dtype=torch.int64, device=device)
        labels = torch.zeros(shape, dtype=torch.float32, device=device)
        mask = torch.zeros(shape, dtype=torch.float32, device=device)
        rows[owner, slot] = self.flat_rows
        labels[owner, slot] = self.flat_labels
        mask[owner, slot] = 1.0
        # as `Step._blocks`: a padding slot repeats its client's last real row
        last = rows[torch.arange(self.n_active, device=device), index_counts(owner, self.n_active) - 1]
        return torch.where(mask > 0, rows, last[:, None]), labels, mask


def device_cohort(train: sp.csr_matrix, sampler: ComplementSampler, rows: np.ndarray, clients: np.ndarray,
                  k: int, epochs: int, batch_size: int, seed: int, r: int, *, ratings: bool = False,
                  label_offsets: np.ndarray | None = None, device: torch.device | str | None = None
                  ) -> CohortBatches:
    """Round ``r``'s draws and layout of ``clients`` (ids; rows ``rows`` of ``train``, in
    `order_by_activity` order) with ``k`` negatives a positive and ``epochs`` local epochs:
    `client_draws` then `build_cohort`, on ``device`` (default: the run's). The per-sample
    record of the reference engine (``sample_*``) is not kept."""
    dev = torch.device(device) if device is not None else torch.get_default_device()
    n_items = train.shape[1]
    C = len(rows)
    counts_np = np.diff(train.indptr)[rows].astype(np.int64)
    per_client_np = counts_np * (1 + k)
    first_np = np.cumsum(per_client_np) - per_client_np
    n = int(per_client_np.sum())
    P = int(counts_np.sum())

    def put(a: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.as_tensor(a, device=dev).to(dtype)

    counts, per_client, first = put(counts_np), put(per_client_np), put(first_np)
    ids = put(np.asarray(clients, np.int64))
    # the positives, in CSR order (gathered on the host: one pass over the chunk's rows)
    starts = train.indptr[rows].astype(np.int64)
    pos_at_train = np.repeat(starts - np.cumsum(counts_np) + counts_np, counts_np) + np.arange(P)
    pos_items = put(train.indices[pos_at_train])
    pos_client = torch.repeat_interleave(torch.arange(C, device=dev), counts, output_size=P)
    offset = torch.arange(P, device=dev) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts,
                                                                   output_size=P)
    client = torch.repeat_interleave(torch.arange(C, device=dev), per_client, output_size=n)
    items = torch.empty(n, dtype=torch.int64, device=dev)
    labels = torch.zeros(n, dtype=torch.float32, device=dev)
    pos_at = first[pos_client] + offset
    items[pos_at] = pos_items
    if ratings:
        labels[pos_at] = put(np.asarray(train.data[pos_at_train], np.float32), torch.float32)
    else:
        labels[pos_at] = 1.0
    if label_offsets is not None:
        labels[pos_at] -= put(np.asarray(label_offsets, np.float32), torch.float32)[pos_client]
    if k:
        sampler.require_allowed(rows)  # before any draw
        u = uniforms((seed, draws.NEGATIVES, r), ids, counts * k).reshape(-1, k)
        negs = DeviceSampler.of(sampler, dev).sample_at(torch.repeat_interleave(put(rows), counts, output_size=P), u)
        neg_at = (first[pos_client] + counts[pos_client])[:, None] + offset[:, None] * k + torch.arange(k, device=dev)
        items[neg_at.reshape(-1)] = negs.reshape(-1)
    keys = client * n_items + items
    uniq, sample_row = torch.unique(keys, sorted=True, return_inverse=True)
    row_items = (uniq % n_items).cpu().numpy()
    row_ptr = np.concatenate([[0], np.cumsum(torch.bincount(uniq // n_items, minlength=C).cpu().numpy())])

    many = np.flatnonzero(per_client_np > batch_size)
    head = int(many[-1]) + 1 if len(many) else 0
    split = int(first_np[head]) if head < C else n
    tail = _one_batch_step(client[split:], sample_row[split:], labels[split:], batch_size)
    bits = 62 - C.bit_length()
    steps: list[Step] = []
    for e in range(epochs):
        key = uniforms((seed, draws.SHUFFLE, r, e), ids, per_client)
        order = torch.sort((client[:split] << bits) | (key[:split] * 2.0**bits).long(), stable=True).indices
        c, row, y = client[order], sample_row[order], labels[order]
        steps.extend(_lockstep(c, row, y, per_client_np[:head], first[:head], batch_size, tail))
    return CohortBatches(clients=np.asarray(rows), row_items=row_items, row_ptr=row_ptr, steps=steps,
                         steps_per_epoch=len(steps) // max(epochs, 1), sample_client=None,
                         sample_row=None, sample_label=None)


def _one_batch_step(client: torch.Tensor, row: torch.Tensor, label: torch.Tensor, batch_size: int
                    ) -> DeviceStep | None:
    """`fedrec.rounds.cohort._one_batch_step` on the device."""
    if not len(client):
        return None
    order = torch.sort(row, stable=True).indices
    c, r = client[order], row[order]
    new_client = torch.ones(len(c), dtype=torch.bool, device=c.device)
    new_client[1:] = c[1:] != c[:-1]
    slot = torch.arange(len(c), device=c.device) - torch.nonzero(new_client).flatten()[torch.cumsum(new_client, 0) - 1]
    return DeviceStep(int(c[-1]) + 1, batch_size, r, c, label[order], slot)


def _lockstep(client: torch.Tensor, row: torch.Tensor, label: torch.Tensor, per_client: np.ndarray,
              first: torch.Tensor, batch_size: int, tail: DeviceStep | None) -> list[Step]:
    """`fedrec.rounds.cohort._lockstep` on the device."""
    if not len(client):
        return [] if tail is None else [tail]
    dev = client.device
    pos = torch.arange(len(client), device=dev) - first[client]
    t = torch.div(pos, batch_size, rounding_mode="floor")
    n_batches = -(-per_client // batch_size)
    n_active = (n_batches[None, :] > np.arange(int(n_batches.max()))[:, None]).sum(1)
    order = torch.sort(t * (int(row.max()) + 1) + row, stable=True).indices
    c, r, ts = client[order], row[order], t[order]
    new_group = torch.ones(len(c), dtype=torch.bool, device=dev)
    new_group[1:] = (c[1:] != c[:-1]) | (ts[1:] != ts[:-1])
    group_first = torch.nonzero(new_group).flatten()
    j = torch.arange(len(c), device=dev) - group_first[torch.cumsum(new_group, 0) - 1]
    y = label[order]
    at = torch.searchsorted(ts, torch.arange(len(n_active) + 1, device=dev)).cpu().numpy()
    steps: list[Step] = [DeviceStep(int(m), batch_size, r[a:b], c[a:b], y[a:b], j[a:b])
                         for m, a, b in zip(n_active, at[:-1], at[1:], strict=True)]
    if tail is not None:
        s0 = steps[0]
        steps[0] = DeviceStep(tail.n_active, batch_size, *(torch.cat([mine, later]) for mine, later in (
            (s0.flat_rows, tail.flat_rows), (s0.flat_owner, tail.flat_owner),
            (s0.flat_labels, tail.flat_labels), (s0.flat_slot, tail.flat_slot))))
    return steps
