"""The `fedrec` command line as one Click command.

The documentation's command reference is generated from `command` (mkdocs-click), so the
reference shows the options the code has.
"""

from __future__ import annotations

import typer

from fedrec.cli import app

#: `fedrec` and all its subcommands, as Click sees them
command = typer.main.get_command(app)
