"""Data set registry: local look-up order, cache, verified downloads, mirror, and the CLI."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from typer.testing import CliRunner

from fedrec.cli import data as cli
from fedrec.data import fetch, parsers, registry
from fedrec.errors import FedrecError, UnknownNameError

FIXTURES = Path(__file__).parent / "fixtures"
U_DATA = FIXTURES / "ml-100k" / "u.data"
INTER = FIXTURES / "ml-100k" / "ml-100k.inter"
WHEEL_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
REAL_PIP_DOWNLOAD = fetch.pip_download  # the autouse fixture replaces it with a failure


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty cache, no FEDREC_DATA, and every download fails fast unless a test says otherwise."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDREC_CACHE", str(cache))
    monkeypatch.delenv("FEDREC_DATA", raising=False)

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise requests.exceptions.ConnectionError("NameResolutionError: offline in tests")

    def no_pip(requirement: str, dest: Path) -> Path:
        raise fetch.SourceFailed("pip download failed: offline in tests")

    monkeypatch.setattr(fetch, "_downloader", lambda: no_network)
    monkeypatch.setattr(fetch, "pip_download", no_pip)
    return cache


def _copy(src: Path, folder: Path, name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(src, folder / (name or src.name)))


# --- local look-ups --------------------------------------------------------------------------


def test_locate_and_load_from_data_dir(tmp_path: Path) -> None:
    path = _copy(U_DATA, tmp_path / "data")
    assert registry.locate("ml-100k", tmp_path / "data") == path
    data = registry.load("ml-100k", tmp_path / "data")
    assert data.name == "ml-100k" and len(data) == 5
    assert data.user_ids.tolist() == [196, 186, 22, 244]


def test_a_data_sets_content_digest_is_the_same_in_any_format_and_tells_other_events_apart(tmp_path: Path) -> None:
    """GroupLens' u.data and RecBole's atomic copy hold the same events in the same order: one
    content digest, though their bytes (the file sha256) differ. Other values, other events, or
    the same events in another row order (PFedRec's copy, ordered by user: ties in time are
    broken by row order) give another."""
    from dataclasses import replace

    from fedrec.data.interactions import Interactions

    u_data, inter = (registry.load("ml-100k", _copy(f, tmp_path / f.name).parent, file=f.name) for f in (U_DATA, INTER))
    assert u_data.source["sha256"] != inter.source["sha256"]
    assert u_data.source["content"] == inter.source["content"] == u_data.content_digest()
    # results files keep the digest, and a bench compares it with the data's now: its scheme must
    # not change, or every recorded run would read as a run of other data and be run again
    assert u_data.source["content"] == "0dc311468b6e051ed40205cc401230ec90dc8644fc300a1253adce06e4f946ab"
    reordered = registry.load("ml-100k", _copy(FIXTURES / "ml-100k" / "ratings.dat", tmp_path / "csv").parent,
                              file="ratings.dat")
    assert reordered.source["content"] != u_data.source["content"]
    lines = U_DATA.read_text().splitlines()
    for i, changed in enumerate((lines[0].replace("\t3\t", "\t4\t"), lines[0].replace("881250949", "881250950"),
                                 lines[0].replace("196\t242", "196\t243"))):
        (tmp_path / f"edit{i}").mkdir()
        (tmp_path / f"edit{i}" / "u.data").write_text("\n".join([changed, *lines[1:]]) + "\n")
        assert registry.load("ml-100k", tmp_path / f"edit{i}").source["content"] != u_data.source["content"], changed
    # the numbering a parser gives the ids, and whether it reads them as numbers, do not count
    events = np.array([line.split("\t") for line in lines])
    as_text = Interactions.from_raw(events[:, 0], events[:, 1], events[:, 2].astype(float), events[:, 3].astype(int))
    assert as_text.content_digest() == u_data.content_digest()
    flip = np.array([1, 0, *range(2, u_data.n_users)])  # users 0 and 1 numbered the other way round
    renumbered = replace(u_data, users=flip[u_data.users], user_ids=u_data.user_ids[flip])
    assert renumbered.content_digest() == u_data.content_digest()
    assert replace(u_data, implicit=True).content_digest() != u_data.content_digest()


def test_the_content_at_hand_is_hashed_not_parsed_when_its_bytes_are_known(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached run is checked against the events at hand: a copy whose bytes a result recorded
    (its sha256) holds the events that result recorded, so it is not parsed again; other bytes
    are; no copy at hand, generated data, or an unreadable file give None; a registered or given
    file gives its own digest."""
    from fedrec.experiment import content_at_hand
    from fedrec.results import known_contents, read_content

    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
    data = _copy(U_DATA, tmp_path / "d" / "u.data").parent
    loaded = registry.load("ml-100k", data)
    assert content_at_hand("ml-100k", str(data)) == loaded.source["content"]
    known = known_contents([{"data": {"source": loaded.source}}, {"data": []}, [1, 2], {}])
    assert known == {loaded.source["sha256"]: loaded.source["content"]}
    parsed: list[str] = []
    real_load = registry.load
    monkeypatch.setattr(registry, "load", lambda *a, **k: parsed.append(a[0]) or real_load(*a, **k))
    assert content_at_hand("ml-100k", str(data), {loaded.source["sha256"]: "recorded"}) == "recorded"
    assert parsed == []  # hashed only
    assert content_at_hand("ml-100k", str(data), {"0" * 64: "recorded"}) == loaded.source["content"]
    assert parsed == ["ml-100k"]
    assert content_at_hand("ml-100k", str(tmp_path / "nowhere")) is None
    assert content_at_hand("synthetic:30x40") is None
    from fedrec.data import user_sets

    own = tmp_path / "mine.csv"
    own.write_text("user,item,rating\n1,2,5\n2,3,4\n")
    user_sets.add("mine", own, "user,item,rating")
    mine = content_at_hand("mine")
    assert mine is not None and mine != loaded.source["content"]
    own.write_text("user,item,rating\n1,2,5\n2,3,5\n")  # edited since it was registered: a run refuses it
    assert content_at_hand("mine") is None
    assert read_content({"data": {"source": "a file"}}) is None and read_content(None) is None


