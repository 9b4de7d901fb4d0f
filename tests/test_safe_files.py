"""Nothing a file sends runs code: run files, checkpoints and node state are `fedrec.tensorfile`
files (safetensors + a JSON tree), and a crafted, truncated, foreign, damaged or older-format
file ends in one line and exit 2 with nothing in it run."""

from __future__ import annotations

import ast
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedrec
from fedrec import tensorfile
from fedrec.api import FORMAT, KIND
from fedrec.cli import main
from fedrec.core import checkpoint
from fedrec.errors import FedrecError
from fedrec.flower.roles import pack_state, unpack_state

PACKAGE = Path(fedrec.__file__).parent
SYN = "synthetic:150x300"


class Plant:
    """A pickle that creates ``path`` when unpickled: what a crafted file would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.path), "w")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.err + captured.out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """A trained FedMF run saved to a file, and user 3's top ten."""
    run = fedrec.run("fedmf", dataset=SYN, rounds=2)
    path = run.save(tmp_path_factory.mktemp("runs") / "r.fedrec")
    return path, run.recommend("3")


def test_every_kind_of_value_a_state_holds_comes_back_as_it_was() -> None:
    param = torch.nn.Parameter(torch.randn(3, 2))
    tree = {
        "f32": torch.randn(4, 3), "bf16": torch.randn(5).to(torch.bfloat16), "scalar": torch.tensor(7),
        "empty": torch.zeros(0, 4, dtype=torch.int64), "strided": torch.arange(12.0).reshape(3, 4)[:, ::2],
        "expanded": torch.zeros(3, 1).expand(3, 4), "bool": torch.tensor([True, False]),
        "param": param, "grad": torch.ones(2, requires_grad=True),
        "arrays": [np.arange(5, dtype=np.int64), np.zeros((2, 2), np.float32), np.array([1, 2], np.uint16),
                   np.array([1.5], ">f8")],
        "np_scalars": (np.float64(0.25), np.int32(-3), np.bool_(True)),
        "floats": [math.nan, math.inf, -math.inf, 1e-300, 0.1], "ints": [0, -1, 2**70], "none": None,
        "text": "ümlaut $tensor", "tuple": (1, (2, "x")), "int_keys": {0: {"step": torch.tensor(3.0)}, 1: "b"},
        "dollar": {"$tensor": "not a tag", "plain": 1}, "nested": {"a": [{"b": ()}]},
    }
    back = tensorfile.loads(tensorfile.dumps(tree, "test", 1), "test", 1)
    assert set(back) == set(tree)
    for key in ("f32", "bf16", "scalar", "empty", "strided", "expanded", "bool", "grad"):
        assert back[key].dtype == tree[key].dtype and torch.equal(back[key], tree[key]), key
    assert isinstance(back["param"], torch.nn.Parameter) and back["param"].requires_grad
    assert torch.equal(back["param"], param) and back["grad"].requires_grad
    assert not back["f32"].requires_grad
    for a, b in zip(back["arrays"], tree["arrays"], strict=True):
        assert isinstance(a, np.ndarray) and a.dtype.kind == b.dtype.kind and np.array_equal(a, b)
    assert [type(v) for v in back["np_scalars"]] == [np.float64, np.int32, np.bool_]
    assert back["np_scalars"] == tree["np_scalars"]
    assert math.isnan(back["floats"][0]) and back["floats"][1:] == tree["floats"][1:]
    assert back["ints"] == tree["ints"] and back["text"] == tree["text"] and back["none"] is None
    assert back["tuple"] == (1, (2, "x")) and isinstance(back["tuple"][1], tuple)
    assert list(back["int_keys"]) == [0, 1] and torch.equal(back["int_keys"][0]["step"], torch.tensor(3.0))
    assert back["dollar"] == tree["dollar"] and back["nested"] == tree["nested"]


