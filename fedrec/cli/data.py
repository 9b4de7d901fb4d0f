"""``fedrec data``: list, describe, fetch and summarise the known data sets, and register a
user's own files by name (`fedrec.data.user_sets`).

Errors are raised as `FedrecError`; the root CLI prints them as ``error: <message>``. This
module imports no torch, so ``fedrec data`` stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedrec.data import registry, user_sets
from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError

app = typer.Typer(help="List, describe, fetch and summarise data sets.", no_args_is_help=True)

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Directory holding the raw file(s); defaults to $FEDREC_DATA, then the cache.",
        file_okay=False,
    ),
]
RawFileName = Annotated[
    str | None,
    typer.Option("--file", help="Which of the data set's raw files to read (see `info`)."),
]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


@app.command("list")
def list_command() -> None:
    """List the known data sets and whether each is cached."""
    table = Table(box=None, pad_edge=False)
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    table.add_column("get", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    for name in registry.list_datasets():
        about = registry.info(name)
        spec = about.spec
        get = "manual" if spec.manual_download else "download"
        label = f"{name} (default)" if name == registry.DEFAULT_DATASET else name
        table.add_row(label, spec.description, get, "yes" if about.cached else "no")
    own = user_sets.entries()
    if own:
        table.add_section()
        for name, entry in own.items():
            present = "yes" if Path(entry.path).is_file() else "missing"
            described = (f"yours: {entry.path} ({entry.rows:,} rows, {entry.users:,} users, "
                         f"{entry.items:,} items; columns {entry.columns})")
            table.add_row(name, described, "added", present)
    _console().print(table)


@app.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="The name to use with -d.")],
    file: Annotated[Path, typer.Argument(help="A CSV/TSV/Parquet file of user-item events.")],
    columns: Annotated[str, typer.Option(
        "--columns", help="USER,ITEM[,RATING][,TIME]: header names, or 0-based positions for a file "
        "without a header; an empty field skips one (user,item,,time), or ROLE=COLUMN pairs.")],
    sep: Annotated[str | None, typer.Option(
        "--sep", help="Field separator (default from the suffix: ',' for .csv, tab for .tsv/.txt/.dat).")] = None,
    implicit_threshold: Annotated[float | None, typer.Option(
        "--implicit-threshold", help="Ratings at or above this are positive interactions under "
        "implicit protocols (default: every row is one).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a data set of this name.")] = False,
) -> None:
    """Register your own file once as NAME: then -d NAME works in every command."""
    entry = user_sets.add(name, file, columns, sep, implicit_threshold, overwrite)
    out = _console()
    out.print(f"registered {escape(name)}: {entry.rows:,} rows, {entry.users:,} users, {entry.items:,} items "
              f"from {escape(entry.path)}")
    if "time" not in user_sets.parse_columns(columns):
        out.print("note: no time column: leave-one-out protocols will hold out a random item per user "
                  "(drawn with the run's seed)")
    out.print(f"use it as: fedrec run pfedrec -d {escape(name)}   (catalogue: {escape(str(user_sets.catalogue_file()))})")


@app.command("remove")
def remove_command(name: Annotated[str, typer.Argument(help="A data set added with `fedrec data add`.")]) -> None:
    """Forget a registered data set (its file is left as it is)."""
    entry = user_sets.remove(name)
    _console().print(f"removed {escape(name)} ({escape(entry.path)} is left as it is)")


@app.command("info")
def info_command(name: Annotated[str, typer.Argument(help="Data set name.")]) -> None:
    """Describe a data set: citation, raw files, parsers, sources and checksums."""
    own = user_sets.get(name) if name not in registry.list_datasets() else None
    if own is not None:
        out = _console()
        out.print(f"[bold]{escape(name)}[/bold]: your data set, registered {escape(own.added)}")
        for key in ("path", "columns", "sep", "implicit_threshold", "rows", "users", "items", "sha256"):
            value = getattr(own, key)
            if value is not None:
                out.print(f"{key:<19}{escape(str(value))}")
        return
    if name not in registry.list_datasets():
        from fedrec.errors import UnknownNameError

        raise UnknownNameError("data set", name, [*registry.list_datasets(), *user_sets.entries()])
    about = registry.info(name)
    spec = about.spec
    out = _console()
    out.print(f"[bold]{escape(spec.name)}[/bold]: {escape(spec.description)}")
    out.print(f"homepage  {escape(spec.homepage)}")
    out.print(f"citation  {escape(spec.citation)}")
    out.print("raw files (first found is used unless --file names one):")
    for raw in spec.files:
        note = f" - {raw.note}" if raw.note else ""
        out.print(f"  {escape(raw.name)}  parser {raw.parser.__name__}{escape(note)}")
    if spec.sources:
        out.print("sources, tried in order after --data-dir/$FEDREC_DATA and the cache:")
        for source in spec.sources:
            out.print(f"  {escape(source.label)}: {escape(source.url)}")
            out.print(f"    checksum {escape(registry.describe_checksum(source))}")
    if spec.manual_download:
        out.print(f"manual download: {escape(spec.manual_download)}")
    cached = ", ".join(str(p) for p in about.cached) or "nothing yet"
    out.print(f"cache     {escape(str(about.cache_dir))} ({escape(cached)})")


@app.command("fetch")
def fetch_command(
    name: Annotated[str, typer.Argument(help="Data set name.")],
    data_dir: DataDir = None,
    file: RawFileName = None,
) -> None:
    """Make sure a data set's raw file is available (downloading it if needed); print its path."""
    from fedrec.data import user_sets
    from fedrec.data.catalogue import REGISTRY

    if name not in REGISTRY and (mine := user_sets.get(name)) is not None:
        raise FedrecError(f"'{name}' is a data set of your own (`fedrec data add`), read from {mine.path}: "
                          "there is nothing to fetch")
    found = registry.resolve(name, data_dir, file=file)
    out = _console()
    for failure in found.failures:
        out.print(f"[dim]skipped: {escape(failure)}[/dim]")
    out.print(f"{escape(str(found.path))}  [dim](from {escape(found.origin)})[/dim]")
    if found.raw.sha256 is not None:
        ok = registry.sha256_of(found.path) == found.raw.sha256
        out.print("sha256 matches the known copy" if ok else "sha256 differs from the known copy")