def test_a_set_aside_file_is_found_whatever_its_name_holds(tmp_path: Path) -> None:
    """Run files are named by their options, which may hold glob characters ([, ], *): their
    set-aside copies are found by the name as written, and given back to it."""
    import json

    from fedrec.results import set_aside_files, set_aside_other_events

    path = tmp_path / "poison-fedmf-items=[1, 2]-none-r1-s0.json"
    path.write_text(json.dumps({"data": {"source": {"content": "a" * 64}}}))
    (tmp_path / "poison-fedmf-items=1-none-r1-s0.other-data-bbbbbbbbbbbb.json").write_text("{}")  # another run's
    assert set_aside_other_events(path, "b" * 64) == ("a" * 64, False) and not path.exists()
    assert [p.name for p in set_aside_files(path)] == [f"{path.stem}.other-data-{'a' * 12}.json"]
    assert set_aside_other_events(path, "a" * 64) == (None, True) and path.exists()
    assert set_aside_files(path) == []


def test_fedrec_data_env_one_level_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "datasets"
    path = _copy(INTER, root / "ml-100k")
    _copy(FIXTURES / "ml-100k" / "ratings.dat", root / "ml-100k")
    monkeypatch.setenv("FEDREC_DATA", str(root))
    found = registry.resolve("ml-100k")
    assert found.path == path and found.raw.parser is parsers.parse_atomic
    assert "data dir" in found.origin
    by_name = registry.load("ml-100k", file="ratings.dat")
    assert by_name.user_ids.tolist() == [22, 186, 196, 244]  # PFedRec order


def test_explicit_data_dir_beats_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy(INTER, tmp_path / "env")
    chosen = _copy(U_DATA, tmp_path / "arg")
    monkeypatch.setenv("FEDREC_DATA", str(tmp_path / "env"))
    assert registry.locate("ml-100k", tmp_path / "arg") == chosen


def test_marker_rejects_other_data_sets_file(tmp_path: Path) -> None:
    _copy(FIXTURES / "ml-100k" / "ratings.dat", tmp_path / "d")  # comma CSV, not ML-1M's '::'
    with pytest.raises(FedrecError, match=r"does not look like ml-1m") as err:
        registry.locate("ml-1m", tmp_path / "d", download=False)
    assert "downloads were not allowed" in str(err.value)
    ml1m = _copy(FIXTURES / "ml-1m" / "ratings.dat", tmp_path / "d" / "ml-1m")
    assert registry.locate("ml-1m", tmp_path / "d", download=False) == ml1m


