"""`fedrec plot`: validation curves and bytes per round of one or more runs, from their results.

Runs are drawn one row of panels per (data set, protocol): figures of different data or
protocols are not comparable, so they never share an axis. Within a row, runs whose options
differ only by seed are one line, coloured per algorithm: the mean over the seeds at each
evaluated round (over the seeds that reached it: a run may stop early), with a band from the
lowest to the highest seed; each run's best round is marked. Runs of one algorithm with other
options are lines of their own, labelled with what differs. Left: the validation metric
(default: the one that selected the runs' best rounds). Right: the bytes the clients uploaded
each round (federated runs; a centralised run uploads nothing and is left out), on a log axis
with plain numbers when they span more than a decade.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from fedrec.errors import FedrecError
from fedrec.files import atomic_write, check_writable
from fedrec.results import malformed

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

#: recorded options that say where or how fast a run was done, or under which seed: runs that
#: differ only in them are one line
_NOT_AN_OPTION = frozenset({"seed", "data_dir", "device", "checkpoint_every", "memory_budget_mb"})


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
        problem = malformed(blob)
        if problem is not None:
            raise FedrecError(f"{path}: not a fedrec results file ({problem})")
        out.append((f"{blob.get('algorithm', '?')} ({Path(path).stem})", blob))
    return out


@dataclass
class Series:
    """The runs drawn as one line: one algorithm and options, one or more seeds."""

    algorithm: str
    options: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

    @property
    def seeds(self) -> list[int]:
        return sorted(int(r.get("seed", 0)) for r in self.runs)


def _flat(blob: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recorded config as ``{"train.lr": 0.001, ...}`` (lists as tuples, to compare)."""
    out: dict[str, Any] = {}
    for key, value in blob.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        elif key not in _NOT_AN_OPTION:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def group_runs(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[Series]]:
    """The runs by (data set, protocol), each as its lines: runs whose recorded options differ
    only by seed (or where the run was done) are one `Series`. A line's label is its algorithm,
    with the options that set it apart from the algorithm's other lines, and its seeds."""
    panels: dict[tuple[str, str], list[Series]] = {}
    for r in runs:
        config = r.get("config") or {}
        options = _flat({k: v for k, v in config.items() if k not in ("algorithm", "dataset", "protocol")})
        algorithm = str(r.get("algorithm", "?"))
        lines = panels.setdefault((str(r.get("dataset", "?")), str(r.get("protocol", "?"))), [])
        seed = int(r.get("seed", 0))
        line = next((s for s in lines if s.algorithm == algorithm and s.options == options
                     and seed not in s.seeds), None)  # a second run of a seed is a line of its own
        if line is None:
            line = Series(algorithm, options)
            lines.append(line)
        line.runs.append(r)
    for lines in panels.values():
        for line in lines:
            others = [s for s in lines if s.algorithm == line.algorithm and s is not line]
            differs = sorted({k for s in others for k in set(s.options) | set(line.options)
                              if s.options.get(k) != line.options.get(k)})
            shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={line.options.get(k)}" for k in differs[:3])
            seeds = line.seeds
            named = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds"
            earlier = [s for s in lines[:lines.index(line)] if s.algorithm == line.algorithm
                       and s.options == line.options]  # runs of a seed seen before
            copy = f" #{len(earlier) + 1}" if earlier else ""
            line.label = f"{line.algorithm}{f' {shown}' if shown else ''} ({named}){copy}"
    return panels


