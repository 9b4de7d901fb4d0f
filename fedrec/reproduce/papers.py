"""Published figures as data, so fedrec's runs can be set beside what a paper claims.

Each paper's tables are transcribed once into ``figures/<paper>.csv`` (values as fractions,
fedrec's algorithm and data-set names) and shipped with the package; see ``figures/README.md``.
They are the papers' claims, never fedrec's measurements.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

from fedrec.errors import FedrecError, UnknownNameError

COLUMNS = ("table", "method", "dataset", "setting", "metric", "mean", "std", "source")

FigureKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class PaperFigure:
    """One published number: a metric of a method on a data set in one table of one paper.

    ``setting`` tells apart rows of one table that vary a condition (``ldp=0.3``); it is empty
    where the table has one condition. ``std`` is ``None`` where the paper gives no spread.
    """

    table: str
    method: str
    dataset: str
    setting: str
    metric: str
    mean: float
    std: float | None
    source: str

    @property
    def key(self) -> FigureKey:
        return (self.table, self.method, self.dataset, self.setting, self.metric)


def _root() -> Traversable:
    """The packaged ``figures`` folder (data files, not a package of its own)."""
    return resources.files("fedrec.reproduce").joinpath("figures")


def papers() -> list[str]:
    """Names of the papers whose figures ship with fedrec (the CSV file stems)."""
    return sorted(p.name[: -len(".csv")] for p in _root().iterdir() if p.name.endswith(".csv"))


@cache
def _load(paper: str) -> tuple[PaperFigure, ...]:
    known = papers()
    if paper not in known:
        raise UnknownNameError("paper", paper, known)
    text = _root().joinpath(f"{paper}.csv").read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise FedrecError(f"{paper}.csv: columns {reader.fieldnames}, expected {list(COLUMNS)}")
    figures = []
    for line, row in enumerate(reader, start=2):
        try:
            figures.append(PaperFigure(
                table=row["table"], method=row["method"], dataset=row["dataset"],
                setting=row["setting"], metric=row["metric"].lower(), mean=float(row["mean"]),
                std=float(row["std"]) if row["std"] else None, source=row["source"],
            ))
        except ValueError as exc:
            raise FedrecError(f"{paper}.csv:{line}: {exc}") from exc
    return tuple(figures)


@cache
def _index(paper: str) -> dict[FigureKey, PaperFigure]:
    """Figures by key; a key seen twice is an error, since a lookup could not tell them apart."""
    index: dict[FigureKey, PaperFigure] = {}
    for f in _load(paper):
        if f.key in index:
            raise FedrecError(f"{paper}.csv: figure {f.key} appears twice")
        index[f.key] = f
    return index


def load_figures(paper: str) -> list[PaperFigure]:
    """Every transcribed figure of ``paper``, in the order of the paper's tables."""
    return list(_load(paper))


def figure(
    paper: str, table: str | int, method: str, dataset: str, metric: str, setting: str = ""
) -> PaperFigure | None:
    """The figure a paper reports for one cell of one table, or ``None`` where it reports none."""
    return _index(paper).get((str(table), method, dataset, setting, metric.lower()))
