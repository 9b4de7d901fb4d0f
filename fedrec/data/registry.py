"""The dataset registry: find a known data set's raw file and read it.

The data sets are described in `fedrec.data.catalogue` (types in `fedrec.data.sources`) and
fetched by `fedrec.data.fetch`.

`locate` looks for a data set's raw file, in order: an explicit ``data_dir`` (or the
``FEDREC_DATA`` directory; one that is not a directory is an error at once, not a step to
skip: a mistyped path must not quietly read another copy), the cache (``FEDREC_CACHE`` or the
platform cache dir), the publisher's URL, then mirrors. Every failed step is recorded, and
when all fail one `FedrecError` lists each of them, so a user sees why in one message instead
of a traceback.
Downloads go to a staging folder and are renamed into the cache only once complete and
verified, so an interrupted fetch never leaves a partial file behind.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrec.data.catalogue import REGISTRY
from fedrec.data.fetch import (  # noqa: F401  (the public names)
    SourceFailed,
    describe_checksum,
    fetch,
    pip_download,
    recorded_hashes,
    sha256_of,
)
from fedrec.data.interactions import Interactions
from fedrec.data.sources import (  # noqa: F401  (the public names)
    DEFAULT_DATASET,
    DatasetInfo,
    DatasetSpec,
    Located,
    RawFile,
    Source,
)
from fedrec.errors import FedrecError, UnknownNameError

log = logging.getLogger("fedrec.data")


def list_datasets() -> list[str]:
    """Names of the known data sets, the default first."""
    return list(REGISTRY)


def get_spec(name: str) -> DatasetSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownNameError("data set", name, list(REGISTRY)) from None


def cache_root() -> Path:
    """``FEDREC_CACHE`` if set, else the platform's user cache dir for fedrec."""
    configured = os.environ.get("FEDREC_CACHE")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("fedrec"))


def info(name: str) -> DatasetInfo:
    """The spec of ``name`` and which of its raw files are already in the cache."""
    spec = get_spec(name)
    folder = cache_root() / spec.name
    cached = tuple(folder / f.name for f in spec.files if (folder / f.name).is_file())
    return DatasetInfo(spec, folder, cached)


def locate(
    name: str,
    data_dir: str | Path | None = None,
    *,
    file: str | None = None,
    download: bool = True,
) -> Path:
    """Path of a raw file of data set ``name``, downloading it into the cache if needed.

    ``file`` picks one of the data set's raw files (e.g. ``user_taggedartists-timestamps.dat``
    for ``lastfm-2k``); ``download=False`` stops after the local look-ups.
    """
    return resolve(name, data_dir, file=file, download=download).path


def load(
    name: str,
    data_dir: str | Path | None = None,
    *,
    file: str | None = None,
    download: bool = True,
    **parser_options: Any,
) -> Interactions:
    """Locate and parse data set ``name``; ``parser_options`` go to the file's parser."""
    found = resolve(name, data_dir, file=file, download=download)
    parser = found.raw.parser
    try:
        inspect.signature(parser).bind(found.path, **parser_options)
    except TypeError:
        accepted = [p for p in inspect.signature(parser).parameters if p != "path"]
        raise FedrecError(
            f"{parser.__name__} (which reads {found.raw.name}) does not take "
            f"{', '.join(sorted(parser_options))}; it takes: {', '.join(accepted) or 'no options'}"
        ) from None
    data = get_spec(name).defining_filter(parser(found.path, **parser_options))
    source = {"file": str(found.path), "origin": found.origin, "sha256": sha256_of(found.path),
              "content": data.content_digest()}  # what `fedrec.bench` compares: the same in any format
    return dataclasses.replace(data, name=name, source=source)


def content_at_hand(name: str, data_dir: str | Path | None = None,
                    known: Mapping[str, str] | None = None) -> str | None:
    """The content digest (`Interactions.content_digest`) of the copy of built-in data set
    ``name`` a run would read now, found without downloading; None when no copy is at hand or
    it cannot be read (a run then fails or downloads on its own). What tells a cached run's
    results from results of other events (`fedrec.results.set_aside_other_events`).
    ``known`` maps a file's sha256 to the digest runs of that file recorded (`known_contents`):
    the same bytes hold the same events, so such a copy is hashed, not parsed again."""
    try:
        if known:
            digest = known.get(sha256_of(resolve(name, data_dir, download=False).path))
            if digest is not None:
                return digest
        return str(load(name, data_dir, download=False).source["content"])
    except (FedrecError, OSError):
        return None