@app.command("stats")
def stats_command(
    name: Annotated[str, typer.Argument(help="Data set name, or your own file with --columns.")],
    data_dir: DataDir = None,
    file: RawFileName = None,
    implicit: Annotated[
        bool | None,
        typer.Option(
            "--implicit/--explicit",
            help="Count distinct user-item pairs (implicit) or every rating row (explicit); "
            "defaults to the data set's nature.",
        ),
    ] = None,
    min_rating: Annotated[
        float | None,
        typer.Option("--min-rating", help="Keep only events rated at least this."),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option("--columns", help="NAME is your own file: its USER,ITEM[,RATING][,TIME] columns."),
    ] = None,
) -> None:
    """Print users, items, interactions and sparsity of a data set (a built-in one, one added with
    `fedrec data add`, or a file with --columns)."""
    min_user_rows, count_rows, implicit_by_nature = 0, False, False
    builtin = name in registry.list_datasets()
    if columns is not None or (not builtin and user_sets.get(name) is not None):
        if file is not None or data_dir is not None:
            raise FedrecError("--file and --data-dir pick a built-in data set's raw file; "
                              f"{name} is {'a file' if columns else 'your data set'}")
        from fedrec.experiment import load_interactions

        data = load_interactions(name, None, 0, columns)
        origin = f"{data.source['file']} ({data.source['origin']})"
        header = escape(name) if columns is None else escape(Path(name).name)
        registered = user_sets.get(name) if columns is None else None
        if min_rating is None and registered is not None and registered.implicit_threshold is not None:
            # as a run of it counts its positives: distinct pairs rated at or above the threshold
            min_rating, implicit = registered.implicit_threshold, True if implicit is None else implicit
    else:
        if not builtin:
            from fedrec.errors import UnknownNameError

            if user_sets.looks_like_a_file(name):  # as `fedrec run` says it
                raise FedrecError(f"{name} is a file: say which columns hold what with --columns "
                                  "USER,ITEM[,RATING][,TIME] (header names, or 0-based positions)")
            raise UnknownNameError("data set", name, [*registry.list_datasets(), *user_sets.entries()])
        found = registry.resolve(name, data_dir, file=file)
        spec = registry.get_spec(name)
        data = spec.defining_filter(found.raw.parser(found.path))
        origin, header = f"{found.raw.name} from {found.origin}", escape(name)
        min_user_rows, count_rows, implicit_by_nature = spec.min_user_rows, spec.count_rows, spec.implicit
    if implicit is None:  # the data set's own count: distinct pairs, or rows as its papers count
        as_implicit = (data.implicit or implicit_by_nature) and not count_rows
    else:
        as_implicit = implicit
    users, items, events, sparsity = _summary(data, as_implicit, min_rating)
    distinct = _summary(data, True, min_rating)[2]
    out = _console()
    kept = f", rating >= {min_rating:g}" if min_rating is not None else ""
    mode = "implicit" if as_implicit else ("implicit, every row counted" if data.implicit else "explicit")
    out.print(f"{header}: {escape(origin)} ({mode}{kept})")
    if min_user_rows:
        out.print(f"users with fewer than {min_user_rows} rows left out (the data set's definition)")
    if not data.clock:
        out.print("no time column: leave-one-out protocols hold out a random item per user (seeded)")
    table = Table.grid(padding=(0, 2))
    table.add_column()
    table.add_column(justify="right")
    table.add_row("users", f"{users:,}")
    table.add_row("items", f"{items:,}")
    table.add_row("interactions", f"{events:,}")
    table.add_row("sparsity", f"{sparsity:.2%}")
    out.print(table)
    # the events as a run reads them, whatever the file's format (`Interactions.content_digest`)
    digest = data.source.get("content") or data.content_digest()  # a user's file was read with it
    out.print(f"content digest {digest[:16]} (the same for a copy of these events in any format)")
    if events > distinct:  # what a run uses: one row per (user, item) pair
        out.print(f"note: {events - distinct:,} rows repeat a (user, item) pair; a run keeps the "
                  f"last of each ({distinct:,} interactions)")


def _summary(
    data: Interactions, implicit: bool, min_rating: float | None
) -> tuple[int, int, int, float]:
    """(users, items, interactions, sparsity) over the events kept.

    Users and items count those with at least one kept event; implicit mode counts distinct
    user-item pairs, explicit mode every row. Sparsity always uses distinct pairs.
    """
    mask = np.ones(len(data), dtype=bool)
    if min_rating is not None:
        mask &= data.ratings >= min_rating
    users = data.users[mask]
    items = data.items[mask]
    n_users = len(np.unique(users))
    n_items = len(np.unique(items))
    pairs = len(np.unique(users * max(data.n_items, 1) + items))
    events = pairs if implicit else int(mask.sum())
    cells = n_users * n_items
    sparsity = 1.0 - pairs / cells if cells else 1.0
    return n_users, n_items, events, sparsity
