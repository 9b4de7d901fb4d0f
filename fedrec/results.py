"""The one results schema shared by every run, written atomically (never a partial file)."""

from __future__ import annotations

import glob
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedrec.files import atomic_write
from fedrec.options import is_whole
from fedrec.version import __version__

SCHEMA_VERSION = 1
#: a run's ``status`` (`RunResult.status`)
COMPLETED, DIVERGED = "completed", "diverged"


@dataclass
class RoundRecord:
    """One round (federated) or epoch (centralised) of training."""

    round: int
    loss: float
    seconds: float
    valid: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    rejected_uploads: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    """Everything needed to read, compare and reproduce one run.

    ``test`` holds the test metrics of the model at ``best_round``, the round with the best
    validation figure (``select``); test figures never take part in choosing it.

    ``status`` is ``"completed"``, or ``"diverged"`` for a run whose loss (or scores) stopped
    being finite in round ``diverged_at``: its ``history`` then holds the rounds before that
    one, and ``best_round``, ``valid_at_best`` and ``test`` what validation had selected among
    them (empty when no round was evaluated). Tables leave a diverged run out of their figures
    and say it diverged. A file written before the field existed reads as completed
    (`status_of`).
    """

    algorithm: str
    dataset: str
    protocol: str
    seed: int
    config: dict[str, Any]
    select: str
    history: list[RoundRecord] = field(default_factory=list)
    best_round: int = 0
    valid_at_best: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    #: rounds after which the run was continued from a checkpoint (wall_seconds covers all parts)
    resumed_at: list[int] = field(default_factory=list)
    peak_memory_mb: float = 0.0
    fedrec_version: str = __version__
    git_revision: str | None = None
    #: versions, date, machine and command line of the process that wrote it (`environment`)
    environment: dict[str, str] = field(default_factory=lambda: environment())
    schema_version: int = SCHEMA_VERSION
    status: str = COMPLETED
    #: the round whose loss (or scores) stopped being finite; None for a completed run
    diverged_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path, exclusive: bool = False) -> Path:
        """Write JSON atomically (`fedrec.files.atomic_write`): never a partial file; with
        ``exclusive``, never over a file another run wrote meanwhile."""

        def dump(tmp: str) -> None:
            with open(tmp, "w") as f:
                json.dump(self.to_dict(), f, indent=2)
                f.write("\n")

        return atomic_write(path, dump, exclusive)


def load_result(path: str | Path) -> dict[str, Any]:
    """A results JSON as a dict, with ``status`` (and ``diverged_at``) filled in for a file
    written before they existed: such a run completed."""
    blob = json.loads(Path(path).read_text())
    if isinstance(blob, dict):
        blob.setdefault("status", COMPLETED)
        blob.setdefault("diverged_at", None)
    return blob


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def malformed(blob: dict[str, Any]) -> str | None:
    """What in ``blob`` (a results JSON as read, with its ``history`` list) this schema never
    writes, among the fields readers of a file they did not write use (`fedrec plot`); or None."""
    for key in ("algorithm", "dataset", "protocol", "select"):
        if key in blob and not isinstance(blob[key], str):
            return f"{key} is not text"
    if "seed" in blob and not is_whole(blob["seed"]):
        return "seed is not a whole number"
    if blob.get("config") is not None and not isinstance(blob["config"], dict):
        return "config is not a table"
    if blob.get("best_round") is not None and not _number(blob["best_round"]):
        return "best_round is not a number"
    for n, h in enumerate(blob["history"]):
        where = f"history[{n}]"
        if not isinstance(h, dict):
            return f"{where} is not a table"
        if not is_whole(h.get("round")):
            return f"{where} has no whole round number"
        valid = h.get("valid")
        if valid is not None and not (isinstance(valid, dict) and all(_number(v) for v in valid.values())):
            return f"{where}.valid is not a table of numbers"
        if h.get("bytes_up") is not None and not _number(h["bytes_up"]):
            return f"{where}.bytes_up is not a number"
    return None


def status_of(result: dict[str, Any]) -> str:
    """A results dict's ``status``: ``"completed"`` where the file predates the field."""
    return str(result.get("status") or COMPLETED)


def diverged(result: dict[str, Any]) -> bool:
    """Whether a results dict is of a run that diverged (`RunResult.status`)."""
    return status_of(result) == DIVERGED


def diverged_rounds(seeds: dict[int, int]) -> str:
    """Where runs diverged, by seed: "round 3", "rounds 3, 5" (boards and tables say it alike)."""
    rounds = sorted(set(seeds.values()))
    return f"round{'s' if len(rounds) > 1 else ''} {', '.join(str(r) for r in rounds)}"


