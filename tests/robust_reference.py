"""The coordinate-wise median written out plainly, for the tests that check a defended round
against a per-client reference (tests/test_*_security.py): nothing here calls
`fedrec.security.robust`."""

from __future__ import annotations

import torch


def median(x: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median over the first axis (the two middle values' mean)."""
    s, c = x.sort(0).values, len(x)
    return (s[(c - 1) // 2] + s[c // 2]) / 2


def clamped_to_median(x: torch.Tensor) -> torch.Tensor:
    """Each of ``x``'s rows clamped, coordinate by coordinate, between the two middle values (the
    one middle value for an odd count): each row moves by the median, and their sum is the
    count x the median (what `RobustRule.admit` keeps of each client under the median)."""
    s, c = x.sort(0).values, len(x)
    return torch.minimum(torch.maximum(x, s[(c - 1) // 2]), s[c // 2])
