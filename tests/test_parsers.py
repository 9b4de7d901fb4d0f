"""Every raw-format parser on a hand-written fixture, and malformed variants by line number."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedrec.data import parsers as P
from fedrec.data.interactions import Interactions
from fedrec.data.tables import read_table
from fedrec.errors import DataFormatError, FedrecError

FIXTURES = Path(__file__).parent / "fixtures"
MALFORMED = FIXTURES / "malformed"
ML100K_USERS = [196, 186, 22, 244]
ML100K_ITEMS = [242, 302, 377, 51]


def _events(data: Interactions) -> list[tuple[object, object, float, int]]:
    """(raw user, raw item, rating, timestamp) per row, to compare parsers by content."""
    return [
        (data.user_ids[u], data.item_ids[i], float(r), int(t))
        for u, i, r, t in zip(data.users, data.items, data.ratings, data.timestamps, strict=True)
    ]


def test_ml100k_u_data() -> None:
    data = P.parse_ml100k(FIXTURES / "ml-100k" / "u.data")
    assert len(data) == 5 and data.n_users == 4 and data.n_items == 4
    assert data.user_ids.tolist() == ML100K_USERS
    assert data.item_ids.tolist() == ML100K_ITEMS
    assert data.users.tolist() == [0, 1, 2, 0, 3]
    assert data.items.tolist() == [0, 1, 2, 3, 0]
    assert data.ratings.dtype == np.float32 and data.ratings.tolist() == [3, 3, 1, 2, 2]
    assert data.timestamps.dtype == np.int64
    assert data.timestamps.tolist() == [881250949, 891717742, 878887116, 880606923, 880606923]
    assert data.row_order.tolist() == [0, 1, 2, 3, 4]
    assert not data.implicit


def test_atomic_inter_matches_u_data() -> None:
    atomic = P.parse_atomic(FIXTURES / "ml-100k" / "ml-100k.inter")
    u_data = P.parse_ml100k(FIXTURES / "ml-100k" / "u.data")
    assert _events(atomic) == _events(u_data)
    assert atomic.user_ids.dtype == np.int64  # integer tokens become ints, like u.data's ids


def test_pfedrec_csv_keeps_file_order() -> None:
    data = P.parse_pfedrec_csv(FIXTURES / "ml-100k" / "ratings.dat")
    assert data.user_ids.tolist() == [22, 186, 196, 244]  # first appearance in this order
    assert sorted(_events(data)) == sorted(_events(P.parse_ml100k(FIXTURES / "ml-100k" / "u.data")))


def test_ml1m_double_colon() -> None:
    data = P.parse_ml1m(FIXTURES / "ml-1m" / "ratings.dat")
    assert _events(data) == [
        (1, 1193, 5.0, 978300760),
        (1, 661, 3.0, 978302109),
        (2, 1193, 4.0, 978298413),
        (3, 3408, 4.0, 978300275),
    ]


def test_amazon_string_ids() -> None:
    data = P.parse_amazon_ratings(FIXTURES / "amazon-video" / "ratings_Amazon_Instant_Video.csv")
    assert data.user_ids.tolist() == ["A1EE2E3N7PW666", "AGZ8SM1BGK3CK"]
    assert data.item_ids.tolist() == ["B000GFDAUG", "B000GIOPK2"]
    assert data.users.tolist() == [0, 1, 0] and data.items.tolist() == [0, 0, 1]
    assert data.ratings.tolist() == [5, 1, 4]
    assert data.timestamps.tolist() == [1202256000, 1383696000, 1215993600]


def test_amazon_header_is_detected() -> None:
    data = P.parse_amazon_ratings(FIXTURES / "amazon-video" / "with_header.csv")
    assert len(data) == 2 and data.user_ids.tolist() == ["A1EE2E3N7PW666", "AGZ8SM1BGK3CK"]
    with pytest.raises(DataFormatError) as err:
        P.parse_amazon_ratings(FIXTURES / "amazon-video" / "with_header.csv", header=False)
    assert err.value.line == 1


def test_lastfm_user_artists_weight_as_rating() -> None:
    data = P.parse_lastfm_user_artists(FIXTURES / "lastfm-2k" / "user_artists.dat")
    assert data.user_ids.tolist() == [2, 3] and data.item_ids.tolist() == [51, 52, 101]
    assert data.ratings.tolist() == [13883, 11690, 228, 600]
    assert data.timestamps.tolist() == [0, 1, 2, 3]  # no clock in the file: row order
    assert not data.implicit


def test_lastfm_tagged_one_row_per_tag_ms_to_seconds() -> None:
    data = P.parse_lastfm_tagged(FIXTURES / "lastfm-2k" / "user_taggedartists-timestamps.dat")
    assert len(data) == 4 and data.implicit
    assert data.users.tolist() == [0, 0, 0, 1] and data.items.tolist() == [0, 0, 1, 0]
    assert data.ratings.tolist() == [1, 1, 1, 1]
    assert data.timestamps.tolist() == [1238536800, 1238536800, 1238536800, 1241128800]


def test_hetrec_movielens() -> None:
    data = P.parse_hetrec_movielens(
        FIXTURES / "hetrec-movielens" / "user_ratedmovies-timestamps.dat"
    )
    assert _events(data) == [
        (75, 3, 1.0, 1162160236),
        (75, 32, 4.5, 1162160624),
        (78, 3, 3.5, 1163045867),
    ]


def test_tafeng_dates_and_big_ids() -> None:
    data = P.parse_tafeng(FIXTURES / "tafeng" / "ta_feng_all_months_merged.csv")
    assert data.implicit and data.ratings.tolist() == [1, 1, 1]
    assert data.user_ids.tolist() == [1104905, 418683]
    assert data.item_ids.tolist() == [4710199010372, 4710857472535, 4710043654103]
    assert data.timestamps.tolist() == [973036800, 973036800, 973123200]  # 2000-11-01/02 UTC


def test_anime_drops_unrated_by_default() -> None:
    path = FIXTURES / "anime" / "rating.csv"
    rated = P.parse_anime(path)
    assert _events(rated) == [(1, 226, 10.0, 0), (2, 11771, 10.0, 1), (3, 20, 8.0, 2)]
    everything = P.parse_anime(path, drop_unrated=False)
    assert len(everything) == 5 and everything.ratings.tolist() == [-1, -1, 10, 10, 8]


def test_book_crossing_latin1_and_implicit_zeros() -> None:
    path = FIXTURES / "book-crossing" / "BX-Book-Ratings.csv"
    data = P.parse_book_crossing(path)
    assert len(data) == 5 and data.user_ids.tolist() == [276725, 276726, 276727, 276744]
    assert data.item_ids.tolist()[-1] == "38550120\u00e9"
    assert data.item_ids.tolist()[1] == "0155061224"  # ISBNs keep their leading zeros
    assert data.ratings.tolist() == [0, 5, 0, 3, 7]
    explicit = P.parse_book_crossing(path, keep_implicit=False)
    assert explicit.ratings.tolist() == [5, 3, 7]
    assert explicit.user_ids.tolist() == [276726, 276725, 276744]


def test_lightgcn_pairs() -> None:
    path = FIXTURES / "splits" / "data1.txt"
    data = P.parse_lightgcn_pairs(path)
    assert data.implicit and data.ratings.tolist() == [1, 1, 1]
    assert data.user_ids.tolist() == [424, 1311] and data.item_ids.tolist() == [4076, 1574, 410]
    weighted = P.parse_lightgcn_pairs(path, value_as_rating=True)
    assert weighted.ratings.tolist() == [993, 957, 146] and not weighted.implicit


def test_metamf_rating() -> None:
    data = P.parse_metamf_rating(FIXTURES / "splits" / "ciao.train.rating")
    assert _events(data) == [(0, 670, 5.0, 0), (0, 159, 5.0, 1), (1, 120, 4.0, 2)]


def test_fedcia_split_returns_split_and_client() -> None:
    path = FIXTURES / "splits" / "fedcia_split.tsv"
    split = P.read_fedcia_split(path)
    assert split.split.tolist() == ["train", "valid", "test", "train"]
    assert split.client.tolist() == [0, 0, 0, 1]
    assert split.interactions.user_ids.tolist() == [0, 1, 2]
    assert split.interactions.item_ids.tolist() == [0, 47, 5]
    assert split.interactions.implicit
    assert _events(P.parse_fedcia_split(path)) == _events(split.interactions)
    assert P.parse_fedcia_split(path).given_split.tolist() == [0, 1, 2, 0]  # train, valid, test


def test_generic_csv_by_header_names() -> None:
    data = read_table(FIXTURES / "generic" / "ratings.csv", "uid", "iid", "score", "ts")
    assert data.user_ids.tolist() == ["u1", "u2"] and data.item_ids.tolist() == ["i1", "i2"]
    assert data.ratings.tolist() == [4.5, 3.0, 5.0] and data.timestamps.tolist() == [100, 200, 300]
    assert not data.implicit


def test_generic_tsv_typed_header_implicit() -> None:
    path = FIXTURES / "generic" / "ratings.tsv"
    data = read_table(path, "user", "item", time_col="ts")
    assert data.implicit and data.ratings.tolist() == [1, 1, 1]
    assert data.user_ids.tolist() == [7, 8] and data.item_ids.tolist() == [10, 11]
    assert data.timestamps.tolist() == [1000, 2000, 3000]
    assert _events(read_table(path, "user:token", "item:token", time_col="ts:float")) == _events(
        data
    )


def test_generic_positions_without_header() -> None:
    data = read_table(FIXTURES / "generic" / "noheader.txt", 0, 1, 2, sep=";", header=False)
    assert _events(data) == [(7, 10, 4.0, 0), (8, 10, 2.0, 1)]


@pytest.mark.parametrize("sep", ["§", "::", "→"])
def test_a_separator_of_more_than_one_byte_is_read(tmp_path: Path, sep: str) -> None:
    """pandas' C reader splits on one byte: a non-ASCII character, like a two-character
    separator, is read as such rather than refused with the reader's own text."""
    path = tmp_path / "events.txt"
    path.write_text(f"u{sep}i{sep}r\n7{sep}10{sep}4\n8{sep}10{sep}2\n", encoding="utf-8")
    assert _events(read_table(path, "u", "i", "r", sep=sep)) == [(7, 10, 4.0, 0), (8, 10, 2.0, 1)]
    quoted = tmp_path / "quoted.csv"  # a .csv is read with quotes: a separator inside them is text
    quoted.write_text(f'"u"{sep}i{sep}r\n"7{sep}1"{sep}"10"{sep}4\n"8"{sep}10{sep}2\n', encoding="utf-8")
    if len(sep) == 1:
        data = read_table(quoted, "u", "i", "r", sep=sep)
        assert data.user_ids.tolist() == [f"7{sep}1", "8"] and data.item_ids.tolist() == [10]


