"""The `fedrec` command line (placeholder until the root app lands)."""

from __future__ import annotations


def main() -> None:
    raise SystemExit("fedrec CLI is being built")
