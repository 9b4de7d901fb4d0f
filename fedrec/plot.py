"""`fedrec plot`: validation curves and bytes per round of one or more runs, from their results.

Left: the validation metric of every evaluated round (default: the metric that selected the
runs' best rounds), with each run's best round marked. Right: the bytes the clients uploaded
each round (federated runs; a centralised run uploads nothing and is left out).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

from fedrec.errors import FedrecError
from fedrec.files import atomic_write, check_writable

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def read_results(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """(label, results) of each file, or one clear error naming the file that is not one."""
    out = []
    for path in paths:
        try:
            blob = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FedrecError(f"{path}: no such results file") from None
        except (OSError, ValueError) as e:
            raise FedrecError(f"{path}: not a results JSON ({type(e).__name__})") from None
        if not isinstance(blob, dict) or not isinstance(blob.get("history"), list):
            raise FedrecError(f"{path}: not a fedrec results file (no per-round history)")
        out.append((f"{blob.get('algorithm', '?')} ({Path(path).stem})", blob))
    return out


def runs_figure(paths: list[Path], out: Path, metric: str | None = None) -> Path:
    """Draw the runs in ``paths`` to ``out`` (PNG); return it."""
    check_writable(out)
    runs = read_results(paths)
    metric = metric or runs[0][1].get("select") or "ndcg@10"
    uploads = [(label, r) for label, r in runs if any(h.get("bytes_up") for h in r["history"])]
    fig, axes = plt.subplots(1, 2 if uploads else 1, figsize=(11 if uploads else 5.5, 4.2), squeeze=False)
    ax = axes[0][0]
    drawn = 0
    for k, (label, r) in enumerate(runs):
        points = [(h["round"], h["valid"][metric]) for h in r["history"] if metric in (h.get("valid") or {})]
        if not points:
            continue
        rounds, values = zip(*points, strict=True)
        ax.plot(rounds, values, color=f"C{k % 10}", lw=1.5, label=label)
        best = r.get("best_round")
        if best in rounds:
            ax.plot([best], [values[rounds.index(best)]], "o", color=f"C{k % 10}", ms=5)
        drawn += 1
    if not drawn:
        raise FedrecError(f"no validation {metric} per round in these results; see their 'valid' keys")
    ax.set(xlabel="round (epoch)", ylabel=f"validation {metric}", title="validation (o: best round)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if uploads:
        ax = axes[0][1]
        for label, r in uploads:
            k = [lbl for lbl, _ in runs].index(label)
            ax.plot([h["round"] for h in r["history"]], [h["bytes_up"] / 2**20 for h in r["history"]],
                    color=f"C{k % 10}", lw=1.5, label=label)
        ax.set(xlabel="round", ylabel="MiB uploaded", title="upload per round (all clients)", yscale="log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return out
