"""What a new user meets first: default file names, early and one-line errors, one name per
policy, the plot of several runs, described options, and listings that fit 80 columns."""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_outcome import outcome
from rich.console import Console

from fedrec.cli import experiments, main
from fedrec.errors import DataFormatError, FedrecError

SYN = "synthetic:60x300"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, out, err = outcome(argv, capsys)
    return code, err + out


# --- 1. the default results file name carries the options given -----------------------------


def test_default_names_differ_by_options_and_a_rerun_finds_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["run", "mf", "-d", SYN, "-q", "--epochs", "1"]
    assert _cli(base, capsys)[0] == 0
    assert _cli([*base, "--lr", "0.01", "--set", "dim=8"], capsys)[0] == 0
    written = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert written == ["mf-synthetic_60x300-loo-sampled-s0-epochs1-lr0.01-dim=8.json",
                       "mf-synthetic_60x300-loo-sampled-s0-epochs1.json"]
    # the same command, its options in another order: the same file, and the usual refusal
    code, text = _cli(["run", "mf", "--set", "dim=8", "-q", "--lr", "0.01", "-d", SYN, "--epochs", "1"], capsys)
    assert code == 2
    assert "runs/mf-synthetic_60x300-loo-sampled-s0-epochs1-lr0.01-dim=8.json exists" in text
    assert "--overwrite" in text
    blob = json.loads((tmp_path / "runs" / written[0]).read_text())
    assert blob["config"]["train"]["lr"] == 0.01 and blob["config"]["model"]["dim"] == 8


def test_a_long_list_of_options_is_hashed_and_where_a_run_is_done_is_not_in_the_name() -> None:
    short = experiments.default_out("pfedrec", "ml-100k", "loo-sampled", 1, [("rounds", 5), ("dual", True)], {})
    assert short == Path("runs/pfedrec-ml-100k-loo-sampled-s1-rounds5-dual.json")
    many = [("rounds", 5), ("lr", 0.01), ("negatives", "train-only"), ("ldp", 0.1), ("clip", 1.0)]
    long = experiments.default_out("fedmf", "my.csv", "loo-full", 0, many, {"dims": (8, 16)})
    other = experiments.default_out("fedmf", "my.csv", "loo-full", 0, many, {"dims": (8, 32)})
    assert re.fullmatch(r"fedmf-my-loo-full-s0-rounds5-lr0\.01-negatives-train-only\+[0-9a-f]{6}\.json", long.name)
    assert other != long and other.name[:-12] == long.name[:-12]
    given = experiments.given_options({**_defaults(), "rounds": 5, "device": "cuda", "threads": 2,
                                        "memory_budget_mb": 64.0, "checkpoint_every": 3, "quiet": True}, True)
    assert given == [("rounds", 5)]
    assert experiments.given_options({**_defaults(), "rounds": 5}, False) == [("epochs", 5)]


def _defaults() -> dict[str, Any]:
    import inspect

    return {name: getattr(p.default, "default", p.default)
            for name, p in inspect.signature(experiments.run_command).parameters.items()}


# --- 2. a missing column is said before the output file is checked ---------------------------


def test_a_missing_column_is_said_before_an_existing_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "my.csv"
    table.write_text("user,item,rating\n" + "".join(f"{u},{i},4\n" for u in range(5) for i in range(6)))
    out = tmp_path / "earlier.json"
    out.write_text("{}")
    code, text = _cli(["run", "mf", "-d", str(table), "--columns", "user,itm", "-o", str(out), "-q"], capsys)
    assert code == 2 and "no column 'itm'; columns are: user, item, rating" in text
    assert "exists" not in text and out.read_text() == "{}"
    code, text = _cli(["run", "mf", "-d", str(tmp_path / "nope.csv"), "--columns", "u,i", "-o", str(out)], capsys)
    assert code == 2 and "nope.csv: no such file" in text


