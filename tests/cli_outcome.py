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
