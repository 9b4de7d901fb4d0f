"""Progress of runs side by side (`fedrec.cli.run_progress`): a bar per running run in a
terminal, and in a log a line at the first and last round, every tenth and once a minute."""

from __future__ import annotations

import math

from fedrec.cli.run_progress import RunBars, batch_progress, status
from fedrec.progress import RoundNote


def _note(r: int, total: int = 20, value: float = 0.25) -> RoundNote:
    return RoundNote(job=0, round=r, total=total, loss=0.5, metric="ndcg@10", value=value, best=0.3,
                     best_round=max(1, r - 1))


def test_status_shows_validation_once_evaluated() -> None:
    assert status(_note(3)) == "loss 0.5000  valid ndcg@10 0.2500  best 0.3000 @ 2"
    assert status(_note(3, value=math.nan)) == "loss 0.5000  valid ndcg@10  best 0.3000 @ 2"
    assert status(RoundNote(0, 1, 5, 0.5)) == "loss 0.5000"  # nothing evaluated yet


def test_a_bar_per_running_run_that_goes_when_it_ends() -> None:
    progress = batch_progress(None, disable=True)
    bars = RunBars(progress)
    bars.note("a", "pfedrec s0", _note(1))
    bars.note("b", "fedmf s0", _note(4))
    bars.note("a", "pfedrec s0", _note(2))
    shown = {t.description.strip(): (t.completed, t.total, t.fields["status"]) for t in progress.tasks}
    assert shown == {"pfedrec s0": (2, 20, status(_note(2))), "fedmf s0": (4, 20, status(_note(4)))}
    bars.end("a")
    assert [t.description.strip() for t in progress.tasks] == ["fedmf s0"]
    bars.end("a")  # twice (a failed run that had reported nothing): nothing to remove
    bars.end_all()
    assert not progress.tasks


def test_a_log_gets_the_first_last_and_every_tenth_round() -> None:
    lines: list[str] = []
    bars = RunBars(batch_progress(None, disable=True), log=lines.append, log_seconds=math.inf)
    for r in range(1, 21):
        bars.note("a", "pfedrec s0", _note(r))
    assert [int(line.split("round ")[1].split("/")[0]) for line in lines] == [1, *range(2, 21, 2)]
    assert lines[0] == f"pfedrec s0: round 1/20  {status(_note(1))}"
    lines.clear()
    for r in range(1, 26):  # a tenth of 25 rounds is every third, not every second
        bars.note("b", "mf", RoundNote(1, r, 25, 0.5, unit="epoch"))
    assert [line.split(":")[1].split("/")[0].strip() for line in lines] == \
        ["epoch 1", *(f"epoch {r}" for r in range(3, 25, 3)), "epoch 25"]
    unlabelled: list[str] = []
    RunBars(batch_progress(None, disable=True), log=unlabelled.append).note("run", "", _note(1))
    assert unlabelled == [f"round 1/20  {status(_note(1))}"]  # `fedrec run`: one run, no label
    assert not bars.progress.tasks  # a log, no bars
    slow: list[str] = []
    bars = RunBars(batch_progress(None, disable=True), log=slow.append, log_seconds=0.0)
    for r in range(1, 6):  # every round once a round takes longer than log_seconds
        bars.note("a", "x", _note(r, total=100))
    assert len(slow) == 5