def test_generic_parquet(tmp_path: Path) -> None:
    path = tmp_path / "events.parquet"
    pd.DataFrame(
        {"u": ["a", "b", "a"], "i": [10, 10, 11], "r": [1.5, 2.0, 3.0], "t": [5, 6, 7]}
    ).to_parquet(path)
    data = read_table(path, "u", "i", "r", "t")
    assert _events(data) == [("a", 10, 1.5, 5), ("b", 10, 2.0, 6), ("a", 11, 3.0, 7)]
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"u": ["a", "b"], "i": [1, 2], "r": ["4", "five"]}).to_parquet(bad)
    with pytest.raises(DataFormatError, match=r"row 2: r 'five' is not a finite number"):
        read_table(bad, "u", "i", "r")


@pytest.mark.parametrize(("frame", "columns", "says"), [
    ({"u": [1.0, 2.0, None], "i": [1, 2, 3]}, ("u", "i"), "row 3: u is empty"),
    ({"u": [1, 2], "i": [1, 2], "r": [float("inf"), 2.0]}, ("u", "i", "r"), "row 1: r inf is not a finite number"),
    ({"u": [[1], [2]], "i": [1, 2]}, ("u", "i"), "u: a column of lists or maps, not of ids"),
    ({"u": [1, 2], "i": [1, 2], "t": pd.to_datetime(["2020-01-01", None])}, ("u", "i", None, "t"), "row 2: t is empty"),
    ({"u": [1.0, None], "i": [1, 2]}, ("u", "x"), "no column 'x'; columns are: u, i"),  # before any value
    ({"u": ["a", " "], "i": [1, 2]}, ("u", "i"), "row 2: u is empty"),  # as a CSV's empty field is
    ({"u": pd.array([1, None], dtype="Int64"), "i": [1, 2]}, ("u", "i"), "row 2: u is empty"),  # nullable ints
    ({"u": [1, 2], "i": [1, 2], "t": [math.inf, 1.0]}, ("u", "i", None, "t"), "row 1: t inf is not a finite number"),
])
def test_a_parquet_files_bad_value_is_named_in_plain_words(tmp_path: Path, frame: dict, columns: tuple,
                                                           says: str) -> None:  # type: ignore[type-arg]
    """No numpy repr (``np.float64(inf)``) in a message; a missing time is empty, not the
    smallest integer; a missing column is said before any value."""
    path = tmp_path / "bad.parquet"
    pd.DataFrame(frame).to_parquet(path)
    with pytest.raises(DataFormatError) as err:
        read_table(path, *columns)
    assert says in str(err.value) and "np." not in str(err.value) and "array(" not in str(err.value)


