"""Reading delimited rating files into `Interactions`, with line-exact errors.

Every reader turns any malformed input into a `DataFormatError` naming the file and the 1-based
line, so that the CLI never shows a traceback. The happy path is one vectorised
``pandas.read_csv`` with explicit column types; only when that fails (or leaves holes) is the
file re-scanned line by line to find and report the first bad line. The published formats
(`fedrec.data.parsers`) and the generic reader (`fedrec.data.tables`) are layouts over it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from fedrec.data.interactions import Interactions
from fedrec.errors import DataFormatError, FedrecError

# pandas is imported where a table is read: with pyarrow it took 1.6 s of the 6.1 s a Flower
# node's process (one a message) spent importing fedrec's app
if TYPE_CHECKING:
    import pandas as pd

Kind = Literal["int", "float", "token", "str", "date", "time"]
"""Column types: ``token`` is an id kept as int64 when every value is a plain integer; ``time``
a number whose type pandas infers (int64 kept exact, else float64, uint64 or text) for `clock`."""

#: pandas' dtype of each kind (None: pandas infers it)
PANDAS_DTYPE = {"int": "int64", "float": "float64", "token": str, "str": str, "date": str, "time": None}
_SEP_LABEL = {"\t": "tab-separated", ",": "comma-separated", ";": "semicolon-separated"}
INT_RE = re.compile(r"\s*[+-]?\d+\s*")
CANONICAL_INT = r"-?(?:0|[1-9]\d*)"
_DATE_FORMATS = ("%m/%d/%Y", "%Y-%m-%d", "%Y-%m-%d %H:%M:%S")
_INT64_MAX = 2**63 - 1
_MULTI_SEP_STANDIN = "\x1f"
_QUOTED = re.compile(rb'("(?:[^"]|"")*")')  # a quoted field ("" a quote inside it), kept whole by split
PathLike = str | Path


@dataclass(frozen=True)
class Layout:
    """How one delimited file is laid out; drives both the fast read and the diagnosis."""

    columns: tuple[str, ...]
    kinds: tuple[Kind, ...]
    sep: str
    header: tuple[str, ...] | None = None
    quoted: bool = False
    encoding: str = "utf-8"
    optional: frozenset[str] = frozenset()

    @property
    def sep_label(self) -> str:
        return _SEP_LABEL.get(self.sep, f"'{self.sep}'-separated")



# ---------------------------------------------------------------------------------------------
# Shared machinery
# ---------------------------------------------------------------------------------------------


def existing(path: PathLike) -> Path:
    """The path, checked to be a non-empty regular file (a zero-byte file is a format error)."""
    p = Path(path)
    if not p.exists():
        raise FedrecError(f"{p}: no such file")
    if not p.is_file():
        raise FedrecError(f"{p}: not a regular file")
    if p.stat().st_size == 0:
        raise DataFormatError(p, "file is empty", line=1)
    return p


def _decoded_lines(path: Path, encoding: str) -> Iterator[str]:
    """Lines without their terminators; a decoding failure names its line."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError as exc:
                raise DataFormatError(
                    path, f"not valid {encoding} text ({exc.reason})", line=number
                ) from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            yield text.rstrip("\r\n")


