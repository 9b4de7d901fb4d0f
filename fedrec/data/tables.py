"""The generic reader: a user/item(/rating/time) table in any delimited or Parquet file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from fedrec.data.delimited import (
    Kind,
    Layout,
    PathLike,
    build_interactions,
    existing,
    first_record,
    read_frame,
    tokens,
)
from fedrec.data.interactions import Interactions
from fedrec.errors import DataFormatError, FedrecError

# ---------------------------------------------------------------------------------------------
# Generic reader
# ---------------------------------------------------------------------------------------------

_SUFFIX_FORMAT = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".txt": "tsv",
    ".dat": "tsv",
    ".inter": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
Column = str | int


def read_table(
    path: PathLike,
    user_col: Column,
    item_col: Column,
    rating_col: Column | None = None,
    time_col: Column | None = None,
    sep: str | None = None,
    header: bool = True,
    fmt: Literal["csv", "tsv", "parquet"] | None = None,
) -> Interactions:
    """Read any CSV/TSV/parquet table by naming its user, item, rating and time columns.

    Columns are header names (a RecBole-style ``name:type`` header matches on ``name``) or,
    with ``header=False``, 0-based positions. ``fmt`` defaults from the suffix; ``sep``
    overrides the delimiter. Without ``rating_col`` the data are implicit; without
    ``time_col`` the row order is the clock. Parquet needs the optional ``pyarrow``.
    """
    p = existing(path)
    if fmt is None:
        fmt_guess = _SUFFIX_FORMAT.get(p.suffix.lower())
        if fmt_guess is None and sep is None:
            raise FedrecError(f"{p}: cannot tell the format from the suffix; pass fmt= or sep=")
        fmt = fmt_guess or "csv"  # type: ignore[assignment]
    if fmt == "parquet":
        return _read_parquet_table(p, user_col, item_col, rating_col, time_col, header)
    if fmt not in ("csv", "tsv"):
        raise FedrecError(f"unknown table format {fmt!r}; use csv, tsv or parquet")
    delimiter = sep if sep is not None else ("," if fmt == "csv" else "\t")
    probe = Layout(("x",), ("str",), delimiter, quoted=fmt == "csv" and len(delimiter) == 1)
    first = [field.strip() for field in first_record(p, probe)]
    names = (
        [field.split(":", 1)[0] for field in first]
        if header
        else [str(i) for i in range(len(first))]
    )
    wanted = {"user": user_col, "item": item_col, "rating": rating_col, "time": time_col}
    positions: dict[str, int] = {}
    for role, column in wanted.items():
        if column is not None:
            positions[role] = _column_position(p, column, names, first, header)
    roles_by_position = {pos: role for role, pos in positions.items()}
    kinds: list[Kind] = []
    for index in range(len(names)):
        role = roles_by_position.get(index)
        kinds.append("token" if role in ("user", "item") else "float" if role else "str")
    columns = (
        tuple(names)
        if len(set(names)) == len(names)
        else tuple(f"{name}#{i}" for i, name in enumerate(names))
    )
    layout = Layout(
        columns,
        tuple(kinds),
        delimiter,
        header=tuple(first) if header else None,
        quoted=probe.quoted,
        optional=frozenset(c for i, c in enumerate(columns) if i not in roles_by_position),
    )
    df = read_frame(p, layout)
    col = {role: columns[pos] for role, pos in positions.items()}
    ratings = df[col["rating"]].to_numpy() if "rating" in col else None
    timestamps = np.floor(df[col["time"]].to_numpy()).astype(np.int64) if "time" in col else None
    return build_interactions(
        tokens(df[col["user"]]),
        tokens(df[col["item"]]),
        ratings,
        timestamps,
        p,
        implicit=ratings is None,
    )


def _column_position(
    path: Path, column: Column, names: list[str], first: list[str], header: bool
) -> int:
    if header:
        if isinstance(column, int):
            raise FedrecError(f"{path}: with header=True name columns by header name, not {column}")
        for candidates in (first, names):
            if column in candidates:
                return candidates.index(column)
        raise DataFormatError(
            path, f"no column {column!r}; columns are: {', '.join(first)}", line=1
        )
    if not isinstance(column, int):
        raise FedrecError(
            f"{path}: with header=False name columns by 0-based position, not {column!r}"
        )
    if not 0 <= column < len(names):
        raise DataFormatError(
            path, f"column {column} is out of range: the first line has {len(names)} fields", line=1
        )
    return column


def _read_parquet_table(
    path: Path,
    user_col: Column,
    item_col: Column,
    rating_col: Column | None,
    time_col: Column | None,
    header: bool,
) -> Interactions:
    if importlib.util.find_spec("pyarrow") is None:
        raise FedrecError(
            f"{path}: reading parquet needs the optional pyarrow package: "
            "pip install 'fedrec[parquet]'"
        )
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataFormatError(path, f"not a readable parquet file: {exc}") from None
    names = [str(c) for c in df.columns]

    def series(column: Column) -> pd.Series:
        if isinstance(column, int) and not header:
            if not 0 <= column < len(names):
                raise DataFormatError(
                    path, f"column {column} is out of range ({len(names)} columns)"
                )
            return df.iloc[:, column]
        if str(column) not in names:
            raise DataFormatError(path, f"no column {column!r}; columns are: {', '.join(names)}")
        return df[df.columns[names.index(str(column))]]

    def ids(column: Column) -> np.ndarray:
        values = series(column)
        _parquet_row_error(path, values.isna().to_numpy(), column, values, "is empty")
        if pd.api.types.is_integer_dtype(values):
            return values.to_numpy(dtype=np.int64)
        return tokens(values.astype(str))

    def numbers(column: Column) -> np.ndarray:
        values = series(column)
        numeric = pd.to_numeric(values, errors="coerce").astype("float64")
        bad = ~np.isfinite(numeric.to_numpy())
        _parquet_row_error(path, bad, column, values, "is not a finite number")
        return numeric.to_numpy()

    ratings = numbers(rating_col) if rating_col is not None else None
    timestamps = np.floor(numbers(time_col)).astype(np.int64) if time_col is not None else None
    return build_interactions(ids(user_col), ids(item_col), ratings, timestamps, path, implicit=ratings is None)


def _parquet_row_error(
    path: Path, bad: np.ndarray, column: Column, values: pd.Series, problem: str
) -> None:
    """Parquet has no lines: name the 1-based row instead."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataFormatError(path, f"row {row + 1}: {column} {values.iloc[row]!r} {problem}")
