"""Convergence plots: a validation metric per round, as FedRAP's Figures 5 and 6 draw them.

One panel per training-negative policy (the leak shifts whole curves, so they are not mixed),
one line per (method, setting): the mean over seeds, with a light min-max band when there are
several seeds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

from fedrec.errors import FedrecError
from fedrec.reproduce.table import POLICY_GROUPS, negatives_of

matplotlib.use("Agg")  # files only: no display is needed, nor wanted on a compute node
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

#: policy -> (method, setting) -> round -> the metric's values over seeds
Curves = dict[str, dict[tuple[str, str], dict[int, list[float]]]]


def curves(results: Iterable[dict[str, Any]], metric: str) -> Curves:
    """The validation ``metric`` of every round that was evaluated, grouped for plotting."""
    out: Curves = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in results:
        group = (r["algorithm"], str((r.get("config") or {}).get("setting") or ""))
        for record in r.get("history") or ():
            value = (record.get("valid") or {}).get(metric)
            if value is not None:
                out[negatives_of(r)][group][int(record["round"])].append(float(value))
    return out


def convergence(
    results: Iterable[dict[str, Any]], metric: str, path: str | Path, title: str
) -> Path:
    """Draw the validation ``metric`` per round of each run group to ``path`` (PNG); return it."""
    by_policy = curves(results, metric)
    if not by_policy:
        raise FedrecError(f"no validation {metric} per round in these results to plot")
    fig, axes = plt.subplots(1, len(by_policy), figsize=(5.5 * len(by_policy), 4.2),
                             sharey=True, squeeze=False)
    leak_free_first = sorted(by_policy, key=lambda p: (POLICY_GROUPS.get(p, p) != "leak-free", p))
    groups = list(dict.fromkeys(g for p in leak_free_first for g in by_policy[p]))
    colour = {g: f"C{i % 10}" for i, g in enumerate(groups)}  # one colour per group in every panel
    for ax, policy in zip(axes[0], leak_free_first, strict=True):
        for (method, setting), per_round in by_policy[policy].items():
            rounds = sorted(per_round)
            values = [per_round[r] for r in rounds]
            label = f"{method} ({setting})" if setting else method
            c = colour[(method, setting)]
            ax.plot(rounds, [statistics.fmean(v) for v in values], label=label, color=c, lw=1.5)
            if any(len(v) > 1 for v in values):
                ax.fill_between(rounds, [min(v) for v in values], [max(v) for v in values],
                                color=c, alpha=0.15, lw=0)
        group = POLICY_GROUPS.get(policy, policy)
        ax.set_title(f"{group} negatives" + (f" ({policy})" if group != policy else ""),
                     fontsize="medium")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"validation {metric.upper()}")
    for ax in axes[0]:
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
