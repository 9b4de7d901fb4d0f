"""`fedrec tune`: search an algorithm's options on a data set's validation split (`fedrec.tune`)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from fedrec.cli.experiments import DEVICE_HELP
from fedrec.cli.run_progress import RunBars, batch_progress
from fedrec.errors import FedrecError
from fedrec.progress import RoundNote

console = Console()


def tune_command(
    algorithm: str = typer.Argument(..., help="The algorithm to tune (`fedrec algorithms`)."),
    dataset: str = typer.Option("ml-100k", "--dataset", "-d", help="Data set name (built in or added with `fedrec data add`), synthetic[:USERSxITEMS], or your own file with --columns."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING][,TIME] columns (as `fedrec run --columns`)."),
    trials: int = typer.Option(20, help="Trials (the same budget for every method you compare)."),
    rounds: int | None = typer.Option(None, "--rounds", "--epochs", help="Rounds (epochs) a trial trains (default: the algorithm's, else 100)."),
    protocol: str | None = typer.Option(None, "--protocol", "-p", help="Protocol whose validation split is searched (default loo-sampled, ratio-rating for the rating autoencoders)."),
    negatives: str = typer.Option("leak-free", help="Training-negative policy (see `fedrec protocols`)."),
    seed: int = typer.Option(0, help="Seed of the data split, the runs and the sampler."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding the raw data files."),
    out: Path | None = typer.Option(None, "--out", "-o", help="The run config to write (default configs/ALGO-DATASET.json), for `fedrec run --config`."),
    threads: int | None = typer.Option(None, "--threads", help="PyTorch threads (default: OMP_NUM_THREADS, else 1)."),
    from_defaults: bool = typer.Option(False, "--from-defaults", help="Make the first trial the algorithm's own settings (one of the trials), so the search cannot end below them."),
    set_options: list[str] = typer.Option([], "--set", help="Model option KEY=VALUE every trial holds (not searched), repeatable, e.g. --set clip=5 for MetaMF."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    workers: int = typer.Option(1, help="Trials trained at once, each a process of one thread (a GPU's use: "
                                "the draws are the one-at-a-time search's while fewer than ten trials have ended; "
                                "fewer trials are pruned)."),
    journal: Path | None = typer.Option(None, "--journal", help="Where finished trials are kept while the search runs (default: OUT with suffix .journal, removed once OUT is written); the same command run again after a kill goes on from it."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out config (by default one is never overwritten)."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Each trial saves itself every N rounds beside the journal (JOURNAL with suffix .trials), so the same command run again after a kill goes on from the cut-off trial's last save rather than its first round (0: trials are not saved)."),
) -> None:
    """Tune ALGORITHM on the validation split with Optuna (TPE, median pruning); the test split is
    never scored. Writes the best options as a run config."""
    from fedrec import threads as torch_threads

    torch_threads.apply(threads)
    from fedrec.core.device import resolve

    device = resolve(device)
    try:
        import optuna  # noqa: F401
    except ImportError as e:
        raise FedrecError(f"fedrec tune needs Optuna ({e}); pip install 'fedrec[tune]'") from e
    from fedrec.cli.experiments import parse_settings
    from fedrec.files import check_writable
    from fedrec.tune import trial_checkpoints, tune, write_config

    out = out or Path("configs") / f"{algorithm}-{Path(dataset).stem.replace(':', '_')}.json"
    # before any trial: what the search writes can be written (its folders are made once the
    # options have been checked, by the journal's opening and at the end)
    from fedrec.experiment import dataset_files

    reads = dataset_files(dataset)
    check_writable(out, "--out", overwrite=overwrite, reads=reads)
    journal = journal or out.with_suffix(".journal")
    check_writable(journal, "--journal", reads=reads)
    if journal.exists():
        console.print(f"going on from the trials kept in {journal}", highlight=False)
    bar = batch_progress(console)
    task = bar.add_task(f"tuning {algorithm} on {dataset}", total=trials, status="")
    bars = RunBars(bar, log=None if console.is_terminal else typer.echo)

    def on_trial(entry: dict[str, Any]) -> None:
        bars.end(entry["trial"])
        tried = ", ".join(f"{k} {_shown(v)}" for k, v in {**entry["engine"], **entry["model"]}.items())
        why = f" ({entry['reason']})" if "reason" in entry else ""
        status = f"trial {entry['trial']}: {entry['state']}{why} [{tried}]"
        if console.is_terminal:
            bar.update(task, advance=entry["state"] != "refused", status=status)  # refused: redrawn
        else:
            typer.echo(f"{status}  {entry.get('best_valid', '')}")

    def on_round(note: RoundNote) -> None:
        bars.note(note.job, f"trial {note.job}", note)

    with bar if console.is_terminal else nullcontext():
        result = tune(algorithm, dataset, trials=trials, rounds=rounds, protocol=protocol, seed=seed,
                      negatives=negatives, data_dir=data_dir, on_trial=on_trial, from_defaults=from_defaults,
                      journal=journal, on_round=on_round, fixed=parse_settings(set_options),
                      device=device, workers=workers, checkpoint_every=checkpoint_every, columns=columns)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_config(result, out)
    journal.unlink(missing_ok=True)
    saves = trial_checkpoints(journal)
    if saves.is_dir() and not any(saves.iterdir()):  # every trial removes its saves as it ends
        saves.rmdir()
    shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in {**result.engine, **result.model}.items())
    redrawn = f"; {result.refused} refused settings redrawn" if result.refused else ""
    console.print(f"best validation {result.metric} {result.best_valid:.4f} ({result.completed} complete, "
                  f"{result.pruned} pruned, {result.trials - result.completed - result.pruned} diverged of "
                  f"{result.trials}{redrawn}): {shown}", highlight=False)
    given = f" --columns {columns}" if columns else ""
    console.print(f"wrote {out}; run it with: fedrec run {algorithm} -d {dataset}{given} -p {result.protocol} "
                  f"--config {out}", highlight=False)


def _shown(value: Any) -> str:
    """A trial's option value as a line shows it: numbers to 4 digits, layer sizes as 16/8."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "/".join(_shown(v) for v in value)
    return str(value)
