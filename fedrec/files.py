"""Output files: checked before any work, written atomically, readable like any other file.

Every file fedrec writes (results JSON, checkpoints, saved runs) goes through `atomic_write`:
a uniquely named temporary file in the target's folder, renamed into place once complete, so a
crash, an interrupt or a concurrent run never leaves a partial file or collides on a fixed
temporary name. `check_writable` is called before training, so a bad ``--out`` is one line at
the start instead of a traceback after the work is done.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

from fedrec.errors import FedrecError


def check_writable(path: str | Path, what: str = "--out", overwrite: bool = True) -> Path:
    """``path`` if a file can be written there, else one clear error: it is a folder, a folder
    on its way is a file, the nearest existing folder is not writable, or (without
    ``overwrite``) the file exists."""
    path = Path(path)
    if path.is_dir():
        raise FedrecError(f"{what} {path} is a folder; give a file name")
    if path.exists() and not overwrite:
        raise FedrecError(f"{what} {path} exists (an earlier run's); pass --overwrite to replace it "
                          "or choose another name")
    _check_creatable(path.parent, path, what)
    return path


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


def atomic_write(path: str | Path, write: Callable[[str], None], exclusive: bool = False) -> Path:
    """Call ``write(temporary path)``, then rename the file to ``path``; nothing is left behind
    if it fails. The file gets the usual permissions (0666 less the umask), not mkstemp's 0600.

    ``exclusive``: never replace an existing ``path`` (another run wrote it meanwhile): the file
    is kept as ``NAME.PID.SUFFIX`` beside it instead, and a `FedrecError` says so.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp: str | None = None
    # Ctrl-C or SIGTERM between mkstemp creating the file and `tmp` naming it would leave the
    # file behind: both are held until `tmp` is known, then raise inside the try below
    held = _hold_interrupts()
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        held = _release(held)
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
    except BaseException:
        _release(held)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path


_INTERRUPTS = {signal.SIGINT, signal.SIGTERM}


def _hold_interrupts() -> set[signal.Signals] | None:
    """Block SIGINT and SIGTERM for this thread (delivered when released); the mask before."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not on POSIX
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)


def _release(held: set[signal.Signals] | None) -> None:
    """Restore the mask `_hold_interrupts` returned (a pending signal is raised now)."""
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
