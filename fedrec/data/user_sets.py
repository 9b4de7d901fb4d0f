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
        if entry.sep == "":  # as `--sep` refuses one (`separator`)
            raise FedrecError(f"{where}: sep must be one or more characters (or absent), not ''")
        check_threshold(entry.implicit_threshold, where)
        counts = (entry.rows, entry.users, entry.items)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise FedrecError(f"{where}: rows, users and items are whole numbers")
        parse_columns(entry.columns)
        return entry

    @property
    def identity(self) -> dict[str, Any]:
        """What shapes a run's figures: how the file is read and what it holds, not where it is
        (a run moved to another machine with the same file keeps its results' keys)."""
        return {"columns": self.columns, "sep": self.sep, "implicit_threshold": self.implicit_threshold,
                "sha256": self.sha256}


def check_threshold(value: Any, where: str) -> None:
    """An implicit threshold is a number or None (not a flag, not text)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                              or value != value):
        raise FedrecError(f"{where}: implicit_threshold must be a number, not {value!r}")


def separator(text: str | None) -> str | None:
    """``--sep`` as typed: ``\\t`` or ``tab`` is a tab (a shell passes the two characters)."""
    if text is None:
        return None
    if not isinstance(text, str) or not text:
        raise FedrecError(f"--sep must be one or more characters, not {text!r}")
    return "\t" if text in ("\\t", "tab", "TAB") else text


def looks_like_a_file(dataset: str) -> bool:
    """Whether ``-d`` names a file of one's own (a path, or a name with a table's suffix)."""
    return "/" in dataset or Path(dataset).suffix.lower() in FILE_SUFFIXES


def has_clock(dataset: str, columns: str | None = None, user_data: dict[str, Any] | None = None) -> bool:
    """Whether the events of ``dataset`` carry their times, told from the run's options alone:
    a file's ``columns`` (or a registered or declared entry's) name a time column, or the
    built-in data set's raw files have one (`fedrec.data.sources.DatasetSpec.clock`)."""
    from fedrec.data.catalogue import REGISTRY

    if columns is not None or looks_like_a_file(dataset):
        return columns is not None and "time" in parse_columns(columns)
    if isinstance(user_data, dict) and isinstance(user_data.get("columns"), str):
        return "time" in parse_columns(user_data["columns"])
    if dataset in REGISTRY:
        return REGISTRY[dataset].clock
    entry = get(dataset) if not dataset.startswith("synthetic") else None
    return entry is None or "time" in parse_columns(entry.columns)


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
    found = {}
    for name, entry in blob["datasets"].items():
        try:
            check_name(name)  # a hand-edited entry must not take a built-in name
        except FedrecError as e:
            raise FedrecError(f"{path}: {e}; rename or remove that entry") from None
        found[name] = UserDataset.from_dict(entry, f"{path}: {name}")
    return found


def get(name: str) -> UserDataset | None:
    return entries().get(name)


def _write(found: dict[str, UserDataset]) -> None:
    from fedrec.files import atomic_write, check_writable

    text = json.dumps({"format": FORMAT, "datasets": {k: v.to_dict() for k, v in sorted(found.items())}},
                      indent=2)

    def write(tmp: str) -> None:
        Path(tmp).write_text(text + "\n", encoding="utf-8")

    catalogue = check_writable(catalogue_file(), "the catalogue")  # one line where it cannot be (FEDREC_HOME)
    atomic_write(catalogue, write)


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

    check_threshold(implicit_threshold, "--implicit-threshold")
    sep = separator(sep)
    file = Path(path).expanduser()
    data = read(file, columns, sep)
    if implicit_threshold is not None and "rating" not in parse_columns(columns):
        raise FedrecError(f"--implicit-threshold {implicit_threshold:g} keeps ratings at or above it, and "
                          f"--columns {columns!r} names no rating column")
    if implicit_threshold is not None and not (data.ratings >= implicit_threshold).any():
        raise FedrecError(f"--implicit-threshold {implicit_threshold:g} keeps no interaction: the file's ratings "
                          f"are at most {float(data.ratings.max()):g}")
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
    from fedrec.data.catalogue import REGISTRY

    if twin := next((known for known in [*REGISTRY, *found] if known.lower() == name.lower() and known != name), None):
        # one results file name for both on a file system that ignores case (macOS, Windows)
        raise FedrecError(f"'{name}' differs only in case from the data set '{twin}'; choose another name")
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
    if not found:
        raise FedrecError(f"no data set is registered, so none named '{name}' (`fedrec data add` registers one)")
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
                                                  "sha256": digest, "content": data.content_digest(),
                                                  "columns": entry.columns})
