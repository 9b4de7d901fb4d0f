"""Ragged index arithmetic shared by the engine's stores: many ``arange`` runs as one array,
and counts of indices."""

from __future__ import annotations

import numpy as np
import torch


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for every (s, l), without a Python loop."""
    lengths = np.asarray(lengths, np.int64)
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(np.asarray(starts, np.int64), lengths) + offsets


def index_counts(index: torch.Tensor, n: int) -> torch.Tensor:
    """``torch.bincount(index, minlength=n)`` for ``0 <= index < n``, without waiting for the
    device: CUDA's bincount reads the largest index back to size its output, a wait for every
    kernel queued before it (once a lockstep step, where the host should run ahead)."""
    return torch.zeros(n, dtype=torch.int64, device=index.device).index_add_(0, index, torch.ones_like(index))
