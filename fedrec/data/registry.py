"""Known data sets: where their raw files come from, how to check them, which parser reads them.

`locate` looks for a data set's raw file, in order: an explicit ``data_dir`` (or the
``FEDREC_DATA`` directory), the cache (``FEDREC_CACHE`` or the platform cache dir), the
publisher's URL, then mirrors. Every failed step is recorded, and when all fail one
`FedrecError` lists each of them, so a user sees why in one message instead of a traceback.
Downloads go to a staging folder and are renamed into the cache only once complete and
verified, so an interrupted fetch never leaves a partial file behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from fedrec.data import parsers
from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError, UnknownNameError

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


_MOVIELENS = (
    "F. Maxwell Harper and Joseph A. Konstan. 2015. The MovieLens Datasets: History and "
    "Context. ACM TiiS 5(4):19. https://doi.org/10.1145/2827872"
)
_HETREC = (
    "Ivan Cantador, Peter Brusilovsky and Tsvi Kuflik. 2011. 2nd Workshop on Information "
    "Heterogeneity and Fusion in Recommender Systems (HetRec 2011). RecSys 2011."
)

REGISTRY: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="ml-100k",
            description="MovieLens 100K: 100,000 ratings (1-5) by 943 users on 1,682 movies",
            citation=_MOVIELENS,
            homepage="https://grouplens.org/datasets/movielens/100k/",
            files=(
                RawFile("u.data", parsers.parse_ml100k, note="GroupLens original"),
                RawFile(
                    "ml-100k.inter",
                    parsers.parse_atomic,
                    # The file inside the recbole==1.2.1 wheel (same rows, same order as u.data).
                    sha256="4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
                    note="RecBole atomic copy",
                ),
                RawFile(
                    "ratings.dat",
                    parsers.parse_pfedrec_csv,
                    # PFedRec's copy (Zhangcx19/IJCAI-23-PFedRec data/ml-100k/ratings.dat).
                    sha256="807b9ab64929525bfeac2a9045cf91df7017239b301fee472e4b47a69b6d6daf",
                    marker=",",
                    note="PFedRec CSV copy, rows ordered by user",
                ),
            ),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/movielens/ml-100k.zip",
                    checksum="sha256:50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229",
                    # GroupLens publishes md5 0e33842e24a9c977be4e0107933c0723 (ml-100k.zip.md5).
                    checksum_source="tensorflow/datasets url_checksums/movielens.txt",
                    members=("ml-100k/u.data",),
                ),
                Source(
                    "PyPI recbole==1.2.1 wheel",
                    "recbole==1.2.1",
                    kind="pip-wheel",
                    # sha256 of recbole-1.2.1-py3-none-any.whl as served by PyPI (pip also checks
                    # it against the index's own hash while downloading).
                    checksum="sha256:9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407",
                    checksum_source="computed from the PyPI wheel with pip download",
                    members=("recbole/dataset_example/ml-100k/ml-100k.inter",),
                ),
            ),
            folders=("ml-100k",),
        ),
        DatasetSpec(
            name="ml-1m",
            description="MovieLens 1M: 1,000,209 ratings (1-5) by 6,040 users on 3,706 movies",
            citation=_MOVIELENS,
            homepage="https://grouplens.org/datasets/movielens/1m/",
            files=(
                RawFile("ratings.dat", parsers.parse_ml1m, marker="::", note="GroupLens original"),
            ),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                    checksum="sha256:a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
                    # GroupLens publishes md5 c4d9eecfca2ab87c1945afe126590906 (ml-1m.zip.md5).
                    checksum_source="tensorflow/datasets url_checksums/movielens.txt",
                    members=("ml-1m/ratings.dat",),
                ),
            ),
            folders=("ml-1m",),
        ),
        DatasetSpec(
            name="lastfm-2k",
            description=(
                "HetRec 2011 Last.fm: 1,892 users, 17,632 artists; 92,834 listening counts "
                "(user_artists.dat, default) or 186,479 timestamped tag assignments"
            ),
            citation=_HETREC,
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            files=(
                RawFile(
                    "user_artists.dat", parsers.parse_lastfm_user_artists, note="weight as rating"
                ),
                RawFile(
                    "user_taggedartists-timestamps.dat",
                    parsers.parse_lastfm_tagged,
                    note="one implicit row per tag assignment (PFedRec's Lastfm-2K)",
                ),
            ),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
                    # GroupLens publishes no hash for the HetRec archives; this md5 is the one
                    # pinned by sisinflab/DataRec (datarec/datasets/lastfm/lastfm_2011.py).
                    checksum="md5:296d61afe4e8632b173fc2dd3be20ce2",
                    checksum_source="sisinflab/DataRec datarec/datasets/lastfm/lastfm_2011.py",
                    members=("user_artists.dat", "user_taggedartists-timestamps.dat"),
                ),
            ),
            folders=("lastfm-2k", "hetrec2011-lastfm-2k", "lastfm"),
        ),
        DatasetSpec(
            name="hetrec-movielens",
            description=(
                "HetRec 2011 MovieLens: 855,598 ratings (0.5-5) by 2,113 users on 10,197 movies"
            ),
            citation=_HETREC,
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            files=(RawFile("user_ratedmovies-timestamps.dat", parsers.parse_hetrec_movielens),),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-movielens-2k-v2.zip",
                    checksum=None,
                    checksum_source="no published checksum found",
                    members=("user_ratedmovies-timestamps.dat",),
                ),
            ),
            folders=("hetrec-movielens", "hetrec2011-movielens-2k-v2", "hetrec2011-movielens-2k"),
        ),
        DatasetSpec(
            name="amazon-video",
            description="Amazon Instant Video ratings (2014 ratings-only CSV, string ids)",
            citation=(
                "Ruining He and Julian McAuley. 2016. Ups and Downs: Modeling the Visual Evolution "
                "of Fashion Trends with One-Class Collaborative Filtering. WWW 2016."
            ),
            homepage="https://cseweb.ucsd.edu/~jmcauley/datasets/amazon/links.html",
            files=(RawFile("ratings_Amazon_Instant_Video.csv", parsers.parse_amazon_ratings),),
            sources=(
                Source(
                    "SNAP (McAuley 2014)",
                    "http://snap.stanford.edu/data/amazon/productGraph/categoryFiles/"
                    "ratings_Amazon_Instant_Video.csv",
                    kind="file",
                    checksum=None,
                    checksum_source="no published checksum found",
                ),
            ),
            folders=("amazon-video", "amazon"),
        ),
        DatasetSpec(
            name="tafeng",
            description="Ta Feng grocery purchases, Nov 2000 - Feb 2001 (implicit)",
            citation=(
                "Chun-Nan Hsu, Hao-Hsiang Chung and Han-Shen Huang. 2004. Mining Skewed and "
                "Sparse Transaction Data for Personalized Shopping Recommendation. Machine "
                "Learning 57."
            ),
            homepage="https://www.kaggle.com/datasets/chiranjivdas09/ta-feng-grocery-dataset",
            files=(RawFile("ta_feng_all_months_merged.csv", parsers.parse_tafeng),),
            manual_download=(
                "download ta_feng_all_months_merged.csv from "
                "https://www.kaggle.com/datasets/chiranjivdas09/ta-feng-grocery-dataset "
                "(needs a Kaggle login)"
            ),
            folders=("tafeng", "ta-feng"),
            implicit=True,
        ),
        DatasetSpec(
            name="anime",
            description=(
                "Kaggle Anime Recommendations: 7.8M ratings (1-10; -1 = watched but unrated, "
                "dropped by default) by 73,515 users on 11,200 anime"
            ),
            citation="CooperUnion. 2016. Anime Recommendations Database. Kaggle.",
            homepage="https://www.kaggle.com/datasets/CooperUnion/anime-recommendations-database",
            files=(RawFile("rating.csv", parsers.parse_anime),),
            manual_download=(
                "download rating.csv from "
                "https://www.kaggle.com/datasets/CooperUnion/anime-recommendations-database "
                "(needs a Kaggle login)"
            ),
            folders=("anime", "anime-recommendations-database"),
        ),
        DatasetSpec(
            name="book-crossing",
            description=(
                "Book-Crossing: 1,149,780 book ratings (1-10 explicit, 0 implicit) by 105,283 users"
            ),
            citation=(
                "Cai-Nicolas Ziegler, Sean M. McNee, Joseph A. Konstan and Georg Lausen. 2005. "
                "Improving Recommendation Lists Through Topic Diversification. WWW 2005."
            ),
            homepage="http://www2.informatik.uni-freiburg.de/~cziegler/BX/",
            files=(RawFile("BX-Book-Ratings.csv", parsers.parse_book_crossing),),
            sources=(
                Source(
                    "Uni Freiburg (original host, often offline)",
                    "http://www2.informatik.uni-freiburg.de/~cziegler/BX/BX-CSV-Dump.zip",
                    # The publisher gives no hash; md5 (and size 26,085,508) as pinned in
                    # PIReTship/bookdata-tools bx/dvc.lock.
                    checksum="md5:37d647ee9e18ba134ea6d78ee4fe5292",
                    checksum_source="PIReTship/bookdata-tools bx/dvc.lock",
                    members=("BX-Book-Ratings.csv",),
                ),
            ),
            folders=("book-crossing", "BX-CSV-Dump", "bx"),
        ),
    )
}


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
    return dataclasses.replace(parser(found.path, **parser_options), name=name)


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

    directory = Path(data_dir) if data_dir is not None else _env_data_dir()
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
            try:
                _fetch(spec, source, cache)
            except _SourceFailed as exc:
                failures.append(f"{source.label} ({source.url}): {exc}")
                continue
            found = _search_dir(spec, wanted, cache, failures, verify=True, nested=False)
            if found is not None:
                origin = f"{source.label} -> cache {cache}"
                return Located(found[0], found[1], origin, tuple(failures))
    elif spec.sources:
        failures.append("downloads were not allowed")
    raise FedrecError(_failure_message(spec, wanted, failures))


def _env_data_dir() -> Path | None:
    configured = os.environ.get("FEDREC_DATA")
    return Path(configured).expanduser() if configured else None


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


class _SourceFailed(Exception):
    """One source could not deliver; the message says why, for the combined error."""


def _fetch(spec: DatasetSpec, source: Source, cache: Path) -> None:
    """Put ``source.provides`` into ``cache``, complete and verified, or raise `_SourceFailed`."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as staging:
        stage = Path(staging)
        if source.kind == "pip-wheel":
            extracted = _fetch_wheel(spec, source, stage)
        else:
            extracted = _fetch_url(source, stage)
        for path in extracted:
            os.replace(path, cache / path.name)


