"""`fedrec compare`: a fair comparison of methods on one data set, in one command.

Each algorithm is tuned with the same trial budget on the validation split (`fedrec.tune`'s
search, from the algorithm's own settings as its first trial; the test split is never scored),
then its best setting is trained on every seed under every protocol asked for, as one
`fedrec.bench` grid. The folder it writes holds:

* ``configs/ALGO.json``: each algorithm's tuned setting (``fedrec run --config``);
* ``bench.toml`` and ``cells/``: the grid and its cached runs, so the same command run again
  after a kill does only what is missing (a search goes on from its journal);
* ``leaderboard.md`` (and a board per protocol in Markdown, CSV, LaTeX and PNG): mean ± std over
  seeds, rank, paired t-test and Wilcoxon against the best, diverged runs named and left out;
* ``curves.png``: validation curves per algorithm, the mean and a band over seeds;
* ``report.md``: the exact command, the data, each tuned setting and the boards.

``trials=0`` compares the algorithms at their defaults.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from fedrec.errors import FedrecError

#: the arguments a comparison folder is made for (`compare.json`); another set is refused there
SETTINGS = "compare.json"


@dataclass
class Comparison:
    """What `compare` wrote: the folder, its boards and each algorithm's tuned setting."""

    folder: Path
    boards: list[Any]
    tuned: dict[str, dict[str, Any]]
    report: Path
    leaderboard: Path | None
    curves: Path | None
    failed: list[str] = field(default_factory=list)
    #: the runs without a result, each "ALGORITHM · PROTOCOL · seed S: why"
    unfinished: list[str] = field(default_factory=list)


def _dataset_name(dataset: str, columns: str | None) -> tuple[str, dict[str, Any] | None]:
    """The name the boards show, and the inline declaration of a file given with ``columns``."""
    from fedrec.data import user_sets

    if columns is None and not user_sets.looks_like_a_file(dataset):
        return dataset, None
    from fedrec.experiment import check_own_file

    check_own_file(dataset, columns)  # a file without its columns is refused there
    user_sets.parse_columns(str(columns))
    path = Path(dataset).expanduser()
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in path.stem).strip("-._")[:58]
    for name in (stem, f"file-{stem}", "file"):  # the file's own name where it is free
        try:
            user_sets.check_name(name)
            break
        except FedrecError:
            continue
    return name, {"path": str(path.resolve()), "columns": columns}


def _data_sha256(name: str, inline: dict[str, Any] | None) -> str | None:
    """The sha256 of a user's data (a file given, or registered), which the comparison's
    folder is for: tuned settings of an earlier version of the file are not reused."""
    from fedrec.data import user_sets

    if inline is not None:
        from fedrec.data.fetch import sha256_of

        return sha256_of(Path(inline["path"]))
    entry = user_sets.get(name) if not user_sets.looks_like_a_file(name) else None
    return None if entry is None else user_sets.check_unchanged(entry)


def _check(algorithms: Sequence[str], protocols: Sequence[str], seeds: int, trials: int,
           rounds: int | None = None, workers: int = 1) -> None:
    from fedrec.algorithms import get_algorithm
    from fedrec.options import is_whole
    from fedrec.protocols.protocol import get_protocol

    for flag, value in (("--seeds", seeds), ("--trials", trials), ("--workers", workers)):
        if not is_whole(value):
            raise FedrecError(f"{flag} must be a whole number (got {value!r})")
    if rounds is not None and not is_whole(rounds):
        raise FedrecError(f"--rounds must be a whole number (got {rounds!r})")
    if workers < 1:
        raise FedrecError(f"--workers must be >= 1 (got {workers})")
    for what, names in (("algorithms", algorithms), ("--protocols", protocols)):
        if not all(isinstance(n, str) for n in names):
            raise FedrecError(f"{what}: give names (text), not {[n for n in names if not isinstance(n, str)][0]!r}")
    if not algorithms:
        raise FedrecError("name at least one algorithm to compare")
    twice = sorted({a for a in algorithms if list(algorithms).count(a) > 1})
    if twice:
        raise FedrecError(f"{', '.join(twice)} named twice")
    if not protocols:
        raise FedrecError("--protocols: name at least one protocol")
    twice = sorted({p for p in protocols if list(protocols).count(p) > 1})
    if twice:
        raise FedrecError(f"--protocols: {', '.join(twice)} named twice")
    if rounds is not None and rounds < 1:
        raise FedrecError(f"--rounds must be >= 1 (got {rounds})")
    if seeds < 1:
        raise FedrecError(f"--seeds must be >= 1 (got {seeds}); paired tests need 2 or more")
    if trials < 0:
        raise FedrecError(f"--trials must be >= 0 (got {trials}; 0 compares at the defaults)")
    for name in protocols:
        ranking = get_protocol(name).ranking
        refused = [a for a in algorithms if ranking not in get_algorithm(a).rankings]
        if refused:
            raise FedrecError(f"{', '.join(refused)} cannot be evaluated under {name} ({ranking}); compare "
                              "methods that share a protocol (`fedrec algorithms NAME` lists each one's)")


