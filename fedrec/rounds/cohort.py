"""The local data of a cohort laid out for lockstep training of all its clients at once.

Every client's samples (its training positives plus freshly drawn negatives) are shuffled and
cut into its own minibatches. Clients are ordered by how many batches they have, so at step t
the clients that still have a batch form a prefix ``[:n_active]``: a step touches exactly the
active clients, and a client that ran out of batches is simply not in the step — the same as
padding it with zero-weight steps, without the wasted work. The last batch of a client may be
short; ``mask`` marks its real slots.

Items live in *local rows*: the distinct (client, item) pairs the cohort touches this round,
flattened with per-client pointers. A client that touches L items holds L rows, never the
whole table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
import torch


@dataclass
class Step:
    """One lockstep minibatch of the ``n_active`` clients that still have a batch.

    Its real slots are flat, client by client (``flat_owner``: the client's position among the
    active ones; ``flat_slot``: the slot's place in its client's batch). ``rows``/``labels``/
    ``mask`` lay them out as ``(n_active, batch_size)`` blocks, built on first use: the item
    family trains on blocks, FedRAP on the flat slots (its batch of 2048 is mostly padding).
    """

    n_active: int
    batch_size: int
    flat_rows: np.ndarray
    flat_owner: np.ndarray
    flat_labels: np.ndarray
    flat_slot: np.ndarray

    @cached_property
    def _blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shape = (self.n_active, self.batch_size)
        rows, labels, mask = np.zeros(shape, np.int64), np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        at = (self.flat_owner, self.flat_slot)
        rows[at], labels[at], mask[at] = self.flat_rows, self.flat_labels, 1.0
        # padding slots (the tail of a client's last batch) repeat the client's last real row,
        # never another client's: a masked slot still computes 0 * value, and a non-finite row
        # of one client must not turn into NaN gradients for every client with a short batch
        counts = np.bincount(self.flat_owner, minlength=self.n_active)
        last = rows[np.arange(self.n_active), counts - 1]
        return np.where(mask > 0, rows, last[:, None]), labels, mask

    @property
    def rows(self) -> np.ndarray:
        return self._blocks[0]

    @property
    def labels(self) -> np.ndarray:
        return self._blocks[1]

    @property
    def mask(self) -> np.ndarray:
        return self._blocks[2]


@dataclass
class CohortBatches:
    """A cohort's local rows and lockstep minibatches for one round.

    ``clients`` are client ids (here: users) in training order. Local rows of client k are
    ``row_ptr[k]:row_ptr[k+1]`` and hold items ``row_items`` (sorted within a client).
    ``samples_*`` keep each client's sample sequence in order, for the reference engine (a
    client whose samples fit one batch keeps them unshuffled: its batch holds them all anyway);
    a layout built on the device (`fedrec.rounds.device_cohort`) keeps none.
    """

    clients: np.ndarray
    row_items: np.ndarray
    row_ptr: np.ndarray
    steps: list[Step]
    steps_per_epoch: int
    sample_client: np.ndarray | None
    sample_row: np.ndarray | None
    sample_label: np.ndarray | None

    @property
    def n_rows(self) -> int:
        return len(self.row_items)

    def rows_of(self, k: int) -> slice:
        return slice(int(self.row_ptr[k]), int(self.row_ptr[k + 1]))


def order_by_activity(train: sp.csr_matrix, clients: np.ndarray) -> np.ndarray:
    """Clients sorted by decreasing training size (stable), so active clients form a prefix."""
    counts = np.diff(train.indptr)[clients]
    return clients[np.argsort(-counts, kind="stable")]


def chunk_clients(clients: np.ndarray, sizes: np.ndarray, budget: int) -> list[np.ndarray]:
    """``clients`` cut in consecutive parts of at most ``budget`` summed ``sizes`` (one client
    at least a part): memory-sized chunks of whole clients."""
    parts, start, total = [], 0, 0
    for k, size in enumerate(sizes.tolist()):
        if total + size > budget and k > start:
            parts.append(clients[start:k])
            start, total = k, 0
        total += size
    if start < len(clients):
        parts.append(clients[start:])
    return parts


def build_cohort(
    train: sp.csr_matrix,
    clients: np.ndarray,
    negatives: np.ndarray | None,
    batch_size: int,
    shuffle_keys: np.ndarray,
    ratings: bool = False,
    label_offsets: np.ndarray | None = None,
) -> CohortBatches:
    """Lay out ``clients`` (already in `order_by_activity` order) for lockstep training.

    ``negatives`` is ``(n_positives, k)``: k negatives for each training positive of the
    cohort, in CSR order of ``clients``; None trains on positives only. ``shuffle_keys`` is
    ``(epochs, n_samples)``: one random key per sample and local epoch, in canonical order
    (client by client; a client's positives, then its negatives). Drawing randomness outside
    keeps a round's result independent of how its cohort is cut into memory-sized chunks.
    ``ratings``: a positive's label is its value in ``train`` (the observed rating, for a loss
    on ratings) instead of 1, less the client's ``label_offsets`` entry when given (the rating
    baseline's offset, `fedrec.federated.family.spec.FamilySpec.baseline`).
    """
    n_items = train.shape[1]
    counts = np.diff(train.indptr)[clients].astype(np.int64)
    starts = train.indptr[clients].astype(np.int64)
    pos_client = np.repeat(np.arange(len(clients)), counts)
    offset = np.arange(len(pos_client)) - np.repeat(np.cumsum(counts) - counts, counts)
    pos_at_train = np.repeat(starts, counts) + offset
    pos_items = train.indices[pos_at_train].astype(np.int64)
    k = negatives.shape[1] if negatives is not None else 0
    per_client = counts * (1 + k)
    first = np.cumsum(per_client) - per_client
    # canonical order without a sort: each client's positives, then its negatives
    n = int(per_client.sum())
    client = np.repeat(np.arange(len(clients)), per_client)
    items = np.empty(n, np.int64)
    labels = np.zeros(n, np.float32)
    pos_at = first[pos_client] + offset
    items[pos_at] = pos_items
    labels[pos_at] = train.data[pos_at_train] if ratings else 1.0
    if label_offsets is not None:
        labels[pos_at] -= np.asarray(label_offsets, np.float32)[pos_client]
    if k:
        neg_at = (first[pos_client] + counts[pos_client])[:, None] + offset[:, None] * k + np.arange(k)
        items[neg_at.ravel()] = negatives.ravel()
    keys = client * n_items + items
    uniq, sample_row = _unique_inverse(keys, len(clients) * n_items)
    row_items = uniq % n_items
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(uniq // n_items, minlength=len(clients)))])

    # Clients whose samples fit one batch train on the same batch every epoch: a shuffle only
    # permutes its slots, which `_lockstep` orders by row. In `order_by_activity` order they
    # are the last clients; their samples are laid out once (`tail`) and their shuffle keys
    # are not read. Clients before the last larger one are shuffled as usual.
    many = np.flatnonzero(per_client > batch_size)
    head = int(many[-1]) + 1 if len(many) else 0
    split = int(first[head]) if head < len(clients) else n
    tail = _one_batch_step(client[split:], sample_row[split:], labels[split:], batch_size)
    seq_client, seq_row, seq_label, steps = [], [], [], []
    bits = 62 - len(clients).bit_length()  # a client id above the key's bits, in an int64
    for epoch_keys in shuffle_keys:
        # shuffle within clients: sort by (client, key); keys are continuous, so ties (at 2^-bits)
        # are as unlikely as equal floats
        order = argsort_ints((client[:split].astype(np.int64) << bits)
                             | (epoch_keys[:split] * 2.0**bits).astype(np.int64))
        c, r, y = client[order], sample_row[order], labels[order]
        seq_client += [c, client[split:]]
        seq_row += [r, sample_row[split:]]
        seq_label += [y, labels[split:]]
        steps.extend(_lockstep(c, r, y, per_client[:head], first[:head], batch_size, tail))
    return CohortBatches(
        clients=clients, row_items=row_items, row_ptr=row_ptr, steps=steps,
        steps_per_epoch=len(steps) // max(len(shuffle_keys), 1),
        sample_client=np.concatenate(seq_client), sample_row=np.concatenate(seq_row),
        sample_label=np.concatenate(seq_label),
    )


#: keys from which a run on a GPU sorts there (below, the copies cost more than the sort)
DEVICE_SORT_MIN = 1 << 14


def argsort_ints(keys: np.ndarray) -> np.ndarray:
    """``np.argsort`` of non-negative int64 ``keys`` (stable), by PyTorch's CPU radix sort: 4x
    numpy's (measured: 2.6 against 11.2 ms for 2x10^5 keys, one thread, numpy 2.4 / torch
    2.13); building a cohort sorts its samples a few times. Keys that fit 31 bits are sorted
    as int32: a radix sort's passes go by byte, and four take half the time of eight
    (measured: 1.5 against 2.7 ms for 2x10^5 keys below 2^20)."""
    t = torch.as_tensor(keys, device="cpu")
    if len(t) and int(t.max()) < 2**31:
        t = t.int()
    run_device = torch.get_default_device()
    if run_device.type != "cpu" and len(t) >= DEVICE_SORT_MIN:
        # a CUDA run sorts on the device: the host sort was 30-45% of a round there (py-spy,
        # H200, PFedRec and FedRAP at ML-1M size); a stable sort's order is the same anywhere
        t = t.to(run_device)
    return torch.sort(t, stable=True).indices.cpu().numpy()


def _unique_inverse(keys: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, n_cells)``.

    When the cells are few next to the keys (a chunk of clients times the catalogue), marking
    them in a dense bitmap is several times faster than sorting.
    """
    if n_cells > 4 * len(keys):
        return np.unique(keys, return_inverse=True)
    mark = np.zeros(n_cells, bool)
    mark[keys] = True
    rank = np.cumsum(mark) - 1
    return np.flatnonzero(mark), rank[keys]


