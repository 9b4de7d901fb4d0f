"""Why a Flower process failed, in one line, from what it wrote.

A failure on Flower surfaces far from its cause: a ClientApp's exception is a traceback in its
SuperNode's log (a deployment) or on the console among Ray's (simulation), and the server sees
only an error reply whose reason is that exception's text. These functions find the exception
in such text so that `fedrec flower` can end with one line naming the failing process and its
reason instead of pointing at the logs.
"""

from __future__ import annotations

import re
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: the line that ends a traceback: a dotted exception name (Ray's ``X(Cause)`` too), a colon,
#: its message
_EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:\([\w.]*\))?):(?: (?P<message>.*))?$")
_FRAME = re.compile(r'^\s+File "')
#: exceptions that only carry another one's text (printed before them in the chain)
_WRAPPERS = ("RayTaskError", "ClientAppException")
#: Flower's text for an exception in an error reply: ``<class 'NAME'>:<'MESSAGE'>``
_REPLY = re.compile(r"^<class '(?P<name>[^']+)'>:<'(?P<message>.*)'>$", re.DOTALL)
_FEDREC = "fedrec.errors.FedrecError"


def exception_line(text: str) -> str | None:
    """The last exception a traceback in ``text`` ended with, as one line (`shown`), or None
    when ``text`` holds no traceback.

    An exception line is an unindented ``name: message`` right after a traceback's indented
    frame lines (``  File "..."`` and the code under it). Of a chain (``... was the direct cause of ...``) the last one counts, except
    that wrappers repeating an earlier exception's text (Ray's ``RayTaskError``, Flower's
    ``ClientAppException``) and exceptions without a message give way to the one before."""
    found: list[tuple[str, str]] = []
    previous, frames = "", False
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.rstrip()
        if _FRAME.match(line):
            frames = True
        m = _EXCEPTION.match(line)
        if m and frames and previous[:1].isspace():
            found.append((m["name"], (m["message"] or "").strip()))
            frames = False
        if line:
            previous = line
    for name, message in reversed(found):
        if message and not name.endswith(_WRAPPERS) and "RayTaskError" not in name:
            return shown(name, message)
    return shown(*found[-1]) if found else None


def shown(name: str, message: str) -> str:
    """An exception as the console shows it: a `FedrecError` by its message (it is written for
    the user), any other by its name and message."""
    if name in (_FEDREC, "FedrecError") or name.startswith("fedrec.errors."):
        return message or name
    return f"{name}: {message}" if message else name


def reply_reason(reason: str) -> str:
    """The one line of an error reply's ``reason``: the exception its text holds."""
    reason = _ANSI.sub("", reason)
    m = _REPLY.match(reason.strip())
    if m is None:
        return exception_line(reason) or _one_line(reason)
    inner = exception_line(m["message"])  # Ray's exception text is the node's traceback
    return inner or shown(m["name"], _one_line(m["message"]))


def error_box(text: str) -> str | None:
    """The message of the last error box a Flower CLI command printed (``╭─ Error ─╮``), as
    one line, or None."""
    lines = _ANSI.sub("", text).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("╭") and "Error" in line]
    if not starts:
        return None
    body = []
    for line in lines[starts[-1] + 1:]:
        if line.startswith("╰"):
            break
        body.append(line.strip("│ \t"))
    return _one_line(" ".join(body)) or None


def log_tail(path: Path, offset: int = 0) -> str:
    """What ``path`` holds from byte ``offset`` on (all of it when the file is shorter, as
    after a restarted process rewrote it; empty when it does not exist)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(offset if offset <= size else 0)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."
