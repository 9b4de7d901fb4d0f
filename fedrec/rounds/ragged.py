"""Ragged index arithmetic shared by the engine's stores: many ``arange`` runs as one array."""

from __future__ import annotations

import numpy as np


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for every (s, l), without a Python loop."""
    lengths = np.asarray(lengths, np.int64)
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(np.asarray(starts, np.int64), lengths) + offsets