def test_a_tensor_met_twice_is_stored_once_and_views_of_one_storage_apart() -> None:
    t = torch.randn(4, 3)
    back = tensorfile.loads(tensorfile.dumps({"a": t, "b": t, "c": t[1:], "d": [t]}, "test", 1), "test", 1)
    assert back["a"] is back["b"] is back["d"][0] and torch.equal(back["a"], t)
    assert torch.equal(back["c"], t[1:]) and back["c"].untyped_storage().data_ptr() != back["a"].untyped_storage().data_ptr()
    on_meta = tensorfile.loads(tensorfile.dumps({"a": t, "b": t}, "test", 1), "test", 1, device="meta")
    assert on_meta["a"] is on_meta["b"]


def test_many_arrays_each_keep_their_own_values() -> None:
    """Temporary tensors made for arrays come and go during encoding; each array keeps its
    own name (a name keyed on a freed object's id would hand one array another's data)."""
    tree = {f"c{i}": {"owner": np.arange(3) + i, "rows": np.ones((3, 2), np.float32) * i} for i in range(40)}
    tree["list"] = [np.full(2, i) for i in range(60)]
    tree["zero_d"] = np.array(3.5)
    shared = np.arange(4)
    tree["twice"] = [shared, shared]
    back = tensorfile.loads(tensorfile.dumps(tree, "test", 1), "test", 1)
    for i in range(40):
        assert np.array_equal(back[f"c{i}"]["owner"], np.arange(3) + i)
        assert back[f"c{i}"]["rows"].dtype == np.float32 and np.all(back[f"c{i}"]["rows"] == i)
    assert [int(a[0]) for a in back["list"]] == list(range(60))
    assert back["zero_d"].shape == () and float(back["zero_d"]) == 3.5
    assert back["twice"][0] is back["twice"][1]


def test_a_crafted_tree_that_passes_the_checksum_is_still_one_error() -> None:
    """Well-formed files (checksum recomputed) whose trees no `encode` would write."""
    from safetensors.torch import save as raw_save

    def crafted(text: str, tensors: dict[str, torch.Tensor]) -> bytes:
        meta = {"fedrec": tensorfile.CONTAINER, "kind": "test", "version": "1", "tree": text,
                "sha256": tensorfile.checksum("test", 1, text, tensors)}
        return raw_save(tensors, metadata=meta)

    ints = {"t0": torch.arange(3)}
    for text, tensors in (("[" * 100_000 + "]" * 100_000, {}), ('{"$tensor":"t0","grad":true}', ints),
                          ('{"$scalar":99999999999,"dtype":"int8"}', {}), ('{"$float":"1e5"}', {}),
                          ('{"$array":"t0","dtype":"<f4"}', ints)):
        with pytest.raises(FedrecError, match="not a fedrec test"):
            tensorfile.loads(crafted(text, tensors), "test", 1)


def test_tensors_go_to_the_device_asked_for_and_arrays_stay_on_the_host() -> None:
    raw = tensorfile.dumps({"t": torch.ones(2), "a": np.arange(3)}, "test", 1)
    back = tensorfile.loads(raw, "test", 1, device="meta")  # a device every build has
    assert back["t"].device.type == "meta" and isinstance(back["a"], np.ndarray)


def test_what_a_file_cannot_hold_is_refused_when_written() -> None:
    for bad in ({"a": {1, 2}}, {"a": np.array(["x"], dtype=object)}, {"a": object()},
                {"a": torch.zeros(3).to_sparse()}):
        with pytest.raises(TypeError, match="cannot store"):
            tensorfile.dumps(bad, "test", 1)