def test_file_choice_and_parser_options(tmp_path: Path) -> None:
    _copy(FIXTURES / "lastfm-2k" / "user_artists.dat", tmp_path / "lastfm")
    for name in ("user_taggedartists-timestamps.dat", "user_taggedartists.dat"):
        _copy(FIXTURES / "lastfm-2k-tags" / name, tmp_path / "lastfm")
    listens = registry.load("lastfm-2k-listens", tmp_path / "lastfm")
    assert not listens.implicit and listens.ratings.tolist() == [13883, 11690, 228, 600]
    tags = registry.load("lastfm-2k", tmp_path / "lastfm")
    assert tags.implicit and tags.name == "lastfm-2k" and tags.source["file"].endswith("-timestamps.dat")
    with pytest.raises(FedrecError, match=r"has no raw file 'nope.dat'"):
        registry.load("lastfm-2k", tmp_path / "lastfm", file="nope.dat")


def test_fedcias_ml1m_split_loads_with_its_split(tmp_path: Path) -> None:
    _copy(FIXTURES / "splits" / "fedcia_split.tsv", tmp_path / "cia")
    (tmp_path / "cia" / "fedcia_split.tsv").rename(tmp_path / "cia" / "fedcia_ml1m_100_split.tsv")
    data = registry.load("ml-1m-fedcia", tmp_path / "cia")
    assert data.implicit and data.given_split.tolist() == [0, 1, 2, 0] and len(data) == 4


def test_ciao_is_metamfs_three_files_with_their_split(tmp_path: Path) -> None:
    for part in ("train", "valid", "test"):
        _copy(FIXTURES / "ciao" / f"ciao.{part}.rating", tmp_path / "ciao")
    data = registry.load("ciao", tmp_path / "ciao")
    assert not data.implicit and data.given_split.tolist() == [0, 0, 0, 0, 1, 2, 2]
    assert data.ratings.tolist() == [5.0, 5.0, 4.0, 3.0, 2.0, 1.0, 4.0]
    assert data.user_ids[data.users].tolist() == [0, 0, 1, 2, 0, 1, 2]
    (tmp_path / "ciao" / "ciao.test.rating").unlink()
    with pytest.raises(FedrecError, match="ciao.test.rating"):
        registry.load("ciao", tmp_path / "ciao")


def test_lastfm_2k_is_the_papers_tag_assignments_of_users_with_five(tmp_path: Path) -> None:
    """PFedRec's Lastfm-2K: one row per tag assignment, users with fewer than 5 rows left out
    (counted on rows, before any deduplication); both HetRec files give the same data."""
    for name in ("user_taggedartists-timestamps.dat", "user_taggedartists.dat"):
        _copy(FIXTURES / "lastfm-2k-tags" / name, tmp_path / "fm")
    stamped = registry.load("lastfm-2k", tmp_path / "fm", file="user_taggedartists-timestamps.dat")
    dated = registry.load("lastfm-2k", tmp_path / "fm", file="user_taggedartists.dat")
    for data in (stamped, dated):
        kept = data.user_ids[np.unique(data.users)].tolist()
        assert kept == [2, 7] and len(data) == 11  # user 4 (4 rows) is out, user 7 (exactly 5) in
    assert stamped.users.tolist() == dated.users.tolist() and stamped.items.tolist() == dated.items.tolist()
    assert np.array_equal(np.argsort(stamped.timestamps, kind="stable"), np.argsort(dated.timestamps, kind="stable"))
    assert (dated.timestamps - stamped.timestamps == 2 * 3600).all()  # UTC midnight vs CEST midnight

    _copy(FIXTURES / "anime" / "rating.csv", tmp_path / "anime")
    assert len(registry.load("anime", tmp_path / "anime")) == 3
    assert len(registry.load("anime", tmp_path / "anime", drop_unrated=False)) == 5
    with pytest.raises(FedrecError, match=r"does not take colour; it takes: drop_unrated"):
        registry.load("anime", tmp_path / "anime", colour="red")