def _one_batch_step(client: np.ndarray, row: np.ndarray, label: np.ndarray, batch_size: int) -> Step | None:
    """The batch of the last clients, whose samples each fit one batch: their slots ordered by
    local row (`_lockstep`'s order), as step 0 of every epoch holds them."""
    if not len(client):
        return None
    order = argsort_ints(row)  # rows are numbered client by client: this groups clients too
    c, r = client[order], row[order]
    new_client = np.r_[True, c[1:] != c[:-1]]
    slot = np.arange(len(c)) - np.flatnonzero(new_client)[np.cumsum(new_client) - 1]
    return Step(int(c[-1]) + 1, batch_size, r, c, label[order], slot)


def _lockstep(client: np.ndarray, row: np.ndarray, label: np.ndarray, per_client: np.ndarray,
              first: np.ndarray, batch_size: int, tail: Step | None = None) -> list[Step]:
    """Cut client-grouped samples into steps of ``(n_active, batch_size)`` blocks.

    Batch t of a client holds its samples ``t*B .. (t+1)*B - 1`` in shuffled order. Within a
    batch the slots are ordered by local row: a batch's loss is a mean, so slot order is free,
    and sorted indices make gathering and scatter-adding rows several times faster. Each step
    is a slice of the sorted samples. ``tail``: the later clients' one batch each
    (`_one_batch_step`), joined to step 0 (the same object every epoch when there is nothing
    else to train).
    """
    if not len(client):
        return [] if tail is None else [tail]
    pos = np.arange(len(client)) - first[client]
    t = pos // batch_size
    n_batches = -(-per_client // batch_size)
    n_active = (n_batches[None, :] > np.arange(int(n_batches.max()))[:, None]).sum(1)
    # local rows are numbered client by client, so sorting by (step, row) also groups clients
    order = argsort_ints(t * (int(row.max()) + 1) + row)  # ties: a duplicate negative, identical slots
    c, r, ts = client[order], row[order], t[order]
    new_group = np.empty(len(c), bool)
    new_group[0] = True
    new_group[1:] = (c[1:] != c[:-1]) | (ts[1:] != ts[:-1])
    group_first = np.flatnonzero(new_group)
    j = np.arange(len(c)) - group_first[np.cumsum(new_group) - 1]
    y = label[order]
    at = np.searchsorted(ts, np.arange(len(n_active) + 1))
    steps = [Step(int(n), batch_size, r[a:b], c[a:b], y[a:b], j[a:b])
             for n, a, b in zip(n_active, at[:-1], at[1:], strict=True)]
    if tail is not None:
        s0 = steps[0]
        steps[0] = Step(tail.n_active, batch_size, *(np.concatenate([mine, later]) for mine, later in (
            (s0.flat_rows, tail.flat_rows), (s0.flat_owner, tail.flat_owner),
            (s0.flat_labels, tail.flat_labels), (s0.flat_slot, tail.flat_slot))))
    return steps
