"""Leaderboards of a benchmark grid: per data set and protocol, every method's test figures as
mean ± standard deviation over seeds, its rank, and paired significance against the best.

A method is an algorithm under a training-negative policy. The best method is the one with the
best mean of the protocol's selection metric (highest, or lowest for RMSE); every other method
is compared with it seed by seed on that metric, with a paired t-test and a Wilcoxon
signed-rank test (scipy), and the table names both. With fewer than two shared seeds no test is
possible and the cell says so; with five seeds the smallest Wilcoxon p-value is 0.0625, so
"not significant" there often means "too few seeds to tell". The standard deviation is the
sample one (ddof=1). Where the rows were trained under different budgets (rounds or epochs,
early stopping), the board says how each was, since a method stopped earlier is not compared on
equal terms.

A run that diverged (its results say ``status: diverged``) is left out of the means, ranks and
tests, never averaged in: a method all of whose runs diverged is shown last, unranked, as
"diverged (round R)" where its figures would be, a ``diverged`` column counts each method's
diverged seeds, and a note under the board lists them.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedrec.results import diverged, diverged_rounds

NO_TEST = "—"


@dataclass
class Board:
    """One leaderboard: ``table`` has a row per method, ranked."""

    dataset: str
    protocol: str
    metric: str
    table: pd.DataFrame
    #: cells of the grid this board has no result for, each "method seed S: why"
    missing: list[str] = field(default_factory=list)
    #: how each method's runs were bounded ("up to 100 rounds, no early stopping"), given only
    #: when the methods differ in it
    stopping: dict[str, str] = field(default_factory=dict)
    #: the runs that diverged, method -> {seed: round}: left out of the figures, ranks and tests
    diverged: dict[str, dict[int, int]] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return f"leaderboard-{self.dataset.replace(':', '_').replace('/', '_')}-{self.protocol}"


def _lower_is_better(metric: str) -> bool:
    return metric.startswith("rmse")


def boards(results: list[dict[str, Any]], missing: Iterable[tuple[Any, str]] = ()) -> list[Board]:
    """A leaderboard per (data set, protocol) of the cells' results JSON; ``missing`` are the
    grid's cells without a result, as (`fedrec.bench.grid.Cell`, why), listed under their board."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(r["dataset"], r["protocol"])].append(r)
    absent: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cell, why in missing:
        absent[(cell.dataset, cell.protocol)].append(f"{cell.algorithm} ({cell.negatives}) seed {cell.seed}: {why}")
    made = []
    for (dataset, protocol), runs in sorted(groups.items()):
        board = _board(dataset, protocol, runs)
        board.missing = absent[(dataset, protocol)]
        made.append(board)
    return made


def method_name(result: dict[str, Any], one_policy: bool) -> str:
    """A row's name: the algorithm, then its grid's label and (where a board mixes them) its
    negative policy, "pfedrec (defaults; legacy)"."""
    tags = [result.get("label") or "", "" if one_policy else result["data"]["negatives"]]
    tags = [t for t in tags if t]
    return result["algorithm"] + (f" ({'; '.join(tags)})" if tags else "")


def stopping(result: dict[str, Any]) -> str:
    """How a run's training was bounded, in words ("up to 100 rounds, stops after 10 evaluations
    without a better validation figure"); empty when its config does not say."""
    config = result.get("config") or {}
    part, unit = (config["federated"], "rounds") if config.get("federated") else (config.get("train"), "epochs")
    if not part or unit not in part:
        return ""
    most, patience = part[unit], part.get("patience") or 0
    rule = (f"stops after {patience} evaluations without a better validation figure" if patience
            else "no early stopping")
    return f"up to {most} {unit}, {rule}"