def peak_memory_mb() -> float:
    """Peak resident memory of this process (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def git_revision() -> str | None:
    """The commit of the fedrec source tree when it is a checkout, with ``-dirty`` when the
    package's files (tracked or new) or ``pyproject.toml`` differ from it: a working tree copied
    to another machine, or an edit not yet committed, ran code the commit alone does not name.
    Other files (docs, results, benchmarks) do not count."""
    package = Path(__file__).parent

    def git(*args: str) -> str | None:
        out = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=5,
                             check=False, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # no index.lock
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=all", "--", ".", "../pyproject.toml")
    except (OSError, subprocess.SubprocessError):
        return None
    if not head:
        return None
    return f"{head}-dirty" if changed else head


def environment() -> dict[str, str]:
    """What a results file needs to be reproduced: library versions, date, machine, command."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("torch", "numpy", "scipy", "flwr"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:  # pragma: no cover - flwr is a dependency
            out[package] = "absent"
    import torch

    out["threads"] = str(torch.get_num_threads())
    # the processor and the kernels PyTorch picked for it: float32 sums round in another order
    # on another CPU, and chaotic runs (GPFedRec's neighbour threshold, FedCIA's fine-tune)
    # then drift apart, so two results files that differ can be told apart by their machines
    out.update(cpu=cpu_model(), cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
               date=datetime.now(UTC).isoformat(timespec="seconds"),
               platform=platform.platform(), command=shlex.join(redacted(sys.argv)))
    return out


#: command-line options whose value is a secret (Flower's ServerApp gets a run token so)
_SECRET = ("token", "secret", "password", "passphrase")


def redacted(argv: list[str]) -> list[str]:
    """``argv`` with the value of each secret-named option (``--token X``, ``--token=X``)
    replaced, so a results file never carries a credential of the process that wrote it."""
    out: list[str] = []
    hide = False
    for a in argv:
        name = a.split("=", 1)[0].lower()
        if hide:
            out.append("<redacted>")
            hide = False
        elif a.startswith("-") and any(s in name for s in _SECRET):
            if "=" in a:
                out.append(f"{a.split('=', 1)[0]}=<redacted>")
            else:
                out.append(a)
                hide = True
        else:
            out.append(a)
    return out


def cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_content(result: Any) -> str | None:
    """The content digest of the events ``result``'s run read (`Interactions.content_digest`,
    recorded as ``data.source.content``); None for a file written before runs recorded it, or
    one of another shape (a cached table's list of figures)."""
    data = result.get("data") if isinstance(result, dict) else None
    source = data.get("source") if isinstance(data, dict) else None
    content = source.get("content") if isinstance(source, dict) else None
    return None if content is None else str(content)


def known_contents(results: Iterable[Any]) -> dict[str, str]:
    """The content digest each data file's runs recorded, by the file's sha256 (both in
    ``data.source``), over ``results`` (results dicts as read): what
    `fedrec.data.registry.content_at_hand` need not parse again."""
    known = {}
    for result in results:
        content = read_content(result)
        sha = result["data"]["source"].get("sha256") if content is not None else None
        if sha is not None:
            known[str(sha)] = content
    return known


def other_events(path: Path, now: str) -> str | None:
    """The content digest the run in results file ``path`` recorded, where it differs from
    ``now`` (the digest of the copy a run would read today); None when they agree, when the
    file is not there or when it records none."""
    if not path.exists():
        return None
    then = read_content(json.loads(path.read_text()))
    return then if then is not None and then != now else None


def set_aside_files(path: Path, content: str = "") -> list[Path]:
    """The results files set aside from ``path`` by `set_aside_other_events`, those read from the
    events with content digest ``content`` where given."""
    return sorted(path.parent.glob(f"{glob.escape(path.stem)}.other-data-{content[:12]}*.json"))


def set_aside_other_events(path: Path, now: str) -> tuple[str | None, bool]:
    """Keep a cached run's results from standing for a run of other events: the results file at
    ``path`` is renamed to ``<stem>.other-data-<digest>.json`` (``digest``: the first 12 hex
    digits of the content it read) when its run read other events than ``now``, the digest of
    the copy a run would read today, so that a cache found by name runs again and the old file
    is kept. Where ``path`` then holds no results and an earlier set-aside file was read from
    ``now``'s events, that file is given back. Returns the set-aside digest (None when nothing
    was set aside: a file without a recorded digest is kept as it is) and whether a file was
    given back."""
    then = other_events(path, now)
    if then is not None:
        path.replace(path.with_name(f"{path.stem}.other-data-{then[:12]}.json"))
    back = [] if path.exists() else set_aside_files(path, now)
    if back:
        back[0].replace(path)
    return then, bool(back)


def check_events(path: Path, now: str, rename: bool) -> tuple[str | None, str]:
    """What becomes of a cached run found by its name at ``path`` when the copy at hand holds
    the events with content digest ``now``: the digest its run read where that differs (else
    None), and the outcome: ``run again`` or ``given back`` (`set_aside_other_events`), or,
    without ``rename`` (a reader that runs nothing), ``left out`` and nothing renamed."""
    if not rename:
        return other_events(path, now), "left out"
    then, given_back = set_aside_other_events(path, now)
    return then, "given back" if given_back else "run again"