def _cutoffs(ks: Any, protocols: Sequence[str]) -> tuple[int, ...]:
    """``ks`` as sorted whole numbers, each one every protocol can take (one line if not)."""
    from fedrec.protocols.protocol import check_cutoffs, get_protocol, with_cutoffs

    ks = check_cutoffs(ks)
    for name in protocols:
        with_cutoffs(get_protocol(name), ks)
    return ks


def _toml_value(value: Any) -> str:
    """A TOML value for a string, a number or a list of them (JSON's escapes are TOML's)."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def compare(
    algorithms: Sequence[str],
    dataset: str,
    *,
    protocols: Sequence[str] = ("loo-sampled", "loo-full"),
    seeds: int = 3,
    trials: int = 8,
    rounds: int | None = None,
    out: str | Path | None = None,
    columns: str | None = None,
    data_dir: str | None = None,
    workers: int = 1,
    device: str = "cpu",
    ks: Sequence[int] = (),
    command: str | None = None,
    on_trial: Callable[[str, dict[str, Any]], None] | None = None,
    on_cell: Callable[[Any, str], None] | None = None,
) -> Comparison:
    """Tune each of ``algorithms`` with ``trials`` trials on ``dataset``'s validation split
    (under the first of ``protocols``), train each best setting on seeds ``0..seeds-1`` under
    every protocol, and write the boards, curves and report into ``out`` (default
    ``compare-DATASET``). ``columns``: ``dataset`` is a file of one's own; ``ks``: further
    cut-offs of the ranking metrics, beside 10 (`fedrec.protocols.protocol.with_cutoffs`). ``on_trial(algorithm,
    entry)`` and ``on_cell(cell, state)`` report progress. Run again with the same arguments, it
    goes on where it stopped."""
    from fedrec.files import atomic_write, check_folder

    # one name is one algorithm (or protocol), not its letters
    for what, names in (("algorithms", algorithms), ("protocols", protocols)):
        if names is not None and not isinstance(names, str | list | tuple):
            raise FedrecError(f"{what}: give a name or a list of names, not {names!r}")
    algorithms = [algorithms] if isinstance(algorithms, str) else list(algorithms or [])
    protocols = [protocols] if isinstance(protocols, str) else list(protocols or [])
    for what, value, kinds in (("device", device, str), ("out", out, str | PathLike | None),
                               ("columns", columns, str | None), ("data_dir", data_dir, str | None)):
        if not isinstance(value, kinds):
            raise FedrecError(f"{what} must be {'text' if kinds is str else 'text or None'}, not {value!r}")
    _check(algorithms, protocols, seeds, trials, rounds, workers)
    ks = _cutoffs(ks, protocols)
    if not isinstance(dataset, str):
        raise FedrecError(f"dataset must be a name or a file's path (text), not {dataset!r}")
    from fedrec.core.device import resolve

    resolve(device)
    name, inline = _dataset_name(dataset, columns)
    folder = check_folder(Path(out) if out is not None else Path(f"compare-{name}"), "--out")
    # the data are named right before compare.json records the settings: a corrected command
    # must not find a folder made for the mistyped one
    if inline is not None:  # (check_columns says a missing file or a folder too)
        from fedrec.data.tables import check_columns

        check_columns(str(inline["path"]), columns)
    else:
        from fedrec.experiment import check_dataset_name

        check_dataset_name(dataset)
    settings = {"algorithms": algorithms, "dataset": dataset, "columns": columns, "protocols": protocols,
                "seeds": seeds, "trials": trials, "rounds": rounds}
    if ks:  # only when given: a comparison made before they existed keeps its settings
        settings["ks"] = list(ks)
    digest = _data_sha256(name, inline)
    if digest is not None:  # a file edited since is another comparison (its settings were tuned on the old)
        settings["sha256"] = digest
    recorded = folder / SETTINGS
    if recorded.exists():
        try:
            earlier = json.loads(recorded.read_text())
        except (OSError, json.JSONDecodeError):
            earlier = None
        if earlier != settings:
            changed = (isinstance(earlier, dict) and {k: v for k, v in earlier.items() if k != "sha256"}
                       == {k: v for k, v in settings.items() if k != "sha256"})
            what = "of the data file as it was before it changed" if changed else "of other settings"
            raise FedrecError(f"{folder} holds a comparison {what} ({recorded}); give another --out or remove it")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(recorded, lambda tmp: Path(tmp).write_text(json.dumps(settings, indent=2) + "\n"))

    tuned: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    if trials:
        tuned, failed = _tune_all(algorithms, dataset, columns, protocols[0], trials, rounds, folder,
                                  data_dir, device, on_trial)
    grid_file = _write_grid(folder, algorithms, name, inline, dataset if inline is None else None, protocols,
                            seeds, rounds, tuned, data_dir, device, workers, ks)
    from fedrec.bench import board_cells, boards, load_grid, run_grid, to_markdown, write

    grid = load_grid(grid_file)
    run_grid(grid, folder, on_cell=on_cell)
    results, missing = board_cells(grid, folder)
    made = sorted(boards(results, missing), key=lambda b: protocols.index(b.protocol))
    for board in made:
        write(board, folder)
    leaderboard = None
    if made:
        leaderboard = folder / "leaderboard.md"
        leaderboard.write_text("\n".join(to_markdown(b) for b in made))
    curves = _curves(grid, folder)
    report = _report(folder, command or _command(settings), settings, name, results, tuned, failed, made,
                     missing, curves)
    unfinished = [f"{c.algorithm} · {c.protocol} · seed {c.seed}: {why}" for c, why in missing]
    return Comparison(folder, made, tuned, report, leaderboard, curves, failed, unfinished)


def _tune_all(algorithms: list[str], dataset: str, columns: str | None, protocol: str, trials: int,
              rounds: int | None, folder: Path, data_dir: str | None, device: str,
              on_trial: Callable[[str, dict[str, Any]], None] | None
              ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each algorithm's tuned setting (kept in ``configs/``, reused when there), and the
    algorithms whose every trial failed (they run at their defaults, and the report says so)."""
    from fedrec.tune import plan_search, read_config, search_changes, tune, write_config

    configs = folder / "configs"
    configs.mkdir(exist_ok=True)
    tuned: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for algorithm in algorithms:
        path = configs / f"{algorithm}.json"
        stored = read_config(path).get("tuning", {}).get("search") if path.exists() else None
        if stored is not None:  # a setting found by another search (a default changed since) is not reused
            now = plan_search(algorithm, dataset, rounds=rounds, protocol=protocol, seed=0, data_dir=data_dir,
                              from_defaults=True, device=device, columns=columns).search
            changed = search_changes(stored, now)
            if changed:
                raise FedrecError(f"{path} was tuned by another search than this comparison's now: "
                                  f"{', '.join(changed[:4])}; remove it to tune again")
        if not path.exists():
            report = None if on_trial is None else (lambda entry, a=algorithm: on_trial(a, entry))
            try:
                result = tune(algorithm, dataset, trials=trials, rounds=rounds, protocol=protocol, seed=0,
                              data_dir=data_dir, on_trial=report, from_defaults=True,
                              journal=configs / f"{algorithm}.journal", device=device, columns=columns)
            except FedrecError as e:
                if "no trial of" not in str(e):
                    raise
                failed.append(f"{algorithm}: {e}; compared at its defaults")
                continue
            write_config(result, path)
            (configs / f"{algorithm}.journal").unlink(missing_ok=True)
        tuned[algorithm] = read_config(path)
    return tuned, failed


