"""The generic reader: a user/item(/rating/time) table in any delimited or Parquet file."""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from fedrec.data.delimited import (
    CANONICAL_INT,
    INT_RE,
    Kind,
    Layout,
    PathLike,
    build_interactions,
    clock,
    existing,
    first_record,
    order_ranks,
    read_frame,
    tokens,
)
from fedrec.data.interactions import Interactions
from fedrec.errors import DataFormatError, FedrecError

if TYPE_CHECKING:  # imported where a table is read (`fedrec.data.delimited`)
    import pandas as pd

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
#: what ``--columns`` names, in its positional order
ROLES = ("user", "item", "rating", "time")


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
    ``time_col`` they have no clock (``Interactions.clock`` False: leave-one-out holds out random
    rows). Parquet needs the optional ``pyarrow``.
    """
    p, fmt = _format(path, fmt, sep)
    if fmt == "parquet":
        return _read_parquet_table(p, user_col, item_col, rating_col, time_col, header)
    delimiter = sep if sep is not None else ("," if fmt == "csv" else "\t")
    probe = Layout(("x",), ("str",), delimiter, quoted=fmt == "csv" and len(delimiter) == 1)
    first, names, positions = _positions(p, probe, header, user_col, item_col, rating_col, time_col)
    roles_by_position = {pos: role for role, pos in positions.items()}
    kinds: list[Kind] = []
    for index in range(len(names)):
        role = roles_by_position.get(index)
        kinds.append("token" if role in ("user", "item") else "time" if role == "time" else "float" if role else "str")
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
    if not header:
        _refuse_a_header_read_as_data(p, df[col["user"]], df[col["item"]])
    ratings = df[col["rating"]].to_numpy() if "rating" in col else None
    timestamps = clock(df[col["time"]]) if "time" in col else None
    return build_interactions(
        tokens(df[col["user"]]),
        tokens(df[col["item"]]),
        ratings,
        timestamps,
        p,
        implicit=ratings is None,
    )


def _refuse_a_header_read_as_data(path: Path, users: pd.Series, items: pd.Series) -> None:
    """Columns named by position read every line as data: a first line of words over lines of
    numeric ids is a header, which would become one more user and item."""
    if len(users) < 2:
        return
    first = (str(users.iloc[0]).strip(), str(items.iloc[0]).strip())
    if any(INT_RE.fullmatch(v) for v in first):  # a number: data (the common case, at no cost)
        return
    if all(v.str.strip().iloc[1:].str.fullmatch(CANONICAL_INT).all() for v in (users, items)):
        raise DataFormatError(path, f"the first line ({first[0]}, {first[1]}) looks like a header over numeric ids: "
                              "name the columns by the header's names in --columns, not by position", line=1)


#: header names that say a time column (as MovieLens' ``timestamp``)
_TIME_NAMES = frozenset({"time", "timestamp", "ts", "datetime", "date"})


def _named_role(column: str) -> str | None:
    """The role a header name says (``rating``, ``timestamp``: time), or None."""
    name = column.strip().lower()
    return "time" if name in _TIME_NAMES else name if name in ROLES else None


def parse_columns(text: str) -> dict[str, Column]:
    """``--columns`` as {role: column}: ``USER,ITEM[,RATING][,TIME]`` in that order (an empty
    field skips a role: ``user,item,,time`` has no rating), or ``ROLE=COLUMN`` pairs in any
    order (``user=uid,item=song,time=ts``). Columns are header names, or 0-based positions for a
    file without a header (all of them numbers)."""
    parts = [p.strip() for p in str(text).split(",")]
    usage = (f"--columns {text!r}: give USER,ITEM[,RATING][,TIME] (an empty field skips one: "
             "user,item,,time) or ROLE=COLUMN pairs (user=..., item=..., rating=..., time=...)")
    if any("=" in p for p in parts):
        pairs = [p.partition("=") for p in parts]
        roles = [r.strip().lower() for r, _, _ in pairs]
        if not all(sep for _, sep, _ in pairs) or set(roles) - set(ROLES) or len(set(roles)) != len(roles):
            raise FedrecError(usage)
        named = {r: c.strip() for r, (_, _, c) in zip(roles, pairs, strict=True)}
    else:
        if not 2 <= len(parts) <= 4:
            raise FedrecError(usage)
        named = {role: p for role, p in zip(ROLES, parts, strict=False) if p}
        for role, column in named.items():  # user,item,timestamp: the third role is the rating
            if _named_role(column) not in (None, role):
                by_name = {_named_role(c): c for c in named.values() if _named_role(c)}
                at = {r: c for r, c in named.items() if not _named_role(c)}
                fix = [by_name.get(r, at.get(r, "")) for r in ROLES]
                hint = f" (--columns {','.join(fix).rstrip(',')}?)" if fix[0] and fix[1] else ""
                raise FedrecError(f"--columns {text!r} gives the {role} role the column named {column!r}: the "
                                  f"roles go USER,ITEM[,RATING][,TIME], an empty field skipping one{hint}")
    if not named.get("user") or not named.get("item") or not all(named.values()):
        raise FedrecError(usage)
    if len(set(named.values())) != len(named):
        raise FedrecError(f"--columns {text!r}: one column named for two roles")
    if all(c.isdigit() for c in named.values()):
        return {r: int(c) for r, c in named.items()}
    if any(c.isdigit() for c in named.values()):
        raise FedrecError(f"--columns {text!r}: name every column by its header, or every one by "
                          "its 0-based position (a file without a header)")
    return dict(named)


def check_columns(path: PathLike, columns: str, sep: str | None = None) -> None:
    """Check, from its first line (a Parquet file: its schema) alone, that the file ``path``
    exists, its format is known and it has the ``--columns`` ``columns``: the errors
    `read_table` would raise on them, before a command reads the whole file or writes anything."""
    roles = parse_columns(columns)
    cols = list(roles.values())
    header = not all(isinstance(c, int) for c in cols)
    p, fmt = _format(path, None, sep)
    wanted = {f"{role}_col": column for role, column in roles.items()}
    if fmt == "parquet":
        names = _parquet_columns(p)
        for column in cols:
            _parquet_position(p, column, names, header)
        return
    delimiter = sep if sep is not None else ("," if fmt == "csv" else "\t")
    probe = Layout(("x",), ("str",), delimiter, quoted=fmt == "csv" and len(delimiter) == 1)
    _positions(p, probe, header, **wanted)


def _format(path: PathLike, fmt: str | None, sep: str | None) -> tuple[Path, str]:
    """The existing file ``path`` and its format: ``fmt``, else the suffix's."""
    p = existing(path)
    if fmt is None:
        fmt_guess = _SUFFIX_FORMAT.get(p.suffix.lower())
        if fmt_guess is None and sep is None:
            raise FedrecError(f"{p}: cannot tell the format from its suffix (.csv, .tsv, .txt, .dat, .parquet, "
                              "...); give the separator (--sep, or read_table's sep=)")
        fmt = fmt_guess or "csv"
    if fmt not in ("csv", "tsv", "parquet"):
        raise FedrecError(f"unknown table format {fmt!r}; use csv, tsv or parquet")
    return p, fmt