def test_cache_hit_and_corrupt_cache(offline: Path) -> None:
    cached = _copy(FIXTURES / "ml-1m" / "ratings.dat", offline / "ml-1m")
    found = registry.resolve("ml-1m", download=False)
    assert found.path == cached and found.origin.startswith("cache")
    assert registry.info("ml-1m").cached == (cached,)

    (offline / "ml-100k").mkdir(parents=True)
    (offline / "ml-100k" / "ml-100k.inter").write_bytes(INTER.read_bytes())  # not the real hash
    with pytest.raises(FedrecError, match=r"wrong sha256"):
        registry.locate("ml-100k", download=False)


def test_cache_root_default_uses_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDREC_CACHE")
    assert registry.cache_root().name == "fedrec"


# --- errors ----------------------------------------------------------------------------------


def test_unknown_name() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown data set 'ml-10k'; did you mean 'ml-100k'.*known: .*ml-100k"):
        registry.load("ml-10k")


@pytest.mark.parametrize("name", ["anime", "tafeng"])
def test_login_only_data_sets_say_where_to_download(name: str) -> None:
    spec = registry.get_spec(name)
    assert not spec.sources and spec.manual_download
    with pytest.raises(FedrecError) as err:
        registry.locate(name)
    message = str(err.value)
    assert "kaggle.com" in message and "login" in message
    assert "--data-dir" in message and "FEDREC_DATA" in message
    assert spec.files[0].name in message


def test_every_failed_source_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedrecError) as err:
        registry.locate("ml-100k", tmp_path / "empty")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("could not find data set 'ml-100k'")
    tried = "\n".join(lines)
    assert f"data dir {tmp_path / 'empty'}: no u.data" in tried
    assert "cache" in tried
    assert "GroupLens (https://files.grouplens.org/datasets/movielens/ml-100k.zip)" in tried
    assert "cannot resolve host files.grouplens.org" in tried
    assert "PyPI recbole==1.2.1 wheel (recbole==1.2.1): pip download failed" in tried
    assert "Traceback" not in tried


# --- downloads (pooch, with a local stand-in for HTTP) ---------------------------------------


def _register(monkeypatch: pytest.MonkeyPatch, spec: registry.DatasetSpec) -> None:
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)


def _serve(monkeypatch: pytest.MonkeyPatch, payload: bytes, calls: list[str]) -> None:
    """Make pooch's downloader write ``payload`` instead of going to the network."""

    def fake_download(url: str, output_file: str, pooch: object, check_only: bool = False) -> None:
        calls.append(url)
        Path(output_file).write_bytes(payload)

    monkeypatch.setattr(fetch, "_downloader", lambda: fake_download)


def _zip_spec(checksum: str | None) -> registry.DatasetSpec:
    return registry.DatasetSpec(
        name="toy",
        description="toy",
        citation="-",
        homepage="-",
        files=(registry.RawFile("u.data", parsers.parse_ml100k),),
        sources=(
            registry.Source(
                "Toy host",
                "https://example.invalid/toy.zip",
                checksum=checksum,
                members=("toy/u.data",),
            ),
        ),
    )


