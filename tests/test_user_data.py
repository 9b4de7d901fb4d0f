"""A user's own data, first class: the catalogue (`fedrec data add`), splits of data without a
clock, portable run files, and `fedrec compare` on one's own file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedrec
from fedrec.cli import app
from fedrec.data import user_sets
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, prepare_split


def write_events(path: Path, users: int = 60, items: int = 90, seed: int = 0, time: bool = True) -> Path:
    """A CSV of string-id events: user, item, rating (1-5)[, ts]; rows sorted by item within a
    user, so "the last row" is the user's largest item id (as HetRec's user_artists.dat)."""
    rng = np.random.default_rng(seed)
    lines = ["user,item,rating" + (",ts" if time else "")]
    for u in range(users):
        for i in sorted(rng.choice(items, size=int(rng.integers(6, 16)), replace=False)):
            row = f"u{u},i{i:03d},{int(rng.integers(1, 6))}"
            lines.append(row + (f",{int(rng.integers(10**6, 10**7))}" if time else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit | FedrecError):
        raise result.exception
    message = str(result.exception) if isinstance(result.exception, FedrecError) else ""
    return (2 if message else result.exit_code), result.output + message


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------


def test_add_list_info_stats_remove(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv")
    code, out = cli("data", "add", "mine", str(data), "--columns", "user,item,rating,ts")
    assert code == 0, out
    entry = user_sets.get("mine")
    assert entry is not None and Path(entry.path).is_absolute() and len(entry.sha256) == 64
    assert entry.rows == len(data.read_text().splitlines()) - 1 and entry.users == 60
    assert "mine" in cli("data", "list")[1]
    assert entry.path in cli("data", "info", "mine")[1].replace("\n", "")
    code, out = cli("data", "stats", "mine")
    assert code == 0 and " ".join(out.split()).count("users 60 items 90") == 1
    assert f"content digest {user_sets.load(entry).content_digest()[:16]}" in out  # the one its runs record
    assert cli("data", "remove", "mine")[0] == 0
    assert user_sets.get("mine") is None and data.exists()  # the file is left alone


def test_add_refuses_bad_names_columns_and_a_second_add(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv")
    for name, why in (("ml-100k", "built-in"), ("synthetic:3x3", "letters"), ("my.csv", "file name"),
                      ("synthetic2", "generator")):
        with pytest.raises(FedrecError, match=why):
            user_sets.add(name, data, "user,item")
    with pytest.raises(FedrecError, match="no column 'itm'"):
        user_sets.add("mine", data, "user,itm")
    with pytest.raises(FedrecError, match="names no rating column"):
        user_sets.add("mine", data, "user,item", implicit_threshold=4)
    assert not user_sets.catalogue_file().exists()  # nothing written by a refused add
    user_sets.add("mine", data, "user,item")
    with pytest.raises(FedrecError, match="already registered"):
        user_sets.add("mine", data, "user,item,rating")
    assert user_sets.add("mine", data, "user,item,rating", overwrite=True).columns == "user,item,rating"


def test_columns_forms() -> None:
    assert user_sets.parse_columns("user,item,,ts") == {"user": "user", "item": "item", "time": "ts"}
    assert user_sets.parse_columns("item=b, user=a, time=t") == {"item": "b", "user": "a", "time": "t"}
    assert user_sets.parse_columns("0,1,2") == {"user": 0, "item": 1, "rating": 2}
    for bad in ("user", "user,item,r,t,x", "user=a", "user=a,thing=b", "a,a", "a,1"):
        with pytest.raises(FedrecError):
            user_sets.parse_columns(bad)


def test_a_changed_file_is_one_line_not_a_new_result(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv")
    user_sets.add("mine", data, "user,item,rating,ts")
    cfg = RunConfig(algorithm="fedmf", dataset="mine", protocol="loo-full")
    assert cfg.user_data is not None and cfg.user_data["sha256"] == user_sets.get("mine").sha256
    prepare_split(cfg)
    with data.open("a") as f:
        f.write("u1,i999,5,1\n")
    with pytest.raises(FedrecError, match="changed since it was registered.*--overwrite"):
        prepare_split(RunConfig(algorithm="fedmf", dataset="mine", protocol="loo-full"))
    data.unlink()
    with pytest.raises(FedrecError, match="is gone"):
        prepare_split(RunConfig(algorithm="fedmf", dataset="mine", protocol="loo-full"))


def test_implicit_threshold_keeps_the_ratings_at_or_above_it(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv")
    user_sets.add("high", data, "user,item,rating,ts", implicit_threshold=4)
    kept = prepare_split(RunConfig(algorithm="fedmf", dataset="high", protocol="loo-full")).data
    ratings = np.array([int(line.split(",")[2]) for line in data.read_text().splitlines()[1:]])
    assert len(kept) == int((ratings >= 4).sum())
    code, out = cli("data", "stats", "high")  # counts what a run of it keeps
    said = " ".join(out.split())
    assert code == 0 and "(implicit, rating >= 4)" in said and f"users {kept.n_users} items {kept.n_items} " \
        f"interactions {len(kept)}" in said


def test_unknown_names_list_the_user_sets(tmp_path: Path) -> None:
    user_sets.add("mine", write_events(tmp_path / "events.csv"), "user,item")
    with pytest.raises(FedrecError, match="did you mean 'mine'"):
        prepare_split(RunConfig(algorithm="fedmf", dataset="minee"))


# ---------------------------------------------------------------------------------------------
# Splits of data without a clock
# ---------------------------------------------------------------------------------------------


def test_leave_one_out_without_a_time_column_holds_out_a_seeded_random_item(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv", time=False)
    split = prepare_split(RunConfig(algorithm="fedmf", dataset=str(data), columns="user,item", protocol="loo-full"))
    assert split.held_out_by == "random"
    # not the row order: the rows are sorted by item, so "last row" would be each largest item
    test_items = split.test.targets.indices
    users = np.flatnonzero(np.diff(split.test.targets.indptr))
    rows = [sorted(split.data.items[split.data.users == u]) for u in users]
    largest = np.array([r[-1] for r in rows])
    assert (test_items != largest).mean() > 0.5
    again = prepare_split(RunConfig(algorithm="fedmf", dataset=str(data), columns="user,item", protocol="loo-full"))
    other = prepare_split(RunConfig(algorithm="fedmf", dataset=str(data), columns="user,item", protocol="loo-full",
                                    seed=1))
    assert (again.label == split.label).all() and (other.label != split.label).any()
    with_time = write_events(tmp_path / "timed.csv", time=True)
    timed = prepare_split(RunConfig(algorithm="fedmf", dataset=str(with_time), columns="user,item,,ts",
                                    protocol="loo-full"))
    assert timed.held_out_by == "time"


def test_the_run_says_how_it_held_out(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv", time=False)
    out = tmp_path / "r.json"
    code, text = cli("run", "fedmf", "-d", str(data), "--columns", "user,item", "-p", "loo-full", "--rounds", "1",
                     "-o", str(out), "-q")
    assert code == 0, text
    assert "random" in text.replace("\n", " ")
    assert json.loads(out.read_text())["data"]["split"] == {"held_out_by": "random"}


# ---------------------------------------------------------------------------------------------
# Portable run files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", fedrec.list_algorithms())
def test_a_saved_run_recommends_with_no_data_file(algorithm: str, tmp_path: Path) -> None:
    from fedrec.algorithms import get_algorithm

    spec = get_algorithm(algorithm)
    protocol = {"sampled": "loo-sampled", "full": "loo-full", "rating": "ratio-rating",
                "rated": "ratio-rating-implicit"}[spec.rankings[0]]
    # FedDAE's default widths (768/512) make a round on every client ten seconds here; a run
    # file is the same file at any width
    small = {"hidden": "64", "latent": 16, "gate_hidden": 16} if algorithm in ("feddae", "fedvae") else None
    run = fedrec.run(algorithm, "synthetic:150x300", protocol=protocol, rounds=1, options=small)
    saved = run.save(tmp_path / "run.fedrec")
    again = fedrec.load(saved)
    users = np.arange(6)
    np.testing.assert_allclose(again.scores(users), run.scores(users), rtol=0, atol=0)
    user = run.split.data.user_ids[3]
    assert again.recommend(user, 7) == run.recommend(user, 7)


# ---------------------------------------------------------------------------------------------
# The researcher's path, end to end
# ---------------------------------------------------------------------------------------------


def test_add_stats_compare_then_recommend_from_a_moved_run_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    data = write_events(work / "my.csv", users=70, items=120)
    assert cli("data", "add", "mine", "my.csv", "--columns", "user,item,rating,ts")[0] == 0
    assert cli("data", "stats", "mine")[0] == 0
    code, out = cli("compare", "fedmf", "pfedrec", "-d", "mine", "--seeds", "2", "--trials", "2", "--rounds", "2",
                    "-p", "loo-full", "-o", "cmp")
    assert code == 0, out
    folder = work / "cmp"
    report = (folder / "report.md").read_text()
    assert "fedrec compare fedmf pfedrec -d mine" in report and "no test figure was read" in report
    board = (folder / "leaderboard.md").read_text()
    assert "| fedmf | 2 |" in board and "| pfedrec | 2 |" in board and "t-test p" in board
    assert (folder / "curves.png").stat().st_size > 1000
    for algorithm in ("fedmf", "pfedrec"):
        tuned = json.loads((folder / "configs" / f"{algorithm}.json").read_text())
        assert tuned["tuning"]["trials"] == 2 and tuned["tuning"]["test_read"] is False
    cells = sorted((folder / "cells").glob("*.json"))
    assert len(cells) == 4
    # the same command again runs nothing: every cell is cached and every search is kept
    stamps = [c.stat().st_mtime_ns for c in cells]
    assert cli("compare", "fedmf", "pfedrec", "-d", "mine", "--seeds", "2", "--trials", "2", "--rounds", "2",
               "-p", "loo-full", "-o", "cmp")[0] == 0
    assert [c.stat().st_mtime_ns for c in cells] == stamps
    code, out = cli("compare", "fedmf", "-d", "mine", "-o", "cmp")
    assert code == 2 and "other settings" in out

    # a saved run on the registered file, moved elsewhere; the data file and catalogue gone
    assert cli("run", "fedmf", "-d", "mine", "--rounds", "2", "-p", "loo-full", "--save", "own.fedrec", "-q")[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(str(work / "own.fedrec"), elsewhere / "own.fedrec")
    data.unlink()
    assert cli("data", "remove", "mine")[0] == 0
    monkeypatch.chdir(elsewhere)
    code, out = cli("recommend", "own.fedrec", "--user", "u5", "-k", "4")
    assert code == 0, out
    user, *items = out.strip().split("\t")
    assert user == "u5" and len(items) == 4 and all(i.startswith("i") for i in items)


def test_compare_declares_a_file_inline_and_refuses_mixed_protocol_kinds(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_events(tmp_path / "events.csv", users=50, items=100)
    with pytest.raises(FedrecError, match="ae cannot be evaluated under loo-full"):
        fedrec.compare(["fedmf", "ae"], "events.csv", columns="user,item", protocols=["loo-full"])
    done = fedrec.compare(["fedmf"], "events.csv", columns="user,item", protocols=["loo-full"], seeds=1, trials=0,
                          rounds=1, out="c")
    bench = (tmp_path / "c" / "bench.toml").read_text()
    assert '[datasets."events"]' in bench and str(tmp_path / "events.csv") in bench
    assert done.boards and done.boards[0].dataset == "events" and not (tmp_path / "c" / "configs").exists()


def test_compare_refuses_what_would_run_nothing_and_fails_when_nothing_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated protocols and no rounds are refused before any folder is made; runs that all
    fail (users with two interactions each: leave-one-out evaluates no one) end in one error
    line and exit 2, not in a report that says so under exit 0."""
    monkeypatch.chdir(tmp_path)
    for flags, says in ((["-p", "loo-full,loo-full"], "--protocols: loo-full named twice"),
                        (["--rounds", "0"], "--rounds must be >= 1 (got 0)")):
        code, out = cli("compare", "fedmf", "mf", "-d", "synthetic:100x400", "--seeds", "1", "--trials", "0",
                        *flags, "-o", "cmp")
        assert code == 2 and says in out and not (tmp_path / "cmp").exists()
    # a mistyped data set, column or device records nothing: the corrected command then runs there
    write_events(tmp_path / "events.csv", users=50, items=100)
    for kwargs, says in (({"dataset": "synthetic:40x2OO"}, "synthetic data is 'synthetic'"),
                         ({"dataset": "no-such-set"}, "unknown data set 'no-such-set'"),
                         ({"dataset": "events.csv", "columns": "user,bogus"}, "bogus"),
                         ({"dataset": "synthetic:100x400", "device": "bogus"}, "device"),
                         ({"dataset": "synthetic:100x400", "workers": 0}, "--workers must be >= 1"),
                         ({"dataset": "synthetic:100x400", "seeds": 1.5}, "--seeds must be a whole number"),
                         ({"dataset": "synthetic:100x400", "rounds": "1"}, "--rounds must be a whole number"),
                         ({"dataset": "synthetic:100x400", "algorithms": None}, "name at least one algorithm"),
                         ({"dataset": "synthetic:100x400", "protocols": [1]}, "give names"),
                         ({"dataset": "synthetic:100x400", "algorithms": 5}, "give a name or a list of names"),
                         ({"dataset": "synthetic:100x400", "device": None}, "device must be text"),
                         ({"dataset": "synthetic:100x400", "out": 5}, "out must be text or None"),
                         ({"dataset": "synthetic:100x400", "ks": [0]}, "--ks takes cut-offs K"),
                         ({"dataset": "synthetic:100x400", "ks": [20], "protocols": ["ratio-rating"],
                           "algorithms": ["mf"]}, "scores predicted ratings"),
                         ({"dataset": "nope.csv"}, "--dataset nope.csv: no such file")):
        args = {"algorithms": ["fedmf"], "protocols": ["loo-full"], "seeds": 1, "trials": 1, "rounds": 1,
                "out": "cmp", **kwargs}
        with pytest.raises(FedrecError, match=says):
            fedrec.compare(args.pop("algorithms"), args.pop("dataset"), **args)
        assert not (tmp_path / "cmp").exists(), kwargs
    # one name is one algorithm (and one protocol), not its letters
    done = fedrec.compare("fedmf", "synthetic:100x400", protocols="loo-full", seeds=1, trials=0, rounds=1, out="one")
    assert [b.protocol for b in done.boards] == ["loo-full"] and "fedmf" in done.leaderboard.read_text()
    assert "hr@20" not in done.leaderboard.read_text()
    # further cut-offs: on the boards, in the grid and in the command the report gives
    code, out = cli("compare", "fedmf", "-d", "synthetic:100x400", "-p", "loo-full", "--seeds", "1", "--trials", "0",
                    "--rounds", "1", "--ks", "20", "-o", "at20")
    assert code == 0, out
    assert "| hr@10 | ndcg@10 | mrr@10 | hr@20 | ndcg@20 | mrr@20 |" in (tmp_path / "at20" / "leaderboard.md").read_text()
    assert "--ks 20" in (tmp_path / "at20" / "report.md").read_text()
    rows = ["user,item"] + [f"u{u},i{(3 * u + k) % 40}" for u in range(20) for k in range(2)]
    (tmp_path / "two.csv").write_text("\n".join(rows) + "\n")
    code, out = cli("compare", "fedmf", "mf", "-d", "two.csv", "--columns", "user,item", "-p", "loo-full",
                    "--seeds", "1", "--trials", "0", "--rounds", "1", "-o", "two")
    assert code == 2, out
    assert "no run finished (2 without a result; first: " in out and "no user has a validation item" in out