def test_the_tree_names_only_tensors_the_file_holds() -> None:
    t = {"t0": torch.zeros(2)}
    assert torch.equal(tensorfile.decode('{"a":{"$tensor":"t0"}}', t)["a"], torch.zeros(2))
    for text, why in (('{"a":{"$tensor":"t1"}}', "lacks"), ('{"a":{"$tensor":["t0"]}}', "lacks"),
                      ('{"a":1}', "not named"), ('{"$call":"os.system"}', "unknown tag"),
                      ('{"$tensor":"t0","$tuple":[]}', "unknown tag"), ('[NaN]', "not JSON"),
                      ('{"$array":"t0","dtype":"O"}', "not allowed"), ('{"$map":[[[1],2]]}', "unhashable")):
        with pytest.raises((ValueError, TypeError), match=why):
            tensorfile.decode(text, dict(t))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_crafted_pickle_runs_nothing_on_any_read_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        how: str) -> None:
    marker = tmp_path / "planted"
    evil = tmp_path / "evil.fedrec"
    blob = {"format": "fedrec-run/1", "config": {}, "result": {}, "state": Plant(marker)}
    if how == "torch.save":
        torch.save(blob, evil)
    else:
        evil.write_bytes(pickle.dumps(blob, protocol=4))
    code, said = _cli(["recommend", str(evil), "--user", "1"], capsys)
    assert code == 2 and said.count("\n") == 1 and "a pickle" in said and "fedrec convert" in said
    with pytest.raises(FedrecError, match="a pickle"):
        fedrec.load(evil)
    with pytest.raises(FedrecError, match="a pickle"):
        checkpoint.peek(evil)
    with pytest.raises(FedrecError, match="a pickle"):
        unpack_state(evil.read_bytes())
    code, said = _cli(["convert", str(evil), "-o", str(tmp_path / "converted.fedrec")], capsys)
    # torch.save's file is refused at its global; a plain pickle is not a file torch.save writes
    says = "refused" if how == "torch.save" else "not written by torch.save"
    assert code == 2 and says in said and not (tmp_path / "converted.fedrec").exists()
    if how == "torch.save":  # the refusal names what the pickle asked for
        assert "builtins.open" in said or "io.open" in said, said
    # a run resumed from a crafted checkpoint at its checkpoint's path
    out = tmp_path / "run.json"
    evil.rename(out.with_suffix(".ckpt"))
    code, said = _cli(["run", "fedmf", "-d", SYN, "--rounds", "2", "-q", "--out", str(out),
                       "--checkpoint-every", "1", "--resume"], capsys)
    assert code == 2 and "a pickle" in said and not out.exists()
    assert not marker.exists()
    # the control: the same file, unpickled as older fedrec did, does plant the file
    crafted = out.with_suffix(".ckpt")
    if how == "torch.save":
        torch.load(crafted, weights_only=False)
    else:
        pickle.loads(crafted.read_bytes())
    assert marker.exists()