def _records(path: Path, layout: Layout) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank record, header included, read the slow way."""
    lines = _decoded_lines(path, layout.encoding)
    if layout.quoted:
        reader = csv.reader(lines, delimiter=layout.sep, quotechar='"')
        for fields in reader:
            if fields:
                yield reader.line_num, fields
        return
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line.split(layout.sep)


def check_value(column: str, kind: Kind, value: str, optional: bool) -> str | None:
    """Why ``value`` cannot fill ``column``, or None when it can."""
    if value.strip() == "":
        return None if optional else f"{column} is empty"
    if kind == "int":
        if not INT_RE.fullmatch(value) or abs(int(value)) > _INT64_MAX:
            return f"{column} {value!r} is not an integer"
    elif kind in ("float", "time"):
        try:
            number = float(value)
        except ValueError:
            return f"{column} {value!r} is not a number"
        if kind == "time" and "_" in value:  # float() takes 1_000; pandas does not
            return f"{column} {value!r} is not a number"
        if not math.isfinite(number):
            return f"{column} {value!r} is not a finite number"
    elif kind == "date" and _parse_date(value) is None:
        return f"{column} {value!r} is not a date like 11/1/2000"
    return None


def _parse_date(value: str) -> datetime | None:
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(value.strip(), fmt)
        except ValueError:
            continue
    return None


def diagnose(path: Path, layout: Layout, reason: str) -> DataFormatError:
    """Find the first line that breaks ``layout``; ``reason`` is what the fast path saw."""
    n = len(layout.columns)
    records = _records(path, layout)
    if layout.header is not None:
        next(records, None)
    for number, fields in records:
        if len(fields) != n:
            return DataFormatError(
                path, f"expected {n} {layout.sep_label} fields, got {len(fields)}", line=number
            )
        for column, kind, value in zip(layout.columns, layout.kinds, fields, strict=True):
            problem = check_value(column, kind, value, column in layout.optional)
            if problem is not None:
                return DataFormatError(path, problem, line=number)
    return DataFormatError(path, f"cannot parse: {reason}")


def _line_of_row(path: Path, layout: Layout, row: int) -> int | None:
    """The 1-based line of the ``row``-th data record (0-based), as pandas counted them."""
    records = _records(path, layout)
    if layout.header is not None:
        next(records, None)
    for index, (number, _) in enumerate(records):
        if index == row:
            return number
    return None


def row_error(path: Path, layout: Layout, bad: np.ndarray, message: Callable[[int], str]) -> None:
    """Raise for the first True row of ``bad`` (a boolean mask over data rows), if any."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataFormatError(path, message(row), line=_line_of_row(path, layout, row))


def first_record(path: Path, layout: Layout) -> list[str]:
    """Fields of the first non-blank line (the header, where there is one)."""
    for _, fields in _records(path, layout):
        return fields
    raise DataFormatError(path, "file holds only blank lines", line=1)


def _check_header(path: Path, layout: Layout) -> None:
    assert layout.header is not None
    got = tuple(field.strip() for field in first_record(path, layout))
    if got != layout.header:
        expected = layout.sep.join(layout.header)
        raise DataFormatError(
            path,
            f"expected header {expected!r} ({layout.sep_label}), got {layout.sep.join(got)!r}",
            line=1,
        )


def read_frame(path: PathLike, layout: Layout) -> pd.DataFrame:
    """Read a delimited file in one vectorised pass, or raise for its first bad line."""
    import pandas as pd

    p = existing(path)
    if layout.header is not None:
        _check_header(p, layout)
    source: Path | io.BytesIO = p
    sep = layout.sep
    if len(sep.encode(layout.encoding)) > 1:  # pandas' C reader splits on one byte: '::', or a non-ASCII '§'
        raw, wide, standin = p.read_bytes(), sep.encode(layout.encoding), _MULTI_SEP_STANDIN.encode()
        if layout.quoted:  # swapped outside quoted fields only: one inside quotes is text
            parts = _QUOTED.split(raw)
            source = io.BytesIO(b"".join(part if i % 2 else part.replace(wide, standin) for i, part in enumerate(parts)))
        else:
            source = io.BytesIO(raw.replace(wide, standin))
        sep = _MULTI_SEP_STANDIN
    try:
        df = pd.read_csv(
            source,
            sep=sep,
            header=None,
            names=list(layout.columns),
            index_col=False,
            skiprows=1 if layout.header is not None else 0,
            dtype={c: PANDAS_DTYPE[k] for c, k in zip(layout.columns, layout.kinds, strict=True)
                   if PANDAS_DTYPE[k] is not None},
            quoting=csv.QUOTE_MINIMAL if layout.quoted else csv.QUOTE_NONE,
            encoding=layout.encoding,
            keep_default_na=False,
            na_values=[""],
            skip_blank_lines=True,
            engine="c",
        )
    except (ValueError, pd.errors.ParserError, OverflowError, csv.Error) as exc:
        raise diagnose(p, layout, str(exc)) from None
    if len(df) == 0:
        raise DataFormatError(p, "no data rows", line=2 if layout.header is not None else 1)
    required = [c for c in layout.columns if c not in layout.optional]
    holes = df[required].isna().to_numpy().any(axis=1)
    for column, kind in zip(layout.columns, layout.kinds, strict=True):
        if kind == "float":
            holes |= ~np.isfinite(df[column].to_numpy()) & df[column].notna().to_numpy()
        elif kind == "time":  # int64 needs no check; floats may be inf; text may be no number
            values = df[column]
            if pd.api.types.is_float_dtype(values):
                holes |= ~np.isfinite(values.to_numpy()) & values.notna().to_numpy()
            elif not pd.api.types.is_integer_dtype(values):
                numbers = pd.to_numeric(values.astype(str).str.strip(), errors="coerce").to_numpy(dtype=np.float64)
                holes |= ~np.isfinite(numbers) & values.notna().to_numpy()
    if holes.any():
        raise diagnose(p, layout, "missing or non-finite values")
    return df


