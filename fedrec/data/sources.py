"""What a data set is made of: its raw files, where they come from, how to check them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError

DEFAULT_DATASET = "ml-100k"
DOWNLOAD_TIMEOUT_S = 10.0
"""Seconds the HTTP client waits on a silent server before moving to the next source."""
PIP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RawFile:
    """One raw file a data set can be read from, and the parser that reads it.

    ``sha256`` is the hash of the file itself, where one is known; it is checked when the file
    is taken from a mirror or the cache (not in a user's own ``data_dir``). ``marker`` is a
    string the first line must contain, to tell apart files that share a name across data
    sets (ML-1M's and PFedRec's ``ratings.dat``).
    """

    name: str
    parser: Callable[..., Interactions]
    sha256: str | None = None
    marker: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Source:
    """One place to download raw files from.

    ``checksum`` is in pooch's ``known_hash`` form: ``sha256:<hex>`` or, where only an md5 is
    documented, ``md5:<hex>``; None means the download cannot be verified.
    ``checksum_source`` says where the hash comes from. ``members`` are the paths inside the
    archive (``kind="zip"`` or ``"pip-wheel"``) to keep; each lands in the cache under its base
    name. For ``kind="pip-wheel"``, ``url`` is a pip requirement such as ``recbole==1.2.1``.
    """

    label: str
    url: str
    kind: Literal["file", "zip", "pip-wheel"] = "zip"
    checksum: str | None = None
    checksum_source: str = ""
    members: tuple[str, ...] = ()

    @property
    def provides(self) -> tuple[str, ...]:
        """Raw file names this source puts in the cache."""
        if self.kind == "file":
            return (self.url.rsplit("/", 1)[-1],)
        return tuple(m.rsplit("/", 1)[-1] for m in self.members)

    @property
    def checksum_kind(self) -> str:
        """``sha256``, ``md5`` or ``unverified``, for display."""
        if self.checksum is None:
            return "unverified"
        return self.checksum.split(":", 1)[0] if ":" in self.checksum else "sha256"


@dataclass(frozen=True)
class DatasetSpec:
    """What fedrec knows about one public data set.

    ``files`` are the raw files it can be read from, in order of preference (the first found
    wins unless the caller names one); ``sources`` are tried in order when none is found.
    ``manual_download`` is set for publishers behind a login, who have no URL here.
    ``folders`` are directory names the raw files usually sit in (the archive's folder).
    ``min_user_rows`` is part of what the name means where the papers define the data set by a
    filter on raw rows (Lastfm-2K: users with at least 5 tag assignments): it is applied when
    the data are read, before any deduplication. ``count_rows``: the papers count every raw row
    as an interaction (a tag assignment), so `fedrec data stats` does too, beside the distinct
    pairs a run keeps. ``clock``: whether the raw files carry the events' times (False: a
    leave-one-out split holds out random items, `fedrec.protocols.split.leave_one_out`); it is
    part of a run's identity, so it is known without reading the data.
    """

    name: str
    description: str
    citation: str
    homepage: str
    files: tuple[RawFile, ...]
    sources: tuple[Source, ...] = ()
    manual_download: str | None = None
    folders: tuple[str, ...] = ()
    implicit: bool = False
    min_user_rows: int = 0
    count_rows: bool = False
    clock: bool = True

    def defining_filter(self, x: Interactions) -> Interactions:
        """``x`` without the users the data set's definition leaves out (``min_user_rows``)."""
        if not self.min_user_rows:
            return x
        rows = np.bincount(x.users, minlength=x.n_users)
        return x.subset(rows[x.users] >= self.min_user_rows)

    @property
    def parser(self) -> Callable[..., Interactions]:
        """Parser of the preferred raw file."""
        return self.files[0].parser

    def file(self, name: str) -> RawFile:
        for raw in self.files:
            if raw.name == name:
                return raw
        known = ", ".join(f.name for f in self.files)
        raise FedrecError(f"data set '{self.name}' has no raw file '{name}'; known: {known}")


@dataclass(frozen=True)
class Located:
    """A raw file found for a data set, and where it was found (for messages)."""

    path: Path
    raw: RawFile
    origin: str
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetInfo:
    """A spec plus its local state, for ``fedrec data info``."""

    spec: DatasetSpec
    cache_dir: Path
    cached: tuple[Path, ...]