def test_a_bench_file_declares_its_own_data(tmp_path: Path) -> None:
    from fedrec.bench import load_grid

    write_events(tmp_path / "events.csv")
    bench = tmp_path / "b.toml"
    bench.write_text('[grid]\nalgorithms = ["fedmf"]\ndatasets = ["mine"]\nprotocols = ["loo-full"]\nseeds = [0]\n'
                     '[datasets.mine]\npath = "events.csv"\ncolumns = "user,item,rating,ts"\n')
    grid = load_grid(bench)
    cfg = grid.cells[0].run_config(None)
    assert cfg.dataset == "mine" and cfg.user_data["path"] == str(tmp_path / "events.csv")
    assert len(prepare_split(cfg).data) > 0
    key = grid.cells[0].key()
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(tmp_path / "events.csv", moved / "events.csv")
    shutil.copy(bench, moved / "b.toml")
    assert load_grid(moved / "b.toml").cells[0].key() == key  # content, not place, makes the key
    with (moved / "events.csv").open("a") as f:
        f.write("u1,i999,5,1\n")
    assert load_grid(moved / "b.toml").cells[0].key() != key
    bench.write_text(bench.read_text().replace('columns = "user,item,rating,ts"\n', 'colums = "x"\n'))
    with pytest.raises(FedrecError, match="needs path and columns"):
        load_grid(bench)


