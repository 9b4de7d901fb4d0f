"""The public Python API: docs/api.md's example runs as written; typed options; recommend."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import fedrec
from fedrec.cli import main
from fedrec.errors import FedrecError

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs" / "api.md"


def _example(path: Path) -> str:
    return re.search(r"```python\n(.*?)```", path.read_text(), re.S).group(1)


def test_the_documented_example_runs_as_written(tmp_path):
    code = _example(DOCS).replace("/tmp/pfedrec.fedrec", str(tmp_path / "pfedrec.fedrec"))
    scope: dict = {}
    exec(compile(code, str(DOCS), "exec"), scope)  # noqa: S102  (our own documentation)
    run = scope["run"]
    assert run.best_round >= 1 and set(run.test) >= {"hr@10", "ndcg@10"}
    assert len(scope["again"].recommend(3, 10)) == 10


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it saves under runs/
    scope: dict = {}
    exec(compile(_example(ROOT / "README.md"), "README.md", "exec"), scope)  # noqa: S102
    assert fedrec.load(tmp_path / "runs" / "pfedrec-synthetic.fedrec").recommend(7, 10) == scope["run"].recommend(7, 10)


def test_public_names_are_curated():
    assert set(fedrec.__all__) == {"Run", "RunConfig", "compare", "list_algorithms", "list_protocols", "load",
                                   "run", "__version__"}
    assert callable(fedrec.compare)
    assert "pfedrec" in fedrec.list_algorithms() and "loo-sampled" in fedrec.list_protocols()


def test_recommend_excludes_training_items_and_orders_by_score():
    run = fedrec.run("mf", dataset="synthetic:150x300", rounds=2)
    u = run.user_index(5)
    got = run.recommend(5, k=20)
    idx = [int(np.flatnonzero(run.split.data.item_ids == i)[0]) for i in got]
    seen = set(run.split.train[u].indices)
    assert not seen & set(idx)
    scores = run.scores(np.array([u]))[0]
    assert list(scores[idx]) == sorted(scores[idx], reverse=True)
    unseen = np.setdiff1d(np.arange(run.split.n_items), list(seen))
    assert scores[idx[-1]] >= np.sort(scores[unseen])[-20]


@pytest.mark.parametrize("algorithm", ["fedmf", "mf"])
def test_scores_take_indices_and_refuse_anything_else(algorithm):
    """Indices out of range (-1 used to score the last user), floats, raw ids and a flat item
    list are one clear error, federated or centralised."""
    run = fedrec.run(algorithm, dataset="synthetic:40x200", rounds=1)
    items = np.array([[0, 5, 7], [1, 2, 3]])
    scores = run.scores([3, 4], items)
    assert scores.shape == (2, 3) and np.allclose(scores[0], run.scores([3])[0][[0, 5, 7]], atol=1e-5)
    for users, items, says in (([-1], None, "users: index -1 is outside 0..39"), ([40], None, "index 40"),
                               ([0.9], None, "whole-number indices"), (["a"], None, "Run.user_index"),
                               ([[0]], None, "a list of user indices"), ([0], [0, 1], "a \\(users, C\\) matrix"),
                               ([0], [[-2]], "items: index -2"), ([0, 1], [[0]], "a row per user"),
                               ([0, 1], [[1, 2], [3]], "rows of unequal length")):
        with pytest.raises(FedrecError, match=says):
            run.scores(users, items)
    for k in (1.5, None, "3", float("nan"), True):
        with pytest.raises(FedrecError, match="k must be a whole number"):
            run.recommend(0, k)
    assert len(run.recommend(0, np.int64(3))) == 3
    for path in (None, 5):
        with pytest.raises(FedrecError, match="path must be"):
            run.save(path)
        with pytest.raises(FedrecError, match="path must be"):
            fedrec.load(path)


@pytest.mark.parametrize(("options", "says"), [
    ({"curriculm": "sin"}, "unknown option curriculm of 'fedrap'; known: .*curriculum"),
    ({"lam": "abc"}, "option lam of 'fedrap' expects number"),
    ({"dim": 0}, "dim must be >= 1"),
])
def test_bad_options_are_one_clear_error(options, says):
    with pytest.raises(FedrecError, match=says):
        fedrec.run("fedrap", dataset="synthetic:100x200", rounds=1, options=options)


def _cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        main(args)
    return int(done.value.code or 0)


def test_cli_set_parses_into_typed_options_and_refuses_unknown_keys(tmp_path, capsys):
    assert _cli(["run", "fedrap", "-d", "synthetic:100x200", "--rounds", "1", "-q",
                 "--set", "curriculm=sin", "-o", str(tmp_path / "r.json")]) == 2
    assert "unknown option curriculm" in capsys.readouterr().err


def test_cli_saves_and_recommends(tmp_path, capsys):
    saved = tmp_path / "m.fedrec"
    assert _cli(["run", "fedmf", "-d", "synthetic:150x300", "--rounds", "2", "-q", "--save", str(saved),
                 "-o", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    assert _cli(["recommend", str(saved), "--user", "4", "-k", "5"]) == 0
    line = capsys.readouterr().out.strip()
    user, *items = line.split("\t")
    assert user == "4"
    assert items == [str(i) for i in fedrec.load(saved).recommend(4, 5)]
    assert _cli(["recommend", str(saved), "--user", "no-such-user"]) == 2
    capsys.readouterr()
    # every id is checked first: a script reads all the lines or none
    assert _cli(["recommend", str(saved), "--user", "4", "--user", "5", "--user", "no-such-user"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "user 'no-such-user' is not in this run's data" in printed.err
    # the file holds its training data: a typed --data-dir is said to be unread, FEDREC_DATA is not
    assert _cli(["recommend", str(saved), "--user", "4", "-k", "5", "--data-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert "holds its own training data; --data-dir is not read" in printed.err and printed.out == line + "\n"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEDREC_DATA", str(tmp_path))
        assert _cli(["recommend", str(saved), "--user", "4", "-k", "5"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"rounds": "2"}, "rounds must be"),
    ({"seed": "a"}, "seed must be int"),
    ({"options": ["dim"]}, "options must be a dict"),
    ({"nosuch": 3}, "unknown data option nosuch; known: columns, max_users"),
    ({"model": {"dim": 4}}, "pass it as run\\(\\)'s options argument"),
    ({"engine": {"lr": "abc"}}, "option lr \\(engine option\\) expects number"),
    ({"rounds": None, "engine": {"rounds": "2"}}, "rounds must be int"),
    ({"rounds": None, "engine": {"rounds": 2.5}}, "rounds must be int"),
    ({"on_round": 5}, "on_round must be a function"),
    ({"out": 5}, "out must be"),
    ({"options": {None: 1}}, "options: its keys are option names"),
    ({"engine": {1: 1}}, "engine: its keys are option names"),
])
def test_bad_arguments_are_one_clear_error(kwargs, says):
    with pytest.raises(FedrecError, match=says):
        fedrec.run("fedmf", **{"dataset": "synthetic:100x200", "rounds": 1, **kwargs})


def test_config_holds_the_parsed_options():
    run = fedrec.run("fedmf", dataset="synthetic:150x300", rounds=1, options={"dim": "8"})
    assert run.config.model == {"dim": 8, "dual": False, "clip": 0.0} == run.result.config["model"]


def test_load_refuses_other_data_and_broken_files(tmp_path):
    from fedrec import tensorfile
    from fedrec.api import FORMAT, KIND

    path = fedrec.run("fedmf", dataset="synthetic:150x300", rounds=1).save(tmp_path / "r.fedrec")
    blob = tensorfile.load(path, KIND, FORMAT)
    edited = dict(blob, portable={**blob["portable"], "item_ids": blob["portable"]["item_ids"][::-1].copy()})
    tensorfile.save(tmp_path / "edited.fedrec", edited, KIND, FORMAT)  # ids under a model not their own
    with pytest.raises(FedrecError, match="not the ones the run was trained on"):
        fedrec.load(tmp_path / "edited.fedrec")
    older = {k: v for k, v in blob.items() if k != "portable"}  # the layout that re-read its data
    older["config"] = dict(blob["config"], dataset="synthetic:160x300")  # another data set, same model
    tensorfile.save(tmp_path / "other.fedrec", older, KIND, FORMAT - 1)
    with pytest.raises(FedrecError, match="not the one the run was trained on"):
        fedrec.load(tmp_path / "other.fedrec")
    tensorfile.save(tmp_path / "same.fedrec", dict(older, config=blob["config"]), KIND, FORMAT - 1)
    assert fedrec.load(tmp_path / "same.fedrec").recommend(3, 5) == fedrec.load(path).recommend(3, 5)
    del blob["state"]
    tensorfile.save(tmp_path / "broken.fedrec", blob, KIND, FORMAT)
    with pytest.raises(FedrecError, match="not a fedrec run file"):
        fedrec.load(tmp_path / "broken.fedrec")


def test_errors_keep_their_brackets(capsys):
    assert _cli(["run", "mf", "-d", "synthetic:100x200", "--set", "[x]=1"]) == 2
    assert "unknown option [x] of 'mf'" in capsys.readouterr().err


def test_algorithms_lists_names_and_shows_one_algorithms_options(capsys):
    assert _cli(["algorithms"]) == 0
    assert "fedavgm" in capsys.readouterr().out
    assert _cli(["algorithms", "fedavgm"]) == 0
    out = capsys.readouterr().out
    assert "server_lr" in out and "momentum" in out and "--lr" in out


def test_recommend_notes_a_user_that_no_interaction_trained(tmp_path, capsys):
    """Under the global temporal split a user whose every interaction is after the cut-off has
    no training item: its list is printed with a note on stderr saying so."""
    rows = ["user,item,ts"] + [f"u{u},i{(7 * u + j) % 40},{1000 * j + u}" for u in range(30) for j in range(8)]
    rows += [f"late,i{j},{10_000 + j}" for j in range(8)]
    data = tmp_path / "t.csv"
    data.write_text("\n".join(rows) + "\n")
    saved = tmp_path / "m.fedrec"
    assert _cli(["run", "fedmf", "-d", str(data), "--columns", "user,item,,ts", "-p", "time-full", "--rounds", "1",
                 "-q", "--save", str(saved), "-o", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    assert _cli(["recommend", str(saved), "--user", "late", "--user", "u3", "-k", "3"]) == 0
    printed = capsys.readouterr()
    assert [line.split("\t")[0] for line in printed.out.splitlines()] == ["late", "u3"]
    assert "note: user 'late' has no training interaction" in printed.err and "'u3'" not in printed.err
