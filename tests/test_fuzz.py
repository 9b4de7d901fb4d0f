"""Fuzzing the command line (Hypothesis): whatever options and data files a user gives, fedrec
exits 0 with a whole results file, or exits 2 with one line and no traceback and leaves no
file behind. Derandomized (the same examples every run) and small, so it is a fast, stable test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from cli_outcome import outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrec.cli import main

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SYN = "synthetic:60x300"

small_ints = st.sampled_from([-3, -1, 0, 1, 2, 3, 7, 2**31])
floats = st.sampled_from([-1.0, 0.0, 1e-9, 0.5, 1.0, 1.5, 3.0, math.inf, math.nan])
words = st.sampled_from(["", "x", "cuda", "rows", "dense", "leak-free", "0.5", "-1", "ml-100k"])

#: option -> values (sizes stay small: a valid huge embedding would only measure the machine)
OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "--rounds": st.sampled_from([-1, 0, 1, 2]),
    "--batch-size": small_ints,
    "--lr": floats,
    "--num-negatives": small_ints,
    "--negatives": words,
    "--patience": small_ints,
    "--eval-every": small_ints,
    "--dim": st.sampled_from([-5, 0, 1, 4]),
    "--clients-per-round": floats,
    "--local-epochs": st.sampled_from([-1, 0, 1, 2]),
    "--item-lr-scale": floats,
    "--ldp": floats,
    "--clip": floats,
    "--dp-clip": floats,
    "--dp-noise": floats,
    "--dp-delta": floats,
    "--encoding": words,
    "--memory-budget-mb": floats,
    "--protocol": st.sampled_from(["loo-sampled", "ratio-full", "ratio-rating", "nope"]),
    "--device": words,
    "--weight-decay": floats,
    "--threads": st.sampled_from([-1, 0, 1]),
    "--set": st.sampled_from(["dual=true", "curriculm=sin", "nosuch", "dim=x", "score=mlp"]),
}


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, _, err = outcome(argv, capsys)
    return code, err


def _check(code: int, err: str, written: Path | None, folder: Path) -> None:
    assert "Traceback" not in err
    if code == 0:
        if written is not None:
            json.loads(written.read_text())  # whole
    else:
        assert code == 2, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), err
        if written is not None:
            assert not written.exists()
    assert not list(folder.rglob(".*.tmp"))  # no partial file


@settings(FUZZ, max_examples=60)
@given(algorithm=st.sampled_from(["mf", "pfedrec", "fedmf", "fedrap", "personalfr"]),
       chosen=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.none(), max_size=4),
       data=st.data())
def test_run_with_any_options(algorithm: str, chosen: dict[str, None], data: st.DataObject,
                              tmp_path_factory: pytest.TempPathFactory,
                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path_factory.mktemp("run")
    out = folder / "r.json"
    argv = ["run", algorithm, "-d", SYN, "--out", str(out), "-q"]
    if "--rounds" not in chosen:
        argv += ["--rounds", "1"]
    for option in chosen:
        argv += [option, str(data.draw(OPTIONS[option], label=option))]
    code, err = _outcome(argv, capsys)
    _check(code, err, out, folder)


def _rows(draw: st.DrawFn) -> str:
    good = st.builds(lambda u, i, r, t: f"{u}\t{i}\t{r}\t{t}", st.integers(1, 30), st.integers(1, 60),
                     st.integers(1, 5), st.integers(0, 10**9))
    bad = st.sampled_from(["", "1\t2", "a\tb\tc\td", "1\t2\t3\t4\t5", "1,2,3,4", "\x00\t1\t1\t1",
                           "1\t2\t3.5\tnan", "é\t1\t1\t1", "   ", "1\t2\t3\t-1"])
    lines = draw(st.lists(st.one_of(good, good, good, bad), min_size=0, max_size=40))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\r\n"]))


@FUZZ
@given(text=st.composite(_rows)())
def test_data_stats_with_any_file(text: str, tmp_path_factory: pytest.TempPathFactory,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path_factory.mktemp("data")
    (folder / "u.data").write_text(text, encoding="utf-8")
    code, err = _outcome(["data", "stats", "ml-100k", "--data-dir", str(folder), "--file", "u.data"], capsys)
    _check(code, err, None, folder)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    try:
        main(["run", "pfedrec", "-d", SYN, "--rounds", "1", "--out", str(folder / "r.json"), "-q",
              "--save", str(folder / "r.fedrec")])
    except SystemExit as e:
        assert not e.code
    return folder / "r.fedrec"


@FUZZ
@given(user=st.one_of(st.integers(-5, 60).map(str), words), k=small_ints,
       garbage=st.sampled_from([None, b"", b"not a run", b"PK\x03\x04"]))
def test_recommend_with_any_arguments(user: str, k: int, garbage: bytes | None, saved_run: Path,
                                      tmp_path_factory: pytest.TempPathFactory,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run_file = saved_run
    if garbage is not None:
        run_file = tmp_path_factory.mktemp("bad") / "r.fedrec"
        run_file.write_bytes(garbage)
    code, err = _outcome(["recommend", str(run_file), "--user", user, "-k", str(k)], capsys)
    _check(code, err, None, run_file.parent)
