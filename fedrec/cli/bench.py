"""`fedrec bench`: run a benchmark grid (cached, resumable, in parallel) and write its leaderboards."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from fedrec.cli.run_progress import RunBars, batch_progress

console = Console()


def bench_command(
    grid_file: Path = typer.Argument(..., help="A bench file (TOML; see `fedrec.bench.grid`)."),
    out: Path = typer.Option(Path("bench"), "--out", "-o", help="Folder for the cells' results (cells/) and the leaderboards."),
    workers: int | None = typer.Option(None, help="Parallel worker processes (default: the file's, else the CPUs)."),
    report_only: bool = typer.Option(False, "--report-only", help="Write the leaderboards of the cells already run; run nothing."),
) -> None:
    """Run GRID_FILE's cells that OUT lacks, then write a leaderboard per data set and protocol
    (Markdown, CSV, LaTeX, PNG) with paired significance against the best method."""
    from fedrec.bench import (
        board_cells,
        boards,
        cell_results,
        load_grid,
        run_grid,
        stale_cells,
        to_markdown,
        write,
    )
    from fedrec.errors import FedrecError
    from fedrec.files import check_folder

    grid = load_grid(grid_file, check_device=not report_only)
    check_folder(out, "--out")
    if workers is not None:
        if workers < 1:
            raise FedrecError("--workers must be >= 1")
        grid.workers = workers
    if not report_only:
        bar = batch_progress(console, disable=not console.is_terminal)
        task = bar.add_task(f"bench ({grid.workers} workers)", total=len(grid.cells), status="")
        bars = RunBars(bar, log=None if console.is_terminal else typer.echo)

        def label_of(cell) -> str:  # type: ignore[no-untyped-def]
            return f"{cell.algorithm} {cell.dataset} {cell.protocol} {cell.negatives} seed {cell.seed}"

        def on_cell(cell, state: str) -> None:  # type: ignore[no-untyped-def]
            bars.end(cell)
            line = f"{label_of(cell)}: {state}"
            if console.is_terminal:
                bar.update(task, advance=1, status=line)
            elif state != "cached":
                typer.echo(line)

        def on_progress(cell, note) -> None:  # type: ignore[no-untyped-def]
            bars.note(cell, label_of(cell), note)

        with bar:
            counts = run_grid(grid, out, on_cell=on_cell, on_progress=on_progress)
        # a diverged cell ran and is recorded (status: diverged); the boards leave it out of their figures
        went = f", {counts['diverged']} diverged" if counts.get("diverged") else ""
        if counts.get("set aside"):
            n = counts["set aside"]
            console.print(f"{n} cell{'s' if n > 1 else ''} had results read from other events than "
                          f"{'their data sets hold' if n > 1 else 'its data set holds'} now: set aside as "
                          f"{out / 'cells'}/KEY.other-data-DIGEST.json and run again", highlight=False)
        console.print(f"{len(grid.cells)} cells: {counts['done']} run{went}, {counts['cached']} cached, "
                      f"{counts['failed']} failed", highlight=False)
    results, missing = board_cells(grid, out)
    summary = []
    made = boards(results, missing)
    for board in made:
        paths = write(board, out)
        summary.append(to_markdown(board))
        console.print(f"wrote {', '.join(str(p) for p in paths)}", highlight=False)
    shown = {(b.dataset, b.protocol) for b in made}
    for dataset, protocol in dict.fromkeys((c.dataset, c.protocol) for c, _ in missing):
        if (dataset, protocol) not in shown:  # no cell of it has a result: no board to list them
            lacking = [why for c, why in missing if (c.dataset, c.protocol) == (dataset, protocol)]
            console.print(f"no leaderboard for {dataset} · {protocol}: none of its {len(lacking)} "
                          f"cells has a result (first: {lacking[0]})", highlight=False)
    stale = stale_cells(grid, out)
    if stale:
        console.print(f"{len(stale)} result files in {out / 'cells'} belong to no cell of this grid (an earlier "
                      f"config of it, or results set aside as read from other data) and are not in the tables",
                      highlight=False)
    if summary:
        (out / "leaderboard.md").write_text("\n".join(summary))
        console.print(f"wrote {out / 'leaderboard.md'}", highlight=False)
    if not report_only and counts["failed"] and not cell_results(grid, out):  # nothing of its own ran
        first = next((why for cell, why in missing if cell in grid.cells), "see its cells' .failed files")
        first = first.removeprefix("failed: ")
        raise FedrecError(f"no cell of this grid has a result ({counts['failed']} of {len(grid.cells)} failed; "
                          f"first: {first})")
