"""Named, leak-free evaluation protocols: splits, evaluation candidates, training negatives."""

from __future__ import annotations

from fedrec.protocols.protocol import (
    NEGATIVE_POLICIES,
    PROTOCOLS,
    EvalSet,
    Protocol,
    Split,
    get_protocol,
    make_split,
)

__all__ = ["NEGATIVE_POLICIES", "PROTOCOLS", "EvalSet", "Protocol", "Split", "get_protocol", "make_split"]