def test_a_file_read_with_the_wrong_separator_says_which_it_looks_like(tmp_path: Path) -> None:
    """A first line that is one field holding another separator is named as such, not listed
    back as "columns are: user,item" (which reads as if the columns were there)."""
    from fedrec.data.tables import check_columns, read_table

    for name, text, says in (("c.tsv", "user,item\n1,2\n", "read as tab-separated, the first line is one field "
                                                            "('user,item'); it looks comma-separated"),
                             ("t.csv", "user\titem\n1\t2\n", "it looks tab-separated"),
                             ("s.csv", "user;item\n1;2\n", "it looks semicolon-separated"),
                             ("n.tsv", 'user;item;"note, free"\n1;2;x\n', "it looks semicolon-separated")):
        (tmp_path / name).write_text(text)
        for read in (lambda f: check_columns(f, "user,item"), lambda f: read_table(f, "user", "item")):
            with pytest.raises(DataFormatError, match="no column 'user'") as err:
                read(tmp_path / name)
            assert says in str(err.value) and "give its separator" in str(err.value)
    (tmp_path / "one.csv").write_text("name\nx\n")  # one column and no other separator: the plain list
    with pytest.raises(DataFormatError, match="no column 'user'; columns are: name"):
        check_columns(tmp_path / "one.csv", "user,name")
    # a binary file's bytes are shown escaped, never sent to the terminal as they are
    (tmp_path / "bin.csv").write_bytes(b"\x1b[2Jab\x07,c" + b",x" * 30 + b"\n1,2\n")
    with pytest.raises(DataFormatError) as err:
        check_columns(tmp_path / "bin.csv", "user,item")
    said = str(err.value)
    assert "\x1b" not in said and "\x07" not in said and "\\x1b[2Jab\\x07, c, x" in said and "(32 in all)" in said


def test_check_columns_reads_the_header_alone(tmp_path: Path) -> None:
    from fedrec.data.tables import check_columns, parse_columns

    assert parse_columns("uid, iid ,r") == {"user": "uid", "item": "iid", "rating": "r"}
    assert parse_columns("0,1") == {"user": 0, "item": 1}
    with pytest.raises(FedrecError, match="give USER,ITEM"):
        parse_columns("uid")
    table = tmp_path / "t.tsv"
    table.write_text("uid\tiid\n1\t2\n" + "not\ta\tvalid\trow\n")  # only the header is read
    check_columns(table, "uid,iid")
    check_columns(table, "0,1")
    check_columns(table, "user=uid,item=iid")
    with pytest.raises(FedrecError, match="no column 'ts'"):
        check_columns(table, "uid,iid,,ts")
    with pytest.raises(FedrecError, match="column 2 is out of range"):
        check_columns(table, "0,2")


# --- 3. more clients per round than there are clients ----------------------------------------


def test_more_clients_per_round_than_clients_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.core.plan import sample_clients

    rng = np.random.default_rng(0)
    assert len(sample_clients(60, 60, rng)) == 60 and len(sample_clients(60, 0.5, rng)) == 30
    assert len(sample_clients(60, 1.0, rng)) == 60  # a fraction <= 1 stays a fraction
    out = tmp_path / "r.json"
    code, text = _cli(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--clients-per-round", "5000",
                       "-o", str(out), "-q"], capsys)
    assert code == 2 and "--clients-per-round 5000 is more than the 60 clients" in text
    assert not out.exists()


# --- 4. a data dir that is not a directory -------------------------------------------------


def test_a_data_dir_that_is_not_a_directory_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.data import registry

    monkeypatch.delenv("FEDREC_DATA", raising=False)
    missing = tmp_path / "nope"
    code, text = _cli(["run", "mf", "--data-dir", str(missing), "-o", str(tmp_path / "r.json")], capsys)
    assert code == 2 and f"--data-dir {missing} does not exist" in text
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(FedrecError, match=f"--data-dir {a_file} is not a directory"):
        registry.resolve("ml-100k", a_file, download=False)
    monkeypatch.setenv("FEDREC_DATA", str(missing))
    with pytest.raises(FedrecError, match=f"FEDREC_DATA {missing} does not exist"):
        registry.resolve("ml-100k", download=False)
    code, text = _cli(["run", "mf", "-o", str(tmp_path / "r.json")], capsys)  # typer reads it too
    assert code == 2 and f"FEDREC_DATA {missing} does not exist" in text
    assert _cli(["run", "mf", "-d", SYN, "--epochs", "1", "-q", "-o", str(tmp_path / "s.json")], capsys)[0] == 0


# --- 5. reproduce reports the sample std, as bench does ------------------------------------


def test_reproduce_tables_report_the_sample_std() -> None:
    from fedrec.reproduce.table import summarise, to_markdown

    runs = [{"algorithm": "pfedrec", "dataset": "ml-100k", "seed": s, "config": {"negatives": "leak-free"},
             "test": {"hr@10": hr, "ndcg@10": 0.4}, "data": {"negatives": "exclude-candidates"}}
            for s, hr in enumerate([0.60, 0.64])]
    mean, std, n = summarise(runs)[("pfedrec", "ml-100k", "", "exclude-candidates")]["hr@10"]
    assert n == 2 and mean == pytest.approx(0.62)
    assert std == pytest.approx(statistics.stdev([0.60, 0.64])) == pytest.approx(0.0282843, abs=1e-6)
    md = to_markdown(summarise(runs), "pfedrec", 1, metrics=["hr@10"], paper_rows=False)
    assert "| pfedrec | ml-100k | 0.6200 ± 0.0283 |" in md and "sample std (ddof=1)" in md


