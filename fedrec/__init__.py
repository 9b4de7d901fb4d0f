"""fedrec: federated recommendation with leak-free protocols and cohort-vectorised simulation."""

from __future__ import annotations

__version__ = "0.1.0"
