"""CoLR's accuracy against its upload, beside FedMF shrunk to the same upload (CoLR's Figure 3
in its own setting, on a data set at hand).

    python benchmarks/colr_payload.py -o results/colr-payload            # ML-100K, 3 seeds
    python benchmarks/colr_payload.py --dataset lastfm-2k --seeds 0 -o results/colr-payload-lastfm

Each point is a run at fedrec's defaults (FedMF's engine, leak-free negatives, validation picks
the round): CoLR at dimension ``--dim`` with each rank r, and FedMF at dimension r, so both send
4 r bytes an item row (and FedMF at ``--dim``, the uncompressed line). Writes ``points.csv``
(one row a run), ``payload.csv`` (mean and standard deviation over seeds) and ``payload.png``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import fedrec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--protocol", default="loo-sampled")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--ranks", default="1,2,4,8,16", help="comma-separated ranks (and FedMF dimensions)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = [int(r) for r in args.ranks.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [("fedmf", args.dim, {"dim": args.dim})]
    runs += [("colr", r, {"dim": args.dim, "rank": r}) for r in ranks]
    runs += [("fedmf", r, {"dim": r}) for r in ranks]
    points = []
    for algorithm, width, options in runs:
        for seed in seeds:
            run = fedrec.run(algorithm, dataset=args.dataset, protocol=args.protocol, seed=seed,
                             options=options, data_dir=args.data_dir)
            up = statistics.mean(h.bytes_up for h in run.history)
            row = {"algorithm": algorithm, "width": width, "seed": seed, "best_round": run.best_round,
                   "bytes_up_per_round": round(up), "hr@10": run.test["hr@10"], "ndcg@10": run.test["ndcg@10"]}
            points.append(row)
            print(row, flush=True)
    with open(out / "points.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(points[0]))
        w.writeheader()
        w.writerows(points)
    summary = []
    for algorithm, width, _ in runs:
        mine = [p for p in points if p["algorithm"] == algorithm and p["width"] == width]
        row = {"algorithm": algorithm, "width": width, "floats_a_row": width, "seeds": len(mine),
               "bytes_up_per_round": round(statistics.mean(p["bytes_up_per_round"] for p in mine))}
        for k in ("hr@10", "ndcg@10"):
            vals = [p[k] for p in mine]
            row[k] = statistics.mean(vals)
            row[f"{k}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        summary.append(row)
    with open(out / "payload.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    _plot(summary, args, out / "payload.png")
    print(f"wrote {out}/points.csv, payload.csv, payload.png")


def _plot(summary: list[dict], args: argparse.Namespace, path: Path) -> None:  # type: ignore[type-arg]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    full = next(s for s in summary if s["algorithm"] == "fedmf" and s["width"] == args.dim)
    for ax, metric in zip(axes, ("hr@10", "ndcg@10"), strict=True):
        for algorithm, label, marker in (("colr", f"CoLR (d={args.dim}, rank r)", "o"),
                                         ("fedmf", "FedMF (d=r)", "s")):
            pts = sorted((s for s in summary if s["algorithm"] == algorithm and s is not full),
                         key=lambda s: s["width"])
            ax.errorbar([s["width"] for s in pts], [s[metric] for s in pts],
                        yerr=[s[f"{metric}_std"] for s in pts], marker=marker, capsize=3, label=label)
        ax.axhline(full[metric], color="black", linestyle="--", label=f"FedMF (d={args.dim})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("floats uploaded an item row (r)")
        ax.set_ylabel(f"test {metric}")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{args.dataset}, {args.protocol}: accuracy against upload")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
