"""`fedrec compare`: tune methods alike on a data set's validation split, run them over seeds
and protocols, and write the leaderboard, curves and report (`fedrec.comparison`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from fedrec.cli.experiments import DEVICE_HELP
from fedrec.cli.run_progress import batch_progress

console = Console()


def compare_command(
    algorithms: list[str] = typer.Argument(..., help="The algorithms to compare (`fedrec algorithms`): two or more, or one for its board alone."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Data set: built in, added with `fedrec data add`, synthetic[:USERSxITEMS], or your own file with --columns."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING][,TIME] columns (as `fedrec run --columns`)."),
    protocols: str = typer.Option("loo-sampled,loo-full", "--protocols", "-p", help="Comma-separated protocols, each a board; the first one's validation split is tuned on."),
    ks: str | None = typer.Option(None, "--ks", help="Further cut-offs K of the ranking metrics, beside 10, e.g. 20 or 5,20 (as `fedrec run --ks`); tuning and the paired tests stay at the protocols' own."),
    seeds: int = typer.Option(3, help="Seeds each tuned setting runs on (0..N-1): mean ± std and paired tests over them."),
    trials: int = typer.Option(8, help="Tuning trials per algorithm, the same for each (0: compare at the defaults)."),
    rounds: int | None = typer.Option(None, "--rounds", "--epochs", help="Rounds (epochs) of every trial and run (default: each algorithm's)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder to write (default compare-DATASET); the same command again goes on where it stopped."),
    workers: int = typer.Option(1, help="Runs trained at once, each a process of one thread."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding a built-in data set's raw files."),
) -> None:
    """Compare ALGORITHMS fairly on one data set: the same tuning budget on validation (test never
    read), then every seed under every protocol; writes leaderboard.md, curves.png and report.md."""
    from fedrec.comparison import compare
    from fedrec.core.device import resolve
    from fedrec.errors import FedrecError

    if workers < 1:
        raise FedrecError("--workers must be >= 1")
    device = resolve(device)
    names = [p.strip() for p in protocols.split(",") if p.strip()]
    from fedrec.protocols.protocol import parse_cutoffs

    cutoffs = parse_cutoffs(ks) if ks is not None else ()
    bar = batch_progress(console, disable=not console.is_terminal)
    tuning = bar.add_task("tuning", total=trials * len(algorithms) or 1, status="", visible=bool(trials))
    cells = bar.add_task("runs", total=seeds * len(names) * len(algorithms), status="")

    def say(line: str, task: Any) -> None:
        if console.is_terminal:
            bar.update(task, advance=1, status=line)
        else:
            typer.echo(line)

    def on_trial(algorithm: str, entry: dict[str, Any]) -> None:
        if entry["state"] != "refused":
            say(f"tuning {algorithm}: trial {entry['trial']} {entry['state']}", tuning)

    def on_cell(cell: Any, state: str) -> None:
        say(f"{cell.algorithm} · {cell.protocol} · seed {cell.seed}: {state}", cells)

    command = shlex.join(["fedrec", *sys.argv[1:]]) if sys.argv[1:2] == ["compare"] else None
    with bar:
        done = compare(algorithms, dataset, protocols=names, seeds=seeds, trials=trials, rounds=rounds, out=out,
                       columns=columns, data_dir=data_dir, workers=workers, device=device, ks=cutoffs, command=command,
                       on_trial=on_trial, on_cell=on_cell)
    for line in done.failed:
        console.print(f"note: {line}", highlight=False)
    for board in done.boards:
        best = board.table.iloc[0]
        figure = best[board.metric]
        if not isinstance(figure, float) or figure != figure:  # every method diverged: no best
            console.print(f"{board.dataset} · {board.protocol}: no method completed (see the board)", highlight=False)
            continue
        console.print(f"{board.dataset} · {board.protocol}: best {best['method']} ({board.metric} {figure:.4f})",
                      highlight=False)
    console.print(f"wrote {done.report}" + (f", {done.leaderboard}" if done.leaderboard else "")
                  + (f", {done.curves}" if done.curves else ""), highlight=False)
    if not done.boards:  # nothing to compare: a failure, whatever the report says of it
        first = done.unfinished[0] if done.unfinished else "no run was planned"
        raise FedrecError(f"no run finished ({len(done.unfinished)} without a result; first: {first})")