def _fetch_url(source: Source, stage: Path) -> list[Path]:
    """Download with pooch (hash-checked, atomic) into ``stage``; unzip the members."""
    import pooch
    import requests

    fname = source.url.rsplit("/", 1)[-1]
    processor = pooch.Unzip(members=list(source.members)) if source.kind == "zip" else None
    downloader = _downloader()
    try:
        with _quiet_pooch():
            result = pooch.retrieve(
                source.url,
                known_hash=source.checksum,
                fname=fname,
                path=stage,
                processor=processor,
                downloader=downloader,
            )
    except requests.exceptions.RequestException as exc:
        raise _SourceFailed(_describe_request_error(exc, source.url)) from None
    except ValueError as exc:
        if "hash" in str(exc).lower():
            raise _SourceFailed(f"checksum mismatch: {_short(exc)}") from None
        raise _SourceFailed(_short(exc)) from None
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        raise _SourceFailed(f"cannot unpack: {_short(exc)}") from None
    if processor is None:
        return [Path(result)]
    paths = [Path(p) for p in result]
    out = []
    for member in source.members:
        base = member.rsplit("/", 1)[-1]
        matches = [p for p in paths if p.as_posix().endswith("/" + member)]
        if not matches:
            raise _SourceFailed(f"archive has no member {member}")
        staged = stage / base
        os.replace(matches[0], staged)
        out.append(staged)
    return out


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
        raise _SourceFailed(f"pip download failed: {_short(exc)}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise _SourceFailed(
            f"pip download failed: {tail[-1] if tail else f'exit {done.returncode}'}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise _SourceFailed("pip download produced no wheel")
    return wheels[0]


def _fetch_wheel(spec: DatasetSpec, source: Source, stage: Path) -> list[Path]:
    """Mirror: a PyPI wheel that ships the raw file; checked, then members extracted."""
    wheel_dir = stage / "wheel"
    wheel_dir.mkdir()
    wheel = pip_download(source.url, wheel_dir)
    if source.checksum is not None:
        _check_hash(wheel, source.checksum, f"wheel {wheel.name}")
    spec_files = {raw.name: raw for raw in spec.files}
    out = []
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in source.members:
                base = member.rsplit("/", 1)[-1]
                staged = stage / base
                try:
                    with archive.open(member) as src, staged.open("wb") as dst:
                        shutil.copyfileobj(src, dst)
                except KeyError:
                    raise _SourceFailed(f"wheel {wheel.name} has no member {member}") from None
                raw = spec_files.get(base)
                if raw is not None and raw.sha256 is not None:
                    _check_hash(staged, f"sha256:{raw.sha256}", f"{member} in {wheel.name}")
                out.append(staged)
    except zipfile.BadZipFile as exc:
        raise _SourceFailed(f"wheel {wheel.name} is not a zip file: {exc}") from None
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
        raise _SourceFailed(
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
