"""Output files: checked before any work, written atomically, readable like any other file.

Every file fedrec writes (results JSON, checkpoints, saved runs) goes through `atomic_write`:
a uniquely named temporary file in the target's folder, renamed into place once complete, so a
crash, an interrupt or a concurrent run never leaves a partial file or collides on a fixed
temporary name. `check_writable` is called before training, so a bad ``--out`` is one line at
the start instead of a traceback after the work is done.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from fedrec.errors import FedrecError


def check_writable(path: str | Path, what: str = "--out", overwrite: bool = True,
                   reads: Iterable[str | Path | None] = (), replace: str = "pass --overwrite to replace it or "
                   "choose another name") -> Path:
    """``path`` if a file can be written there, else one clear error: it is a folder, a folder
    on its way is a file, the nearest existing folder is not writable, it is one of the files
    the command ``reads`` (even with ``overwrite``: writing it would destroy an input), or
    (without ``overwrite``) the file exists; ``replace`` says how to replace one."""
    path = Path(path)
    if path.is_dir():
        raise FedrecError(f"{what} {path} is a folder; give a file name")
    for source in reads:
        if source is not None and _same_file(path, Path(source)):
            raise FedrecError(f"{what} {path} is {source}, a file this command reads; give another name")
    if path.exists() and not overwrite:
        raise FedrecError(f"{what} {path} exists (an earlier run's); {replace}")
    _check_creatable(path.parent, path, what)
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.is_file() and os.path.samefile(a, b)
    except OSError:
        return False


def check_folder(path: str | Path, what: str) -> Path:
    """``path`` if files can be written into it as a folder (made when missing), else one clear
    error: it is a file, a folder on its way is a file, or it cannot be written in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FedrecError(f"{what} {path} is a file; give a folder")
    _check_creatable(path, path, what)
    return path


def _check_creatable(folder: Path, path: Path, what: str) -> None:
    """The nearest existing folder at or above ``folder`` is a writable folder."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise FedrecError(f"{what} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FedrecError(f"{what} {path}: cannot write in {folder} (permission denied)")


@contextlib.contextmanager
def no_empty_folders(*folders: str | Path | None) -> Iterator[None]:
    """Run the block; then remove each of ``folders``, and the folders above it, that did not
    exist before and are empty: a command stopped or failed before it wrote anything (Ctrl-C
    before the first cell, every run failed, a download refused) leaves no empty folder."""
    # resolved: "a/../b" is the existing b, never a folder this block made
    made = [f for folder in folders if folder is not None for f in _missing_folders(Path(folder).resolve())]
    try:
        yield
    finally:
        for folder in made:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those above it that do not exist yet, innermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def atomic_write(path: str | Path, write: Callable[[str], None], exclusive: bool = False) -> Path:
    """Call ``write(temporary path)``, then rename the file to ``path``; nothing is left behind
    if it fails. The file gets the usual permissions (0666 less the umask).

    ``exclusive``: never replace an existing ``path`` (another run wrote it meanwhile): the file
    is kept as ``NAME.PID.SUFFIX`` beside it instead, and a `FedrecError` says so.
    """
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            # named before it exists: Ctrl-C or SIGTERM at any point finds the name to remove (a
            # signal mask cannot promise that: a process-directed signal goes to any thread)
            tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp"))
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                break
            except FileExistsError:
                tmp = None
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        if not exclusive:
            os.replace(tmp, path)
            return path
        try:
            os.link(tmp, path)  # atomic, and fails if the name exists
        except FileExistsError:
            kept = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
            os.replace(tmp, kept)
            raise FedrecError(f"{path} was written by another run meanwhile; this run's file is "
                              f"{kept}") from None
        except OSError:  # a file system without hard links: check, then rename
            if path.exists():
                raise
            os.replace(tmp, path)
            return path
        Path(tmp).unlink()
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):  # the place refuses what os.access promised (/proc, a full disk)
            raise FedrecError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
