"""`fedrec ARGV` run in the test's process, for tests of what the command line prints."""

from __future__ import annotations

import pytest

from fedrec.cli import main


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``fedrec ARGV``."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def said(*args: str) -> tuple[int, str]:
    """(exit status, everything printed, on one line) of ``fedrec ARGS`` through typer's runner;
    a FedrecError is exit 2 with its message."""
    from typer.testing import CliRunner

    from fedrec.cli import app
    from fedrec.errors import FedrecError

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit | FedrecError):
        raise result.exception
    message = str(result.exception) if isinstance(result.exception, FedrecError) else ""
    return (2 if message else result.exit_code), " ".join((result.output + message).split())