# --- 6. one name of the leaky policy in run and reproduce ----------------------------------


def test_legacy_names_the_leaky_policy_everywhere(
        tmp_path: Path, small_data: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.protocols.protocol import make_split, negative_policy
    from fedrec.reproduce.runner import POLICY_CHOICES

    assert negative_policy("legacy") == negative_policy("legacy-exclude-heldout") == "legacy-exclude-heldout"
    assert POLICY_CHOICES["legacy"] == ("legacy-exclude-heldout",)
    a = make_split(small_data, "loo-sampled", negatives="legacy")
    b = make_split(small_data, "loo-sampled", negatives="legacy-exclude-heldout")
    assert a.negatives == b.negatives == "legacy-exclude-heldout"
    assert np.array_equal(a.sampler.n_allowed, b.sampler.n_allowed)
    with pytest.raises(FedrecError, match="did you mean 'legacy'"):
        negative_policy("legacyy")
    out = tmp_path / "r.json"
    assert _cli(["run", "mf", "-d", SYN, "--epochs", "1", "--negatives", "legacy", "-q", "-o", str(out)], capsys)[0] == 0
    blob = json.loads(out.read_text())
    assert blob["config"]["negatives"] == blob["data"]["negatives"] == "legacy-exclude-heldout"
    code, text = _cli(["reproduce", "pfedrec", "--tables", "1", "--negatives", "legacy-exclude-heldout",
                       "--reuse-only", "--out-dir", str(tmp_path / "rep")], capsys)
    # the alias is taken; with nothing in the out-dir to print, the run ends on that (exit 2)
    assert "--negatives must be one of" not in text and "no result of these runs is in" in text, text


# --- 7. the plot: panels per data set and protocol, seeds as one line ----------------------


def _run(algorithm: str, seed: int, values: list[float], protocol: str = "loo-sampled",
         uploads: float = 0.0) -> dict[str, Any]:
    history = [{"round": r + 1, "valid": {"ndcg@10": v}, "bytes_up": uploads * 10**r}
               for r, v in enumerate(values)]
    best = int(np.argmax(values)) + 1
    return {"algorithm": algorithm, "dataset": "ml-100k", "protocol": protocol, "seed": seed,
            "select": "ndcg@10", "best_round": best, "history": history,
            "config": {"algorithm": algorithm, "seed": seed, "negatives": "leak-free",
                       "train": {"lr": 0.001, "device": "cpu"}}}


def test_plot_groups_seeds_into_one_line_with_a_band(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from matplotlib.collections import PolyCollection

    from fedrec.plot import draw_runs

    runs = [_run("pfedrec", 0, [0.1, 0.3, 0.2], uploads=2**20), _run("pfedrec", 1, [0.2, 0.5, 0.4], uploads=2**20),
            _run("mf", 0, [0.15, 0.25, 0.35])]
    fig = draw_runs(runs)
    valid, uploads = fig.axes
    lines = {line.get_label(): line for line in valid.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"pfedrec (2 seeds)", "mf (seed 0)"}
    assert np.allclose(lines["pfedrec (2 seeds)"].get_ydata(), [0.15, 0.4, 0.3])  # the mean over seeds
    assert lines["pfedrec (2 seeds)"].get_color() != lines["mf (seed 0)"].get_color()
    bands = [c for c in valid.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # only the line of two seeds has a band
    low, high = bands[0].get_paths()[0].vertices[:, 1].min(), bands[0].get_paths()[0].vertices[:, 1].max()
    assert (low, high) == pytest.approx((0.1, 0.5))
    assert "ml-100k · loo-sampled" in valid.get_title()
    # uploads span two decades: a log axis with plain numbers
    assert uploads.get_yscale() == "log"
    fig.canvas.draw()
    ticks = [t.get_text() for t in uploads.get_yticklabels() if t.get_text()]
    assert ticks and all(re.fullmatch(r"[0-9.]+", t) for t in ticks), ticks


def test_plot_splits_protocols_into_panels_and_labels_what_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.plot import draw_runs

    other_lr = _run("mf", 0, [0.1, 0.2])
    other_lr["config"]["train"]["lr"] = 0.01
    runs = [_run("mf", 0, [0.1, 0.3]), _run("mf", 1, [0.2, 0.3], protocol="loo-full"), other_lr]
    fig = draw_runs(runs)
    assert [ax.get_title().splitlines()[0] for ax in fig.axes] == ["ml-100k · loo-sampled", "ml-100k · loo-full"]
    labels = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert labels == ["mf lr=0.001 (seed 0)", "mf lr=0.01 (seed 0)"]
    paths = []
    for k, r in enumerate(runs):
        paths.append(tmp_path / f"{k}.json")
        paths[-1].write_text(json.dumps(r))
    out = tmp_path / "fig.png"
    code, text = _cli(["plot", *map(str, paths), "--out", str(out)], capsys)
    assert code == 0 and out.read_bytes()[:4] == b"\x89PNG"


# --- 8. every option of every algorithm is described ---------------------------------------


def test_every_option_of_every_algorithm_has_a_description(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedrec.algorithms import ALGORITHMS

    for spec in ALGORITHMS.values():
        helps = spec.options.help()
        assert set(helps) == set(spec.defaults), spec.name
        empty = [k for k, text in helps.items() if not text.strip()]
        assert not empty, f"{spec.name}: {empty} have no description"
    assert ALGORITHMS["stacked"].options.help()["aggregation"].startswith("cia (average")  # inherited
    text = _render(monkeypatch, ["algorithms", "fedrap-no"], width=200)
    reg = next(line for line in text.splitlines() if line.startswith("│ reg "))
    assert [c.strip() for c in reg.split("│")[1:-1]] == [
        "reg", "none", "text", "sparsity term on C: l1 (proximal step), l2 or none (fixed by this algorithm)"]


# --- 9. listings at 80 columns ---------------------------------------------------------------


def _render(monkeypatch: pytest.MonkeyPatch, argv: list[str], width: int = 80) -> str:
    buffer = io.StringIO()
    monkeypatch.setattr(experiments, "console", Console(file=buffer, width=width))
    try:
        main(argv)
    except SystemExit as e:
        assert not e.code
    return buffer.getvalue()


def _first_cells(text: str) -> list[str]:
    return [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]


def test_listings_at_80_columns_keep_every_name_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedrec.algorithms import ALGORITHMS
    from fedrec.protocols.protocol import NEGATIVE_POLICIES, PROTOCOLS

    text = _render(monkeypatch, ["protocols"])
    assert max(map(len, text.splitlines())) <= 80
    names = [c for c in _first_cells(text) if c]
    assert names == [*PROTOCOLS, *NEGATIVE_POLICIES]
    assert "ndcg@10*" in text and "protocols" in text.splitlines()[0]
    text = _render(monkeypatch, ["algorithms"])
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    assert [c for c in _first_cells(text) if c] == list(ALGORITHMS)
    assert "algorithms (fedrec algorithms NAME: its options)" in text.splitlines()[0]
    for name in ("fedrap", "personalfr", "fedcia"):
        text = _render(monkeypatch, ["algorithms", name])
        assert max(map(len, text.splitlines())) <= 80
        ours = text.split("its paper's setting")[0]  # the papers' table lists data sets, not options
        options = [c for c in _first_cells(ours) if c and not c.startswith("--")]
        assert options == list(ALGORITHMS[name].defaults)
        assert "engine defaults (command-line options)" in text


def test_too_few_items_for_the_default_negatives_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user who never gave --num-negatives is told the count is the algorithm's default, and
    what to give instead."""
    table = tmp_path / "four.csv"
    table.write_text("user,item\n" + "".join(f"{u},{i}\n" for u in range(5) for i in range(4)))
    code, text = _cli(["run", "mf", "-d", str(table), "--columns", "user,item", "-p", "loo-full", "-q",
                       "-o", str(tmp_path / "r.json")], capsys)
    assert code == 2 and "the algorithm's default where not given" in text and "below 4" in text
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "mf", "--dim", "4", "--set", "dim=3"], "--dim 4 and --set dim=... both give the model's dim"),
    (["run", "pfedrec", "--dual", "--set", "dual=false"], "--dual and --set dual=... both give the model's dual"),
    (["run", "mf", "--set", "dim=4", "--set", "dim=3"], "--set dim is given twice"),
    (["flower", "fedmf", "--dim", "4", "--set", "dim=3"], "--dim 4 and --set dim=... both give the model's dim"),
])
def test_a_model_option_given_twice_is_refused(argv: list[str], says: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Which of two values for one option wins is nothing a user should have to know: neither does."""
    out = tmp_path / "r.json"
    code, text = _cli([*argv, "-d", "synthetic:60x300", "--rounds", "1", "-o", str(out)], capsys)
    assert code == 2 and says in text and not out.exists()
