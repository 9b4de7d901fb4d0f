"""Readers for the raw rating files that federated-recommendation papers use.

Every reader returns an `Interactions` (ids numbered by first appearance, raw ids kept) and
turns any malformed input into a `DataFormatError` naming the file and the 1-based line, so
that the CLI never shows a traceback. The happy path is one vectorised ``pandas.read_csv``
with explicit column types; only when that fails (or leaves holes) is the file re-scanned line
by line to find and report the first bad line.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from fedrec.data.interactions import Interactions
from fedrec.errors import DataFormatError, FedrecError

Kind = Literal["int", "float", "token", "str", "date"]
"""Column types: ``token`` is an id kept as int64 when every value is a plain integer."""

_PANDAS_DTYPE = {"int": "int64", "float": "float64", "token": str, "str": str, "date": str}
_SEP_LABEL = {"\t": "tab-separated", ",": "comma-separated", ";": "semicolon-separated"}
_INT_RE = re.compile(r"\s*[+-]?\d+\s*")
_CANONICAL_INT = r"-?(?:0|[1-9]\d*)"
_DATE_FORMATS = ("%m/%d/%Y", "%Y-%m-%d", "%Y-%m-%d %H:%M:%S")
_INT64_MAX = 2**63 - 1
_MULTI_SEP_STANDIN = "\x1f"
PathLike = str | Path


@dataclass(frozen=True)
class _Layout:
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


@dataclass(frozen=True)
class FedCIASplit:
    """FedCIA's split TSV: the events plus, per event, its split name and client id."""

    interactions: Interactions
    split: np.ndarray
    client: np.ndarray


# ---------------------------------------------------------------------------------------------
# Shared machinery
# ---------------------------------------------------------------------------------------------


def _existing(path: PathLike) -> Path:
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


def _records(path: Path, layout: _Layout) -> Iterator[tuple[int, list[str]]]:
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


def _check_value(column: str, kind: Kind, value: str, optional: bool) -> str | None:
    """Why ``value`` cannot fill ``column``, or None when it can."""
    if value.strip() == "":
        return None if optional else f"{column} is empty"
    if kind == "int":
        if not _INT_RE.fullmatch(value) or abs(int(value)) > _INT64_MAX:
            return f"{column} {value!r} is not an integer"
    elif kind == "float":
        try:
            number = float(value)
        except ValueError:
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


def _diagnose(path: Path, layout: _Layout, reason: str) -> DataFormatError:
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
            problem = _check_value(column, kind, value, column in layout.optional)
            if problem is not None:
                return DataFormatError(path, problem, line=number)
    return DataFormatError(path, f"cannot parse: {reason}")


def _line_of_row(path: Path, layout: _Layout, row: int) -> int | None:
    """The 1-based line of the ``row``-th data record (0-based), as pandas counted them."""
    records = _records(path, layout)
    if layout.header is not None:
        next(records, None)
    for index, (number, _) in enumerate(records):
        if index == row:
            return number
    return None