def resolve(
    name: str,
    data_dir: str | Path | None = None,
    *,
    file: str | None = None,
    download: bool = True,
) -> Located:
    """Like `locate`, but also says which raw file was found and where it came from."""
    spec = get_spec(name)
    wanted = (spec.file(file),) if file is not None else spec.files
    failures: list[str] = []

    directory = data_directory(data_dir)
    if directory is not None:
        found = _search_dir(spec, wanted, directory, failures, verify=False)
        if found is not None:
            return Located(found[0], found[1], f"data dir {directory}", tuple(failures))

    cache = cache_root() / spec.name
    found = _search_dir(spec, wanted, cache, failures, verify=True, nested=False)
    if found is not None:
        return Located(found[0], found[1], f"cache {cache}", tuple(failures))

    if download:
        names = {raw.name for raw in wanted}
        for source in spec.sources:
            if not names & set(source.provides):
                continue
            rejected = [f for f in failures if f.startswith("cache: ")]
            if rejected:  # a re-fetch says why
                log.warning("%s; fetching it again from %s", rejected[-1][len("cache: "):], source.label)
            try:
                fetch(spec, source, cache)
            except SourceFailed as exc:
                failures.append(f"{source.label} ({source.url}): {exc}")
                continue
            found = _search_dir(spec, wanted, cache, failures, verify=True, nested=False)
            if found is not None:
                origin = f"{source.label} -> cache {cache}"
                return Located(found[0], found[1], origin, tuple(failures))
    elif spec.sources:
        failures.append("downloads were not allowed")
    raise FedrecError(_failure_message(spec, wanted, failures))


def data_directory(data_dir: str | Path | None = None) -> Path | None:
    """The folder to look in first: ``data_dir`` if given, else ``FEDREC_DATA`` if set, else
    None; one that is not a directory is a `FedrecError` naming where it came from."""
    configured = os.environ.get("FEDREC_DATA")
    if data_dir is None and not configured:
        return None
    directory = Path(data_dir if data_dir is not None else str(configured)).expanduser()
    if not directory.is_dir():
        # the command line's --data-dir also reads FEDREC_DATA: the same text came from there
        origin = "FEDREC_DATA" if data_dir is None or str(data_dir) == configured else "--data-dir"
        problem = "is not a directory" if directory.exists() else "does not exist"
        raise FedrecError(f"{origin} {directory} {problem}: give the folder that holds the "
                          "data set's raw files (or leave it unset to use the cache)")
    return directory


def _search_dir(
    spec: DatasetSpec,
    wanted: tuple[RawFile, ...],
    directory: Path,
    failures: list[str],
    *,
    verify: bool,
    nested: bool = True,
) -> tuple[Path, RawFile] | None:
    """First wanted raw file in ``directory`` (or one level down in a dataset-named folder)."""
    label = "cache" if not nested else "data dir"
    if not directory.is_dir():
        failures.append(f"{label} {directory}: " + ("not a directory" if nested else "empty"))
        return None
    folders = [directory]
    if nested:
        folders += [directory / sub for sub in (spec.name, *spec.folders)]
    skipped: list[str] = []
    for raw in wanted:
        for folder in folders:
            path = folder / raw.name
            if not path.is_file():
                continue
            if raw.marker is not None and not _first_line_has(path, raw.marker):
                skipped.append(
                    f"{path} does not look like {spec.name} (no '{raw.marker}' on line 1)"
                )
                continue
            if verify and raw.sha256 is not None and sha256_of(path) != raw.sha256:
                skipped.append(f"{path} has the wrong sha256 (corrupt or different copy)")
                continue
            recorded = recorded_hashes(folder).get(raw.name) if verify else None
            if recorded is not None and sha256_of(path) != recorded:
                skipped.append(f"{path} is not the file fetched into the cache (its sha256 "
                               "changed since: truncated or overwritten)")
                continue
            return path, raw
    names = ", ".join(raw.name for raw in wanted)
    if skipped:
        failures.extend(f"{label}: {reason}" for reason in skipped)
    else:
        failures.append(f"{label} {directory}: no {names}")
    return None


def _first_line_has(path: Path, marker: str) -> bool:
    with path.open("rb") as fh:
        return marker.encode() in fh.readline()


def _failure_message(spec: DatasetSpec, wanted: tuple[RawFile, ...], failures: list[str]) -> str:
    names = " or ".join(raw.name for raw in wanted)
    lines = [f"could not find data set '{spec.name}' ({names}); tried:"]
    lines += [f"  - {failure}" for failure in failures]
    if spec.manual_download:
        lines.append(f"{spec.manual_download}; then")
    lines.append(
        f"pass --data-dir DIR (or set FEDREC_DATA=DIR) where DIR holds {names} "
        f"(directly or in a folder named {spec.name})"
    )
    return "\n".join(lines)