def test_zip_download_is_verified_unpacked_and_cached(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _zip_bytes({"toy/u.data": U_DATA.read_bytes(), "toy/README": b"x"})
    calls: list[str] = []
    _serve(monkeypatch, archive, calls)
    _register(monkeypatch, _zip_spec(f"sha256:{_sha256(archive)}"))
    found = registry.resolve("toy")
    assert found.path == offline / "toy" / "u.data"
    assert found.path.read_bytes() == U_DATA.read_bytes()
    assert sorted(p.name for p in (offline / "toy").iterdir()) == [".sha256.json", "u.data"]  # no staging left
    assert len(registry.load("toy")) == 5
    assert calls == ["https://example.invalid/toy.zip"]  # second call served from the cache


def test_md5_checksums_are_accepted(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _zip_bytes({"toy/u.data": U_DATA.read_bytes()})
    _serve(monkeypatch, archive, [])
    _register(monkeypatch, _zip_spec(f"md5:{hashlib.md5(archive).hexdigest()}"))
    assert registry.locate("toy").is_file()


def test_checksum_mismatch_fails_and_leaves_nothing(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _zip_bytes({"toy/u.data": U_DATA.read_bytes()})
    _serve(monkeypatch, archive, [])
    _register(monkeypatch, _zip_spec("sha256:" + "0" * 64))
    with pytest.raises(
        FedrecError, match=r"Toy host \(https://example.invalid/toy.zip\): checksum"
    ):
        registry.locate("toy")
    assert not (offline / "toy").exists()  # nothing fetched: not even an empty cache folder


def test_missing_archive_member_is_reported(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _zip_bytes({"other/u.data": U_DATA.read_bytes()})
    _serve(monkeypatch, archive, [])
    _register(monkeypatch, _zip_spec(None))
    with pytest.raises(FedrecError, match=r"Toy host .*toy/u.data"):
        registry.locate("toy")


# --- the PyPI wheel mirror -------------------------------------------------------------------


def _wheel_spec(wheel_sha: str, member_sha: str) -> registry.DatasetSpec:
    return registry.DatasetSpec(
        name="toy-wheel",
        description="toy",
        citation="-",
        homepage="-",
        files=(registry.RawFile("ml-100k.inter", parsers.parse_atomic, sha256=member_sha),),
        sources=(
            registry.Source(
                "Toy wheel",
                "toypkg==1.0",
                kind="pip-wheel",
                checksum=f"sha256:{wheel_sha}",
                members=(WHEEL_MEMBER,),
            ),
        ),
    )


def _fake_pip(monkeypatch: pytest.MonkeyPatch, wheel: bytes, calls: list[str]) -> None:
    def fake(requirement: str, dest: Path) -> Path:
        calls.append(requirement)
        path = dest / "toypkg-1.0-py3-none-any.whl"
        path.write_bytes(wheel)
        return path

    monkeypatch.setattr(fetch, "pip_download", fake)


def test_wheel_mirror_extracts_and_verifies(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = INTER.read_bytes()
    wheel = _zip_bytes({WHEEL_MEMBER: content, "toypkg/__init__.py": b""})
    calls: list[str] = []
    _fake_pip(monkeypatch, wheel, calls)
    _register(monkeypatch, _wheel_spec(_sha256(wheel), _sha256(content)))
    found = registry.resolve("toy-wheel")
    assert calls == ["toypkg==1.0"]
    assert found.path == offline / "toy-wheel" / "ml-100k.inter"
    assert found.path.read_bytes() == content
    assert sorted(p.name for p in (offline / "toy-wheel").iterdir()) == [".sha256.json", "ml-100k.inter"]
    assert len(registry.load("toy-wheel")) == 5 and calls == ["toypkg==1.0"]


@pytest.mark.parametrize("broken", ["wheel", "member"])
def test_wheel_mirror_rejects_bad_hashes(
    offline: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    content = INTER.read_bytes()
    wheel = _zip_bytes({WHEEL_MEMBER: content})
    _fake_pip(monkeypatch, wheel, [])
    wheel_sha = "0" * 64 if broken == "wheel" else _sha256(wheel)
    member_sha = "0" * 64 if broken == "member" else _sha256(content)
    _register(monkeypatch, _wheel_spec(wheel_sha, member_sha))
    expected = "wheel toypkg" if broken == "wheel" else f"{WHEEL_MEMBER} in toypkg"
    with pytest.raises(FedrecError, match=rf"checksum mismatch for {re.escape(expected)}"):
        registry.locate("toy-wheel")
    assert not (offline / "toy-wheel").exists()  # no partial file in the cache, nor an empty folder


def test_ml100k_falls_through_to_the_wheel_mirror(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real ml-100k spec: GroupLens unreachable, then the recbole wheel (faked, same layout)."""
    content = INTER.read_bytes()
    wheel = _zip_bytes({WHEEL_MEMBER: content})
    spec = registry.get_spec("ml-100k")
    mirror = spec.sources[1]
    assert mirror.kind == "pip-wheel" and mirror.url == "recbole==1.2.1"
    assert mirror.members == (WHEEL_MEMBER,)
    patched_files = tuple(
        registry.RawFile(f.name, f.parser, sha256=_sha256(content))
        if f.name == "ml-100k.inter"
        else f
        for f in spec.files
    )
    patched_mirror = registry.Source(
        mirror.label,
        mirror.url,
        kind="pip-wheel",
        checksum=f"sha256:{_sha256(wheel)}",
        members=mirror.members,
    )
    _register(
        monkeypatch,
        registry.DatasetSpec(
            spec.name,
            spec.description,
            spec.citation,
            spec.homepage,
            patched_files,
            (spec.sources[0], patched_mirror),
            folders=spec.folders,
        ),
    )
    calls: list[str] = []
    _fake_pip(monkeypatch, wheel, calls)
    found = registry.resolve("ml-100k")
    assert calls == ["recbole==1.2.1"]
    assert found.raw.name == "ml-100k.inter" and "PyPI recbole" in found.origin
    assert any("GroupLens" in f and "cannot resolve host" in f for f in found.failures)


def test_pip_download_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        (Path(command[command.index("-d") + 1]) / "pkg-1.0-py3-none-any.whl").write_bytes(b"x")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    wheel = REAL_PIP_DOWNLOAD("recbole==1.2.1", tmp_path)
    assert wheel.name == "pkg-1.0-py3-none-any.whl"
    command = seen[0]
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in command and "recbole==1.2.1" in command

    def failing_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(fetch.subprocess, "run", failing_run)
    with pytest.raises(fetch.SourceFailed, match=r"No matching distribution"):
        REAL_PIP_DOWNLOAD("recbole==1.2.1", tmp_path / "empty")


# --- registry contents -----------------------------------------------------------------------


def test_registry_contents_and_checksums() -> None:
    names = registry.list_datasets()
    assert names[0] == registry.DEFAULT_DATASET == "ml-100k"
    for required in (
        "ml-100k",
        "ml-1m",
        "lastfm-2k",
        "lastfm-2k-listens",
        "hetrec-movielens",
        "amazon-video",
        "tafeng",
        "anime",
        "book-crossing",
    ):
        assert required in names
    for name in names:
        spec = registry.get_spec(name)
        assert spec.files and spec.citation and spec.homepage
        assert spec.sources or spec.manual_download
        for source in spec.sources:
            if source.checksum is not None:
                kind, _, digest = source.checksum.partition(":")
                assert (kind, len(digest)) in (("sha256", 64), ("md5", 32)), source
                assert source.checksum_source
            assert set(source.provides) <= {f.name for f in spec.files}
    ml100k = registry.get_spec("ml-100k").sources
    assert ml100k[0].url == "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
    assert registry.get_spec("ml-100k").file("ml-100k.inter").sha256 == (
        "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff"
    )
    assert registry.describe_checksum(registry.get_spec("hetrec-movielens").sources[0]).startswith(
        "unverified"
    )


# --- CLI -------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_list_and_info() -> None:
    listed = runner.invoke(cli.app, ["list"])
    assert listed.exit_code == 0, listed.output
    for name in registry.list_datasets():
        assert name in listed.output
    info = runner.invoke(cli.app, ["info", "ml-100k"])
    assert info.exit_code == 0, info.output
    assert "ml-100k.zip" in info.output and "recbole==1.2.1" in info.output
    assert "sha256" in info.output and "parse_ml100k" in info.output
    unverified = runner.invoke(cli.app, ["info", "amazon-video"])
    assert "unverified" in unverified.output
    unknown = runner.invoke(cli.app, ["info", "nope"])
    assert isinstance(unknown.exception, UnknownNameError)


def test_cli_stats_on_fixture(tmp_path: Path) -> None:
    _copy(U_DATA, tmp_path / "data")
    result = runner.invoke(cli.app, ["stats", "ml-100k", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert re.search(r"users\s+4\n", result.output)
    assert re.search(r"items\s+4\n", result.output)
    assert re.search(r"interactions\s+5\n", result.output)
    assert re.search(r"sparsity\s+68\.75%", result.output)  # 1 - 5 / (4 * 4)
    # the same events in RecBole's format: the same content digest, the one a run records
    _copy(INTER, tmp_path / "data")
    atomic = runner.invoke(cli.app, ["stats", "ml-100k", "--data-dir", str(tmp_path / "data"), "--file", "ml-100k.inter"])
    digest = registry.load("ml-100k", tmp_path / "data", file="ml-100k.inter").source["content"]
    assert f"content digest {digest[:16]}" in result.output and f"content digest {digest[:16]}" in atomic.output
    filtered = runner.invoke(
        cli.app, ["stats", "ml-100k", "--data-dir", str(tmp_path / "data"), "--min-rating", "3"]
    )
    assert re.search(r"users\s+2\n", filtered.output)
    assert re.search(r"interactions\s+2\n", filtered.output)
    assert re.search(r"sparsity\s+50\.00%", filtered.output)


def test_cli_stats_thousands_and_implicit(tmp_path: Path) -> None:
    rows = "".join(f"{u}\t{u % 1100}\t4\t{1000 + u}\n" for u in range(1500))
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "u.data").write_text(rows)
    result = runner.invoke(cli.app, ["stats", "ml-100k", "--data-dir", str(tmp_path / "big")])
    assert re.search(r"users\s+1,500\n", result.output)
    assert re.search(r"items\s+1,100\n", result.output)

    _copy(FIXTURES / "lastfm-2k-tags" / "user_taggedartists.dat", tmp_path / "fm")
    args = ["stats", "lastfm-2k", "--data-dir", str(tmp_path / "fm")]
    papers = runner.invoke(cli.app, args)  # counted as the papers count: every tag assignment
    assert re.search(r"users\s+2\n", papers.output) and re.search(r"items\s+7\n", papers.output)
    assert re.search(r"interactions\s+11\n", papers.output)
    assert "users with fewer than 5 rows left out" in papers.output
    assert "a run keeps the last of each (7 interactions)" in papers.output
    pairs = runner.invoke(cli.app, [*args, "--implicit"])
    assert re.search(r"interactions\s+7\n", pairs.output)  # distinct (user, artist) pairs


def test_cli_fetch_prints_path(tmp_path: Path) -> None:
    path = _copy(U_DATA, tmp_path / "data")
    result = runner.invoke(cli.app, ["fetch", "ml-100k", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert str(path) in result.output
    failed = runner.invoke(cli.app, ["fetch", "tafeng"])
    assert isinstance(failed.exception, FedrecError)
    assert "kaggle.com" in str(failed.exception)


def test_cli_module_does_not_import_torch() -> None:
    code = "import sys, fedrec.cli.data; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_truncated_cached_file_is_caught_and_fetched_again_with_a_reason(
    offline: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """u.data has no published checksum; the cache records the sha256 of what it unpacked from
    the verified download, so a truncated copy is not used: it is fetched again, and said so."""
    archive = _zip_bytes({"toy/u.data": U_DATA.read_bytes()})
    calls: list[str] = []
    _serve(monkeypatch, archive, calls)
    _register(monkeypatch, _zip_spec(f"sha256:{_sha256(archive)}"))
    cached = registry.resolve("toy").path
    full = len(registry.load("toy"))
    assert fetch.recorded_hashes(cached.parent)["u.data"] == _sha256(U_DATA.read_bytes())
    lines = cached.read_bytes().splitlines(keepends=True)
    cached.write_bytes(b"".join(lines[: len(lines) * 4 // 5]))  # a cut-off copy
    with caplog.at_level("WARNING", logger="fedrec.data"):
        assert len(registry.load("toy")) == full and len(calls) == 2
    assert "truncated or overwritten" in caplog.text and "fetching it again" in caplog.text


def test_a_killed_fetch_leaves_no_staging_folder_for_long(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    archive = _zip_bytes({"toy/u.data": U_DATA.read_bytes()})
    _serve(monkeypatch, archive, [])
    _register(monkeypatch, _zip_spec(f"sha256:{_sha256(archive)}"))
    stale, fresh = offline / "toy" / ".fetch-killed", offline / "toy" / ".fetch-running"
    for d in (stale, fresh):
        d.mkdir(parents=True)
    old = time.time() - 2 * fetch.STALE_STAGING_S
    os.utime(stale, (old, old))
    registry.resolve("toy")
    assert not stale.exists() and fresh.exists()  # a live fetch's folder is left alone
