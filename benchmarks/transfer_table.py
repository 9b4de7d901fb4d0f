"""Print the transfer table of docs/defaults.md from the cells of two bench folders: test HR@10
at the best validation round (mean ± sample std over seeds) of each method at fedrec's defaults
and under its paper's setting, beside centralised MF, one column per data set:

    python benchmarks/transfer_table.py results/bench/transfer-defaults results/bench/transfer-papers \
        --tuned results/transfer-tuned/ml-100k results/transfer-tuned/lastfm-2k

``--tuned`` adds a third table from `fedrec compare` folders: each method after the same tuning
budget on validation (its defaults one of the trials), then the same seeds. ``--defaults-also``
and ``--papers-also`` add the cells of more bench folders (a GPU's, say) to either side, and
``--protocol loo-full`` reports full ranking. A method none of whose seeds completed is shown
as diverged.

    python benchmarks/transfer_table.py results/bench/transfer-defaults results/bench/transfer-papers \
        --defaults-also results/bench/transfer-defaults-gpu --papers-also results/bench/transfer-papers-gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def cells(folder: Path) -> dict[tuple[str, str, str], list[float]]:
    """(algorithm, data set, protocol) -> the test figure of each completed seed."""
    found: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for path in sorted((folder / "cells").glob("*.json")):
        r = json.loads(path.read_text())
        if r.get("status", "completed") == "completed":
            found[(r["algorithm"], r["dataset"], r["protocol"])].append(r["test"].get(METRIC, float("nan")))
        else:
            found.setdefault((r["algorithm"], r["dataset"], r["protocol"]), [])
    return found


def shown(values: list[float] | None) -> str:
    if values is None:
        return "not run"
    if not values:
        return "diverged"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {std:.3f}"


METRIC = "hr@10"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("defaults", type=Path)
    ap.add_argument("papers", type=Path)
    ap.add_argument("--protocol", default="loo-sampled")
    ap.add_argument("--tuned", type=Path, nargs="*", default=[], help="fedrec compare folders")
    ap.add_argument("--defaults-also", type=Path, nargs="*", default=[], help="more cells at the defaults")
    ap.add_argument("--papers-also", type=Path, nargs="*", default=[], help="more cells at the papers' settings")
    args = ap.parse_args()
    ours, papers = cells(args.defaults), cells(args.papers)
    for folder in args.defaults_also:
        ours.update(cells(folder))
    for folder in args.papers_also:
        papers.update(cells(folder))
    tuned: dict[tuple[str, str, str], list[float]] = {}
    for folder in args.tuned:
        tuned.update(cells(folder))
    datasets = sorted({d for _, d, p in ours if p == args.protocol},
                      key=lambda d: (d.startswith("synthetic"), d))
    algorithms = sorted({a for a, _, p in ours if p == args.protocol}, key=lambda a: (a != "mf", a))
    def table(title: str, cell) -> None:  # type: ignore[no-untyped-def]
        print(f"{title}\n")
        print("| method | " + " | ".join(datasets) + " |")
        print("|---|" + "---|" * len(datasets))
        for a in algorithms:
            row = [cell(a, d) for d in datasets]
            if any(row):
                print(f"| {a} | " + " | ".join(row) + " |")
        print()

    def mean(found, a: str, d: str) -> float | None:  # type: ignore[no-untyped-def]
        values = found.get((a, d, args.protocol))
        return statistics.mean(values) if values else None

    def at_defaults(a: str, d: str) -> str:
        mine, mf = mean(ours, a, d), mean(ours, "mf", d)
        gap = f" ({mine - mf:+.3f})" if a != "mf" and mine is not None and mf is not None else ""
        return shown(ours.get((a, d, args.protocol))) + gap

    def beside(other):  # type: ignore[no-untyped-def]
        """A cell of ``other``'s figures, with the defaults' mean less its mean in brackets."""
        def cell(a: str, d: str) -> str:
            mine, theirs = mean(ours, a, d), mean(other, a, d)
            if a == "mf" or (a, d, args.protocol) not in other:
                return ""
            gain = f" ({mine - theirs:+.3f})" if mine is not None and theirs is not None else ""
            return shown(other[(a, d, args.protocol)]) + gain
        return cell

    table(f"Test {METRIC.upper()} ({args.protocol}) at fedrec's defaults, mean ± std over seeds "
          "(in brackets: less centralised MF's)", at_defaults)
    table(f"Test {METRIC.upper()} ({args.protocol}) under each paper's setting (in brackets: the "
          "defaults' mean less this)", beside(papers))
    if tuned:
        table(f"Test {METRIC.upper()} ({args.protocol}) after tuning on validation (in brackets: the "
              "defaults' mean less this)", beside(tuned))

if __name__ == "__main__":
    main()
