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


def _torch_out_of_memory(e: RuntimeError) -> str | None:
    """What PyTorch failed to allocate, when ``e`` is its allocator's failure; None otherwise."""
    import re

    text = str(e)
    if type(e).__name__ != "OutOfMemoryError" and "can't allocate memory" not in text:
        return None
    tried = re.search(r"allocate ([\d.]+ ?[KMGT]?i?B|\d+ bytes)", text)
    return f"PyTorch could not allocate {tried.group(1)}" if tried else "PyTorch could not allocate a tensor"


def _say_out_of_memory(detail: str) -> None:
    err_console.print(Text.assemble(("error:", "bold red"), " out of memory", f" ({detail})" if detail else "",
                                    "; a smaller --batch-size, --clients-per-round or --memory-budget-mb "
                                    "asks for less at once"), highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    try:
        # not standalone: click's usage errors come here, to be said in one line as fedrec's own
        # are (standalone, Typer draws them in a box below the usage); a command returns None,
        # so what comes back is the code of a click exit (--help: 0, Ctrl-C: 130)
        code = app(args=argv, prog_name="fedrec", standalone_mode=False)
    except FedrecError as e:
        # the message as text: brackets in it ([1, 5], fedrec[flower]) are not markup
        label = "interrupted:" if isinstance(e, Interrupted) else "error:"
        err_console.print(Text.assemble((label, "bold red"), " ", str(e)), highlight=False,
                          soft_wrap=True)
        sys.exit(Interrupted.exit_code if isinstance(e, Interrupted) else 2)
    except click.ClickException as e:
        _say_usage_error(e)
        sys.exit(e.exit_code)
    except MemoryError as e:  # numpy's allocation of a block that does not fit: no traceback, what to shrink
        _say_out_of_memory(str(e))
        sys.exit(2)
    except RuntimeError as e:  # PyTorch's allocators say it with a RuntimeError (CUDA: its OutOfMemoryError)
        detail = _torch_out_of_memory(e)
        if detail is None:
            raise
        _say_out_of_memory(detail)
        sys.exit(2)
    except click.Abort:  # click's own stop (Typer raises it for an EOFError)
        err_console.print(Text.assemble(("error:", "bold red"), " aborted"), highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        _say_interrupted()
        sys.exit(130)
    if code == 130:  # Ctrl-C outside a run's own handler (reading the data, between a grid's cells)
        _say_interrupted()
    sys.exit(code or 0)


def _say_usage_error(e: click.ClickException) -> None:
    """A usage error (an unknown option, a value of the wrong type, a missing argument) in one
    line, with the command whose help says more. A group called without a command has printed
    its help already (`click.exceptions.NoArgsIsHelpError`)."""
    if isinstance(e, click.exceptions.NoArgsIsHelpError):
        return
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    see = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message, see), highlight=False, soft_wrap=True)


def _say_interrupted() -> None:
    err_console.print(Text.assemble(("interrupted:", "bold red"), " stopped by Ctrl-C before the command ended"),
                      highlight=False, soft_wrap=True)