def _positions(
    path: Path,
    probe: Layout,
    header: bool,
    user_col: Column,
    item_col: Column,
    rating_col: Column | None = None,
    time_col: Column | None = None,
) -> tuple[list[str], list[str], dict[str, int]]:
    """The first line's fields, the column names and the position of each named role."""
    first = [field.strip() for field in first_record(path, probe)]
    names = (
        [field.split(":", 1)[0] for field in first]
        if header
        else [str(i) for i in range(len(first))]
    )
    wanted = {"user": user_col, "item": item_col, "rating": rating_col, "time": time_col}
    positions: dict[str, int] = {}
    for role, column in wanted.items():
        if column is not None:
            if header and len(first) == 1 and column not in first + names:
                _wrong_separator(path, column, first[0], probe)
            positions[role] = _column_position(path, column, names, first, header)
    return first, names, positions


#: separators a one-field first line is tested for, the likeliest first
_OTHER_SEPARATORS = ("\t", ",", ";", "|", "::")


def _wrong_separator(path: Path, column: Column, line: str, probe: Layout) -> None:
    """Where the first line is one field that another separator splits into fields naming
    ``column``, say so: the columns listed back joined by that separator read as if they were
    there."""
    def names(sep: str) -> list[str]:
        return [field.strip().strip('"').split(":", 1)[0] for field in line.split(sep)]

    other = next((sep for sep in _OTHER_SEPARATORS if sep != probe.sep and str(column) in names(sep)), None)
    if other is None:
        return
    label = Layout((), (), other).sep_label
    suffix = {",": " or the suffix .csv", "\t": " or the suffix .tsv"}.get(other, "")
    raise DataFormatError(
        path, f"no column {column!r}: read as {probe.sep_label}, the first line is one field ({line!r}); "
        f"it looks {label}: give its separator (`fedrec data add ... --sep`, read_table's sep=){suffix}", line=1)