def _write_grid(folder: Path, algorithms: list[str], name: str, inline: dict[str, Any] | None,
                dataset: str | None, protocols: list[str], seeds: int, rounds: int | None,
                tuned: dict[str, dict[str, Any]], data_dir: str | None, device: str, workers: int,
                ks: tuple[int, ...] = ()) -> Path:
    """The comparison as a bench file (`fedrec.bench.grid`): its cells are the runs."""
    lines = ["[grid]", f"algorithms = {_toml_value(algorithms)}", f"datasets = {_toml_value([name])}",
             f"protocols = {_toml_value(protocols)}", f"seeds = {_toml_value(list(range(seeds)))}",
             f"workers = {workers}", f"device = {_toml_value(device)}"]
    if ks:
        lines.append(f"ks = {_toml_value(list(ks))}")
    if rounds is not None:
        lines.append(f"rounds = {rounds}")
    if data_dir is not None:
        lines.append(f"data_dir = {_toml_value(str(Path(data_dir).resolve()))}")
    if tuned:
        lines += ["", "[tuned]"] + [f"{_toml_value(a)} = {_toml_value(f'configs/{a}.json')}" for a in tuned]
    if inline is not None:
        lines += ["", f"[datasets.{_toml_value(name)}]"] + [f"{k} = {_toml_value(v)}" for k, v in inline.items()]
    path = folder / "bench.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _curves(grid: Any, folder: Path) -> Path | None:
    """Validation curves of every finished cell: one panel per protocol, the mean and a band
    over seeds per algorithm (`fedrec.plot.runs_figure`)."""
    from fedrec.bench.grid import cell_path, current_result

    # the cells the boards show: an outdated result (`fedrec.bench.grid.outdated`) is not drawn
    paths = [cell_path(folder, c) for c in grid.cells if current_result(folder, c)[0] is not None]
    if not paths:
        return None
    from fedrec.plot import runs_figure

    try:
        return Path(runs_figure(paths, folder / "curves.png", None))
    except FedrecError:  # no run has a validation point to draw (all diverged in round 1, say)
        return None


