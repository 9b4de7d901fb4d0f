"""GFed-PP's tables that are more than one run per row: alpha chosen on validation (Table 2),
public / private / all users (Table 6), and the public-ratio x alpha grid (Figure 6).

The paper states neither the public ratio nor alpha behind Table 2. fedrec runs GFed-PP with all
users public (its Amazon-Video figures suggest it) and takes, per negative policy and seed, the
alpha whose run has the best *validation* HR@10 (never test).
"""

from __future__ import annotations

import copy
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

from fedrec.errors import FedrecError
from fedrec.reproduce.table import POLICY_GROUPS, negatives_of
from fedrec.results import diverged

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GROUPS = ("all", "public", "private")


def _model(r: dict[str, Any]) -> dict[str, Any]:
    return (r.get("config") or {}).get("model") or {}


def _is_plain_gfedpp(r: dict[str, Any]) -> bool:
    fed = (r.get("config") or {}).get("federated") or {}
    return r.get("algorithm") == "gfedpp" and not fed.get("ldp")


def choose_alpha(results: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Table 2: GFed-PP's all-public runs reduced to the best alpha on validation.

    Returns the results with each (policy, seed)'s candidates replaced by the chosen one
    (labelled as the plain ``gfedpp`` row), and a note per policy saying which alpha won.
    """
    results = list(results)
    candidates: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    rest = []
    for r in results:
        if _is_plain_gfedpp(r) and float(_model(r).get("public_ratio", 1.0)) == 1.0:
            candidates[(negatives_of(r), int(r["seed"]))].append(r)
        else:
            rest.append(r)
    notes = []
    for (policy, seed), runs in sorted(candidates.items()):
        # a candidate that diverged is not chosen while another completed (its table cell says so)
        completed = [r for r in runs if not diverged(r)] or runs
        best = max(completed, key=lambda r: (r.get("valid_at_best") or {}).get("hr@10", float("-inf")))
        chosen = copy.deepcopy(best)
        chosen["config"]["setting"] = ""
        rest.append(chosen)
        tried = ", ".join(f"{float(_model(r)['alpha']):g}: {(r.get('valid_at_best') or {}).get('hr@10', float('nan')):.4f}"
                          for r in sorted(runs, key=lambda r: float(_model(r)["alpha"])))
        notes.append(f"GFed-PP alpha chosen on validation HR@10 ({policy}, seed {seed}): "
                     f"{float(_model(best)['alpha']):g} (tried {tried})")
    return rest, notes


def by_group(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 6: each GFed-PP run as three rows, its test figures over all, public and private users.

    Rows are labelled ``gfedpp/<group>`` with the public ratio as their setting.
    """
    out = []
    for r in results:
        groups = (r.get("extra") or {}).get("test_groups") or {}
        ratio = float(_model(r).get("public_ratio", 1.0))
        for name in GROUPS:
            test = r.get("test") if name == "all" else groups.get(name)
            if not test:
                continue
            row = dict(r, algorithm=f"gfedpp/{name}", test=test)
            row["config"] = dict(r["config"], setting=f"ratio={ratio:g}")
            out.append(row)
    return out


def grid(results: Iterable[dict[str, Any]], metric: str, stage: str = "test"
         ) -> dict[str, dict[tuple[float, float], float]]:
    """policy group -> (public ratio, alpha) -> the metric (mean over seeds) of plain GFed-PP runs."""
    cells: dict[str, dict[tuple[float, float], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if not _is_plain_gfedpp(r) or diverged(r):  # a diverged run's figures are not averaged in
            continue
        value = (r.get(stage if stage == "test" else "valid_at_best") or {}).get(metric)
        if value is None:
            continue
        m = _model(r)
        policy = POLICY_GROUPS.get(negatives_of(r), negatives_of(r))
        cells[policy][(float(m["public_ratio"]), float(m["alpha"]))].append(float(value))
    return {p: {k: statistics.fmean(v) for k, v in c.items()} for p, c in cells.items()}


def _cell(cells: dict[tuple[float, float], float], ratio: float, alpha: float) -> float:
    """A grid cell; at ratio 0 (no public users, alpha does not matter) the row's one run."""
    if ratio == 0:
        zero = [v for (q, _), v in cells.items() if q == 0]
        return statistics.fmean(zero) if zero else float("nan")
    return cells.get((ratio, alpha), float("nan"))


def heatmap(results: Iterable[dict[str, Any]], metric: str, path: str | Path, title: str) -> Path:
    """Figure 6: test ``metric`` over public ratio (rows) x alpha (columns), one panel per policy.

    At ratio 0 there are no public users, so alpha does not matter: its one run fills the row.
    The cell with the best validation HR@10 of each row is framed.
    """
    results = list(results)
    tests, valids = grid(results, metric), grid(results, "hr@10", stage="valid")
    if not tests:
        raise FedrecError(f"no GFed-PP runs with a test {metric} to draw")
    policies = sorted(tests, key=lambda p: (p != "leak-free", p))
    fig, axes = plt.subplots(1, len(policies), figsize=(5.2 * len(policies), 4.4), squeeze=False)
    for ax, policy in zip(axes[0], policies, strict=True):
        cells = tests[policy]
        ratios = sorted({r for r, _ in cells})
        alphas = sorted({a for r, a in cells if r > 0}) or sorted({a for _, a in cells})
        table = [[_cell(cells, r, a) for a in alphas] for r in ratios]
        known = [v for row in table for v in row if v == v]
        middle = (min(known) + max(known)) / 2
        image = ax.imshow(table, cmap="Blues", aspect="auto", origin="lower")
        for i, r in enumerate(ratios):
            for j, _ in enumerate(alphas):
                value = table[i][j]
                if value == value:
                    ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize="small",
                            color="white" if value > middle else "black")
            row_valid = {a: v for (q, a), v in valids.get(policy, {}).items() if q == r}
            if r > 0 and row_valid:
                best = max(row_valid, key=row_valid.__getitem__)
                if best in alphas:
                    ax.add_patch(plt.Rectangle((alphas.index(best) - 0.5, i - 0.5), 1, 1, fill=False,
                                               edgecolor="darkorange", lw=2))
        ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
        ax.set_xlabel("alpha (personalisation)")
        ax.set_ylabel("public user ratio")
        ax.set_title(f"{policy} negatives", fontsize="medium")
        fig.colorbar(image, ax=ax, label=f"test {metric.upper()}")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
