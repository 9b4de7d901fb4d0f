"""Pseudo-item padding: a client also uploads noisy rows for items it never touched.

Which rows a client uploads tells the server which items it touched (its positives and this
round's sampled negatives; `fedrec.security.inference` measures it). FedMF (Chai et al., 2020)
and FedGNN (Wu et al., 2021) hide that set by also sending rows for randomly chosen items, with
values drawn from a Gaussian whose spread matches the client's real updates. The cost is paid
twice: in bytes (the pseudo rows travel like real ones) and in accuracy (their noise enters
the average). Here each client adds ``pad_items`` pseudo rows, drawn uniformly without
replacement among the items it did not touch this round, with N(0, σ²) entries, σ the standard
deviation of its real row deltas' entries. Draws are keyed by (seed, round, client), so a Flower
node pads exactly as the simulator does.
"""

from __future__ import annotations

import numpy as np
import torch

from fedrec.rounds import draws
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES


def pseudo_rows(clients: np.ndarray, row_items: np.ndarray, row_ptr: np.ndarray, delta: torch.Tensor,
                n_items: int, n_pad: int, seed: int, r: int) -> tuple[np.ndarray, np.ndarray, torch.Tensor, int]:
    """Each client's pseudo rows: ``(ptr, items, rows, bytes)`` with client k's rows at
    ``ptr[k]:ptr[k+1]`` (items sorted), and the bytes they add to the upload."""
    c = len(clients)
    n_pad = min(n_pad, n_items)
    keys = draws.uniforms((seed, draws.PAD_ITEMS, r), clients, n_items).reshape(c, n_items)
    owner = np.repeat(np.arange(c), np.diff(row_ptr))
    keys[owner, row_items] = 2.0  # touched items are never drawn (keys are in [0, 1))
    free = np.minimum(n_items - np.diff(row_ptr), n_pad)
    order = np.argsort(keys, axis=1, kind="stable")[:, :n_pad]
    take = np.arange(n_pad)[None, :] < free[:, None]
    items = np.sort(np.where(take, order, n_items), axis=1)[take]  # the sentinel n_items sorts last
    ptr = np.concatenate([[0], np.cumsum(free)])
    width = delta.shape[1]
    counts = torch.as_tensor(np.diff(row_ptr))
    own = torch.repeat_interleave(torch.arange(c), counts)
    n_entries = (counts * width).clamp_min(1).double()
    mean = torch.zeros(c, dtype=torch.float64).index_add_(0, own, delta.double().sum(1)) / n_entries
    sq = torch.zeros(c, dtype=torch.float64).index_add_(0, own, delta.double().square().sum(1)) / n_entries
    sigma = (sq - mean.square()).clamp_min(0).sqrt().float()
    z = torch.as_tensor(draws.normals((seed, draws.PAD_VALUES, r), clients, n_pad * width), dtype=torch.float32)
    z = z.reshape(c, n_pad, width) * sigma[:, None, None]
    rows = z[torch.as_tensor(take)]
    return ptr, items.astype(np.int64), rows, int(free.sum()) * (INDEX_BYTES + width * FLOAT_BYTES)