def _board(dataset: str, protocol: str, runs: list[dict[str, Any]]) -> Board:
    select = runs[0]["select"]
    finished = [r for r in runs if not diverged(r)]
    # a diverged run's test figures are of a model selected before it diverged, not a result
    shown_by = next((r for r in finished if r["test"]), None) or next((r for r in runs if r["test"]), None)
    metrics = [m for m in shown_by["test"] if m != "users"] if shown_by else [select]
    by_method: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    gone: dict[str, dict[int, int]] = defaultdict(dict)
    rules: dict[str, set[str]] = defaultdict(set)
    one_policy = len({r["data"]["negatives"] for r in runs}) == 1  # else a method is per policy
    for r in runs:
        method = method_name(r, one_policy)
        if diverged(r):
            gone[method][int(r["seed"])] = int(r.get("diverged_at") or 0)
            by_method.setdefault(method, {})
        else:
            by_method[method][int(r["seed"])] = r["test"]
        rules[method].add(stopping(r))
    rows = []
    for method, seeds in by_method.items():
        row: dict[str, Any] = {"method": method, "seeds": len(seeds)}
        for m in metrics:
            values = np.array([s[m] for s in seeds.values() if m in s], float)
            row[m] = float(values.mean()) if len(values) else math.nan
            row[f"{m} std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        if gone:
            row["diverged"] = len(gone.get(method, {}))
        rows.append(row)
    table = pd.DataFrame(rows)
    ascending = _lower_is_better(select)
    # a method all of whose runs diverged has no figure: it goes last, unranked
    table = table.sort_values(select, ascending=ascending, kind="stable", na_position="last").reset_index(drop=True)
    ranked = int(table[select].notna().sum())
    table.insert(0, "rank", pd.array(list(range(1, ranked + 1)) + [None] * (len(table) - ranked), dtype="Int64"))
    best = table["method"].iloc[0] if ranked else None
    t_p, w_p = [], []
    for method in table["method"]:
        t, w = (_paired(by_method[best], by_method[method], select) if best is not None and method != best
                else (None, None))
        t_p.append(t)
        w_p.append(w)
    table["t-test p"] = t_p
    table["Wilcoxon p"] = w_p
    said = {m: "; ".join(sorted(r for r in rules[m] if r)) for m in table["method"]}
    differ = len(set(said.values())) > 1
    return Board(dataset, protocol, select, table, stopping=said if differ else {},
                 diverged={m: dict(sorted(gone[m].items())) for m in table["method"] if m in gone})


def _paired(best: dict[int, dict[str, float]], other: dict[int, dict[str, float]],
            metric: str) -> tuple[float | None, float | None]:
    """p-values of the paired t-test and the Wilcoxon test over the seeds both ran."""
    from scipy import stats

    shared = sorted(set(best) & set(other))
    if len(shared) < 2:
        return None, None
    a = np.array([best[s][metric] for s in shared])
    b = np.array([other[s][metric] for s in shared])
    if np.all(a == b):
        return 1.0, 1.0
    # a deterministic method (GF-CF) against another makes the differences (nearly) constant:
    # scipy warns of precision loss, and the p-value is then ~0, as it should be
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t = float(stats.ttest_rel(a, b).pvalue)
        w = float(stats.wilcoxon(a, b).pvalue)
    return (None if math.isnan(t) else t), (None if math.isnan(w) else w)


def _shown(table: pd.DataFrame, diverged_runs: dict[str, dict[int, int]] | None = None) -> pd.DataFrame:
    """Mean ± std and p-values as text, one column per metric; a method all of whose runs
    diverged reads "diverged (round R)" where its figures would be, and the ``diverged``
    column (where any run diverged) how many of a method's seeds did."""
    diverged_runs = diverged_runs or {}
    metrics = [c for c in table.columns if c not in ("rank", "method", "seeds", "diverged", "t-test p", "Wilcoxon p")
               and not c.endswith(" std")]
    out = table[["rank", "method", "seeds"]].copy()
    out["rank"] = [NO_TEST if pd.isna(v) else int(v) for v in table["rank"]]
    for m in metrics:
        std = table[f"{m} std"]
        out[m] = [f"diverged ({diverged_rounds(diverged_runs.get(name, {}))})" if n == 0 and name in diverged_runs
                  else NO_TEST if math.isnan(v) else f"{v:.4f}" + ("" if math.isnan(s) else f" ± {s:.4f}")
                  for name, n, v, s in zip(table["method"], table["seeds"], table[m], std, strict=True)]
    if "diverged" in table.columns:
        out["diverged"] = [f"{n} ({diverged_rounds(diverged_runs[name])})" if n else NO_TEST
                           for name, n in zip(table["method"], table["diverged"], strict=True)]
    for p in ("t-test p", "Wilcoxon p"):
        out[p] = ["best" if not pd.isna(r) and r == 1 else (NO_TEST if pd.isna(v) else f"{v:.3g}")
                  for r, v in zip(table["rank"], table[p], strict=True)]
    return out


def to_markdown(board: Board) -> str:
    """The board as a Markdown table, with a caption naming the tests."""
    shown = _shown(board.table, board.diverged)
    lines = [f"**{board.dataset} · {board.protocol}** (test figures at the best validation round; "
             f"mean ± std over seeds; p: paired t-test and Wilcoxon signed-rank test of "
             f"{board.metric} against the best method)", "",
             "| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    if board.stopping:
        by_rule: dict[str, list[str]] = defaultdict(list)
        for method, rule in board.stopping.items():
            by_rule[rule or "not recorded"].append(method)
        lines += ["", "The rows were trained under different budgets:", ""]
        lines += [f"- {rule}: {', '.join(methods)}" for rule, methods in by_rule.items()]
    if board.diverged:
        runs = [f"{method} seed {seed} (round {r})" for method, seeds in board.diverged.items()
                for seed, r in seeds.items()]
        lines += ["", f"Diverged (the loss or the scores stopped being finite), left out of the means, ranks "
                  f"and tests: {', '.join(runs)}; their results files say so (status: diverged)."]
    if board.missing:
        lines += ["", f"Not in the table ({len(board.missing)} cell{'s' if len(board.missing) > 1 else ''} "
                  "of the grid without a result):", ""] + [f"- {line}" for line in board.missing]
    return "\n".join(lines) + "\n"


def write(board: Board, folder: str | Path) -> list[Path]:
    """Markdown, CSV (numbers unrounded), LaTeX and a bar chart (PNG) of ``board``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / board.stem
    paths = [base.with_suffix(".md"), base.with_suffix(".csv"), base.with_suffix(".tex"), base.with_suffix(".png")]
    paths[0].write_text(to_markdown(board))
    board.table.to_csv(paths[1], index=False)
    latex = _shown(board.table, board.diverged).style.hide(axis="index").to_latex(hrules=True)
    paths[2].write_text(latex.replace("±", r"$\pm$"))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(board.table)), 3.4))
    std = board.table[f"{board.metric} std"]  # NaN for one seed: matplotlib draws no bar there
    # a row with fewer seeds than the board's most says so under its bar (one seed: no error bar)
    most = int(board.table["seeds"].max())
    labels = [m if n == most else f"{m}\n(diverged)" if n == 0 else f"{m}\n({n} seed{'s' if n > 1 else ''})"
              for m, n in zip(board.table["method"], board.table["seeds"], strict=True)]
    ax.bar(labels, board.table[board.metric], yerr=std, capsize=4, color="#4C72B0")
    ax.set_ylabel(f"test {board.metric}")
    ax.set_title(f"{board.dataset} · {board.protocol}\n(mean ± std over seeds)", fontsize=10)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(paths[3], dpi=120)
    plt.close(fig)
    return paths