def test_tune_reads_a_file_with_columns(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from fedrec.tune import tune

    data = write_events(tmp_path / "events.csv")
    result = tune("fedmf", str(data), trials=1, rounds=1, protocol="loo-full", columns="user,item,rating,ts")
    assert result.completed == 1


# ---------------------------------------------------------------------------------------------
# What a catalogue or a clock may change, and what it must not
# ---------------------------------------------------------------------------------------------


def test_a_random_holdout_is_part_of_a_runs_identity_and_built_in_keys_stay() -> None:
    from fedrec.bench.grid import Cell

    assert "held_out" not in RunConfig.identity({"dataset": "ml-100k", "protocol": "loo-full"})
    assert RunConfig.identity({"dataset": "lastfm-2k-listens", "protocol": "loo-full"})["held_out"] == "random"
    assert "held_out" not in RunConfig.identity({"dataset": "lastfm-2k-listens", "protocol": "ratio-full"})
    own = {"dataset": "x.csv", "protocol": "loo-sampled"}
    assert RunConfig.identity({**own, "columns": "u,i"})["held_out"] == "random"
    assert "held_out" not in RunConfig.identity({**own, "columns": "u,i,,t"})
    # the key of a cell on a built-in data set with a clock is the one it had before catalogues
    # (under the papers' setting: fedrec's defaults of FedMF changed after)
    assert Cell("fedmf", "ml-100k", "loo-sampled", "leak-free", 0, 5, paper=True).key() == "b904c3120807455bb0b9"


def test_the_catalogue_never_shadows_a_built_in_name_nor_breaks_its_runs(tmp_path: Path) -> None:
    user_sets.catalogue_file().parent.mkdir(parents=True, exist_ok=True)
    user_sets.catalogue_file().write_text("{not json")
    assert RunConfig(algorithm="fedmf", dataset="ml-100k").user_data is None  # never read for it
    with pytest.raises(FedrecError, match="cannot be read"):
        RunConfig(algorithm="fedmf", dataset="mine")
    entry = user_sets.describe(write_events(tmp_path / "e.csv"), "user,item", name="ml-100k").to_dict()
    user_sets.catalogue_file().write_text(json.dumps({"format": 1, "datasets": {"ml-100k": entry}}))
    with pytest.raises(FedrecError, match="built-in data set.*rename or remove"):
        user_sets.entries()


def test_a_bench_file_names_only_data_it_can_find(tmp_path: Path) -> None:
    from fedrec.bench import load_grid

    data = write_events(tmp_path / "events.csv")
    bench = tmp_path / "b.toml"
    bench.write_text('[grid]\nalgorithms = ["fedmf"]\ndatasets = ["mine"]\nprotocols = ["loo-full"]\nseeds = [0]\n')
    with pytest.raises(FedrecError, match="grid.datasets: unknown data set 'mine'.*fedrec data add"):
        load_grid(bench)
    user_sets.add("mine", data, "user,item,rating,ts")
    key = load_grid(bench).cells[0].key()
    data.unlink()
    assert load_grid(bench, check_device=False).cells[0].key() == key  # a report reads no data
    with pytest.raises(FedrecError, match="is gone"):
        load_grid(bench)
    bench.write_text(bench.read_text().replace('"mine"]', '"other"]') + '[datasets.other]\npath = 1\ncolumns = "u,i"\n')
    with pytest.raises(FedrecError, match="datasets.other: path, columns and sep are text"):
        load_grid(bench)


def test_a_tab_separator_can_be_typed(tmp_path: Path) -> None:
    data = tmp_path / "events.txt"
    data.write_text("user;item\n" + "".join(f"u{u};i{i}\n" for u in range(5) for i in range(4)))
    code, out = cli("data", "add", "semi", str(data), "--columns", "user,item", "--sep", ";")
    assert code == 0 and user_sets.get("semi").rows == 20, out
    tabbed = tmp_path / "events.log"
    tabbed.write_text(data.read_text().replace(";", "\t"))
    assert user_sets.add("tabbed", tabbed, "user,item", sep="\\t").sep == "\t"


def test_an_older_run_file_on_data_without_a_clock_says_why_it_cannot_be_loaded(tmp_path: Path) -> None:
    from fedrec import tensorfile
    from fedrec.api import FORMAT, KIND

    data = write_events(tmp_path / "events.csv", time=False)
    path = fedrec.run("fedmf", str(data), columns="user,item", protocol="loo-full", rounds=1).save(tmp_path / "r.fedrec")
    blob = {k: v for k, v in tensorfile.load(path, KIND, FORMAT).items() if k != "portable"}
    blob["data"] = dict(blob["data"], sha256="0" * 64)  # as its row-order split recorded it
    tensorfile.save(tmp_path / "old.fedrec", blob, KIND, FORMAT - 1)
    with pytest.raises(FedrecError, match="held out each user's last rows.*train the run again"):
        fedrec.load(tmp_path / "old.fedrec")


def test_compare_refuses_a_folder_made_for_the_file_before_it_changed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_events(tmp_path / "events.csv", users=40, items=100)
    fedrec.compare(["fedmf"], "events.csv", columns="user,item,,ts", protocols=["loo-full"], seeds=1, trials=0,
                   rounds=1, out="c")
    with data.open("a") as f:
        f.write("u1,i999,5,1\n")
    with pytest.raises(FedrecError, match="as it was before it changed"):
        fedrec.compare(["fedmf"], "events.csv", columns="user,item,,ts", protocols=["loo-full"], seeds=1,
                       trials=0, rounds=1, out="c")


def test_removing_from_an_empty_catalogue_and_an_unknown_suffix_are_one_line(tmp_path: Path) -> None:
    code, out = cli("data", "remove", "nope")
    assert code == 2 and "no data set is registered" in out
    odd = tmp_path / "events.log"
    odd.write_text("user,item\nu1,i1\n")
    code, out = cli("data", "add", "odd", str(odd), "--columns", "user,item")
    assert code == 2 and "--sep" in out and not user_sets.catalogue_file().exists()
    assert cli("data", "add", "odd", str(odd), "--columns", "user,item", "--sep", ",")[0] == 0


def test_a_catalogue_that_cannot_be_written_or_holds_an_empty_separator_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_events(tmp_path / "events.csv")
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    monkeypatch.setenv("FEDREC_HOME", str(blocked / "home"))
    code, out = cli("data", "add", "mine", str(data), "--columns", "user,item,rating,ts")
    assert code == 2 and f"the catalogue {blocked}/home/datasets.json: {blocked} is a file, not a folder" in out
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FEDREC_HOME", str(home))
    entry = {"name": "a", "path": str(data), "columns": "user,item", "sep": ""}
    (home / "datasets.json").write_text(json.dumps({"format": 1, "datasets": {"a": entry}}))
    code, out = cli("data", "list")
    assert code == 2 and "a: sep must be one or more characters (or absent), not ''" in out


def test_a_file_without_columns_and_a_name_with_them_each_say_what_to_do(tmp_path: Path) -> None:
    data = write_events(tmp_path / "events.csv")
    code, out = cli("data", "stats", str(data))
    assert code == 2 and f"{data} is a file: say which columns hold what with --columns" in out
    # a misspelt path, or a folder, is said to be one (not "a file" to give columns for)
    code, out = cli("run", "fedmf", "-d", str(tmp_path / "evnts.csv"), "-q", "-o", str(tmp_path / "r.json"))
    assert code == 2 and f"{tmp_path / 'evnts.csv'}: no such file" in out
    code, out = cli("run", "fedmf", "-d", f"{tmp_path}/", "-q", "-o", str(tmp_path / "r.json"))
    assert code == 2 and "is a folder; give the data file in it" in out
    assert cli("data", "add", "mine", str(data), "--columns", "user,item,rating,ts")[0] == 0
    code, out = cli("run", "fedmf", "-d", "mine", "--columns", "user,item", "-q", "-o", str(tmp_path / "r.json"))
    assert code == 2 and "--dataset mine is a data set you added (`fedrec data add`)" in out
    assert not (tmp_path / "r.json").exists()


def test_names_thresholds_and_fetches_that_would_fail_later_are_refused_when_added(tmp_path: Path) -> None:
    """A name one case away from another (one results file on a case-blind file system), a
    threshold that keeps no interaction (every later run: "no interactions left"), a fetch of
    one's own data set, and --threshold on a file without ratings: each said at once."""
    data = write_events(tmp_path / "events.csv")
    assert cli("data", "add", "mine", str(data), "--columns", "user,item,rating,ts")[0] == 0
    for name, twin in (("Mine", "mine"), ("ML-100K", "ml-100k")):
        code, out = cli("data", "add", name, str(data), "--columns", "user,item,rating,ts")
        assert code == 2 and f"differs only in case from the data set '{twin}'" in out, out
    assert cli("data", "add", "mine", str(data), "--columns", "user,item,rating,ts", "--overwrite")[0] == 0
    code, out = cli("data", "add", "strict", str(data), "--columns", "user,item,rating,ts", "--implicit-threshold", "9")
    assert code == 2 and "--implicit-threshold 9 keeps no interaction: the file's ratings are at most 5" in out
    assert set(user_sets.entries()) == {"mine"}
    code, out = cli("data", "fetch", "mine")
    assert code == 2 and "is a data set of your own" in out and "nothing to fetch" in out
    with pytest.raises(FedrecError, match="--threshold 3 keeps ratings at or above it, and --columns 'user,item' "
                                          "names no rating column"):
        prepare_split(RunConfig("mf", dataset=str(data), columns="user,item", threshold=3))


def test_a_checkpoint_of_a_file_edited_since_is_not_resumed(tmp_path: Path) -> None:
    """A run of one's own file is named by its path; its checkpoint holds the file's sha256, so
    resuming after the file was edited (same users and items, so the state would fit) is refused
    in one line, and resuming the unedited file goes on."""
    from fedrec.experiment import federated_config, train

    data = write_events(tmp_path / "events.csv")

    def cfg(rounds: int) -> RunConfig:
        return RunConfig(algorithm="fedmf", dataset=str(data), columns="user,item,rating,ts", protocol="loo-full",
                         federated=federated_config("fedmf", str(data), "loo-full", rounds=rounds, patience=0,
                                                    checkpoint_every=1))

    ckpt = tmp_path / "run.ckpt"
    train(cfg(2), checkpoint=ckpt)
    original = data.read_text()
    lines = original.splitlines()
    user, item, rating, ts = lines[1].split(",")
    lines[1] = ",".join([user, item, str(6 - int(rating)) if rating != "3" else "4", ts])
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(FedrecError, match="data_content"):  # other events, not only other bytes
        train(cfg(3), checkpoint=ckpt, resume=True)
    data.write_text(original)
    assert train(cfg(3), checkpoint=ckpt, resume=True).result.resumed_at == [2]


def test_compare_does_not_reuse_a_setting_tuned_by_another_search(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuned config records the search that found it (its base run as it resolved, every
    default included); a comparison run again after a default changed refuses the config rather
    than run its cells under the new defaults with settings tuned under the old, and says what."""
    monkeypatch.chdir(tmp_path)
    write_events(tmp_path / "events.csv", users=40, items=100)
    kw = dict(columns="user,item,,ts", protocols=["loo-full"], seeds=1, trials=1, rounds=1, out="c")
    fedrec.compare(["fedmf"], "events.csv", **kw)
    path = tmp_path / "c" / "configs" / "fedmf.json"
    config = json.loads(path.read_text())
    dim = config["tuning"]["search"]["base"]["model"]["dim"]
    fedrec.compare(["fedmf"], "events.csv", **kw)  # the same search: reused
    config["tuning"]["search"]["base"]["model"]["dim"] = dim + 1  # as if tuned when the default was one more
    path.write_text(json.dumps(config))
    with pytest.raises(FedrecError, match=rf"was tuned by another search .*base\.model\.dim \(then {dim + 1}, now {dim}\)"):
        fedrec.compare(["fedmf"], "events.csv", **kw)