def _shown(names: list[str], most: int = 20) -> str:
    """A first line's fields for a message: escaped where not printable (a binary file's bytes
    would reach the terminal), each cut at 40 characters, at most ``most`` of them."""
    cut = [n if n.isprintable() and len(n) <= 40 else repr(n[:40])[1:-1] + ("..." if len(n) > 40 else "")
           for n in names[:most]]
    return ", ".join(cut) + (f", ... ({len(names)} in all)" if len(names) > most else "")


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
            path, f"no column {column!r}; columns are: {_shown(first)}", line=1
        )
    if not isinstance(column, int):
        raise FedrecError(
            f"{path}: with header=False name columns by 0-based position, not {column!r}"
        )
    if not 0 <= column < len(names):
        fits = [sep for sep in _OTHER_SEPARATORS if len(first) == 1 and len(first[0].split(sep)) > column]
        hint = (f"; it looks {Layout((), (), fits[0]).sep_label}: give its separator (`fedrec data add ... --sep`, "
                "read_table's sep=)") if fits else ""
        raise DataFormatError(
            path, f"column {column} is out of range: the first line has {len(names)} fields{hint}", line=1
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
    import pandas as pd

    _need_pyarrow(path)
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataFormatError(path, f"not a readable parquet file: {exc}") from None
    names = [str(c) for c in df.columns]
    # every column is found before any value is judged: a missing column is said first
    wanted = {role: column for role, column in (("user", user_col), ("item", item_col), ("rating", rating_col),
                                               ("time", time_col)) if column is not None}
    at = {role: _parquet_position(path, column, names, header) for role, column in wanted.items()}

    def ids(role: str) -> np.ndarray:
        values = df.iloc[:, at[role]]
        _parquet_row_error(path, values.isna().to_numpy(), wanted[role], values, "is empty")  # Int64's <NA> too
        if pd.api.types.is_integer_dtype(values):
            return values.to_numpy(dtype=np.int64)
        # a Parquet column has one type: a list or map column is nested from its first row on
        if len(values) and isinstance(values.iloc[0], (list, tuple, dict, np.ndarray)):
            raise DataFormatError(path, f"{wanted[role]}: a column of lists or maps, not of ids")
        text = values.astype(str)
        _parquet_row_error(path, (text.str.strip() == "").to_numpy(), wanted[role], values, "is empty")
        return tokens(text)

    def numbers(role: str) -> np.ndarray:
        values = df.iloc[:, at[role]]
        _parquet_row_error(path, values.isna().to_numpy(), wanted[role], values, "is empty")
        numeric = pd.to_numeric(values, errors="coerce").astype("float64")
        bad = ~np.isfinite(numeric.to_numpy())
        _parquet_row_error(path, bad, wanted[role], values, "is not a finite number")
        return numeric.to_numpy()

    def times() -> np.ndarray:
        """Integers as they are (nanoseconds do not fit a float's 53 bits); dates and times as
        seconds since 1970 (UTC), as a text date is read; other numbers as a text time column
        is read (`fedrec.data.delimited.clock`: whole ones as they are, else their ranks)."""
        values = df.iloc[:, at["time"]]
        _parquet_row_error(path, values.isna().to_numpy(), wanted["time"], values, "is empty")
        if pd.api.types.is_integer_dtype(values):
            return values.to_numpy(dtype=np.int64)
        dated = pd.api.types.is_datetime64_any_dtype(values) or (
            values.dtype == object and isinstance(values.iloc[0], datetime.date))
        if dated:
            try:
                since = pd.to_datetime(values, utc=True) - pd.Timestamp(0, tz="UTC")
            except (ValueError, TypeError) as e:
                raise DataFormatError(path, f"{wanted['time']}: not a column of dates ({e})") from None
            return (since // pd.Timedelta(seconds=1)).to_numpy(dtype=np.int64)
        return order_ranks(numbers("time"))

    ratings = numbers("rating") if rating_col is not None else None
    timestamps = times() if time_col is not None else None
    return build_interactions(ids("user"), ids("item"), ratings, timestamps, path, implicit=ratings is None)


def _need_pyarrow(path: Path) -> None:
    if importlib.util.find_spec("pyarrow") is None:
        raise FedrecError(
            f"{path}: reading parquet needs the optional pyarrow package: "
            "pip install 'fedrec[parquet]'"
        )


def _parquet_columns(path: Path) -> list[str]:
    """The column names of a Parquet file as pandas reads it (less a stored pandas index),
    from its schema: no data is read."""
    _need_pyarrow(path)
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        index = {c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
        return [str(name) for name in schema.names if name not in index]
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataFormatError(path, f"not a readable parquet file: {exc}") from None


def _parquet_position(path: Path, column: Column, names: list[str], header: bool) -> int:
    """The 0-based position of ``column`` (a position without a header, else a name)."""
    if isinstance(column, int) and not header:
        if not 0 <= column < len(names):
            raise DataFormatError(path, f"column {column} is out of range ({len(names)} columns)")
        return column
    if str(column) not in names:
        raise DataFormatError(path, f"no column {column!r}; columns are: {_shown(names)}")
    return names.index(str(column))


def _parquet_row_error(
    path: Path, bad: np.ndarray, column: Column, values: pd.Series, problem: str
) -> None:
    """Parquet has no lines: name the 1-based row instead."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = values.iloc[row]
        if isinstance(value, np.generic | np.ndarray):  # numpy's own reprs say np.float64(inf), array([1])
            value = value.tolist()
        shown = "" if problem == "is empty" else f" {value!r}"
        raise DataFormatError(path, f"row {row + 1}: {column}{shown} {problem}")
