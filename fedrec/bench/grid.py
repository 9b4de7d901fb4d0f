"""The benchmark grid of `fedrec bench`: algorithms × data sets × protocols × negative policies ×
seeds, from one TOML file, each cell one run cached under its full config.

A cell's results JSON is stored as ``OUT/cells/<key>.json``, ``key`` a hash of everything that
shapes its figures (the `RunConfig`, with the data folder left out), written atomically when
the run ends. So a rerun does only the missing cells, a killed grid resumes where it stopped
(the cells that were running start again, or go on from their last checkpoint with
``checkpoint_every``), and changing any option makes new cells rather than reusing stale
ones. The key holds the model options a grid sets, not their defaults (an option added with
the old behaviour as its default keeps every cell); a cell whose results file records a model
option that now resolves otherwise (a changed default) is *outdated*: it is run again, and
until then the boards leave it out and say why (`outdated`). Cells run in worker processes,
one PyTorch thread each.

The file::

    [grid]
    algorithms = ["fedmf", "pfedrec"]
    datasets = ["ml-100k", "lastfm-2k"]
    protocols = ["loo-sampled", "loo-full"]   # sampled and full ranking
    negatives = ["leak-free"]
    seeds = [0, 1, 2, 3, 4]
    rounds = 100            # optional: every cell's rounds (epochs)
    workers = 2             # optional: parallel processes (default: CPUs)
    device = "auto"         # optional: cpu, cuda, or auto (cuda when PyTorch sees one)
    data_dir = "data"       # optional
    checkpoint_every = 10   # optional: a cell saves itself every N rounds (epochs) to
                            # OUT/cells/<key>.ckpt, so a killed grid loses at most N of each

    label = "defaults"      # optional: shown after each method's name on boards, "pfedrec (defaults)"
    settings = "paper"      # optional: each method's paper setting (item-row rule, rates per data
                            # set, fixed budget: as `fedrec reproduce`) instead of fedrec's defaults

    [tuned]                 # optional: `fedrec tune` configs, by "ALGO" or "ALGO@DATASET"
    "pfedrec@lastfm-2k" = "configs/pfedrec-lastfm-2k.json"

    [join]                  # optional: other grids' finished cells on this grid's boards
    "other-grid.toml" = "results/other-grid"   # bench file = the folder its cells are in

    [datasets.mine]         # optional: a data set of your own, used as "mine" in grid.datasets
    path = "data/my.csv"
    columns = "user,item,rating,time"   # as `fedrec data add --columns`
    sep = ","               # optional (default from the suffix)
    implicit_threshold = 4  # optional

A name in ``datasets`` may also be one registered with `fedrec data add`. Either way each cell
carries the file's description (`fedrec.data.user_sets`), and its key holds the file's sha256
rather than its path: an edited file makes new cells, a moved one keeps them. A built-in data
set's cells are keyed without where its copy lives (``data_dir``, or where fedrec finds it), so
each run records the content digest of the events it read (`Interactions.content_digest`, the
same for a copy in another format); before a grid runs, a cell whose results were read from
other events than the copy it would read now is set aside (`set_aside_other_data`) and run
again. Results written before runs recorded the digest are kept as they are.

Paths are relative to the bench file. A joined grid's cells are never run from here (it may have
run on a GPU machine, or under another budget): its finished cells become rows of the boards,
paired seed by seed with the rest, and its missing ones are listed under them. That is how a board
gathers rows that ran at different times and places without copying result files; a grid's own
``label`` keeps its rows apart from a joined grid's rows of the same algorithm. Joins do not
chain: a joined grid's own ``[join]`` is not read. Its cells are checked against the board's
other rows rather than against the data (`board_cells`): one read from other events is listed,
not shown.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedrec.errors import FedrecError
from fedrec.results import known_contents, read_content, set_aside_files, set_aside_other_events

if TYPE_CHECKING:
    from fedrec.progress import RoundNote

GRID_KEYS = {"algorithms", "datasets", "protocols", "negatives", "seeds", "rounds", "workers", "data_dir", "device",
             "checkpoint_every", "label", "settings", "ks"}
#: ``settings``: fedrec's defaults, or each algorithm's paper setting (`fedrec.experiment.federated_config`)
SETTINGS = ("defaults", "paper")
TABLES = ("grid", "tuned", "join", "datasets")
DATASET_KEYS = {"path", "columns", "sep", "implicit_threshold"}


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    algorithm: str
    dataset: str
    protocol: str
    negatives: str
    seed: int
    rounds: int | None
    engine: tuple[tuple[str, Any], ...] = ()  # from a tuned config
    model: tuple[tuple[str, Any], ...] = ()
    device: str = "cpu"
    #: a user's data set as JSON (`fedrec.data.user_sets.UserDataset`), "" for the others
    user_data: str = ""
    #: the paper's setting instead of fedrec's defaults (``settings = "paper"``; the key is the
    #: config it resolves to, so it needs no place of its own there)
    paper: bool = False
    #: further cut-offs of the ranking metrics (``ks = [20]``, `fedrec run --ks`)
    ks: tuple[int, ...] = ()

    def run_config(self, data_dir: str | None) -> Any:
        from fedrec.algorithms import get_algorithm
        from fedrec.experiment import RunConfig, federated_config
        from fedrec.train.centralised import TrainConfig

        spec = get_algorithm(self.algorithm)
        cfg = RunConfig(algorithm=self.algorithm, dataset=self.dataset, protocol=self.protocol, seed=self.seed,
                        negatives=self.negatives, data_dir=data_dir, model=dict(self.model),
                        user_data=json.loads(self.user_data) if self.user_data else None, ks=self.ks)
        engine = dict(self.engine)
        if spec.kind == "federated":
            cfg.federated = federated_config(self.algorithm, self.dataset, self.protocol, paper=self.paper,
                                             rounds=self.rounds, device=self.device, **engine)
        else:
            lr = engine.pop("lr", spec.lr or TrainConfig().lr)
            cfg.train = TrainConfig(epochs=self.rounds or 100, lr=lr, device=self.device, **engine)
        return cfg

    def key(self) -> str:
        """A hash of the run's whole config, less where the data live (and less the options that
        change nothing, `FederatedConfig.identity`)."""
        from fedrec.experiment import RunConfig
        from fedrec.federated.engine import FederatedConfig

        blob = RunConfig.identity(dataclasses.asdict(self.run_config(None)))
        blob.pop("data_dir")
        blob["federated"] = FederatedConfig.identity(blob["federated"])
        text = json.dumps(blob, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class Grid:
    """A parsed bench file."""

    cells: list[Cell]
    workers: int
    data_dir: str | None
    checkpoint_every: int = 0  # how often a cell saves itself (not part of its key)
    label: str = ""  # shown after each method's name on boards (not part of a cell's key)
    #: grids whose finished cells join this one's boards: (name, grid, the folder of its cells)
    joined: list[tuple[str, Grid, Path]] = dataclasses.field(default_factory=list)


def load_grid(path: str | Path, *, check_device: bool = True, join: bool = True) -> Grid:
    """Parse and check a bench file (unknown keys, algorithms, protocols and policies are one
    clear error each, before anything runs). ``check_device`` False keeps a named device this
    machine lacks, to report cells a GPU machine ran (``auto`` is always this machine's).
    ``join`` False leaves its ``[join]`` unread (a joined grid's own)."""
    from fedrec.algorithms import get_algorithm
    from fedrec.experiment import check_seed
    from fedrec.protocols.protocol import check_cutoffs, get_protocol, negative_policy, with_cutoffs
    from fedrec.tune import read_config

    p = Path(path)
    try:
        blob = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: TOML's errors, and a file that is not UTF-8
        raise FedrecError(f"{p}: not a readable bench file ({e})") from None
    grid = blob.get("grid")
    if not isinstance(grid, dict):
        raise FedrecError(f"{p}: no [grid] table")
    for table in ("tuned", "join", "datasets"):
        if not isinstance(blob.get(table, {}), dict):
            raise FedrecError(f"{p}: {table} must be a table ([{table}]), not {blob[table]!r}")
    unknown = sorted(set(grid) - GRID_KEYS) + sorted(set(blob) - set(TABLES))
    if unknown:
        raise FedrecError(f"{p}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(GRID_KEYS))}, "
                          "[tuned], [join], [datasets.NAME]")
    label = grid.get("label", "")
    if not isinstance(label, str):
        raise FedrecError(f"{p}: grid.label must be text, not {label!r}")
    settings = grid.get("settings", "defaults")
    if settings not in SETTINGS:
        raise FedrecError(f"{p}: grid.settings must be one of {', '.join(SETTINGS)}, not {settings!r}")
    lists = {}
    for key in ("algorithms", "datasets", "protocols", "negatives", "seeds"):
        value = grid.get(key, ["leak-free"] if key == "negatives" else None)
        if not isinstance(value, list) or not value:
            raise FedrecError(f"{p}: grid.{key} must be a non-empty list")
        if key != "seeds" and not all(isinstance(v, str) for v in value):  # seeds: whole numbers, below
            raise FedrecError(f"{p}: grid.{key} must list names (text), not {value!r}")
        lists[key] = value
    ks = check_cutoffs(grid.get("ks", []), f"{p}: grid.ks")
    try:
        for name in lists["algorithms"]:
            get_algorithm(name)
        for name in lists["protocols"]:
            with_cutoffs(get_protocol(name), ks, "grid.ks")
    except FedrecError as e:  # which file says it
        raise FedrecError(f"{p}: {e}") from None
    try:
        lists["negatives"] = [negative_policy(name) for name in lists["negatives"]]  # aliases by their names
        for seed in lists["seeds"]:
            check_seed(seed, "grid.seeds")
    except FedrecError as e:
        raise FedrecError(f"{p}: {e}") from None
    for key, value in lists.items():
        repeated = sorted({str(v) for v in value if value.count(v) > 1})
        if repeated:  # each would be a second cell of the same run
            raise FedrecError(f"{p}: grid.{key} names {', '.join(repeated)} more than once")
    if grid.get("data_dir") is not None and check_device:  # about to run: one line now, not one a cell
        from fedrec.data.registry import data_directory

        try:
            data_directory(str(grid["data_dir"]))  # as the cells read it: from where bench runs
        except FedrecError as e:
            raise FedrecError(f"{p}: grid.data_dir: {e}") from None
    whole = [(k, grid[k]) for k in ("rounds", "workers", "checkpoint_every") if k in grid]
    for key, value in whole:
        least = 0 if key == "checkpoint_every" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise FedrecError(f"{p}: grid.{key} must hold whole numbers >= {least}, not {value!r}")
    # a relative path is relative to the bench file (an absolute one stays as it is)
    configs = {str(k): read_config(p.parent / str(v)) for k, v in blob.get("tuned", {}).items()}
    rounds = grid.get("rounds")
    from fedrec.core.device import parse, resolve

    device = str(grid.get("device", "auto"))
    try:
        device = resolve(device) if check_device or device == "auto" else parse(device)
    except FedrecError as e:
        raise FedrecError(f"{p}: grid.device: {e}") from None
    own = user_data_sets(p, blob.get("datasets", {}), lists["datasets"], check_files=check_device)
    cells = []
    for algorithm in lists["algorithms"]:
        for dataset in lists["datasets"]:
            config = configs.get(f"{algorithm}@{dataset}") or configs.get(algorithm)
            if config is not None and config["algorithm"] != algorithm:
                raise FedrecError(f"{p}: the tuned config for {algorithm} was tuned for {config['algorithm']}")
            engine = dict(config["engine"]) if config else {}
            cell_rounds = rounds if rounds is not None else engine.get("rounds")
            engine.pop("rounds", None)
            model = tuple(sorted(config["model"].items())) if config else ()
            for protocol in lists["protocols"]:
                for negatives in lists["negatives"]:
                    for seed in lists["seeds"]:
                        cells.append(Cell(algorithm, dataset, protocol, negatives, seed, cell_rounds,
                                          tuple(sorted(engine.items())), model, device, own.get(dataset, ""),
                                          settings == "paper", ks))
    joined = []
    for name, folder in (blob.get("join", {}) if join else {}).items():
        if not isinstance(folder, str):
            raise FedrecError(f"{p}: join.\"{name}\" must be the folder its cells are in, not {folder!r}")
        if not (p.parent / folder).is_dir():  # a mistyped folder would list every cell as "not run"
            raise FedrecError(f"{p}: join.\"{name}\": {p.parent / folder} is not a folder of results")
        try:
            other = load_grid(p.parent / name, check_device=False, join=False)
        except FedrecError as e:
            raise FedrecError(f"{p}: join.\"{name}\": {e}") from None
        joined.append((name, other, p.parent / folder))
    return Grid(cells, grid.get("workers", os.cpu_count() or 1), grid.get("data_dir"),
                grid.get("checkpoint_every", 0), label, joined)


def user_data_sets(bench: Path, declared: Any, names: list[Any], check_files: bool = True) -> dict[str, str]:
    """The user data sets among ``names``, each as the JSON a `Cell` carries: those declared in
    the bench file's ``[datasets.NAME]`` tables (a relative path is relative to the bench file;
    each file is read once here, so a bad one is an error before any cell runs) and those
    registered with `fedrec data add` (their file checked against its recorded sha256 when
    ``check_files``: a grid that only reports reads no data). A name that is neither these nor
    built in nor synthetic is one error, before any cell runs."""
    from fedrec.data import user_sets
    from fedrec.data.catalogue import REGISTRY

    if not isinstance(declared, dict):
        raise FedrecError(f"{bench}: [datasets] must hold tables [datasets.NAME]")
    found: dict[str, str] = {}
    for name, table in declared.items():
        where = f"{bench}: datasets.{name}"
        if not isinstance(table, dict):
            raise FedrecError(f"{where} must be a table with path and columns")
        unknown = sorted(set(table) - DATASET_KEYS)
        if unknown or not {"path", "columns"} <= set(table):
            raise FedrecError(f"{where}: needs path and columns, may have sep and implicit_threshold"
                              + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
        if name not in names:
            raise FedrecError(f"{where} is declared but not in grid.datasets")
        texts = [table["path"], table["columns"], table.get("sep", "")]
        try:
            if not all(isinstance(v, str) for v in texts):
                raise FedrecError("path, columns and sep are text")
            user_sets.check_name(name)
            entry = user_sets.describe(bench.parent / table["path"], table["columns"], table.get("sep"),
                                       table.get("implicit_threshold"), name)
        except FedrecError as e:
            raise FedrecError(f"{where}: {e}") from None
        found[name] = json.dumps(entry.to_dict(), sort_keys=True)
    for name in names:
        if name in found or name in REGISTRY or str(name).startswith("synthetic"):
            continue
        entry = user_sets.get(str(name))
        if entry is None:
            from fedrec.errors import UnknownNameError

            unknown = UnknownNameError("data set", str(name), [*REGISTRY, *user_sets.entries()])
            raise FedrecError(f"{bench}: grid.datasets: {unknown}; or declare it in [datasets.{name}], or register "
                              "it with fedrec data add")
        if check_files:
            user_sets.check_unchanged(entry)
        found[str(name)] = json.dumps(entry.to_dict(), sort_keys=True)
    return found


def cell_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.key()}.json"


def failure_path(out: Path, cell: Cell) -> Path:
    """Where a cell that failed keeps its reason (a resume tries it again; the leaderboard
    names it, so a row with fewer seeds says why)."""
    return out / "cells" / f"{cell.key()}.failed"


def run_grid(grid: Grid, out: str | Path, *, on_cell: Callable[[Cell, str], None] | None = None,
             on_progress: Callable[[Cell, RoundNote], None] | None = None) -> dict[str, int]:
    """Run the cells of ``grid`` that ``out`` lacks; ``on_cell(cell, state)`` reports each one
    (``cached``, ``done``, ``diverged in round R`` or ``failed: reason``), ``on_progress(cell,
    note)`` each round (epoch) a running cell ends. Returns the counts of each state. A cell
    that diverged keeps its results file (status ``diverged``) and the grid goes on; the boards
    show it as diverged and leave it out of their figures."""
    from fedrec.files import no_empty_folders

    out = Path(out)
    with no_empty_folders(out / "cells"):  # a grid stopped before its first cell ended (Ctrl-C, a bad worker)
        (out / "cells").mkdir(parents=True, exist_ok=True)
        return _run_cells(grid, out, on_cell, on_progress)


def _run_cells(grid: Grid, out: Path, on_cell: Callable[[Cell, str], None] | None,
               on_progress: Callable[[Cell, RoundNote], None] | None) -> dict[str, int]:
    from fedrec.pool import run_files

    counts = {"cached": 0, "done": 0, "diverged": 0, "failed": 0,
              "set aside": set_aside_other_data(grid, out, data_digests(grid, out))}
    todo = []
    for cell in grid.cells:
        if current_result(out, cell)[0] is not None:
            counts["cached"] += 1
            if on_cell is not None:
                on_cell(cell, "cached")
        else:  # not run, failed, or outdated: its file is replaced when the run ends
            todo.append(cell)
    if not todo:
        return counts
    jobs = [(cell.run_config(grid.data_dir), cell_path(out, cell)) for cell in todo]

    def on_note(note: RoundNote) -> None:
        if on_progress is not None:
            on_progress(todo[note.job], note)

    notes = on_note if on_progress is not None else None
    for i, reason in run_files(jobs, grid.workers, grid.checkpoint_every, on_round=notes):
        cell = todo[i]
        at = diverged_at(out, cell) if reason is not None else None
        if reason is None or at is not None:
            # a diverged cell is a result (its JSON says so): cached like a finished one, and
            # its checkpoint, which would only diverge again, is not kept
            state = "done" if at is None else f"diverged in round {at}"
            failure_path(out, cell).unlink(missing_ok=True)
            cell_path(out, cell).with_suffix(".ckpt").unlink(missing_ok=True)
        else:
            state = f"failed: {reason}"
            failure_path(out, cell).write_text(state + "\n")
        counts["done" if state == "done" else "diverged" if at is not None else "failed"] += 1
        if on_cell is not None:
            on_cell(cell, state)
    return counts


def outdated(cell: Cell, result: dict[str, Any]) -> str | None:
    """Why ``result`` (a results file under ``cell``'s key) is no longer ``cell``'s run: the model
    options it records that ``cell``'s options now resolve to other values, as ``name then -> now``
    (a default changed since it ran, `AlgorithmSpec.changed_options`). None when it is current."""
    from fedrec.algorithms import get_algorithm

    try:
        changes = get_algorithm(cell.algorithm).changed_options(dict(cell.model), result.get("config", {}).get("model"))
    except FedrecError:  # options the algorithm no longer takes: the cell fails on its own when run
        return None
    changed = [f"{k} {then!r} -> {now!r}" for k, (then, now) in changes.items()]
    return f"outdated: its run had {', '.join(changed)} (a default changed since)" if changed else None


def data_digests(grid: Grid, out: Path) -> dict[str, str]:
    """The content digest of each built-in data set read by a cell of ``grid`` that has results
    in ``out`` (current or set aside), each read once from the grid's ``data_dir`` (or where
    fedrec finds it without downloading; hashed, not parsed, when its bytes are those the
    results record). A cell's key leaves out where its data live, so that
    a moved copy keeps its cells; this is what tells a copy with other events from a copy in
    another format. A data set not at hand is left out (its cells are not checked, and run or
    fail as they would); a user's data set needs none: its key holds its file's sha256."""
    from fedrec.data.catalogue import REGISTRY
    from fedrec.data.registry import content_at_hand

    cached: dict[str, list[Path]] = {}
    for cell in grid.cells:
        path = cell_path(out, cell)
        if cell.dataset in REGISTRY and not cell.user_data and (path.exists() or set_aside_files(path)):
            cached.setdefault(cell.dataset, []).append(path)
    found = {name: content_at_hand(name, grid.data_dir,  # a copy of the bytes the results record is not parsed
                                   known_contents(json.loads(p.read_text()) for p in paths if p.exists()))
             for name, paths in sorted(cached.items())}
    return {name: digest for name, digest in found.items() if digest is not None}


def set_aside_other_data(grid: Grid, out: Path, digests: dict[str, str]) -> int:
    """Set aside the results file of each cell of ``grid`` whose run read other events than
    ``digests`` (`data_digests`) say its data set holds now (`fedrec.results.set_aside_other_events`):
    the cell runs again, the boards (which read no data) never show the old figures, and the
    file is kept, counted among the files that belong to no cell (`stale_cells`). A cell
    without results whose set-aside results were read from the events its data set holds now
    gets them back. Returns how many were set aside."""
    moved = 0
    for cell in grid.cells:
        now = digests.get(cell.dataset)
        if now is not None and set_aside_other_events(cell_path(out, cell), now)[0] is not None:
            moved += 1
    return moved


def current_result(out: Path, cell: Cell) -> tuple[dict[str, Any] | None, str | None]:
    """``cell``'s results in ``out`` and None, or None and why it has none that is current:
    the reason its last run failed (an `outdated` result's rerun included), why its results are
    `outdated`, or ``not run``."""
    path, failed = cell_path(out, cell), failure_path(out, cell)
    why = None
    if path.exists():
        result = json.loads(path.read_text())
        why = outdated(cell, result)
        if why is None:
            return result, None
    if failed.exists():
        return None, failed.read_text().strip()
    return None, why or "not run"


def diverged_at(out: Path, cell: Cell) -> int | None:
    """The round ``cell``'s run diverged in, where its results file says it did (`fedrec.experiment.train`
    writes a diverged run's results before it raises)."""
    from fedrec.results import diverged, load_result

    path = cell_path(out, cell)
    if not path.exists():
        return None
    result = load_result(path)
    return int(result.get("diverged_at") or 0) if diverged(result) else None


def _read_cells(grid: Grid, out: str | Path) -> tuple[list[tuple[Cell, dict[str, Any]]], list[tuple[Cell, str]]]:
    """One pass over ``grid``'s cells in ``out``: each cell with a current result and that result
    (with the grid's ``label``, when it has one: the boards name rows by it), and the cells
    without one, each with why (`current_result`)."""
    found, missing = [], []
    for cell in grid.cells:
        result, why = current_result(Path(out), cell)
        if result is None:
            missing.append((cell, why))
        else:
            found.append((cell, {**result, **({"label": grid.label} if grid.label else {})}))
    return found, missing


def missing_cells(grid: Grid, out: str | Path) -> list[tuple[Cell, str]]:
    """The cells of ``grid`` without a current result in ``out``, each with why: the reason it
    failed (``failed: ...``), ``not run``, or why its result is `outdated`."""
    return _read_cells(grid, out)[1]


def stale_cells(grid: Grid, out: str | Path) -> list[Path]:
    """Result files in ``out`` that belong to no cell of ``grid``: cells of an earlier version of
    it (a re-tuned config, a changed option), and results set aside because their runs read
    other data (`set_aside_other_data`). The tables leave them out; listing them says why a
    folder holds more results than its tables show."""
    keys = {cell_path(Path(out), cell).name for cell in grid.cells}
    return sorted(p for p in (Path(out) / "cells").glob("*.json") if p.name not in keys)


def cell_results(grid: Grid, out: str | Path) -> list[dict[str, Any]]:
    """The results JSON of every finished cell of ``grid`` that is not `outdated` (with its
    ``label``, when it has one: the boards name rows by it)."""
    return [result for _, result in _read_cells(grid, out)[0]]


def board_cells(grid: Grid, out: str | Path) -> tuple[list[dict[str, Any]], list[tuple[Cell, str]]]:
    """What the boards of ``grid`` show: the finished cells of it and of the grids it joins, and
    the cells of either without a result (a joined one says which grid it is from). A joined
    grid's cells join the boards this grid has, its data sets under its protocols: a joined
    board of another protocol would only copy that grid's own. Two results
    for one row and seed, one here and one joined, are an error: the board could show only one.
    Rows are paired seed by seed, so every result of a data set on a board must have been read
    from the same events: a result whose run read other events of its data set than the board's
    others (`same_events`) is listed among the cells without one, with both digests."""
    from fedrec.bench.leaderboard import method_name

    found, missing = _read_cells(grid, out)
    gathered = [("this grid", cell, result) for cell, result in found]
    boards = {(c.dataset, c.protocol) for c in grid.cells}
    for name, other, folder in grid.joined:
        theirs, lacking = _read_cells(other, folder)
        gathered += [(name, cell, result) for cell, result in theirs if (cell.dataset, cell.protocol) in boards]
        missing += [(cell, f"{why} (in {name})") for cell, why in lacking if (cell.dataset, cell.protocol) in boards]
    source: dict[tuple[str, str, str, int], str] = {}
    for name, _, r in gathered:
        row = (r["dataset"], r["protocol"], method_name(r, one_policy=False), int(r["seed"]))
        if row in source:
            raise FedrecError(f"{r['algorithm']} seed {r['seed']} on {r['dataset']} · {r['protocol']} has a result "
                              f"in {source[row]} and in {name}; a grid.label in one of them keeps their rows apart")
        source[row] = name
    events = same_events([(name == "this grid", r) for name, _, r in gathered])
    results = []
    for name, cell, r in gathered:
        then, now = read_content(r), events.get(r["dataset"])
        if then is None or now is None or then == now:
            results.append(r)
        else:
            where = "" if name == "this grid" else f" (in {name})"
            missing.append((cell, f"read other events of {r['dataset']} (content {then[:12]}) than the board's "
                                  f"other rows ({now[:12]}): run it again with their copy at hand{where}"))
    return results, missing


def same_events(results: list[tuple[bool, dict[str, Any]]]) -> dict[str, str]:
    """The content digest each data set's rows on a board are paired under: of ``results``
    (``(own, result)``: whether it is the grid's own cell, in board order), the digest most of
    the grid's own results of that data set recorded, or, where it has none, most of the joined
    ones; a tie goes to the first met. A grid's own cells are checked against the data before it
    runs (`set_aside_other_data`, where the data are at hand); a joined grid's only where it ran."""
    from collections import Counter

    counts: dict[tuple[str, bool], Counter[str]] = {}
    for own, r in results:
        content = read_content(r)
        if content is not None:
            counts.setdefault((r["dataset"], own), Counter())[content] += 1
    chosen = {}
    for dataset in dict.fromkeys(d for d, _ in counts):
        tally = counts.get((dataset, True)) or counts[(dataset, False)]
        chosen[dataset] = tally.most_common(1)[0][0]  # Counter keeps first-met order among ties
    return chosen
