"""`fedrec reproduce PAPER`: the runs behind a paper's tables, printed beside its figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from fedrec.cli.experiments import DEVICE_HELP, console
from fedrec.cli.run_progress import RunBars, batch_progress
from fedrec.errors import FedrecError, UnknownNameError


def reproduce_command(
    paper: str = typer.Argument(..., help="Paper whose tables to reproduce (pfedrec, fedrap, gfedpp, fedcia, personalfr), or attacks (FedRecAttack's anchor, poisoning and inference tables on ML-100K)."),
    tables: str | None = typer.Option(None, help="Comma-separated tables (default: all of the paper's: pfedrec 1,2,7,8; fedrap 1,3,4,5,6,ablation,curriculum; gfedpp 2,3,4,ratio,heatmap; fedcia 1,3,hetero; personalfr 3,4; attacks takes none: it runs all three of its tables)."),
    dataset: str = typer.Option("ml-100k", "--dataset", "-d"),
    methods: str | None = typer.Option(None, help="Comma-separated rows (methods) to run and show, e.g. gfcf-im,fedcia-gfcf (default: every row of the tables)."),
    settings: str | None = typer.Option(None, help="Semicolon-separated settings of the rows to run and show, as result files name them (e.g. 'ratio=1,alpha=0.9;ratio=1,alpha=0.1'; 'default' for a row without one), to run one cell of a sweep alone."),
    seeds: str = typer.Option("0", help="Comma-separated seeds (the papers use five)."),
    negatives: str = typer.Option("both", help="both, leak-free, legacy (the official code's leaky negatives; also legacy-exclude-heldout, as `fedrec run --negatives` calls it), legacy-split (those negatives on the official code's split of repeated events: Lastfm-2K) or all."),
    rounds: int | None = typer.Option(None, help="Rounds per run (default: 100; PersonalFR's 800)."),
    patience: int | None = typer.Option(None, min=0, help="Stop every run after N evaluations without a better validation figure, in place of each table's own rule (0: never), to see what the rule costs; result files do not name it, so give such runs their own --out-dir."),
    out_dir: Path = typer.Option(Path("runs/reproduce"), help="Where run results are kept (reused when present)."),
    markdown: Path | None = typer.Option(None, help="Also write the tables as markdown to this file."),
    plots: Path | None = typer.Option(None, "--plots", help="Folder for convergence plots (PNG) of the tables the paper draws as figures (default: OUT_DIR/plots)."),
    leaderboard: Path | None = typer.Option(None, "--leaderboard", help="Also write each table's runs as fedrec bench leaderboards (rank, mean ± std over seeds, paired t-test and Wilcoxon against the best row; Markdown, CSV, LaTeX, PNG) into FOLDER/PAPER-table-T/."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA"),
    reuse_only: bool = typer.Option(False, "--reuse-only", help="Print the tables from the results already in OUT_DIR; run nothing."),
    threads: int | None = typer.Option(None, "--threads", help="PyTorch threads (default: OMP_NUM_THREADS, else 1; 0: PyTorch's default)."),
    checkpoint_every: int = typer.Option(0, min=0, help="Each run saves itself every N rounds (epochs) beside its result; a killed reproduction goes on from there (0: never)."),
    workers: int = typer.Option(1, min=1, help="Run the missing runs side by side in this many processes of one thread each (each shows its rounds as it goes)."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
) -> None:
    """Run the runs behind a paper's tables and print our figures beside the paper's.

    Every run is done under the legacy negative policy the paper's code used and under
    fedrec's leak-free default, so a gap can be told apart from the leak.
    """
    from fedrec import threads as torch_threads

    torch_threads.apply(threads)
    from fedrec.core.device import resolve
    from fedrec.protocols.protocol import NEGATIVE_ALIASES
    from fedrec.reproduce.papers import load_figures
    from fedrec.reproduce.runner import (
        DATA_OPTIONS,
        PLOTS,
        POLICY_CHOICES,
        ROUNDS,
        execute,
        only_methods,
        only_settings,
        plan,
        privacy_notes,
        sparsity_notes,
    )
    from fedrec.reproduce.table import render, summarise, to_markdown

    # `fedrec run`'s name of the leaky policy (legacy-exclude-heldout) is taken for legacy
    negatives = {policy: alias for alias, policy in NEGATIVE_ALIASES.items()}.get(negatives, negatives)
    if negatives not in POLICY_CHOICES:
        raise FedrecError(f"--negatives must be one of {', '.join(POLICY_CHOICES)}")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError as e:
        raise FedrecError(f"--seeds must be comma-separated integers (got '{seeds}')") from e
    from fedrec.experiment import check_dataset_name, check_seed

    if not seed_list:
        raise FedrecError(f"--seeds {seeds!r} names no seed")
    for seed in seed_list:
        check_seed(seed)
    for flag, given in (("--tables", tables), ("--methods", methods), ("--settings", settings)):
        if given is not None and not [part for part in given.replace(";", ",").split(",") if part.strip()]:
            raise FedrecError(f"{flag} {given!r} selects nothing")
    if rounds is not None and rounds < 1:
        raise FedrecError(f"--rounds must be >= 1 (got {rounds})")
    from fedrec.reproduce.runner import PLANS

    if paper != "attacks" and paper not in PLANS:
        raise UnknownNameError("paper", paper, [*PLANS, "attacks"])
    if paper == "attacks":  # its tables are FedRecAttack's setting on ML-100K: these do not apply
        ignored = [flag for flag, given in (
            ("--tables", tables is not None), ("--dataset", dataset != "ml-100k"), ("--methods", methods is not None),
            ("--settings", settings is not None), ("--negatives", negatives != "both"),
            ("--patience", patience is not None), ("--leaderboard", leaderboard is not None),
            ("--checkpoint-every", checkpoint_every != 0), ("--workers", workers != 1)) if given]
        if ignored:
            raise FedrecError(f"fedrec reproduce attacks does not take {', '.join(ignored)} "
                              "(its tables are FedRecAttack's setting on ML-100K)")
    else:
        check_dataset_name(dataset)
    from fedrec.files import check_folder, check_writable, no_empty_folders

    for folder, what in ((out_dir, "--out-dir"), (plots, "--plots"), (leaderboard, "--leaderboard")):
        if folder is not None:
            check_folder(folder, what)
    if markdown is not None:
        check_writable(markdown, "--markdown")
    if paper == "attacks":
        if device not in ("cpu", "auto"):
            raise FedrecError("fedrec reproduce attacks runs on the CPU only (--device cpu)")
        with no_empty_folders(out_dir, plots or out_dir / "plots"):
            _attacks(seed_list, rounds, out_dir, markdown, plots, data_dir, reuse_only)
        return
    device = resolve(device)
    chosen = plan(paper, None if tables is None else [t.strip() for t in tables.split(",") if t.strip()],
                  dataset)
    if methods is not None:
        chosen = only_methods(chosen, [m.strip() for m in methods.split(",") if m.strip()])
    if settings is not None:
        chosen = only_settings(chosen, [s.strip() for s in settings.split(";") if s.strip()])
    every = [r for runs in chosen.values() for r in runs]
    n_total = len(dict.fromkeys(every)) * len(POLICY_CHOICES[negatives]) * len(seed_list)
    failed: list[str] = []
    with no_empty_folders(out_dir), batch_progress(console, disable=not console.is_terminal) as bar:
        task = bar.add_task("runs", total=n_total, status="")
        bars = RunBars(bar, log=None if console.is_terminal else typer.echo)
        ended = [0]

        def label_of(planned, policy, seed) -> str:  # type: ignore[no-untyped-def]
            return " ".join(f"{planned.method} {planned.setting} {planned.protocol} {policy} s{seed}".split())

        def on_run(planned, policy, seed, reused) -> None:  # type: ignore[no-untyped-def]
            label = label_of(planned, policy, seed)  # reported as it ends (or is found)
            bars.end((planned, policy, seed))
            bar.update(task, advance=1, description=("reused " if reused else "") + label)
            ended[0] += 1
            if not console.is_terminal and not reused:  # a log file (nohup, CI) says what ran
                typer.echo(f"run {ended[0]}/{n_total} ended: {label}")

        def on_progress(planned, policy, seed, note) -> None:  # type: ignore[no-untyped-def]
            bars.note((planned, policy, seed), label_of(planned, policy, seed), note)

        def on_fail(planned, policy, seed, reason) -> None:  # type: ignore[no-untyped-def]
            failed.append(reason)
            bars.end((planned, policy, seed))
            console.print(f"[red]failed[/] {label_of(planned, policy, seed)}: {reason}")

        def on_stale(planned, policy, seed, changes) -> None:  # type: ignore[no-untyped-def]
            made = ", ".join(f"{k.split('.')[-1]} {old} (the plan now: {new})" for k, (old, new) in changes.items())
            console.print(f"[yellow]reused[/] {label_of(planned, policy, seed)} was made with {made}; "
                          "delete its file to run it again")

        def on_set_aside(path, then, now, outcome) -> None:  # type: ignore[no-untyped-def]
            console.print(other_events_line(path.name, dataset, then, now, outcome), highlight=False)

        results = execute(every, dataset=dataset, seeds=seed_list,
                          policies=POLICY_CHOICES[negatives],
                          rounds=rounds or ROUNDS.get(paper, 100), out_dir=out_dir,
                          data_dir=data_dir, on_run=on_run, on_fail=on_fail,
                          run_missing=not reuse_only, data_options=DATA_OPTIONS.get((paper, dataset)),
                          checkpoint_every=checkpoint_every, workers=workers, on_progress=on_progress,
                          device=device, on_stale=on_stale, patience=patience, on_set_aside=on_set_aside)
        if not results:  # nothing to print: a failure, not an empty table
            raise FedrecError(f"no run finished ({len(failed)} of {n_total} failed; first: {failed[0]})" if failed
                              else f"no result of these runs is in {out_dir} (--reuse-only runs nothing)")
    figures = load_figures(paper)
    parts = []
    drawn = []
    notes_first: list[str] = []
    for table, runs in chosen.items():
        keys = {(r.method, r.setting, r.protocol) for r in runs}
        mine = [r for r in results
                if (r["algorithm"], r["config"]["setting"], r["protocol"]) in keys]
        mine, table_notes = _adjust(paper, table, mine)
        notes_first += table_notes
        # the metrics the paper's table reports (Table 5 of FedRAP: HR@10 only); all where none
        metrics = list(dict.fromkeys(f.metric for f in figures if f.table == table)) or _protocol_metrics(runs)
        summary = summarise(mine, metrics=metrics) if metrics else summarise(mine)
        reported = {f.dataset for f in figures if f.table == table}
        stand_in = "ml-1m" if reported and dataset not in reported and "ml-1m" in reported else None
        render(summary, paper, table, console, metrics=metrics, unpublished=True, stand_in=stand_in)
        parts.append(f"### {paper} Table {table}\n\n"
                     + to_markdown(summary, paper, table, metrics=metrics, unpublished=True,
                                   stand_in=stand_in))
        if table in PLOTS.get(paper, {}) and mine:
            drawn += _convergence_plots(mine, paper, table, PLOTS[paper][table], dataset,
                                        plots or out_dir / "plots")
        if (paper, table) == ("gfedpp", "heatmap") and mine:
            drawn += _heatmaps(mine, dataset, plots or out_dir / "plots")
        if leaderboard is not None and mine:
            drawn += _leaderboards(mine, leaderboard / f"{paper}-table-{table}")
    notes = notes_first + privacy_notes(results) + sparsity_notes(paper, results)
    if paper == "personalfr":
        from fedrec.reproduce.personalfr import compression_notes

        notes += compression_notes(results)
    for line in notes:
        console.print(line, highlight=False)
    for path in drawn:
        console.print(f"wrote {path}")
    if markdown is not None:
        text = "\n\n".join(parts) + "\n"
        if notes:
            text += "\n" + "".join(f"- {line}\n" for line in notes)
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text)
        console.print(f"wrote {markdown}")


def _protocol_metrics(runs: list[Any]) -> list[str] | None:
    """A table the paper shows only as a plot: the metrics of its runs' protocol (F1 standing
    for precision and recall)."""
    from fedrec.protocols.protocol import get_protocol

    if not runs:
        return None
    p = get_protocol(runs[0].protocol)
    names = [m for m in p.metrics if not ("f1" in p.metrics and m in ("precision", "recall"))]
    return [m if m == "rmse" else f"{m}@{p.ks[0]}" for m in names]


def _adjust(paper: str, table: str, results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Tables whose rows are not one run each: GFed-PP's alpha chosen on validation (Table 2)
    and its public / private / all users (the ratio sweep, as Table 6)."""
    from fedrec.reproduce.gfedpp import by_group, choose_alpha

    if (paper, table) == ("gfedpp", "2"):
        return choose_alpha(results)
    if (paper, table) == ("gfedpp", "ratio"):
        return by_group(results), []
    return results, []


