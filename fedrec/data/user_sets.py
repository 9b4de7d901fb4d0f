"""A user's own data sets: files registered once by name (`fedrec data add`), then usable as
``-d NAME`` wherever a data set is (run, tune, bench, compare, flower, data stats, the API).

The catalogue is one JSON file, ``datasets.json`` in fedrec's user data folder (``FEDREC_HOME``,
else the platform's user data directory). Each entry records what is needed to read the file
again exactly: its absolute path, which columns hold the user, item, rating and time, the
separator, an optional implicit threshold, and the sha256 and row count it had when it was
added. Reading an entry checks the sha256 first, so a file edited since is one clear error, not
a silently different result under the same name.

A bench or compare file can declare such an entry inline (``[datasets.NAME]``); it then travels
inside each run's `fedrec.experiment.RunConfig` (``user_data``), so worker processes and
Flower nodes need no catalogue of their own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields
from datetime import date
from pathlib import Path
from typing import Any

from fedrec.data.interactions import Interactions
from fedrec.data.tables import ROLES, parse_columns  # noqa: F401  (the columns of an entry)
from fedrec.errors import FedrecError

FORMAT = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: suffixes that make ``-d`` read its value as a file path (`fedrec.experiment`)
FILE_SUFFIXES = (".csv", ".tsv", ".txt", ".dat", ".parquet", ".pq", ".inter", ".tab")


@dataclass(frozen=True)
class UserDataset:
    """One registered file: how to read it, and what it held when it was registered."""

    name: str
    path: str
    columns: str
    sep: str | None = None
    implicit_threshold: float | None = None
    sha256: str = ""
    rows: int = 0
    users: int = 0
    items: int = 0
    added: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(blob: Any, where: str) -> UserDataset:
        """An entry as JSON holds it; anything else is one error naming ``where``."""
        known = {f.name for f in fields(UserDataset)}
        if not isinstance(blob, dict) or set(blob) - known or not {"name", "path", "columns"} <= set(blob):
            raise FedrecError(f"{where}: not a data set entry (it needs name, path, columns; "
                              f"may have {', '.join(sorted(known - {'name', 'path', 'columns'}))})")
        entry = UserDataset(**blob)
        texts = [entry.name, entry.path, entry.columns, entry.sha256, entry.added]
        if not all(isinstance(v, str) for v in texts) or not (entry.sep is None or isinstance(entry.sep, str)):
            raise FedrecError(f"{where}: name, path, columns, sep, sha256 and added are text")
        if entry.implicit_threshold is not None and (
                isinstance(entry.implicit_threshold, bool) or not isinstance(entry.implicit_threshold, int | float)):
            raise FedrecError(f"{where}: implicit_threshold must be a number, not {entry.implicit_threshold!r}")
        parse_columns(entry.columns)
        return entry

    @property
    def identity(self) -> dict[str, Any]:
        """What shapes a run's figures: how the file is read and what it holds, not where it is
        (a run moved to another machine with the same file keeps its results' keys)."""
        return {"columns": self.columns, "sep": self.sep, "implicit_threshold": self.implicit_threshold,
                "sha256": self.sha256}


def home() -> Path:
    """fedrec's user data folder: ``FEDREC_HOME`` if set, else the platform's."""
    configured = os.environ.get("FEDREC_HOME")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("fedrec"))


def catalogue_file() -> Path:
    return home() / "datasets.json"


def entries() -> dict[str, UserDataset]:
    """The registered data sets by name (none when nothing was ever added)."""
    path = catalogue_file()
    if not path.exists():
        return {}
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedrecError(f"{path}: the catalogue of your data sets cannot be read ({e}); "
                          "fix or delete it") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT or not isinstance(blob.get("datasets"), dict):
        raise FedrecError(f"{path}: not a fedrec data set catalogue (format {FORMAT}); fix or delete it")
    return {name: UserDataset.from_dict(entry, f"{path}: {name}") for name, entry in blob["datasets"].items()}


def get(name: str) -> UserDataset | None:
    return entries().get(name)


def _write(found: dict[str, UserDataset]) -> None:
    from fedrec.files import atomic_write

    text = json.dumps({"format": FORMAT, "datasets": {k: v.to_dict() for k, v in sorted(found.items())}},
                      indent=2)

    def write(tmp: str) -> None:
        Path(tmp).write_text(text + "\n", encoding="utf-8")

    atomic_write(catalogue_file(), write)


