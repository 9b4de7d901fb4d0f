"""fedrec's runs beside a paper's published figures, one row per method and setting.

Runs are grouped by the training-negative policy they used, because the official code of
PFedRec and its successors draws negatives in a way that leaks the test item: a paper's figure
should be compared with our ``legacy`` column to check the reproduction, and with our
``leak-free`` column to see what the method is worth without the leak. Where the official code
also splits repeated events (Lastfm-2K), ``legacy split`` is its whole setting.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from fedrec.errors import FedrecError
from fedrec.reproduce.papers import figure, load_figures
from fedrec.results import diverged, diverged_rounds

DEFAULT_METRICS = ("hr@10", "ndcg@10")
MISSING = "—"

#: The column group each training-negative policy (`fedrec protocols`) is shown under.
POLICY_GROUPS: dict[str, str] = {
    "leak-free": "leak-free",
    "exclude-candidates": "leak-free",
    "train-only": "leak-free",
    "legacy-exclude-heldout": "legacy",
    "legacy-split": "legacy split",
}
_GROUP_ORDER = ("leak-free", "legacy", "legacy split")

#: (method, dataset, setting, negatives)
Key = tuple[str, str, str, str]
#: (mean, std, n)
Cell = tuple[float, float, int]


class Summary(dict[Key, dict[str, Cell]]):
    """Each run group's cells by metric (`summarise`), and its runs that diverged:
    ``diverged[key][metric]`` maps the seed of each to the round it diverged in. A diverged run
    has no figure in its cells; the table says it diverged instead."""

    def __init__(self, cells: dict[Key, dict[str, Cell]] | None = None,
                 diverged: dict[Key, dict[str, dict[int, int]]] | None = None) -> None:
        super().__init__(cells or {})
        self.diverged = diverged or {}


def negatives_of(result: dict[str, Any]) -> str:
    """The negative policy a run used: the resolved one in ``data`` if recorded, else the asked;
    ``legacy-split`` for a run on the official split of repeated events (``--legacy-repeats``)."""
    data = result.get("data") or {}
    config = result.get("config") or {}
    if config.get("repeats"):
        return "legacy-split"
    return str(data.get("negatives") or config.get("negatives") or "")


def summarise(results: Iterable[dict[str, Any]], metrics: Sequence[str] = DEFAULT_METRICS) -> Summary:
    """Mean, std and count of each test metric over the seeds of each run group.

    Groups are ``(algorithm, dataset, setting, negatives)``; ``setting`` is ``config["setting"]``
    (empty when absent); a group may join runs of several protocols that report different
    metrics (PersonalFR's RMSE and NDCG rows). The std is the sample std (``ddof=1``), as
    `fedrec bench`'s leaderboards report it; it is 0 for a single seed. A metric a run lacks is left out of its
    group's count. Two runs of one group with the same seed are an error: counting a seed twice
    would shrink the spread. A run that diverged (``status: diverged``) adds no figure: it is
    kept in `Summary.diverged` under each metric of its protocol (each metric no completed run
    of its group reports, when none does), and its group is in the summary even when no run of
    it completed.
    """
    values: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[tuple[Key, str], set[int]] = defaultdict(set)
    source: dict[tuple[Key, str], str] = {}
    gone: list[tuple[Key, str, int, int]] = []
    for r in results:
        config = r.get("config") or {}
        key = (r["algorithm"], r["dataset"], str(config.get("setting") or ""), negatives_of(r))
        protocol = str(r.get("protocol") or "")
        if r["seed"] in seeds[(key, protocol)]:
            raise FedrecError(f"two results for {key} with seed {r['seed']}")
        seeds[(key, protocol)].add(r["seed"])
        if diverged(r):  # its test figures are of a model chosen before it diverged: no result
            gone.append((key, protocol, int(r["seed"]), int(r.get("diverged_at") or 0)))
            continue
        for m in metrics:
            if m in r["test"]:
                if source.setdefault((key, m), protocol) != protocol:
                    raise FedrecError(f"{key}: {m} comes from two protocols")
                values[key][m].append(float(r["test"][m]))
    summary = Summary({key: {m: (statistics.fmean(v), sample_std(v), len(v)) for m, v in per.items()}
                       for key, per in values.items()})
    for key, protocol, seed, at in gone:
        summary.setdefault(key, {})
        for m in metrics:
            if source.get((key, m), protocol) == protocol:
                summary.diverged.setdefault(key, {}).setdefault(m, {})[seed] = at
    return summary


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (``ddof=1``) of the seeds' figures; 0 for a single seed."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _group_labels(policies: Iterable[str]) -> dict[str, str]:
    """Column label per policy; policies that would share a group keep their own names."""
    policies = sorted(set(policies))
    grouped = {p: POLICY_GROUPS.get(p, p or "unrecorded") for p in policies}
    shared = {g for g in grouped.values() if list(grouped.values()).count(g) > 1}
    return {p: p if g in shared else g for p, g in grouped.items()}


def _rank(order: list[str]) -> Any:
    """Sort key: names in ``order`` first, in that order, then the rest alphabetically."""
    pos = {name: i for i, name in enumerate(order)}
    return lambda name: (pos.get(name, len(pos)), name)


def _fmt(mean: float, std: float | None, n: int = 0, most: int = 0, gone: int = 0) -> str:
    """``mean ± std``; a cell over fewer seeds than the table's most says how many, since its
    spread (none for one seed) is not comparable with its neighbours', and how many of its
    runs diverged (``gone``; left out of the figure)."""
    text = f"{mean:.4f}" if std is None or n == 1 else f"{mean:.4f} ± {std:.4f}"
    notes = ([f"{n} seed{'s' if n > 1 else ''}"] if 0 < n < most else []) + ([f"{gone} diverged"] if gone else [])
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _diverged(seeds: dict[int, int]) -> str:
    """A cell none of whose runs completed: "diverged (round 3)", "diverged (rounds 3, 5)"."""
    return f"diverged ({diverged_rounds(seeds)})"


def _build(
    summary: Summary, paper: str, table: str | int, metrics: Sequence[str] | None,
    paper_rows: bool, unpublished: bool = False, stand_in: str | None = None,
) -> tuple[list[str], list[list[str]], int]:
    """Header, rows and the number of leading text columns of the comparison table."""
    table = str(table)
    published = [f for f in load_figures(paper) if f.table == table]
    if not published and not unpublished:
        tables = ", ".join(dict.fromkeys(f.table for f in load_figures(paper)))
        raise FedrecError(f"no figures of {paper} Table {table} are transcribed; tables: {tables}")
    if metrics is None:
        seen = [m for cells in summary.values() for m in cells] + [f.metric for f in published]
        metrics = list(dict.fromkeys(seen))
    labels = _group_labels(k[3] for k in summary)
    groups = sorted(set(labels.values()), key=_rank(list(_GROUP_ORDER)))

    rows = {k[:3] for k in summary}
    if paper_rows:
        datasets = {k[1] for k in summary}
        rows |= {(f.method, f.dataset, f.setting) for f in published
                 if f.dataset in datasets and not stand_in}
    method_rank = _rank(list(dict.fromkeys(f.method for f in published)))
    dataset_rank = _rank(list(dict.fromkeys(f.dataset for f in published)))
    setting_rank = _rank(list(dict.fromkeys(f.setting for f in published)))
    ordered = sorted(rows, key=lambda r: (dataset_rank(r[1]), method_rank(r[0]), setting_rank(r[2])))
    show_setting = any(r[2] for r in ordered)

    header = ["method", "dataset"] + (["setting"] if show_setting else [])
    lead = len(header)
    for m in metrics:
        theirs = f"paper ({stand_in}) " if stand_in else "paper "
        header += [f"ours ({g}) {m.upper()}" for g in groups] + [f"{theirs}{m.upper()}"]

    most = max((n for cells in summary.values() for _, _, n in cells.values()), default=0)
    gone_of = getattr(summary, "diverged", {})
    body = []
    for method, dataset, setting in ordered:
        by_group = {
            labels[k[3]]: cells for k, cells in summary.items() if k[:3] == (method, dataset, setting)
        }
        gone = {labels[k[3]]: per for k, per in gone_of.items() if k[:3] == (method, dataset, setting)}
        line = [method, dataset] + ([setting] if show_setting else [])
        for m in metrics:
            for g in groups:
                cell = by_group.get(g, {}).get(m)
                lost = gone.get(g, {}).get(m, {})
                line.append(_fmt(*cell, most=most, gone=len(lost)) if cell is not None
                            else _diverged(lost) if lost else MISSING)
            pub = figure(paper, table, method, stand_in or dataset, m, setting)
            line.append(MISSING if pub is None else _fmt(pub.mean, pub.std))
        body.append(line)
    return header, body, lead


def _caption(summary: Summary, paper: str, table: str | int) -> str:
    counts = sorted({n for cells in summary.values() for _, _, n in cells.values()})
    seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}" if counts else "0"
    published = next((f.source for f in load_figures(paper) if f.table == str(table)), None)
    theirs = f"as published in {published}" if published else "no published figures (plots only)"
    lost = {(k, seed) for k, per in getattr(summary, "diverged", {}).items() for s in per.values() for seed in s}
    diverged_note = (f"{len(lost)} run{'s' if len(lost) > 1 else ''} diverged and "
                     f"{'are' if len(lost) > 1 else 'is'} left out of the figures" if lost else "")
    if not counts:  # every run failed or diverged: an empty table must not read as a result
        why = f"{diverged_note}; other failures are printed above" if lost else "their failures are printed above"
        return f"ours: no run completed ({why}); paper: {theirs}"
    return (f"ours: mean ± sample std (ddof=1) over {seeds} seed(s)"
            f"{f' ({diverged_note})' if lost else ''}; paper: {theirs}")


def render(
    summary: Summary, paper: str, table: str | int, console: Console,
    metrics: Sequence[str] | None = None, paper_rows: bool = True, unpublished: bool = False,
    stand_in: str | None = None,
) -> None:
    """Print ours beside the paper as a rich table.

    One row per (method, data set, setting); for each metric a column per negative-policy group
    of ours, then the paper's figure; "—" where either has none. With ``paper_rows`` the
    paper's methods that we have not run appear too, for the data sets we have run. A table
    with no transcribed figures is an error (a mistyped table number, most likely) unless
    ``unpublished``: the paper shows some results only as plots (FedRAP's ablations).
    ``stand_in`` puts the paper's figures on that data set beside every row (ours ran on a data
    set the paper does not report; the header names the stand-in).
    """
    header, body, lead = _build(summary, paper, table, metrics, paper_rows, unpublished, stand_in)
    out = Table(title=f"{paper} Table {table}: ours beside the paper",
                caption=_caption(summary, paper, table))
    for i, name in enumerate(header):
        out.add_column(name, justify="left" if i < lead else "right")
    for line in body:
        out.add_row(*line)
    console.print(out)


def to_markdown(
    summary: Summary, paper: str, table: str | int,
    metrics: Sequence[str] | None = None, paper_rows: bool = True, unpublished: bool = False,
    stand_in: str | None = None,
) -> str:
    """The table of `render` as GitHub markdown, with its caption as a closing line."""
    header, body, lead = _build(summary, paper, table, metrics, paper_rows, unpublished, stand_in)
    align = [":---" if i < lead else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(row) + " |" for row in [header, align, *body]]
    return "\n".join(lines) + f"\n\n{_caption(summary, paper, table)}\n"