def test_parquet_times_are_seconds_as_a_text_date_is(tmp_path: Path) -> None:
    """Timestamps and dates (Arrow's date32 reads as Python dates) are seconds since 1970 UTC;
    integer times are kept whole (nanoseconds apart stay apart, which a float would not keep)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pd.DataFrame({"u": [1, 2], "i": [1, 2], "t": [pd.Timestamp("2020-01-01"), pd.Timestamp("2020-01-02 00:00:05")]}).to_parquet(path)
    assert read_table(path, "u", "i", time_col="t").timestamps.tolist() == [1577836800, 1577923205]
    dates = pa.array([datetime.date(2020, 1, 1), datetime.date(2020, 1, 2)], pa.date32())
    pq.write_table(pa.table({"u": [1, 2], "i": [1, 2], "t": dates}), path)
    assert read_table(path, "u", "i", time_col="t").timestamps.tolist() == [1577836800, 1577923200]
    nanos = [1577836800000000001, 1577836800000000002]
    pd.DataFrame({"u": [1, 2], "i": [1, 2], "t": nanos}).to_parquet(path)
    assert read_table(path, "u", "i", time_col="t").timestamps.tolist() == nanos


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_times_keep_their_order_when_they_have_fractions_or_do_not_fit_int64(tmp_path: Path, suffix: str) -> None:
    """Times in [0, 1), nanoseconds 100 apart and 1e19 keep the rows' order and ties (as ranks
    where a time has a fraction or does not fit int64); whole times that fit are kept as they
    are. Flooring made every time in [0, 1) equal, and a cast wrapped 1e19 round to the
    earliest time."""
    cases = {
        "fractions": (["0.9", "0.6", "0.6", "0.1"], [2, 1, 1, 0]),
        "nanoseconds": (["1700000000000000300", "1700000000000000200", "1700000000000000100", "1700000000000000000"],
                        [1700000000000000300, 1700000000000000200, 1700000000000000100, 1700000000000000000]),
        "beyond int64": (["5", "1e19", "7", "-2.5"], [1, 3, 2, 0]),
        "whole beyond int64": (["10000000000000000001", "10000000000000000000", "5"], [2, 1, 0]),
        "whole beyond uint64": (["100000000000000000000001", "100000000000000000000000", " 5"], [2, 1, 0]),
        "whole floats": (["5.0", "3", "1.7e9", "-2"], [5, 3, 1700000000, -2]),
    }
    for name, (times, order) in cases.items():
        path = tmp_path / f"{name}.{suffix}"
        if suffix == "csv":
            path.write_text("u,i,t\n" + "".join(f"0,{j},{t}\n" for j, t in enumerate(times)))
        elif name.startswith("whole beyond"):  # a Parquet column holds at most uint64
            continue
        else:
            values = [int(t) for t in times] if name == "nanoseconds" else [float(t) for t in times]
            pd.DataFrame({"u": [0] * len(times), "i": list(range(len(times))), "t": values}).to_parquet(path)
        got = read_table(path, "u", "i", time_col="t").timestamps
        assert got.dtype == np.int64 and got.tolist() == order, name


def test_generic_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.parquet"
    path.write_bytes(b"PAR1")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyarrow" else real(name, *a),
    )
    with pytest.raises(FedrecError, match=r"needs the optional pyarrow"):
        read_table(path, "u", "i")


def test_generic_unknown_column_and_format() -> None:
    with pytest.raises(DataFormatError, match=r"no column 'user'") as err:
        read_table(FIXTURES / "generic" / "ratings.csv", "user", "iid")
    assert err.value.line == 1
    with pytest.raises(FedrecError, match=r"cannot tell the format"):
        read_table(FIXTURES / "ml-100k" / "u.data", "a", "b")


MALFORMED_CASES: list[tuple[str, Callable[..., Interactions], int, str]] = [
    ("short_row.u.data", P.parse_ml100k, 3, "expected 4 tab-separated fields, got 3"),
    ("long_row.u.data", P.parse_ml100k, 2, "expected 4 tab-separated fields, got 5"),
    ("bad_rating.u.data", P.parse_ml100k, 4, "rating 'x' is not a number"),
    ("blank_then_bad.u.data", P.parse_ml100k, 4, "expected 4 tab-separated fields, got 3"),
    ("bad_utf8.u.data", P.parse_ml100k, 2, "not valid utf-8"),
    ("empty.u.data", P.parse_ml100k, 1, "file is empty"),
    ("blank_only.inter", P.parse_atomic, 1, "only blank lines"),
    ("header_only.inter", P.parse_atomic, 2, "no data rows"),
    ("no_item.inter", P.parse_atomic, 1, "header has no item_id column"),
    ("bad_timestamp.inter", P.parse_atomic, 3, "timestamp 'soon' is not a number"),
    ("bad_timestamp.ratings.dat", P.parse_ml1m, 2, "timestamp 'abc' is not an integer"),
    ("wrong_sep.ratings.dat", P.parse_ml1m, 3, "expected 4 '::'-separated fields, got 1"),
    ("bad_rating.amazon.csv", P.parse_amazon_ratings, 2, "rating 'five' is not a number"),
    ("bad_header.user_artists.dat", P.parse_lastfm_user_artists, 1, "expected header"),
    ("bad_date.tafeng.csv", P.parse_tafeng, 3, "'31/31/2000' is not a date"),
    ("bad_date.user_taggedartists.dat", P.parse_lastfm_tagged_dates, 3, "'2009-02-31' is not a date"),
    ("short_row.tafeng.csv", P.parse_tafeng, 2, "expected 9 comma-separated fields, got 8"),
    ("bad_rating.anime.csv", P.parse_anime, 4, "rating 11 is not -1 or in 1..10"),
    ("bad_rating.bx.csv", P.parse_book_crossing, 3, "Book-Rating 'five' is not an integer"),
    ("bad_split.fedcia.tsv", P.parse_fedcia_split, 3, "split 'holdout' is not one of"),
    ("short_row.data1.txt", P.parse_lightgcn_pairs, 2, "expected 3 tab-separated fields, got 2"),
    ("bad_item.ciao.rating", P.parse_metamf_rating, 3, "item 'abc' is not an integer"),
]


@pytest.mark.parametrize(("name", "parser", "line", "message"), MALFORMED_CASES)
def test_malformed_names_file_and_line(
    name: str, parser: Callable[..., Interactions], line: int, message: str
) -> None:
    path = MALFORMED / name
    with pytest.raises(DataFormatError) as err:
        parser(path)
    assert err.value.path == str(path)
    assert err.value.line == line
    assert message in str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_generic_reader_bad_value_line() -> None:
    path = MALFORMED / "bad_score.csv"
    with pytest.raises(DataFormatError, match=r"score 'n/a' is not a number") as err:
        read_table(path, "uid", "iid", "score")
    assert err.value.line == 3


def test_missing_file_is_fedrec_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "u.data"
    with pytest.raises(FedrecError, match=r"no such file") as err:
        P.parse_ml100k(missing)
    assert str(missing) in str(err.value)
    assert not isinstance(err.value, DataFormatError)


def test_parsers_table_is_complete() -> None:
    assert P.PARSERS["ml-100k"] is P.parse_ml100k
    assert all(callable(fn) for fn in P.PARSERS.values())