def read(path: str | Path, columns: str, sep: str | None = None) -> Interactions:
    """The file at ``path`` read with ``columns`` (`parse_columns`) and ``sep`` (default from the
    suffix: comma for .csv, tab for .tsv/.txt/.dat). Without a time column the data have no
    clock (``Interactions.clock`` False)."""
    from fedrec.data.tables import read_table

    roles = parse_columns(columns)
    positions = all(isinstance(c, int) for c in roles.values())
    return read_table(path, roles["user"], roles["item"], roles.get("rating"), roles.get("time"),
                      sep=sep, header=not positions)


def check_name(name: str) -> None:
    """A new entry's name must be free: not built in, not ``synthetic``, not read as a file."""
    from fedrec.data.catalogue import REGISTRY

    if not _NAME.match(name):
        raise FedrecError(f"data set name {name!r}: use letters, digits, '.', '_' and '-' "
                          "(at most 64, starting with a letter or digit)")
    if name in REGISTRY:
        raise FedrecError(f"'{name}' is a built-in data set (`fedrec data list`); choose another name")
    if name.split(":")[0] == "synthetic" or name.startswith("synthetic"):
        raise FedrecError(f"'{name}': names starting with 'synthetic' are the generator's")
    if Path(name).suffix.lower() in FILE_SUFFIXES:
        raise FedrecError(f"'{name}' ends like a file name ({Path(name).suffix}), so -d would read it as "
                          "a path; choose a name without it")


def describe(path: str | Path, columns: str, sep: str | None = None,
             implicit_threshold: float | None = None, name: str = "") -> UserDataset:
    """Read the file once (every line checked) and describe it as an entry named ``name``."""
    from fedrec.data.fetch import sha256_of

    if implicit_threshold is not None and not float(implicit_threshold) == float(implicit_threshold):
        raise FedrecError("--implicit-threshold must be a number")
    file = Path(path).expanduser()
    data = read(file, columns, sep)
    if implicit_threshold is not None and "rating" not in parse_columns(columns):
        raise FedrecError(f"--implicit-threshold {implicit_threshold:g} keeps ratings at or above it, and "
                          f"--columns {columns!r} names no rating column")
    return UserDataset(name=name, path=str(file.resolve()), columns=columns, sep=sep,
                       implicit_threshold=None if implicit_threshold is None else float(implicit_threshold),
                       sha256=sha256_of(file), rows=len(data), users=data.n_users, items=data.n_items,
                       added=date.today().isoformat())


def add(name: str, path: str | Path, columns: str, sep: str | None = None,
        implicit_threshold: float | None = None, overwrite: bool = False) -> UserDataset:
    """Register the file at ``path`` as ``name`` (it is read once, every line checked, before
    anything is written); an existing name is replaced only with ``overwrite``."""
    check_name(name)
    found = entries()
    if name in found and not overwrite:
        raise FedrecError(f"data set '{name}' is already registered ({found[name].path}); pass --overwrite "
                          "to replace it, or `fedrec data remove` it first")
    entry = describe(path, columns, sep, implicit_threshold, name)
    found[name] = entry
    _write(found)
    return entry


def remove(name: str) -> UserDataset:
    """Forget ``name`` (the file itself is left alone)."""
    found = entries()
    if name not in found:
        from fedrec.errors import UnknownNameError

        raise UnknownNameError("registered data set", name, list(found))
    entry = found.pop(name)
    _write(found)
    return entry


def check_unchanged(entry: UserDataset) -> str:
    """The sha256 of the entry's file, once it is checked to be the one registered; one line
    that says what to do if the file is gone or changed."""
    from fedrec.data.fetch import sha256_of

    file = Path(entry.path)
    again = (f"add it again: fedrec data add {entry.name} FILE --columns {entry.columns}"
             f"{' --sep ' + repr(entry.sep) if entry.sep else ''} --overwrite")
    if not file.is_file():
        raise FedrecError(f"data set '{entry.name}': {file} is gone (it was registered from there); {again}")
    digest = sha256_of(file)
    if entry.sha256 and digest != entry.sha256:
        raise FedrecError(f"data set '{entry.name}': {file} changed since it was registered on {entry.added} "
                          f"(sha256 {entry.sha256[:12]}…, now {digest[:12]}…), so results under this name "
                          f"would not be comparable; if the change is meant, {again.replace('FILE', str(file))}")
    return digest


def load(entry: UserDataset) -> Interactions:
    """The entry's file read as it was registered, once its sha256 is checked to be the same."""
    from dataclasses import replace

    digest = check_unchanged(entry)
    file = Path(entry.path)
    data = read(file, entry.columns, entry.sep)
    return replace(data, name=entry.name, source={"file": str(file), "origin": f"registered data set '{entry.name}'",
                                                  "sha256": digest, "columns": entry.columns})