def _command(settings: dict[str, Any]) -> str:
    """The command line that makes this comparison (for the API's calls)."""
    argv = ["fedrec", "compare", *settings["algorithms"], "-d", settings["dataset"]]
    if settings["columns"]:
        argv += ["--columns", settings["columns"]]
    argv += ["--protocols", ",".join(settings["protocols"]), "--seeds", str(settings["seeds"]),
             "--trials", str(settings["trials"])]
    if settings["rounds"] is not None:
        argv += ["--rounds", str(settings["rounds"])]
    if settings.get("ks"):
        argv += ["--ks", ",".join(str(k) for k in settings["ks"])]
    return shlex.join(argv)


def _report(folder: Path, command: str, settings: dict[str, Any], name: str, results: list[dict[str, Any]],
            tuned: dict[str, dict[str, Any]], failed: list[str], made: list[Any], missing: list[Any],
            curves: Path | None) -> Path:
    """``report.md``: what was compared, how, and the boards."""
    from fedrec.bench import to_markdown

    lines = [f"# {', '.join(settings['algorithms'])} on {name}", "", "```", command, "```", ""]
    if results:
        data = results[0]["data"]
        source = data.get("source") or {}
        held = (data.get("split") or {}).get("held_out_by", "time")
        lines += ["## Data", "", f"- {data['users']:,} users, {data['items']:,} items, "
                  f"{data['interactions']:,} interactions"]
        if source.get("file"):
            lines.append(f"- file `{source['file']}`, sha256 `{source.get('sha256', '?')}`")
        lines += [f"- held out by {held}" + (" (the data have no time column; seeded per run)" if held == "random" else ""),
                  ""]
    lines += ["## Tuning", ""]
    if not settings["trials"]:
        lines += ["None (`--trials 0`): every algorithm runs at its defaults (`fedrec algorithms NAME`).", ""]
    else:
        lines += [f"{settings['trials']} trials per algorithm (Optuna TPE with median pruning; the first trial is "
                  f"the algorithm's own settings) on the validation split of {settings['protocols'][0]}, seed 0; "
                  "no test figure was read. The best setting then ran on every seed and protocol.", "",
                  "| algorithm | best validation | trials (complete / pruned / diverged) | setting |",
                  "|---|---|---|---|"]
        for algorithm, config in tuned.items():
            t = config["tuning"]
            shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in {**config["engine"], **config["model"]}.items())
            lines.append(f"| {algorithm} | {t['metric'].removeprefix('best validation ')} {t['best_valid']:.4f} | "
                         f"{t['completed']} / {t['pruned']} / {t['diverged']} | {shown} |")
        lines += [""] + [f"- {f}" for f in failed] + ([""] if failed else [])
    lines += ["## Results", "", "Test figures at each run's best validation round; mean ± std (sample) over "
              "seeds; p-values of paired tests against the best method.", ""]
    lines += [to_markdown(b) for b in made] or ["No run finished.", ""]
    if missing:
        lines += ["## Runs without a result", ""] + [f"- {c.algorithm} · {c.protocol} · seed {c.seed}: {why}"
                                                     for c, why in missing] + [""]
    if curves is not None:
        lines += ["## Validation curves", "", f"![validation curves]({curves.name})", ""]
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path
