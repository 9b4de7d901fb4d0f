"""A cohort's steps replayed from CUDA graphs (`fedrec.rounds.step_graphs`) train as the plain
steps do. A graph fixes its shapes, so each step runs at a bucket of clients with the ones past
its active clients padded (zero weight, slots on a zero row); on the CPU here the padded steps
run without capture, and whole runs end with the plain steps' figures. On CUDA the captured
graphs end with the uncaptured steps' figures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from fedrec.core.device import on
from fedrec.federated.family.state import FamilyState
from fedrec.rounds import step_graphs
from fedrec.rounds.step_graphs import StepGraphs, bucket

#: the item family's members whose steps take graphs (FedProx's objective and CoLR's basis do not)
GRAPHED = ["pfedrec", "fedmf", "fedncf", "fedrecon", "gpfedrec", "gfedpp", "perfedrec", "fedavgm", "metamf",
           "fedmf-bias"]
#: engine settings under which a round has chunks of several clients whose steps pad (the
#: default: a small memory budget, so a round has several chunks). FedNCF's copies of its MLP,
#: and the graph methods' tables, take one chunk a client at that budget; MetaMF trains its
#: clients without copies unless each client's upload is kept (a defence's)
SETTINGS: dict[str, dict[str, Any]] = {"fedncf": {}, "gpfedrec": {"memory_budget_mb": 4.0},
                                       "gfedpp": {"memory_budget_mb": 4.0}, "metamf": {"defence": "median"}}


def test_a_bucket_holds_its_clients_with_at_most_half_again() -> None:
    got = [bucket(n) for n in range(1, 5000)]
    assert all(b >= n for n, b in zip(range(1, 5000), got, strict=True))
    assert all(b <= 1.5 * n for n, b in zip(range(2, 5000), got[1:], strict=True))
    assert got == sorted(got)  # more clients never take a smaller bucket
    assert len(set(got)) <= 2 * 13 + 1  # two shapes an octave
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 6, 7, 9, 13)] == [1, 2, 3, 4, 6, 6, 8, 12, 16]


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record each step's (active clients, bucket) as `StepGraphs.run` takes it."""
    seen: list[tuple[int, int]] = []
    run = StepGraphs.run

    def counting(self: StepGraphs, steps: Any, *args: Any, **kwargs: Any) -> None:
        seen.extend((int(s[0].shape[0]), bucket(int(s[0].shape[0]))) for s in steps)
        run(self, steps, *args, **kwargs)

    monkeypatch.setattr(StepGraphs, "run", counting)
    return seen


@pytest.mark.parametrize("name", GRAPHED)
def test_padded_steps_end_with_the_plain_steps_figures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round's figures and the final scores, the padded steps against the plain ones (the
    losses to their sums' round-off), on the CPU (chunks of a small memory budget, so a round has several and the
    workspace is reused and grown)."""
    from test_contract import config

    from fedrec.experiment import train

    run = config(name, rounds=2, **SETTINGS.get(name, {"memory_budget_mb": 0.05}))
    plain = train(run)
    seen = _counted(monkeypatch)
    monkeypatch.setattr(step_graphs, "PAD_ON_CPU", True)
    padded = train(run)
    assert seen and any(n < b for n, b in seen), "no step was padded"
    assert [h.valid for h in padded.result.history] == [h.valid for h in plain.result.history]
    np.testing.assert_allclose([h.loss for h in padded.result.history], [h.loss for h in plain.result.history],
                               rtol=1e-6)
    users = np.arange(plain.split.n_users)
    # bit for bit: a padded client's gradients are zeros, and each client's products its own
    np.testing.assert_array_equal(padded.model.scores(users, None), plain.model.scores(users, None))


@pytest.mark.parametrize("name", ["fedprox", "colr"])
def test_states_whose_steps_read_more_take_no_graphs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_contract import config

    from fedrec.experiment import train

    seen = _counted(monkeypatch)
    monkeypatch.setattr(step_graphs, "PAD_ON_CPU", True)
    train(config(name, rounds=1))
    assert seen == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("error:the steps run uncaptured")  # a failed capture fails the test
@pytest.mark.parametrize("name", GRAPHED)
def test_captured_steps_end_with_the_uncaptured_ones_on_cuda(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the runs replay captured graphs (at least one a run, none failed), and end
    within float round-off of the same padded steps launched one by one, and of the plain
    steps on the GPU."""
    from test_contract import config

    from fedrec.experiment import train

    cpu = config(name, rounds=3, **SETTINGS.get(name, {"memory_budget_mb": 0.05}))
    run = replace(cpu, federated=replace(cpu.federated, device="cuda"), train=replace(cpu.train, device="cuda"))
    captures: list[int] = []
    capture = StepGraphs._capture

    def counting(self: StepGraphs, *args: Any) -> Any:
        graph = capture(self, *args)  # (a capture that fails raises, and counts nothing)
        captures.append(1)
        return graph

    monkeypatch.setattr(StepGraphs, "_capture", counting)
    graphed = train(run)
    assert captures
    init = StepGraphs.__init__
    monkeypatch.setattr(StepGraphs, "__init__", lambda self, capture: init(self, False))
    captures.clear()
    padded = train(run)  # the same kernels at the same shapes, launched one by one
    monkeypatch.setattr(FamilyState, "graphed_steps", False)
    plain = train(run)
    assert not captures
    users = np.arange(plain.split.n_users)
    with on("cuda"):
        a, p, b = (r.model.scores(users, None) for r in (graphed, padded, plain))
    assert np.isfinite(a).all()
    assert np.abs(a - p).max() <= 1e-5 * np.abs(p).max()  # (scatter-adds' atomics may reorder sums)
    assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()  # `tests/test_device.py`'s round-off
    for x, y in zip(graphed.result.history, plain.result.history, strict=True):
        for key, value in y.valid.items():
            assert x.valid[key] == pytest.approx(value, rel=1e-3, abs=1.0 / max(y.valid.get("users", 1), 1))