def _row_error(path: Path, layout: _Layout, bad: np.ndarray, message: Callable[[int], str]) -> None:
    """Raise for the first True row of ``bad`` (a boolean mask over data rows), if any."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataFormatError(path, message(row), line=_line_of_row(path, layout, row))


def _first_record(path: Path, layout: _Layout) -> list[str]:
    """Fields of the first non-blank line (the header, where there is one)."""
    for _, fields in _records(path, layout):
        return fields
    raise DataFormatError(path, "file holds only blank lines", line=1)


def _check_header(path: Path, layout: _Layout) -> None:
    assert layout.header is not None
    got = tuple(field.strip() for field in _first_record(path, layout))
    if got != layout.header:
        expected = layout.sep.join(layout.header)
        raise DataFormatError(
            path,
            f"expected header {expected!r} ({layout.sep_label}), got {layout.sep.join(got)!r}",
            line=1,
        )


def _read(path: PathLike, layout: _Layout) -> pd.DataFrame:
    """Read a delimited file in one vectorised pass, or raise for its first bad line."""
    p = _existing(path)
    if layout.header is not None:
        _check_header(p, layout)
    source: Path | io.BytesIO = p
    sep = layout.sep
    if len(sep) > 1:
        source = io.BytesIO(p.read_bytes().replace(sep.encode(), _MULTI_SEP_STANDIN.encode()))
        sep = _MULTI_SEP_STANDIN
    try:
        df = pd.read_csv(
            source,
            sep=sep,
            header=None,
            names=list(layout.columns),
            index_col=False,
            skiprows=1 if layout.header is not None else 0,
            dtype={c: _PANDAS_DTYPE[k] for c, k in zip(layout.columns, layout.kinds, strict=True)},
            quoting=csv.QUOTE_MINIMAL if layout.quoted else csv.QUOTE_NONE,
            encoding=layout.encoding,
            keep_default_na=False,
            na_values=[""],
            skip_blank_lines=True,
            engine="c",
        )
    except (ValueError, pd.errors.ParserError, OverflowError, csv.Error) as exc:
        raise _diagnose(p, layout, str(exc)) from None
    if len(df) == 0:
        raise DataFormatError(p, "no data rows", line=2 if layout.header is not None else 1)
    required = [c for c in layout.columns if c not in layout.optional]
    holes = df[required].isna().to_numpy().any(axis=1)
    for column, kind in zip(layout.columns, layout.kinds, strict=True):
        if kind == "float":
            holes |= ~np.isfinite(df[column].to_numpy()) & df[column].notna().to_numpy()
    if holes.any():
        raise _diagnose(p, layout, "missing or non-finite values")
    return df


def _tokens(values: pd.Series) -> np.ndarray:
    """Id column as int64 when every value is a plain integer, else as strings."""
    stripped = values.str.strip()
    if stripped.str.fullmatch(_CANONICAL_INT).all():
        try:
            return stripped.astype("int64").to_numpy()
        except (ValueError, OverflowError):
            pass
    return stripped.to_numpy(dtype=object)


def _dates_to_seconds(path: Path, layout: _Layout, column: str, values: pd.Series) -> np.ndarray:
    """Dates like ``11/1/2000`` (or ISO) to Unix seconds at UTC midnight."""
    parsed = pd.to_datetime(values, format=_DATE_FORMATS[0], errors="coerce")
    missing = parsed.isna().to_numpy()
    if missing.any():
        parsed[missing] = pd.to_datetime(values[missing], format="ISO8601", errors="coerce")
        missing = parsed.isna().to_numpy()
    _row_error(path, layout, missing, lambda r: f"{column} {values.iloc[r]!r} is not a date")
    return parsed.to_numpy().astype("datetime64[s]").astype(np.int64)


def _build(
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


def _ms_to_seconds(values: np.ndarray) -> np.ndarray:
    """HetRec timestamps are milliseconds; seconds keep every clock in the library alike."""
    return np.floor_divide(values, 1000)


# ---------------------------------------------------------------------------------------------
# Published formats
# ---------------------------------------------------------------------------------------------

_UIRT = ("user", "item", "rating", "timestamp")
_UIRT_KINDS: tuple[Kind, ...] = ("int", "int", "float", "int")


def _uirt(path: PathLike, layout: _Layout) -> Interactions:
    df = _read(path, layout)
    return _build(
        df[layout.columns[0]].to_numpy(),
        df[layout.columns[1]].to_numpy(),
        df[layout.columns[2]].to_numpy(),
        df[layout.columns[3]].to_numpy(),
        Path(path),
    )


def parse_ml100k(path: PathLike) -> Interactions:
    """MovieLens-100K ``u.data``: ``user<TAB>item<TAB>rating<TAB>timestamp``, no header."""
    return _uirt(path, _Layout(_UIRT, _UIRT_KINDS, "\t"))


def parse_ml1m(path: PathLike) -> Interactions:
    """MovieLens-1M ``ratings.dat``: ``UserID::MovieID::Rating::Timestamp``, no header."""
    return _uirt(path, _Layout(_UIRT, _UIRT_KINDS, "::"))


def parse_pfedrec_csv(path: PathLike) -> Interactions:
    """PFedRec-style ``ratings.dat``: ``user,item,rating,timestamp`` integers, no header.

    The row order is kept as is: the peer code numbers ids and breaks timestamp ties by it.
    """
    return _uirt(path, _Layout(_UIRT, _UIRT_KINDS, ","))


def parse_amazon_ratings(path: PathLike, *, header: bool | None = None) -> Interactions:
    """Amazon "ratings only" CSV: ``user,item,rating,timestamp`` with string ids.

    The published files have no header; ``header=None`` skips a first line whose rating and
    timestamp fields are both non-numeric (a header some re-distributions add).
    """
    p = _existing(path)
    layout = _Layout(_UIRT, ("token", "token", "float", "int"), ",", quoted=True)
    if header is None:
        first = _first_record(p, layout)
        header = len(first) == 4 and all(
            _check_value(c, k, v, False) is not None
            for c, k, v in zip(_UIRT[2:], ("float", "int"), first[2:], strict=True)
        )
    if header:
        first = _first_record(p, layout)
        layout = _Layout(
            _UIRT, layout.kinds, ",", header=tuple(f.strip() for f in first), quoted=True
        )
    df = _read(p, layout)
    return _build(
        _strings(df["user"]),
        _strings(df["item"]),
        df["rating"].to_numpy(),
        df["timestamp"].to_numpy(),
        p,
    )


def _strings(values: pd.Series) -> np.ndarray:
    return values.str.strip().to_numpy(dtype=object)


_ATOMIC_KINDS: dict[str, Kind] = {"token": "token", "float": "float"}


def parse_atomic(path: PathLike) -> Interactions:
    """RecBole atomic ``.inter``: tab-separated with a typed header such as
    ``user_id:token<TAB>item_id:token<TAB>rating:float<TAB>timestamp:float``.

    Columns are found by the name before the colon; ``rating`` and ``timestamp`` are optional
    (implicit data, row order as clock). Other columns are read and ignored.
    """
    p = _existing(path)
    first = _first_record(p, _Layout(("x",), ("str",), "\t"))
    header = tuple(field.strip() for field in first)
    names = tuple(field.split(":", 1)[0] for field in header)
    types = tuple(field.split(":", 1)[1] if ":" in field else "token" for field in header)
    for needed in ("user_id", "item_id"):
        if needed not in names:
            raise DataFormatError(
                p, f"header has no {needed} column (columns: {', '.join(header)})", line=1
            )
    if len(set(names)) != len(names):
        raise DataFormatError(p, f"header repeats a column name: {', '.join(header)}", line=1)
    kinds: tuple[Kind, ...] = tuple(_ATOMIC_KINDS.get(t, "str") for t in types)
    for column in ("rating", "timestamp"):
        if column in names and kinds[names.index(column)] != "float":
            kinds = tuple("float" if n == column else k for n, k in zip(names, kinds, strict=True))
    used = {"user_id", "item_id", "rating", "timestamp"}
    optional = frozenset(n for n in names if n not in used)
    layout = _Layout(names, kinds, "\t", header=header, optional=optional)
    df = _read(p, layout)
    ratings = df["rating"].to_numpy() if "rating" in names else None
    timestamps = (
        np.floor(df["timestamp"].to_numpy()).astype(np.int64) if "timestamp" in names else None
    )
    return _build(
        _tokens(df["user_id"]),
        _tokens(df["item_id"]),
        ratings,
        timestamps,
        p,
        implicit=ratings is None,
    )


def parse_lastfm_user_artists(path: PathLike) -> Interactions:
    """HetRec-2011 Last.fm ``user_artists.dat``: ``userID artistID weight`` with a header.

    The listening count (``weight``) is the rating; the file has no clock, so the row order
    stands in for one.
    """
    layout = _Layout(
        ("userID", "artistID", "weight"),
        ("int", "int", "float"),
        "\t",
        header=("userID", "artistID", "weight"),
    )
    df = _read(path, layout)
    return _build(
        df["userID"].to_numpy(),
        df["artistID"].to_numpy(),
        df["weight"].to_numpy(),
        None,
        Path(path),
    )


def parse_lastfm_tagged(path: PathLike) -> Interactions:
    """HetRec-2011 Last.fm ``user_taggedartists-timestamps.dat``: one row per tag assignment.

    Header ``userID artistID tagID timestamp`` (milliseconds, converted to seconds). The data
    are implicit and a (user, artist) pair repeats once per tag, as in PFedRec's copy.
    """
    columns = ("userID", "artistID", "tagID", "timestamp")
    layout = _Layout(columns, ("int", "int", "int", "int"), "\t", header=columns)
    df = _read(path, layout)
    return _build(
        df["userID"].to_numpy(),
        df["artistID"].to_numpy(),
        None,
        _ms_to_seconds(df["timestamp"].to_numpy()),
        Path(path),
        implicit=True,
    )


def parse_hetrec_movielens(path: PathLike) -> Interactions:
    """HetRec-2011 MovieLens ``user_ratedmovies-timestamps.dat``.

    Header ``userID movieID rating timestamp``; ratings 0.5-5, timestamps in milliseconds
    (converted to seconds).
    """
    columns = ("userID", "movieID", "rating", "timestamp")
    layout = _Layout(columns, ("int", "int", "float", "int"), "\t", header=columns)
    df = _read(path, layout)
    return _build(
        df["userID"].to_numpy(),
        df["movieID"].to_numpy(),
        df["rating"].to_numpy(),
        _ms_to_seconds(df["timestamp"].to_numpy()),
        Path(path),
    )


_TAFENG_COLUMNS = (
    "TRANSACTION_DT",
    "CUSTOMER_ID",
    "AGE_GROUP",
    "PIN_CODE",
    "PRODUCT_SUBCLASS",
    "PRODUCT_ID",
    "AMOUNT",
    "ASSET",
    "SALES_PRICE",
)


def parse_tafeng(path: PathLike) -> Interactions:
    """Ta Feng grocery (Kaggle ``ta_feng_all_months_merged.csv``), implicit purchases.

    The transaction date (``11/1/2000``) becomes Unix seconds at UTC midnight; every purchase
    line is one event, repeated purchases included.
    """
    kinds: tuple[Kind, ...] = (
        "date",
        "token",
        "str",
        "str",
        "str",
        "token",
        "float",
        "float",
        "float",
    )
    layout = _Layout(
        _TAFENG_COLUMNS,
        kinds,
        ",",
        header=_TAFENG_COLUMNS,
        quoted=True,
        optional=frozenset({"AGE_GROUP", "PIN_CODE", "PRODUCT_SUBCLASS"}),
    )
    p = _existing(path)
    df = _read(p, layout)
    timestamps = _dates_to_seconds(p, layout, "TRANSACTION_DT", df["TRANSACTION_DT"])
    return _build(
        _tokens(df["CUSTOMER_ID"]), _tokens(df["PRODUCT_ID"]), None, timestamps, p, implicit=True
    )


def parse_anime(path: PathLike, *, drop_unrated: bool = True) -> Interactions:
    """Kaggle Anime Recommendations ``rating.csv``: ``user_id,anime_id,rating`` with a header.

    A rating of -1 means "watched but not rated". ``drop_unrated=True`` (the default) removes
    those rows so the ratings are the explicit 1-10 scores; with ``False`` they stay, rated
    -1.0, for callers that binarise the data into implicit feedback. No clock: row order.
    """
    columns = ("user_id", "anime_id", "rating")
    layout = _Layout(columns, ("int", "int", "float"), ",", header=columns)
    p = _existing(path)
    df = _read(p, layout)
    ratings = df["rating"].to_numpy()
    bad = ~((ratings == -1) | ((ratings >= 1) & (ratings <= 10)))
    _row_error(p, layout, bad, lambda r: f"rating {ratings[r]:g} is not -1 or in 1..10")
    if drop_unrated:
        df = df[ratings != -1]
    return _build(
        df["user_id"].to_numpy(), df["anime_id"].to_numpy(), df["rating"].to_numpy(), None, p
    )


def parse_book_crossing(path: PathLike, *, keep_implicit: bool = True) -> Interactions:
    """Book-Crossing ``BX-Book-Ratings.csv``: ``"User-ID";"ISBN";"Book-Rating"``, latin-1.

    A rating of 0 records an implicit interaction, 1-10 an explicit rating. With
    ``keep_implicit=True`` (default) the 0 rows stay (rating 0.0); ``False`` drops them.
    ISBNs stay strings. No clock: row order.
    """
    columns = ("User-ID", "ISBN", "Book-Rating")
    layout = _Layout(
        columns, ("token", "str", "int"), ";", header=columns, quoted=True, encoding="latin-1"
    )
    p = _existing(path)
    df = _read(p, layout)
    ratings = df["Book-Rating"].to_numpy()
    bad = (ratings < 0) | (ratings > 10)
    _row_error(p, layout, bad, lambda r: f"Book-Rating {ratings[r]} is not in 0..10")
    if not keep_implicit:
        df = df[ratings != 0]
    return _build(
        _tokens(df["User-ID"]), _strings(df["ISBN"]), df["Book-Rating"].to_numpy(), None, p
    )


def parse_lightgcn_pairs(path: PathLike, *, value_as_rating: bool = False) -> Interactions:
    """LightGCN/GF-CF pair files (``data1.txt``): ``user<TAB>item<TAB>value``, no header.

    The official code reads only the first two columns, so by default the data are implicit;
    ``value_as_rating=True`` keeps the third column as the rating.
    """
    columns = ("user", "item", "value")
    layout = _Layout(columns, ("int", "int", "float"), "\t")
    df = _read(path, layout)
    ratings = df["value"].to_numpy() if value_as_rating else None
    return _build(
        df["user"].to_numpy(),
        df["item"].to_numpy(),
        ratings,
        None,
        Path(path),
        implicit=not value_as_rating,
    )


def parse_metamf_rating(path: PathLike) -> Interactions:
    """MetaMF split files (``ciao.train.rating``): ``user<TAB>item<TAB>rating``, 0-based ids."""
    columns = ("user", "item", "rating")
    layout = _Layout(columns, ("int", "int", "float"), "\t")
    df = _read(path, layout)
    return _build(
        df["user"].to_numpy(), df["item"].to_numpy(), df["rating"].to_numpy(), None, Path(path)
    )


_FEDCIA_COLUMNS = ("client", "user_in_client", "user_global", "item", "split")
_FEDCIA_SPLITS = ("train", "valid", "test")


def read_fedcia_split(path: PathLike) -> FedCIASplit:
    """FedCIA's split TSV (header ``client user_in_client user_global item split``).

    Returns the implicit events keyed by ``user_global`` and ``item`` together with each
    event's split (``train``/``valid``/``test``) and client, so the published split can be
    replayed exactly.
    """
    layout = _Layout(
        _FEDCIA_COLUMNS, ("int", "int", "int", "int", "str"), "\t", header=_FEDCIA_COLUMNS
    )
    p = _existing(path)
    df = _read(p, layout)
    split = df["split"].str.strip().to_numpy(dtype=object)
    bad = ~np.isin(split, _FEDCIA_SPLITS)
    _row_error(p, layout, bad, lambda r: f"split {split[r]!r} is not one of train, valid, test")
    interactions = _build(
        df["user_global"].to_numpy(), df["item"].to_numpy(), None, None, p, implicit=True
    )
    return FedCIASplit(interactions, split, df["client"].to_numpy())


def parse_fedcia_split(path: PathLike) -> Interactions:
    """The events of a FedCIA split TSV without the split column (see `read_fedcia_split`)."""
    return read_fedcia_split(path).interactions


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
    p = _existing(path)
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
    probe = _Layout(("x",), ("str",), delimiter, quoted=fmt == "csv" and len(delimiter) == 1)
    first = [field.strip() for field in _first_record(p, probe)]
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
    layout = _Layout(
        columns,
        tuple(kinds),
        delimiter,
        header=tuple(first) if header else None,
        quoted=probe.quoted,
        optional=frozenset(c for i, c in enumerate(columns) if i not in roles_by_position),
    )
    df = _read(p, layout)
    col = {role: columns[pos] for role, pos in positions.items()}
    ratings = df[col["rating"]].to_numpy() if "rating" in col else None
    timestamps = np.floor(df[col["time"]].to_numpy()).astype(np.int64) if "time" in col else None
    return _build(
        _tokens(df[col["user"]]),
        _tokens(df[col["item"]]),
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
        return _tokens(values.astype(str))

    def numbers(column: Column) -> np.ndarray:
        values = series(column)
        numeric = pd.to_numeric(values, errors="coerce").astype("float64")
        bad = ~np.isfinite(numeric.to_numpy())
        _parquet_row_error(path, bad, column, values, "is not a finite number")
        return numeric.to_numpy()

    ratings = numbers(rating_col) if rating_col is not None else None
    timestamps = np.floor(numbers(time_col)).astype(np.int64) if time_col is not None else None
    return _build(ids(user_col), ids(item_col), ratings, timestamps, path, implicit=ratings is None)


def _parquet_row_error(
    path: Path, bad: np.ndarray, column: Column, values: pd.Series, problem: str
) -> None:
    """Parquet has no lines: name the 1-based row instead."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataFormatError(path, f"row {row + 1}: {column} {values.iloc[row]!r} {problem}")


PARSERS: dict[str, Callable[..., Interactions]] = {
    "ml-100k": parse_ml100k,
    "atomic": parse_atomic,
    "ml-1m": parse_ml1m,
    "pfedrec-csv": parse_pfedrec_csv,
    "amazon-ratings": parse_amazon_ratings,
    "lastfm-user-artists": parse_lastfm_user_artists,
    "lastfm-tagged": parse_lastfm_tagged,
    "hetrec-movielens": parse_hetrec_movielens,
    "tafeng": parse_tafeng,
    "anime": parse_anime,
    "book-crossing": parse_book_crossing,
    "lightgcn-pairs": parse_lightgcn_pairs,
    "metamf-rating": parse_metamf_rating,
    "fedcia-split": parse_fedcia_split,
}
"""Raw formats by name, for callers (the CLI) that pick a parser from a string."""
