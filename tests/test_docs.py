"""The documentation site: it builds with ``mkdocs build --strict``, and no page shows a command
that does not work.

The tutorials run: every ```bash and ```python block of the start page, of
``docs/tutorials/*.md`` and of the walkthrough that adds a method runs in order, in one fresh
folder per page, on synthetic data (a ```toml or other block with ``title="FILE"`` is written to
FILE there first). A block right after a ``<!-- not run: WHY -->`` line is shown only: it needs
a real data set, a GPU, a long run or machines of its own. Every ``fedrec`` and ``make`` line of
every page and of the README, run or not, names a real command and real options.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIALS = [DOCS / "index.md", *sorted((DOCS / "tutorials").glob("*.md")), DOCS / "adding-an-algorithm.md"]
SHELL, PYTHON = ("bash", "sh", "console"), ("python", "py")
NOT_RUN = re.compile(r"<!--\s*not run:\s*\S.*-->")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    title: str | None
    text: str
    run: bool


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with whether it runs."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        title = re.search(r'title="([^"]+)"', fence.group(2))
        shown_only = i > 0 and bool(NOT_RUN.fullmatch(lines[i - 1].strip()))
        found.append(Block(page, i + 1, fence.group(1), title.group(1) if title else None,
                           "\n".join(lines[i + 1:end]) + "\n", not shown_only))
        i = end + 1
    return found


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
               FEDREC_HOME=str(home / "home"), FEDREC_CACHE=str(home / "cache"), MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", COLUMNS="120", NO_MKDOCS_2_WARNING="1")
    return env


def _run_shell(block: Block, where: str, cwd: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A shell block, line by line as bash would (stopping at the first failure). A plain
    `fedrec` line runs in this process (the command's own code, without a second start of
    PyTorch); anything else (a pipe, a redirection, another program) runs in bash."""
    from fedrec.cli import main

    for words in _command_lines(block.text):
        if not words:
            continue
        line = " ".join(shlex.quote(w) for w in words)
        if words[0] == "fedrec" and not set(words) & {"|", "&&", ";", ">", ">>", "<", "2>&1"}:
            argv = [m for w in words[1:] for m in (sorted(glob.glob(w, root_dir=cwd)) or [w])]
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code or 0
            out = capsys.readouterr()
            assert code == 0, f"{where}: `{line}` exited {code}:\n{out.out[-3000:]}\n{out.err[-3000:]}"
        else:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", line], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{where}: `{line}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_tutorial_runs_as_written(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(tmp_path)
    for key in ("FEDREC_HOME", "FEDREC_CACHE", "MPLBACKEND", "COLUMNS"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(tmp_path)
    from fedrec.algorithms import ALGORITHMS

    registered = dict(ALGORITHMS)  # a page may register a method of its own: not for later tests
    try:
        # NumPy's BLAS at one thread, as the shell's OMP_NUM_THREADS=1 gives the subprocesses:
        # fedrec's --threads sets PyTorch's, and two BLAS threads beside another busy process
        # took `fedrec audit-privacy --ldp` from 1.7 s to 74 s
        with threadpool_limits(1):
            _run_page(page, tmp_path, env, capsys)
    finally:
        ALGORITHMS.clear()
        ALGORITHMS.update(registered)


def _run_page(page: Path, tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for block in blocks(page):
        if not block.run:
            continue
        where = f"{page.relative_to(ROOT)}:{block.line}"
        if block.title:
            (tmp_path / block.title).write_text(block.text)
        elif block.lang in SHELL:
            _run_shell(block, where, tmp_path, env, capsys)
        elif block.lang in PYTHON:
            module = types.ModuleType("fedrec_docs_page")  # a module of its own: dataclasses look it up
            sys.modules[module.__name__] = module
            try:
                exec(compile(block.text, where, "exec"), module.__dict__)  # noqa: S102  (our own pages)
            finally:
                del sys.modules[module.__name__]


def test_most_tutorial_blocks_run() -> None:
    """The blocks shown only are the exception: most of the tutorials' code blocks run, and each
    tutorial runs some."""
    code = [b for page in TUTORIALS for b in blocks(page) if b.lang in SHELL + PYTHON and not b.title]
    ran = [b for b in code if b.run]
    assert len(ran) > len(code) / 2, f"{len(ran)} of {len(code)} blocks run"
    assert {b.page for b in ran} == set(TUTORIALS)


def _command_lines(text: str) -> list[list[str]]:
    """Each shell line of a block as words, continuation lines joined, comments dropped."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unclosed quote: a heredoc or prose, not a command
            continue
        out.append(words)
    return out


def _check_fedrec(words: list[str], where: str) -> None:
    from fedrec.cli.command import command

    cmd, args = command, words[1:]
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        assert args[0] in cmd.commands, f"{where}: no command `{' '.join(words[:2])}`: {args[0]}"
        cmd, args = cmd.commands[args[0]], args[1:]
    known = {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for word in args:
        if word in ("|", "&&", ";", ">", ">>", "2>&1"):
            break
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", word):
            assert word.split("=")[0] in known, f"{where}: `fedrec {cmd.name}` has no option {word}"


def _all_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _all_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_is_real(page: Path) -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    for block in blocks(page):
        if block.lang not in SHELL:
            continue
        for words in _command_lines(block.text):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if words and re.fullmatch(r"(\S*/)?fedrec", words[0]):
                _check_fedrec(words, where)
            elif words[:1] == ["make"]:
                named = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
                assert set(named) <= targets, f"{where}: no make target {set(named) - targets}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link, a missing anchor, a page left out of the nav or a reference mkdocstrings
    cannot resolve fails the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "reference" / "cli.html").read_text().count("fedrec run") > 0


def test_the_bench_file_page_names_every_key() -> None:
    """docs/files.md documents the bench file; every key the reader accepts is there."""
    from fedrec.bench.grid import DATASET_KEYS, GRID_KEYS, TABLES

    text = (DOCS / "files.md").read_text()
    section = text[text.index("## The bench file"):text.index("## `fedrec compare`")]
    missing = [f"grid.{k}" for k in sorted(GRID_KEYS) if f"`grid.{k}`" not in section]
    missing += [f"[{t}]" for t in TABLES if t != "grid" and f"[{t}" not in section]
    missing += [k for k in sorted(DATASET_KEYS) if f"\n{k} = " not in section]
    assert not missing, f"docs/files.md's bench file section lacks {missing}"
