"""Readers for the raw rating files that federated-recommendation papers use.

Every reader returns an `Interactions` (ids numbered by first appearance, raw ids kept) and
turns any malformed input into a `DataFormatError` naming the file and the 1-based line
(`fedrec.data.delimited`); files in no published format: `fedrec.data.tables.read_table`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedrec.data.delimited import (
    Kind,
    Layout,
    PathLike,
    build_interactions,
    check_value,
    dates_to_seconds,
    existing,
    first_record,
    ms_to_seconds,
    read_frame,
    row_error,
    tokens,
)
from fedrec.data.interactions import Interactions
from fedrec.errors import DataFormatError

if TYPE_CHECKING:  # imported where a table is read (`fedrec.data.delimited`)
    import pandas as pd


@dataclass(frozen=True)
class FedCIASplit:
    """FedCIA's split TSV: the events plus, per event, its split name and client id."""

    interactions: Interactions
    split: np.ndarray
    client: np.ndarray


# ---------------------------------------------------------------------------------------------
# Published formats
# ---------------------------------------------------------------------------------------------

_UIRT = ("user", "item", "rating", "timestamp")
_UIRT_KINDS: tuple[Kind, ...] = ("int", "int", "float", "int")


def _uirt(path: PathLike, layout: Layout) -> Interactions:
    df = read_frame(path, layout)
    return build_interactions(
        df[layout.columns[0]].to_numpy(),
        df[layout.columns[1]].to_numpy(),
        df[layout.columns[2]].to_numpy(),
        df[layout.columns[3]].to_numpy(),
        Path(path),
    )


def parse_ml100k(path: PathLike) -> Interactions:
    """MovieLens-100K ``u.data``: ``user<TAB>item<TAB>rating<TAB>timestamp``, no header."""
    return _uirt(path, Layout(_UIRT, _UIRT_KINDS, "\t"))


def parse_ml1m(path: PathLike) -> Interactions:
    """MovieLens-1M ``ratings.dat``: ``UserID::MovieID::Rating::Timestamp``, no header."""
    return _uirt(path, Layout(_UIRT, _UIRT_KINDS, "::"))


def parse_pfedrec_csv(path: PathLike) -> Interactions:
    """PFedRec-style ``ratings.dat``: ``user,item,rating,timestamp`` integers, no header.

    The row order is kept as is: the peer code numbers ids and breaks timestamp ties by it.
    """
    return _uirt(path, Layout(_UIRT, _UIRT_KINDS, ","))