def _mean_band(points: list[dict[int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds, mean, lowest and highest over the runs that have each round."""
    rounds = np.array(sorted({r for p in points for r in p}))
    values = [[p[r] for p in points if r in p] for r in rounds]
    return (rounds, np.array([np.mean(v) for v in values]), np.array([min(v) for v in values]),
            np.array([max(v) for v in values]))


def _plain_number(value: float, _: object = None) -> str:
    """A tick as a plain number: 0.001, 0.2, 5, 20000 (not 10^-3 or 2e+04)."""
    return np.format_float_positional(value, precision=6, trim="-")


def draw_runs(runs: list[dict[str, Any]], metric: str | None = None) -> Figure:
    """The figure of ``runs`` (results as read from their files): one row of panels per
    (data set, protocol) (see the module docstring)."""
    panels = group_runs(runs)
    uploading = any(h.get("bytes_up") for r in runs for h in r["history"])
    colours: dict[str, str] = {}
    for r in runs:
        colours.setdefault(str(r.get("algorithm", "?")), f"C{len(colours) % 10}")
    rows, cols = len(panels), 2 if uploading else 1
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for row, ((dataset, protocol), lines) in enumerate(panels.items()):
        chosen = metric or lines[0].runs[0].get("select") or "ndcg@10"
        ax = axes[row][0]
        drawn = 0
        for line in lines:
            colour = colours[line.algorithm]
            style = ("-", "--", ":", "-.")[[s for s in lines if s.algorithm == line.algorithm].index(line) % 4]
            points = [{h["round"]: h["valid"][chosen] for h in r["history"] if chosen in (h.get("valid") or {})}
                      for r in line.runs]
            points = [p for p in points if p]
            if not points:
                continue
            rounds, mean, low, high = _mean_band(points)
            ax.plot(rounds, mean, color=colour, ls=style, lw=1.5, label=line.label)
            if len(points) > 1:
                ax.fill_between(rounds, low, high, color=colour, alpha=0.2, lw=0)
            for r, p in zip(line.runs, points, strict=False):
                best = r.get("best_round")
                if best in p:
                    ax.plot([best], [p[best]], "o", color=colour, ms=4)
            drawn += 1
        if not drawn and not any(r["history"] for line in lines for r in line.runs):
            raise FedrecError(f"the runs on {dataset} · {protocol} hold no round (each diverged in its "
                              "first round, or stopped before it ended): nothing to draw")
        if not drawn:
            raise FedrecError(f"no validation {chosen} per round in the runs on {dataset} · {protocol}; "
                              "see their 'valid' keys")
        ax.set(xlabel="round (epoch)", ylabel=f"validation {chosen}",
               title=f"{dataset} · {protocol}\nvalidation (mean, band: seeds' range; o: best round)")
        ax.title.set_fontsize("medium")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if uploading:
            _draw_uploads(axes[row][1], lines, colours, f"{dataset} · {protocol}")
    fig.tight_layout()
    return fig


def _draw_uploads(ax: Any, lines: list[Series], colours: dict[str, str], where: str) -> None:
    """MiB uploaded per round, the mean over each line's seeds."""
    drawn: list[float] = []
    for line in lines:
        points = [{h["round"]: h["bytes_up"] / 2**20 for h in r["history"] if h.get("bytes_up")} for r in line.runs]
        points = [p for p in points if p]
        if not points:
            continue
        rounds, mean, _, _ = _mean_band(points)
        ax.plot(rounds, mean, color=colours[line.algorithm], lw=1.5, label=line.label)
        drawn += list(mean)
    ax.set_title(f"{where}\nupload per round (all clients)", fontsize="medium")
    if not drawn:  # centralised runs only: nothing travels
        ax.text(0.5, 0.5, "no uploads (centralised runs)", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ax.set(xlabel="round", ylabel="MiB uploaded")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    decades = float(np.log10(max(drawn) / min(drawn)))
    if decades > 1:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))


#: the figure formats `runs_figure` writes, by the file's suffix
FORMATS = ("png", "pdf", "svg")


def runs_figure(paths: list[Path], out: Path, metric: str | None = None) -> Path:
    """Draw the runs in ``paths`` to ``out`` (PNG, PDF or SVG, by its suffix); return it."""
    kind = Path(out).suffix.lower().lstrip(".")
    if kind not in FORMATS:
        raise FedrecError(f"--out {out}: give a file ending in {', '.join('.' + f for f in FORMATS)} "
                          "(the suffix says the format)")
    check_writable(out, reads=paths)
    fig = draw_runs([blob for _, blob in read_results(paths)], metric)
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=120, format=kind))
    finally:
        plt.close(fig)
    return out
