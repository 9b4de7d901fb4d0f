"""Taking files out of a zip archive (a data set's download, a wheel that mirrors it) by the
one rule that keeps an archive from writing anywhere else or filling the disk.

Only the members the caller names are read, each written as its base name into one folder:
a member's own path (``../``, an absolute path, a link) never becomes a path on disk, and
members the caller did not name are never touched. A member larger than ``max_bytes``, by
its declared size or by the bytes it actually inflates to, is refused and nothing of it is
kept. Every archive fedrec opens goes through `extract_members`.
"""

from __future__ import annotations

import stat
import zipfile
from collections.abc import Sequence
from pathlib import Path

#: the most one member may inflate to: far above the largest raw file of the registry
#: (tens of MB), far below what a zip bomb would reach
MAX_MEMBER_BYTES = 4 << 30
_CHUNK = 1 << 20


class ArchiveError(Exception):
    """An archive that lacks a named member, or whose member breaks the rule."""


def base_name(member: str) -> str:
    """The name a member is written under: its last path component (``/`` or ``\\`` ending
    the ones before it), which must be a plain file name (not empty, ``.``, ``..``, nor
    holding a NUL)."""
    base = member.replace("\\", "/").rsplit("/", 1)[-1]
    if base in ("", ".", "..") or "\0" in base:
        raise ArchiveError(f"member {member!r} has no usable file name")
    return base


def extract_members(archive: Path, members: Sequence[str], dest: Path,
                    max_bytes: int = MAX_MEMBER_BYTES) -> list[Path]:
    """Write each of ``members`` (exact names inside ``archive``) to ``dest / base_name``;
    returns those paths. `ArchiveError` if one is missing, is not a regular file, or is
    larger than ``max_bytes``; the files written before it are removed."""
    out: list[Path] = []
    names = [base_name(m) for m in members]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ArchiveError(f"two members would be written as {twice[0]}")
    if Path(archive).resolve() in {(dest / n).resolve() for n in names}:
        raise ArchiveError(f"a member would be written over the archive {Path(archive).name}")
    try:
        with zipfile.ZipFile(archive) as z:
            for member in members:
                target = dest / base_name(member)
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise ArchiveError(f"archive has no member {member}") from None
                mode = info.external_attr >> 16
                # a file type of 0 is a plain file too (zip writers that record no Unix mode)
                if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                    raise ArchiveError(f"member {member} is not a regular file")
                if info.file_size > max_bytes:
                    raise ArchiveError(f"member {member} is {info.file_size:,} bytes, over the "
                                       f"{max_bytes:,} allowed")
                out.append(target)
                _copy(z, info, target, max_bytes)
    except zipfile.BadZipFile as e:
        _remove(out)
        raise ArchiveError(f"damaged, or not a zip archive: {e}") from None
    except BaseException:
        _remove(out)
        raise
    return out


def _copy(z: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, max_bytes: int) -> None:
    """Inflate one member, stopping as soon as it passes ``max_bytes``. (A member's declared
    size can lie: `zipfile` reads no more than it declares and then fails the CRC check, and
    this count holds whatever a later `zipfile` does.)"""
    written = 0
    with z.open(info) as src, target.open("wb") as dst:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > max_bytes:
                raise ArchiveError(f"member {info.filename} inflates past the {max_bytes:,} "
                                   "bytes allowed")
            dst.write(chunk)


def _remove(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)