def test_truncated_foreign_damaged_and_mislabelled_files_are_one_line(
        saved: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import save_file

    path, _ = saved
    raw = path.read_bytes()
    cases: dict[str, tuple[bytes, str]] = {
        "truncated": (raw[: len(raw) // 2], "not a fedrec run file"),
        "header-only": (raw[:5], "not a fedrec run file"),
        "empty": (b"", "not a fedrec run file"),
        "text": (b"user,item\n1,2\n", "not a fedrec run file"),
        "damaged": (raw[:-9] + bytes([raw[-9] ^ 0xFF]) + raw[-8:], "damaged run file"),
    }
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, foreign)
    cases["foreign"] = (foreign.read_bytes(), "a safetensors file of another program")
    ckpt = tmp_path / "c.ckpt"
    tensorfile.save(ckpt, {"round": 1}, checkpoint.KIND, checkpoint.FORMAT)
    cases["a checkpoint"] = (ckpt.read_bytes(), "a fedrec 'checkpoint' file, not a run file")
    newer = tmp_path / "newer"
    tensorfile.save(newer, tensorfile.load(path, KIND, FORMAT), KIND, FORMAT + 1)
    cases["newer"] = (newer.read_bytes(), f"layout version {FORMAT + 1}; this fedrec reads version {FORMAT - 1} or {FORMAT}")
    for name, (content, says) in cases.items():
        bad = tmp_path / f"{name}.fedrec"
        bad.write_bytes(content)
        code, said = _cli(["recommend", str(bad), "--user", "3"], capsys)
        assert code == 2 and says in said and said.count("\n") == 1, (name, said)
    code, said = _cli(["recommend", str(tmp_path / "missing.fedrec"), "--user", "3"], capsys)
    assert code == 2 and "no such run file" in said


def _mutate(blob: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``blob`` with ``path`` (dotted) set to ``value`` (``...``: removed)."""
    import copy

    out = copy.deepcopy(blob)
    *head, last = path.split(".")
    node = out
    for key in head:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out


RUN_FILE_CRAFTS = [("config.algorithm", ["x"]), ("config.dataset", 5), ("config.seed", "abc"),
                   ("config.federated.lr", "x"), ("config.model", [1]), ("config.federated", 3),
                   ("result.history", ...), ("result.history", 5), ("result.history", [{"bogus": 1}]),
                   ("state.server.items", "text"), ("state.server.items", None), ("result", []),
                   ("state.server.items", torch.zeros(3, 2)), ("state.clients.private.user", torch.zeros(7, 32)),
                   # private state the algorithm scores with, missing: another algorithm named, a key deleted
                   ("config.algorithm", "pfedrec"), ("state.clients.private.user", ...),
                   ("config.federated.aggregation", "nope"), ("config.protocol", "bogus")]


def test_a_well_formed_run_file_with_crafted_contents_is_one_line(
        saved: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files with a valid checksum whose contents no fedrec wrote: every one is refused in one
    line naming the file, before anything is scored."""
    path, _ = saved
    blob = tensorfile.load(path, KIND, FORMAT)
    assert "items" in blob["state"]["server"] and "user" in blob["state"]["clients"]["private"]
    for i, (where, value) in enumerate(RUN_FILE_CRAFTS):
        bad = tmp_path / f"craft{i}.fedrec"
        tensorfile.save(bad, _mutate(blob, where, value), KIND, FORMAT)
        code, said = _cli(["recommend", str(bad), "--user", "3"], capsys)
        assert code == 2 and said.startswith("error:") and said.count("\n") == 1, (where, value, said)
        assert str(bad) in said, (where, value, said)


def test_a_file_an_older_fedrec_wrote_without_fields_added_since_still_loads(
        saved: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config field or an empty server table added after a file was written (an older fedrec's
    file lacks them) is filled in by the loader: the file recommends as before. Only a missing
    key that holds tensors the model scores with is refused (the crafts above)."""
    path, top = saved
    blob = tensorfile.load(path, KIND, FORMAT)
    assert "attacker_norm" in blob["config"]["federated"] and "objective_memo" in blob["state"]["server"]
    old = _mutate(_mutate(blob, "config.federated.attacker_norm", ...), "state.server.objective_memo", ...)
    older = tmp_path / "older.fedrec"
    tensorfile.save(older, old, KIND, FORMAT)
    code, said = _cli(["recommend", str(older), "--user", "3"], capsys)
    assert code == 0 and said.splitlines()[0].split("\t")[1:] == [str(i) for i in top], said


CHECKPOINT_CRAFTS = [("round", "x"), ("round", [1]), ("round", -1), ("history", 5), ("history", [{"bogus": 1}]),
                     ("best_round", ...), ("valid_at_best", ...), ("valid_at_best", [1]), ("resumed_at", 5), ("resumed_at", ["x"]), ("seconds", "x"),
                     ("state.server", [1]), ("state.server.items", "text"), ("state.server.items", torch.zeros(2, 2)),
                     ("best_state", {"server": {"items": torch.zeros(1)}})]


def test_a_well_formed_checkpoint_with_crafted_contents_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    args = ["run", "fedmf", "-d", SYN, "-q", "--out", str(out), "--checkpoint-every", "1"]
    assert _cli([*args, "--rounds", "2"], capsys)[0] == 0
    ckpt = out.with_suffix(".ckpt")
    blob = checkpoint.read(ckpt)
    for where, value in CHECKPOINT_CRAFTS:
        tensorfile.save(ckpt, _mutate(blob, where, value), checkpoint.KIND, checkpoint.FORMAT)
        code, said = _cli([*args, "--rounds", "3", "--resume", "--overwrite"], capsys)
        assert code == 2 and "error:" in said and "checkpoint" in said, (where, value, said)
    tensorfile.save(ckpt, blob, checkpoint.KIND, checkpoint.FORMAT)  # the control: the real one resumes
    assert _cli([*args, "--rounds", "3", "--resume"], capsys)[0] == 0


def test_a_damaged_node_state_or_checkpoint_is_refused(tmp_path: Path) -> None:
    raw = pack_state({"items": torch.randn(4, 3), "seen": np.arange(3)})
    assert torch.equal(unpack_state(raw)["items"], tensorfile.loads(raw, "node-state", 1)["items"])
    flipped = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(FedrecError, match="damaged node state"):
        unpack_state(flipped)
    with pytest.raises(FedrecError, match="not a fedrec node state"):
        unpack_state(raw[:40])
    bad = tmp_path / "c.ckpt"
    bad.write_bytes(b"\x80\x04garbage")
    with pytest.raises(FedrecError, match="a pickle"):
        checkpoint.peek(bad)


def test_an_older_run_file_converts_once_and_recommends_the_same(
        saved: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run file laid out as older fedrec pickled it (``torch.save`` of its dict with
    ``format: fedrec-run/1``) is refused by every reader, then converted by `fedrec convert`."""
    path, top = saved
    old = tmp_path / "old.fedrec"
    torch.save({"format": "fedrec-run/1", **tensorfile.load(path, KIND, FORMAT)}, old)
    code, said = _cli(["recommend", str(old), "--user", "3"], capsys)
    assert code == 2 and "fedrec convert" in said
    code, said = _cli(["convert", str(old)], capsys)
    assert code == 0 and f"wrote run file {old}" in said
    code, said = _cli(["recommend", str(old), "--user", "3"], capsys)
    assert code == 0 and said.splitlines()[0].split("\t")[1:] == [str(i) for i in top]
    code, said = _cli(["convert", str(old)], capsys)
    assert code == 2 and "already in the safe format" in said


def test_convert_refuses_what_it_cannot_convert_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pickle

    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=4))  # not what torch.save writes: no warning first
    code, said = _cli(["convert", str(plain)], capsys)
    assert code == 2 and said.strip().splitlines() == [
        f"error: {plain}: cannot be read (damaged, or not written by torch.save: UnpicklingError)"]
    code, said = _cli(["convert", str(tmp_path)], capsys)
    assert code == 2 and f"{tmp_path} is a folder; give the run file or checkpoint" in said
    hollow = tmp_path / "hollow.fedrec"  # the right keys, none of what a run file holds in them
    torch.save({"format": "fedrec-run/1", "config": {}, "result": {}, "state": {}}, hollow)
    code, said = _cli(["convert", str(hollow)], capsys)
    assert code == 2 and "not a run file of an older fedrec (no data)" in said
    assert hollow.read_bytes()[:2] == b"PK"  # left as it was (torch.save's zip)
    code, said = _cli(["convert", str(hollow), "-o", str(plain)], capsys)
    assert code == 2 and "exists" in said and "leave out --out" in said and "--overwrite" not in said


def test_a_file_pickled_under_numpy_1_converts(tmp_path: Path) -> None:
    """NumPy 1 named its array builder ``numpy.core.multiarray``; such files convert too."""
    import io
    import zipfile

    from fedrec.legacy import read_legacy

    blob = {"format": "fedrec-run/1", "config": {}, "result": {},
            "state": {"ids": np.arange(3), "s": np.float64(2.5), "t": torch.ones(2)}}
    torch.save(blob, tmp_path / "numpy2.fedrec")
    buf = io.BytesIO()
    with zipfile.ZipFile(tmp_path / "numpy2.fedrec") as zin, zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            zout.writestr(info.filename, data)
    (tmp_path / "numpy1.fedrec").write_bytes(buf.getvalue())
    state = read_legacy(tmp_path / "numpy1.fedrec")["state"]
    assert np.array_equal(state["ids"], np.arange(3)) and state["s"] == 2.5


def test_an_older_checkpoint_converts_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    args = ["run", "fedmf", "-d", SYN, "-q", "--out", str(out), "--checkpoint-every", "1"]
    assert _cli([*args, "--rounds", "2"], capsys)[0] == 0
    ckpt = out.with_suffix(".ckpt")
    torch.save({"format": 2, **checkpoint.read(ckpt)}, ckpt)
    code, said = _cli([*args, "--rounds", "3", "--resume"], capsys)
    assert code == 2 and "fedrec convert" in said
    assert _cli(["convert", str(ckpt)], capsys)[0] == 0
    assert _cli([*args, "--rounds", "3", "--resume"], capsys)[0] == 0
    assert checkpoint.peek(ckpt)["round"] == 3


# --- no read path can run code: checked on the package's syntax, not its text --------------

#: modules whose loaders run code from their input
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def _unsafe_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {n}" for n in names if n.split(".")[0] in UNSAFE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        kw = {k.arg: k.value for k in node.keywords}
        if isinstance(func, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
            found.append(f"{name}()")
        if name == "load" and owner == "torch":
            safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if not safe:
                found.append("torch.load without weights_only=True")
        if name == "load" and owner in ("np", "numpy"):
            if not (isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is False):
                found.append("np.load without allow_pickle=False")
        if owner == "yaml" and name in ("load", "unsafe_load", "full_load", "load_all"):
            found.append(f"yaml.{name}")
        if name in ("read_pickle", "to_pickle"):
            found.append(name)
        if name == "allow_pickle" or ("allow_pickle" in kw and getattr(kw["allow_pickle"], "value", None) is True):
            found.append("allow_pickle=True")
    return found


def test_no_read_path_in_the_package_can_run_code() -> None:
    """The package and the benchmark scripts (the tests make crafted pickles on purpose)."""
    files = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "benchmarks").rglob("*.py")]
    found = {str(p.relative_to(PACKAGE.parent)): _unsafe_calls(ast.parse(p.read_text())) for p in sorted(files)}
    assert len(found) > 100  # the scan saw the tree
    assert {k: v for k, v in found.items() if v} == {}
    # the scan finds what it looks for
    probe = ("import pickle\nfrom marshal import loads\neval('1')\ntorch.load(p)\n"
             "torch.load(p, weights_only=False)\nnp.load(p)\nyaml.load(s)\npd.read_pickle(p)\n")
    assert len(_unsafe_calls(ast.parse(probe))) == 8
    assert _unsafe_calls(ast.parse("torch.load(p, weights_only=True)\nmodel.eval()\n")) == []


def test_tune_journals_are_json_lines_that_optuna_never_unpickles(tmp_path: Path) -> None:
    """Optuna's JournalStorage unpickles snapshots, but only from a backend that keeps them
    (its Redis one); the file backend `fedrec tune --journal` uses keeps none."""
    pytest.importorskip("optuna")
    from optuna.storages.journal import JournalFileBackend
    from optuna.storages.journal._base import BaseJournalSnapshot

    from fedrec.tune import _journal_storage

    storage = _journal_storage(tmp_path / "journal.log")
    assert isinstance(storage._backend, JournalFileBackend)
    assert not isinstance(storage._backend, BaseJournalSnapshot)


def test_a_results_file_never_records_a_secret_of_its_command_line() -> None:
    from fedrec.results import redacted

    argv = ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:9091", "--token", "s3cr3t",
            "--run-once", "--auth-secret=abc", "--tokens-file", "f", "--k", "v"]
    assert redacted(argv) == ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:9091", "--token",
                              "<redacted>", "--run-once", "--auth-secret=<redacted>", "--tokens-file",
                              "<redacted>", "--k", "v"]
