"""fedrec: federated recommendation with leak-free protocols and cohort-vectorised simulation.

The public API (docs/api.md): `run` trains an algorithm and returns a `Run` (figures, the
trained model, `Run.recommend`, `Run.save`); `load` reads a saved run back; `list_algorithms` and
`list_protocols` name what is registered; `compare` tunes and runs several algorithms alike on
one data set and writes their leaderboard, curves and report.
"""

from __future__ import annotations

from fedrec.version import __version__

__all__ = ["Run", "RunConfig", "compare", "list_algorithms", "list_protocols", "load", "run", "__version__"]


def list_algorithms() -> list[str]:
    """Names of the registered algorithms."""
    from fedrec.algorithms import ALGORITHMS

    return list(ALGORITHMS)


def list_protocols() -> list[str]:
    """Names of the evaluation protocols."""
    from fedrec.protocols.protocol import PROTOCOLS

    return list(PROTOCOLS)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # imported on first use: `import fedrec` stays cheap (no torch) for the CLI's --help
    if name in ("run", "load", "Run"):
        from fedrec import api

        return getattr(api, name)
    if name == "compare":
        from fedrec.comparison import compare

        return compare
    if name == "RunConfig":
        from fedrec.experiment import RunConfig

        return RunConfig
    raise AttributeError(f"module 'fedrec' has no attribute {name!r}")