def _leaderboards(results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """A table's runs as `fedrec bench` leaderboards, one per data set and protocol: a row per
    method (and setting), ranked, with paired tests against the best over the seeds both ran."""
    from fedrec.bench.leaderboard import boards, write

    rows = [{**r, "algorithm": " ".join(f"{r['algorithm']} {r['config'].get('setting') or ''}".split())}
            for r in results]
    return [path for board in boards(rows) for path in write(board, folder)]


def _heatmaps(results: list[dict[str, Any]], dataset: str, folder: Path) -> list[Path]:
    """GFed-PP's Figure 6: test HR@10 and NDCG@10 over public ratio x alpha, one PNG each."""
    from fedrec.reproduce.gfedpp import heatmap

    return [heatmap(results, metric, folder / f"gfedpp-heatmap-{metric.split('@')[0]}.png",
                    f"GFed-PP Fig. 6 on {dataset}: test {metric.upper()} (frame: best validation alpha)")
            for metric in ("hr@10", "ndcg@10")]


def _convergence_plots(
    results: list[dict[str, Any]], paper: str, table: str, figure: str, dataset: str, folder: Path
) -> list[Path]:
    """The validation HR@10 and NDCG@10 per round of one table's runs, one PNG each."""
    from fedrec.reproduce.plots import convergence

    paths = []
    for metric in ("hr@10", "ndcg@10"):
        path = folder / f"{paper}-{table}-{metric.split('@')[0]}.png"
        title = f"{paper} {figure} on {dataset}: validation {metric.upper()}"
        try:
            paths.append(convergence(results, metric, path, title))
        except FedrecError as e:  # e.g. runs evaluated on another protocol's metrics
            console.print(f"[yellow]no plot[/] {path.name}: {e}")
    return paths


def _attacks(seeds: list[int], rounds: int | None, out_dir: Path, markdown: Path | None, plots: Path | None,
             data_dir: str | None, reuse_only: bool) -> None:
    """`fedrec reproduce attacks` (`fedrec.reproduce.attacks`)."""
    from fedrec.reproduce.attacks import plot, reproduce_attacks, to_markdown

    with console.status("attacks") as status:
        tables = reproduce_attacks(out_dir, data_dir, seeds=seeds, rounds=rounds or 20, run_missing=not reuse_only,
                                   on_run=lambda label: status.update(f"attacks: {label}"))
    for name, then, now, outcome in tables.set_aside:
        console.print(other_events_line(name, "ml-100k", then, now, outcome), highlight=False)
    if not (tables.anchor or tables.poisoning or tables.inference):
        raise FedrecError(f"no result of the attack tables' runs is in {out_dir} (--reuse-only runs nothing)")
    for name, changes in tables.stale:
        made = ", ".join(f"{k} {then} (now: {now})" for k, (then, now) in changes.items())
        console.print(f"[yellow]reused[/] {name} was made with {made}; delete it to run it again", highlight=False)
    if tables.unchecked:
        console.print(f"[yellow]{tables.unchecked} reused files record no settings[/] (written before the files "
                      "held them): not checked against the runs they stand for", highlight=False)
    text = to_markdown(tables)
    console.print(text, markup=False, highlight=False)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text)
    for path in plot(tables, plots or out_dir / "plots"):
        console.print(f"wrote {path}")


def other_events_line(name: str, dataset: str, then: str, now: str, outcome: str) -> str:
    """What became of a cached run's file ``name`` whose run read other events of ``dataset``
    (content digest ``then``) than the copy at hand (``now``): ``run again`` or ``given back``
    (set aside as ``NAME.other-data-DIGEST.json``, `fedrec.results.set_aside_other_events`) or
    ``left out`` (``--reuse-only`` renames nothing)."""
    read = f"its run read other events of {dataset} (content {then[:12]}) than the copy at hand ({now[:12]})"
    stem = name.removesuffix(".json")
    if outcome == "left out":
        return (f"[yellow]left out[/] {name}: {read}; --reuse-only renames nothing (without it the file is "
                f"set aside and its run runs again)")
    kept = f"[yellow]set aside[/] {name}: {read}; kept as {stem}.other-data-{then[:12]}.json"
    return kept + (", and the run of the copy at hand given back" if outcome == "given back" else ", run again")
