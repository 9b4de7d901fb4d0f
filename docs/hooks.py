"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks``)."""

from __future__ import annotations

from typing import Any


def on_page_content(html: str, page: Any, **_: Any) -> str:
    """The command reference shows each command's ``--help`` as the terminal does: Typer escapes
    the brackets of ``[required]`` and ``[default: ...]`` for Rich, which a page does not read."""
    if page.file.src_uri == "reference/cli.md":
        html = html.replace("\\[", "[")
    return html
