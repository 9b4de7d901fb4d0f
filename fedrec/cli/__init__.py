"""The `fedrec` command line: `fedrec data ...`, `fedrec run ...`, `fedrec audit-protocol ...`.

Every user-facing failure is a `FedrecError`; `main` prints its message on one line and exits
with status 2, never a traceback.
"""

from __future__ import annotations

import sys

import click
import typer
from rich.console import Console
from rich.text import Text

from fedrec.errors import FedrecError, Interrupted

app = typer.Typer(
    name="fedrec",
    help="Federated recommendation: data sets, leak-free protocols, algorithms, runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

err_console = Console(stderr=True)


def _mount() -> None:
    from fedrec.cli import data, experiments

    app.add_typer(data.app, name="data", help="List, fetch and describe data sets.")
    experiments.register(app)
    from fedrec.cli.bench import bench_command
    from fedrec.cli.compare import compare_command
    from fedrec.cli.flower import flower_command
    from fedrec.cli.reproduce import reproduce_command
    from fedrec.cli.security import audit_privacy_command
    from fedrec.cli.tune import tune_command

    app.command("reproduce")(reproduce_command)
    app.command("tune")(tune_command)
    app.command("audit-privacy")(audit_privacy_command)
    app.command("bench")(bench_command)
    app.command("compare")(compare_command)
    app.command("flower")(flower_command)


_mount()


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    try:
        app(args=argv, standalone_mode=True)
    except FedrecError as e:
        # the message as text: brackets in it ([1, 5], fedrec[flower]) are not markup
        label = "interrupted:" if isinstance(e, Interrupted) else "error:"
        err_console.print(Text.assemble((label, "bold red"), " ", str(e)), highlight=False,
                          soft_wrap=True)
        sys.exit(Interrupted.exit_code if isinstance(e, Interrupted) else 2)
    except KeyboardInterrupt:
        _say_interrupted()
        sys.exit(130)
    except SystemExit as e:
        # Ctrl-C outside a run's own handler (reading the data, between a grid's cells): Typer
        # turns it into a silent exit 130; said here in the one line every stop gets
        if e.code == 130 and isinstance(e.__context__, click.exceptions.Exit) \
                and isinstance(e.__context__.__cause__, KeyboardInterrupt):
            _say_interrupted()
        raise


def _say_interrupted() -> None:
    err_console.print(Text.assemble(("interrupted:", "bold red"), " stopped by Ctrl-C before the command ended"),
                      highlight=False, soft_wrap=True)
