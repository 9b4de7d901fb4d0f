"""An archive writes only the members fedrec names, under their base names, into one folder,
and never more than the size allowed (`fedrec.data.archive`)."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

import pytest

from fedrec.data import archive
from fedrec.data.archive import ArchiveError, extract_members


def _zip(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, content in members.items():
            z.writestr(name, content)  # writestr keeps the name as given: ../ and / included
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, target)
    return path


def _files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_crafted_member_names_never_leave_the_folder(tmp_path: Path) -> None:
    crafted = {"../escape.txt": b"up", "/tmp/absolute.txt": b"abs", "a/../../../escape2.txt": b"up2",
               "ml-100k/u.data": b"1\t2\t5\t0\n", "..\\windows.txt": b"win"}
    zpath = _zip(tmp_path / "crafted.zip", crafted)
    dest = tmp_path / "box" / "dest"
    dest.mkdir(parents=True)
    got = extract_members(zpath, ["ml-100k/u.data", "../escape.txt", "/tmp/absolute.txt",
                                  "a/../../../escape2.txt", "..\\windows.txt"], dest)
    assert [p.name for p in got] == ["u.data", "escape.txt", "absolute.txt", "escape2.txt", "windows.txt"]
    assert all(p.parent == dest for p in got)
    assert _files_under(tmp_path) == {"crafted.zip", *(f"box/dest/{p.name}" for p in got)}
    assert (dest / "u.data").read_bytes() == b"1\t2\t5\t0\n"


def test_only_named_members_are_written(tmp_path: Path) -> None:
    zpath = _zip(tmp_path / "a.zip", {"d/keep.csv": b"k", "../other.csv": b"o", "d/skip.csv": b"s"})
    dest = tmp_path / "dest"
    dest.mkdir()
    extract_members(zpath, ["d/keep.csv"], dest)
    assert _files_under(dest) == {"keep.csv"}


@pytest.mark.parametrize("member", ["d/", "d/..", "d/.", ""])
def test_a_member_without_a_file_name_is_refused(tmp_path: Path, member: str) -> None:
    zpath = _zip(tmp_path / "a.zip", {"d/x": b"x"})
    with pytest.raises(ArchiveError, match="no usable file name"):
        extract_members(zpath, [member], tmp_path)


def test_two_members_of_one_name_or_one_named_as_the_archive_are_refused(tmp_path: Path) -> None:
    zpath = _zip(tmp_path / "a.zip", {"x/u.data": b"1", "y/u.data": b"2", "in/a.zip": b"3"})
    with pytest.raises(ArchiveError, match="two members would be written as u.data"):
        extract_members(zpath, ["x/u.data", "y/u.data"], tmp_path)
    with pytest.raises(ArchiveError, match="written over the archive a.zip"):
        extract_members(zpath, ["in/a.zip"], tmp_path)
    assert zpath.read_bytes()[:2] == b"PK" and _files_under(tmp_path) == {"a.zip"}


def test_links_missing_members_and_non_zips_are_refused_leaving_nothing(tmp_path: Path) -> None:
    zpath = _zip(tmp_path / "a.zip", {"d/first.csv": b"1"}, links={"d/link": "/etc/passwd"})
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError, match="d/link is not a regular file"):
        extract_members(zpath, ["d/first.csv", "d/link"], dest)
    with pytest.raises(ArchiveError, match="has no member d/missing"):
        extract_members(zpath, ["d/first.csv", "d/missing"], dest)
    assert _files_under(dest) == set()  # the first member, written before the refusal, is gone
    (tmp_path / "not.zip").write_bytes(b"plain text")
    with pytest.raises(ArchiveError, match="damaged, or not a zip archive"):
        extract_members(tmp_path / "not.zip", ["x"], dest)


def test_an_oversized_member_is_refused_by_its_declared_and_its_real_size(tmp_path: Path) -> None:
    zpath = _zip(tmp_path / "bomb.zip", {"big.bin": b"\0" * (3 << 20), "small.bin": b"s"})
    assert zpath.stat().st_size < 50_000  # a zip bomb in small: 3 MB of zeros
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError, match="over the 1,048,576 allowed"):
        extract_members(zpath, ["small.bin", "big.bin"], dest, max_bytes=1 << 20)
    assert _files_under(dest) == set()
    # the count while inflating holds without the declared size's check
    with zipfile.ZipFile(zpath) as z, pytest.raises(ArchiveError, match="inflates past the 1,048,576"):
        archive._copy(z, z.getinfo("big.bin"), dest / "big.bin", 1 << 20)
    assert (dest / "big.bin").stat().st_size <= 1 << 20
    # size fields that lie (10 bytes declared, 3 MB inside): read no further than declared, refused
    raw = bytearray(zpath.read_bytes())
    for signature, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = raw.index(signature)  # big.bin's headers come first
        raw[start + at: start + at + 4] = (10).to_bytes(4, "little")
    (tmp_path / "liar.zip").write_bytes(bytes(raw))
    (dest / "big.bin").unlink()
    with pytest.raises(ArchiveError, match="damaged.*Bad CRC"):
        extract_members(tmp_path / "liar.zip", ["big.bin"], dest, max_bytes=1 << 20)
    assert _files_under(dest) == set()


def test_the_registry_takes_members_out_only_through_extract_members(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """Both archive paths of the data layer (a zip download, a wheel mirror) call the one rule."""
    from fedrec.data import fetch

    calls: list[tuple[str, ...]] = []

    def spy(path: Path, members: tuple[str, ...], dest: Path, max_bytes: int = 1) -> list[Path]:
        calls.append(tuple(members))
        raise ArchiveError("spied")

    monkeypatch.setattr(fetch, "extract_members", spy)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("ml-100k/u.data", b"1\t1\t1\t1\n")
    (tmp_path / "x.whl").write_bytes(buf.getvalue())
    monkeypatch.setattr(fetch, "pip_download", lambda url, dest: tmp_path / "x.whl")
    from fedrec.data.sources import Source

    src = Source(label="w", url="x", kind="pip-wheel", members=("ml-100k/u.data",))
    spec = type("Spec", (), {"files": ()})()
    with pytest.raises(fetch.SourceFailed, match="spied"):
        fetch._fetch_wheel(spec, src, tmp_path)
    assert calls == [("ml-100k/u.data",)]