def tokens(values: pd.Series) -> np.ndarray:
    """Id column as int64 when every value is a plain integer, else as strings."""
    stripped = values.str.strip()
    if stripped.str.fullmatch(CANONICAL_INT).all():
        try:
            return stripped.astype("int64").to_numpy()
        except (ValueError, OverflowError):
            pass
    return stripped.to_numpy(dtype=object)


def clock(values: pd.Series) -> np.ndarray:
    """A ``time`` column (every value a finite number) as int64 that orders the rows as the
    times do.

    Whole numbers are kept as they are: pandas reads a column of int64 values exactly
    (seconds, milliseconds and nanoseconds alike; a float's 53 bits would tie nanoseconds
    apart). Otherwise the column becomes the times' ranks (equal times, equal ranks): whole
    numbers beyond int64 ranked exactly, times with a fraction ranked as 64-bit floats (about
    16 significant digits). fedrec compares times and never subtracts them, so ranks split and
    order the rows as the times would, where flooring tied times that differ (every time in
    [0, 1) was 0) and a cast wrapped 1e19 round to the earliest time."""
    import pandas as pd

    if pd.api.types.is_signed_integer_dtype(values):
        return values.to_numpy(dtype=np.int64)
    if pd.api.types.is_integer_dtype(values):  # uint64: beyond int64, exact
        return np.unique(values.to_numpy(), return_inverse=True)[1].reshape(-1).astype(np.int64)
    if pd.api.types.is_float_dtype(values):
        return order_ranks(values.to_numpy(dtype=np.float64))
    text = values.astype(str).str.strip()  # what pandas could not type: spaces, whole numbers beyond uint64
    if text.str.fullmatch(r"[+-]?\d+").all():
        whole = [int(t) for t in text]  # Python ints: exact at any size
        if all(-(2**63) <= t < 2**63 for t in whole):
            return np.array(whole, np.int64)
        return np.unique(np.array(whole, dtype=object), return_inverse=True)[1].reshape(-1).astype(np.int64)
    return order_ranks(pd.to_numeric(text).to_numpy(dtype=np.float64))


def order_ranks(times: np.ndarray) -> np.ndarray:
    """``times`` as int64 ranks (0 the earliest; equal times, equal ranks); whole numbers that
    fit a float's 53 bits exactly are returned as they are."""
    times = np.asarray(times, np.float64)
    if np.all(np.floor(times) == times) and np.all(np.abs(times) < 2.0**53):
        return times.astype(np.int64)
    return np.unique(times, return_inverse=True)[1].reshape(-1).astype(np.int64)


def dates_to_seconds(path: Path, layout: Layout, column: str, values: pd.Series) -> np.ndarray:
    """Dates like ``11/1/2000`` (or ISO) to Unix seconds at UTC midnight."""
    import pandas as pd

    parsed = pd.to_datetime(values, format=_DATE_FORMATS[0], errors="coerce")
    missing = parsed.isna().to_numpy()
    if missing.any():
        parsed[missing] = pd.to_datetime(values[missing], format="ISO8601", errors="coerce")
        missing = parsed.isna().to_numpy()
    row_error(path, layout, missing, lambda r: f"{column} {values.iloc[r]!r} is not a date")
    return parsed.to_numpy().astype("datetime64[s]").astype(np.int64)


def build_interactions(
    users: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray | None,
    timestamps: np.ndarray | None,
    path: Path,
    implicit: bool = False,
) -> Interactions:
    return Interactions.from_raw(
        users, items, ratings, timestamps, name=Path(path).stem, implicit=implicit
    )


def ms_to_seconds(values: np.ndarray) -> np.ndarray:
    """HetRec timestamps are milliseconds; seconds keep every clock in the library alike."""
    return np.floor_divide(values, 1000)
