"""Odd but valid files of one's own: each is read as its user means, said where preprocessing
or the protocol changes what the figures mean, or refused in one line that says what to do."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_outcome import said as cli
from typer.testing import CliRunner

from fedrec.cli import app
from fedrec.cli.tune import _shown
from fedrec.tune import trial_value


def write(path: Path, header: str, rows: list[tuple]) -> Path:  # type: ignore[type-arg]
    path.write_text(header + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def events(users: int = 30, items: int = 40, per_user: int = 8, rating: int | None = None) -> list[tuple]:  # type: ignore[type-arg]
    """Rows (user, item, rating, time): each user's items drawn with a seed, ratings 1-5 (or
    all ``rating``), times growing within a user."""
    rng = np.random.default_rng(0)
    rows = []
    for u in range(users):
        for j, i in enumerate(rng.choice(items, per_user, replace=False)):
            rows.append((u, int(i), rating if rating is not None else int(rng.integers(1, 6)), 1000 * u + j))
    return rows


#: PersonalFR, small: it runs the rated ranking (ratio-rating-implicit)
RATED = ("--algorithm-is", "personalfr", "--set", "clients=0", "--set", "hidden=16/8")


def run(tmp_path: Path, data: Path, columns: str, *extra: str) -> tuple[int, str, Path]:
    """``fedrec run mf`` (or PersonalFR, with `RATED` among ``extra``) for one round."""
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    algorithm, extra = ("personalfr", extra[2:]) if extra[:2] == RATED[:2] else ("mf", extra)
    code, said = cli("run", algorithm, "-d", str(data), "--columns", columns, "--rounds", "1", "-q", "-o", str(out),
                     *extra)
    return code, said, out


def test_a_rating_protocol_on_a_file_without_ratings_is_refused(tmp_path: Path) -> None:
    """Every row would be a rating of 1: an RMSE near 0 was printed as a result."""
    data = write(tmp_path / "e.csv", "user,item,rating,time", events())
    for protocol, algorithm in (("ratio-rating", ()), ("ratio-rating-implicit", RATED)):
        code, said, out = run(tmp_path, data, "user,item,,time", *algorithm, "-p", protocol)
        assert code == 2 and f"protocol '{protocol}' reads ratings" in said and "no rating column" in said
        assert not out.exists()
        # what else the method runs: MF interactions, PersonalFR ratings alone
        assert ("take loo-sampled, loo-full, time-full, ratio-full" in said) == (protocol == "ratio-rating")
        assert ("personalfr runs on ratings alone" in said) == (protocol != "ratio-rating")
    code, said, out = run(tmp_path, data, "user,item,rating,time", "-p", "ratio-rating")
    assert code == 0 and json.loads(out.read_text())["test"]["rmse"] > 0.3


def test_rated_ranking_with_no_positive_held_out_is_refused_not_an_empty_result(tmp_path: Path) -> None:
    """Ratings all below the positive threshold left nothing to rank: the run wrote an empty
    test and called itself completed."""
    data = write(tmp_path / "low.csv", "user,item,rating,time", events(rating=2))
    code, said, out = run(tmp_path, data, "user,item,rating,time", *RATED, "-p", "ratio-rating-implicit")
    assert code == 2 and "rating is at or above 3.5" in said and "--threshold" in said and not out.exists()
    code, said, out = run(tmp_path, data, "user,item,rating,time", *RATED, "-p", "ratio-rating-implicit",
                          "--threshold", "2")
    assert code == 0 and math.isfinite(json.loads(out.read_text())["test"]["rated-ndcg@10"])


def test_positions_on_a_file_with_a_header_and_role_names_out_of_place_are_refused(tmp_path: Path) -> None:
    data = write(tmp_path / "e.csv", "user,item,rating,time", events())
    code, said, out = run(tmp_path, data, "0,1")  # the header would be one more user and item
    assert code == 2 and "first line (user, item) looks like a header" in said and not out.exists()
    code, said, out = run(tmp_path, data, "user,item,time")  # the third role is the rating
    assert code == 2 and "gives the rating role the column named 'time'" in said and "--columns user,item,,time?" in said
    code, said, out = run(tmp_path, data, "uid,iid,timestamp")  # MovieLens' name for a time
    assert code == 2 and "gives the rating role the column named 'timestamp'" in said \
        and "(--columns uid,iid,,timestamp?)" in said
    code, said, out = run(tmp_path, data, "user,item,,time", "-p", "loo-full")
    assert code == 0


def test_a_multi_character_separator_read_by_positions_is_named(tmp_path: Path) -> None:
    data = tmp_path / "e.dat"
    data.write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in events()))
    code, said, _ = run(tmp_path, data, "0,1,2,3")
    assert code == 2 and "it looks '::'-separated" in said and "--sep" in said


def test_what_preprocessing_and_the_protocol_change_is_said(tmp_path: Path) -> None:
    rows = events()
    data = write(tmp_path / "dup.csv", "user,item,rating,time", rows + rows[:20])
    code, said, _ = run(tmp_path, data, "user,item,rating,time", "-p", "loo-full")
    assert code == 0 and "note: 20 rows repeat a (user, item) pair; the last of each is kept (240 interactions)" in said
    low = [(u, i, 1 if u < 10 else r, t) for u, i, r, t in rows]  # users 0-9 rate nothing at 4 or more
    code, said, _ = run(tmp_path, write(tmp_path / "low.csv", "user,item,rating,time", low),
                        "user,item,rating,time", "-p", "loo-full", "--threshold", "4")
    assert code == 0 and "ratings >= 4 kept" in said and "of 30 users" in said
    dense = [(u, i, 5, 100 * u + i) for u in range(20) for i in range(15)]  # every user saw every item
    code, said, _ = run(tmp_path, write(tmp_path / "dense.csv", "user,item,rating,time", dense),
                        "user,item,rating,time", "-p", "loo-full")
    assert code == 0 and "20 of 20 test users rank at most 10 candidate items" in said
    code, said, _ = run(tmp_path, data, "user,item,rating,time", "-p", "ratio-full")
    assert code == 0 and "no time column" not in said  # a ratio split always draws its held-out rows


def test_messages_name_a_user_by_the_files_id(tmp_path: Path) -> None:
    rows = [("Zoë", i, 1) for i in range(30)]  # the first user: row 0, which the message used to say
    rows += [(f"u{u}", i, 1) for u in range(12) for i in range(10 * u, 10 * u + 6)]  # 84 items in all
    code, said, _ = run(tmp_path, write(tmp_path / "z.csv", "user,item,rating", rows), "user,item,rating")
    assert code == 2 and "user 'Zoë' has only 54 unseen items" in said


def test_a_time_cut_on_a_tie_and_a_fixed_split_say_what_happened(tmp_path: Path) -> None:
    rows = [(u, i, 5, 1) for u in range(10) for i in range(8)]  # 80 rows at time 1
    rows += [(u, 8 + i, 5, 2 + i) for u in range(10) for i in range(2)]
    code, said, _ = run(tmp_path, write(tmp_path / "t.csv", "user,item,rating,time", rows),
                        "user,item,rating,time", "-p", "time-full")
    assert code == 2 and "the validation cut falls on the earliest timestamp, which 80 of the 80 rows before the test cut" in said
    data = write(tmp_path / "e.csv", "user,item,rating,time", events())
    code, said, _ = run(tmp_path, data, "user,item,rating,time", "-p", "given-rating")
    assert code == 2 and "(ciao has one)" in said


def test_too_many_clients_says_which_option_to_set(tmp_path: Path) -> None:
    data = write(tmp_path / "e.csv", "user,item,rating,time", events())
    code, said = cli("run", "fedcia", "-d", str(data), "--columns", "user,item,rating,time", "-p", "loo-full",
                     "--rounds", "1", "-q", "-o", str(tmp_path / "c.json"))
    assert code == 2 and "clients=100 but the data set has 30 users" in said and "--set clients=0" in said


def test_a_trial_line_shows_any_option_and_a_trial_without_a_figure_scores_worst() -> None:
    assert [_shown(v) for v in (0.0123456, 7, "legacy-distance", (16, 8), True)] == [
        "0.01235", "7", "legacy-distance", "16/8", "True"]
    assert trial_value({"state": "complete", "best_valid": None}, maximise=True) == -math.inf
    assert trial_value({"state": "complete", "best_valid": float("nan")}, maximise=False) == math.inf
    assert trial_value({"state": "complete", "best_valid": 0.25}, maximise=True) == 0.25


@pytest.mark.parametrize("user", ["u5", " u5 "])
def test_recommend_prints_tab_separated_ids_and_reads_an_id_as_a_file_is_read(tmp_path: Path, user: str) -> None:
    rows = [(f"u{u}", f"Song {i}, live", 1) for u in range(20) for i in range(u % 7, u % 7 + 6)]
    data = tmp_path / "s.csv"
    data.write_text("user,item,rating\n" + "".join(f'{u},"{i}",{r}\n' for u, i, r in rows))
    saved = tmp_path / "s.fedrec"
    code, _, _ = run(tmp_path, data, "user,item,rating", "-p", "loo-full", "--save", str(saved))
    assert code == 0
    result = CliRunner().invoke(app, ["recommend", str(saved), "--user", user, "-k", "3"])
    fields = result.output.strip().split("\t")
    assert result.exit_code == 0 and fields[0] == "u5" and len(fields) == 4
    assert all(f.startswith("Song ") and f.endswith(", live") for f in fields[1:])