def parse_amazon_ratings(path: PathLike, *, header: bool | None = None) -> Interactions:
    """Amazon "ratings only" CSV: ``user,item,rating,timestamp`` with string ids.

    The published files have no header; ``header=None`` skips a first line whose rating and
    timestamp fields are both non-numeric (a header some re-distributions add).
    """
    p = existing(path)
    layout = Layout(_UIRT, ("token", "token", "float", "int"), ",", quoted=True)
    if header is None:
        first = first_record(p, layout)
        header = len(first) == 4 and all(
            check_value(c, k, v, False) is not None
            for c, k, v in zip(_UIRT[2:], ("float", "int"), first[2:], strict=True)
        )
    if header:
        first = first_record(p, layout)
        layout = Layout(
            _UIRT, layout.kinds, ",", header=tuple(f.strip() for f in first), quoted=True
        )
    df = read_frame(p, layout)
    return build_interactions(
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
    p = existing(path)
    first = first_record(p, Layout(("x",), ("str",), "\t"))
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
    layout = Layout(names, kinds, "\t", header=header, optional=optional)
    df = read_frame(p, layout)
    ratings = df["rating"].to_numpy() if "rating" in names else None
    timestamps = (
        np.floor(df["timestamp"].to_numpy()).astype(np.int64) if "timestamp" in names else None
    )
    return build_interactions(
        tokens(df["user_id"]),
        tokens(df["item_id"]),
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
    layout = Layout(
        ("userID", "artistID", "weight"),
        ("int", "int", "float"),
        "\t",
        header=("userID", "artistID", "weight"),
    )
    df = read_frame(path, layout)
    return build_interactions(
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
    layout = Layout(columns, ("int", "int", "int", "int"), "\t", header=columns)
    df = read_frame(path, layout)
    return build_interactions(
        df["userID"].to_numpy(),
        df["artistID"].to_numpy(),
        None,
        ms_to_seconds(df["timestamp"].to_numpy()),
        Path(path),
        implicit=True,
    )


def parse_lastfm_tagged_dates(path: PathLike) -> Interactions:
    """HetRec-2011 Last.fm ``user_taggedartists.dat``: the tag assignments with their dates.

    Header ``userID artistID tagID day month year``; a row's clock is its date (midnight UTC,
    in seconds): the same order as the ``-timestamps`` file's milliseconds, which are local
    midnights of the same dates. One implicit row per tag assignment.
    """
    columns = ("userID", "artistID", "tagID", "day", "month", "year")
    layout = Layout(columns, ("int",) * 6, "\t", header=columns)
    df = read_frame(path, layout)
    iso = (df["year"].astype(str) + "-" + df["month"].astype(str).str.zfill(2) + "-"
           + df["day"].astype(str).str.zfill(2))
    seconds = dates_to_seconds(Path(path), layout, "date (year-month-day)", iso)
    return build_interactions(
        df["userID"].to_numpy(), df["artistID"].to_numpy(), None, seconds, Path(path), implicit=True,
    )


def parse_hetrec_movielens(path: PathLike) -> Interactions:
    """HetRec-2011 MovieLens ``user_ratedmovies-timestamps.dat``.

    Header ``userID movieID rating timestamp``; ratings 0.5-5, timestamps in milliseconds
    (converted to seconds).
    """
    columns = ("userID", "movieID", "rating", "timestamp")
    layout = Layout(columns, ("int", "int", "float", "int"), "\t", header=columns)
    df = read_frame(path, layout)
    return build_interactions(
        df["userID"].to_numpy(),
        df["movieID"].to_numpy(),
        df["rating"].to_numpy(),
        ms_to_seconds(df["timestamp"].to_numpy()),
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
    layout = Layout(
        _TAFENG_COLUMNS,
        kinds,
        ",",
        header=_TAFENG_COLUMNS,
        quoted=True,
        optional=frozenset({"AGE_GROUP", "PIN_CODE", "PRODUCT_SUBCLASS"}),
    )
    p = existing(path)
    df = read_frame(p, layout)
    timestamps = dates_to_seconds(p, layout, "TRANSACTION_DT", df["TRANSACTION_DT"])
    return build_interactions(
        tokens(df["CUSTOMER_ID"]), tokens(df["PRODUCT_ID"]), None, timestamps, p, implicit=True
    )


def parse_anime(path: PathLike, *, drop_unrated: bool = True) -> Interactions:
    """Kaggle Anime Recommendations ``rating.csv``: ``user_id,anime_id,rating`` with a header.

    A rating of -1 means "watched but not rated". ``drop_unrated=True`` (the default) removes
    those rows so the ratings are the explicit 1-10 scores; with ``False`` they stay, rated
    -1.0, for callers that binarise the data into implicit feedback. No clock: row order.
    """
    columns = ("user_id", "anime_id", "rating")
    layout = Layout(columns, ("int", "int", "float"), ",", header=columns)
    p = existing(path)
    df = read_frame(p, layout)
    ratings = df["rating"].to_numpy()
    bad = ~((ratings == -1) | ((ratings >= 1) & (ratings <= 10)))
    row_error(p, layout, bad, lambda r: f"rating {ratings[r]:g} is not -1 or in 1..10")
    if drop_unrated:
        df = df[ratings != -1]
    return build_interactions(
        df["user_id"].to_numpy(), df["anime_id"].to_numpy(), df["rating"].to_numpy(), None, p
    )


def parse_book_crossing(path: PathLike, *, keep_implicit: bool = True) -> Interactions:
    """Book-Crossing ``BX-Book-Ratings.csv``: ``"User-ID";"ISBN";"Book-Rating"``, latin-1.

    A rating of 0 records an implicit interaction, 1-10 an explicit rating. With
    ``keep_implicit=True`` (default) the 0 rows stay (rating 0.0); ``False`` drops them.
    ISBNs stay strings. No clock: row order.
    """
    columns = ("User-ID", "ISBN", "Book-Rating")
    layout = Layout(
        columns, ("token", "str", "int"), ";", header=columns, quoted=True, encoding="latin-1"
    )
    p = existing(path)
    df = read_frame(p, layout)
    ratings = df["Book-Rating"].to_numpy()
    bad = (ratings < 0) | (ratings > 10)
    row_error(p, layout, bad, lambda r: f"Book-Rating {ratings[r]} is not in 0..10")
    if not keep_implicit:
        df = df[ratings != 0]
    return build_interactions(
        tokens(df["User-ID"]), _strings(df["ISBN"]), df["Book-Rating"].to_numpy(), None, p
    )


def parse_lightgcn_pairs(path: PathLike, *, value_as_rating: bool = False) -> Interactions:
    """LightGCN/GF-CF pair files (``data1.txt``): ``user<TAB>item<TAB>value``, no header.

    The official code reads only the first two columns, so by default the data are implicit;
    ``value_as_rating=True`` keeps the third column as the rating.
    """
    columns = ("user", "item", "value")
    layout = Layout(columns, ("int", "int", "float"), "\t")
    df = read_frame(path, layout)
    ratings = df["value"].to_numpy() if value_as_rating else None
    return build_interactions(
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
    layout = Layout(columns, ("int", "int", "float"), "\t")
    df = read_frame(path, layout)
    return build_interactions(
        df["user"].to_numpy(), df["item"].to_numpy(), df["rating"].to_numpy(), None, Path(path)
    )


def parse_metamf_split(path: PathLike) -> Interactions:
    """A MetaMF split (``ciao.train.rating``) with its siblings ``.valid.rating`` and
    ``.test.rating``: the three files' ratings, each with its published split in
    ``given_split`` (read by the ``given-rating`` protocol)."""
    p = existing(path)
    if not p.name.endswith(".train.rating"):
        raise DataFormatError(p, "a MetaMF split is read from its .train.rating file")
    stem = p.name[: -len(".train.rating")]
    parts = [parse_metamf_rating(p)] + [parse_metamf_rating(existing(p.with_name(f"{stem}.{part}.rating")))
                                        for part in ("valid", "test")]
    raw = [(x.user_ids[x.users], x.item_ids[x.items], x.ratings) for x in parts]
    merged = build_interactions(np.concatenate([r[0] for r in raw]), np.concatenate([r[1] for r in raw]),
                                np.concatenate([r[2] for r in raw]), None, p)
    split = np.repeat(np.arange(3, dtype=np.int8), [len(x) for x in parts])  # train 0, valid 1, test 2
    return dataclasses.replace(merged, given_split=split)


_FEDCIA_COLUMNS = ("client", "user_in_client", "user_global", "item", "split")
_FEDCIA_SPLITS = ("train", "valid", "test")


def read_fedcia_split(path: PathLike) -> FedCIASplit:
    """FedCIA's split TSV (header ``client user_in_client user_global item split``).

    Returns the implicit events keyed by ``user_global`` and ``item`` together with each
    event's split (``train``/``valid``/``test``) and client, so the published split can be
    replayed exactly.
    """
    layout = Layout(
        _FEDCIA_COLUMNS, ("int", "int", "int", "int", "str"), "\t", header=_FEDCIA_COLUMNS
    )
    p = existing(path)
    df = read_frame(p, layout)
    split = df["split"].str.strip().to_numpy(dtype=object)
    bad = ~np.isin(split, _FEDCIA_SPLITS)
    row_error(p, layout, bad, lambda r: f"split {split[r]!r} is not one of train, valid, test")
    interactions = build_interactions(
        df["user_global"].to_numpy(), df["item"].to_numpy(), None, None, p, implicit=True
    )
    return FedCIASplit(interactions, split, df["client"].to_numpy())


def parse_fedcia_split(path: PathLike) -> Interactions:
    """The events of a FedCIA split TSV, each with its published split (``given_split``: 0
    train, 1 validation, 2 test, read by the ``given-full`` protocol); the client column is
    FedCIA's contiguous blocks of users, which ``grouping=contiguous`` rebuilds."""
    published = read_fedcia_split(path)
    codes = np.zeros(len(published.split), np.int8)
    for code, name in enumerate(_FEDCIA_SPLITS):  # train 0, valid 1, test 2
        codes[published.split == name] = code
    return dataclasses.replace(published.interactions, given_split=codes)


PARSERS: dict[str, Callable[..., Interactions]] = {
    "ml-100k": parse_ml100k,
    "atomic": parse_atomic,
    "ml-1m": parse_ml1m,
    "pfedrec-csv": parse_pfedrec_csv,
    "amazon-ratings": parse_amazon_ratings,
    "lastfm-user-artists": parse_lastfm_user_artists,
    "lastfm-tagged": parse_lastfm_tagged,
    "lastfm-tagged-dates": parse_lastfm_tagged_dates,
    "hetrec-movielens": parse_hetrec_movielens,
    "tafeng": parse_tafeng,
    "anime": parse_anime,
    "book-crossing": parse_book_crossing,
    "lightgcn-pairs": parse_lightgcn_pairs,
    "metamf-rating": parse_metamf_rating,
    "fedcia-split": parse_fedcia_split,
    "metamf-split": parse_metamf_split,
}
"""Raw formats by name, for callers (the CLI) that pick a parser from a string."""
