"""fedrec on Flower's simulation engine (Ray): a checkpointed run resumes with its clients'
private state, and SecAgg+ sums what the plain server sums."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flower_support import (
    assert_same_outcome,
    make_run,
    read_flower_outcome,
)

from fedrec.core import checkpoint
from fedrec.flower.dispatch import run_in_process


def test_simulation_engine_resumes_a_checkpointed_run(tmp_path: Path) -> None:
    """Flower's simulation engine: 2 rounds with a checkpoint, then a new run resumes to 4;
    the clients' private state (FedCA's models, with the mixtures an evaluation message
    delivered, of the half of the clients each round samples) comes back from their disk; the
    figures are an uninterrupted run's. (Every method's private state is whole in its bytes: in
    `tests/test_contract.py` and `tests/test_flower.py` each message is answered by a fresh
    node that loads only them; what this adds is the disk and Ray, which are the same for
    every method, so one method with the most state stands for all.)"""
    from fedrec.flower.launch import simulate

    opts = {"clients_per_round": 0.5}
    full = make_run("fedca", rounds=4, **opts)
    kw = {"checkpoint": tmp_path / "server.ckpt", "client_state_dir": tmp_path / "clients"}
    simulate(make_run("fedca", rounds=2, **opts), 3, out=tmp_path / "first.json", **kw)
    simulate(full, 3, out=tmp_path / "resumed.json", resume=True, **kw)
    resumed = read_flower_outcome(tmp_path / "resumed.json")
    assert_same_outcome(resumed, run_in_process(full, 3).out)


@pytest.mark.parametrize(("alg", "engine"), [
    ("fedmf", {"aggregation": "clients"}),  # the papers' rule: each row's sum over the round's clients
    # fedrec's rule (each row over its senders, who are summed securely too), and CoLR's
    # coordinates: the masked table is n_items x rank
    ("colr", {"model": {"rank": 3}}),
])
def test_secure_aggregation_sums_what_the_plain_server_sums(tmp_path: Path, alg: str, engine: dict[str, Any]) -> None:
    """Through Flower's SecAgg+ (simulation engine): the server's table after 2 rounds is the
    plain aggregate up to SecAgg+'s quantisation (steps of 2 x range / 2^24)."""
    from fedrec.flower.launch import simulate

    run = make_run(alg, rounds=2, **engine)
    ckpt = tmp_path / "server.ckpt"
    simulate(run, 3, out=tmp_path / "secure.json", checkpoint=ckpt, secagg=True)
    secure = checkpoint.read(ckpt)
    plain = run_in_process(run, 3)
    from fedrec.flower.secagg import QUANTIZATION, RANGE

    step = 2 * RANGE / QUANTIZATION
    diff = (secure["state"]["server"]["role"]["items"] - plain.side.state.items).abs()  # the one checkpoint format
    assert 0 < float(diff.max()) < 2 * 3 * step  # quantised (not bypassed), within a round's steps
    history = json.loads((tmp_path / "secure.json").read_text())["history"]
    assert [h["extra"]["secure_aggregation"] for h in history] == [1.0, 1.0]
    assert [h["bytes_up"] for h in history] == [h.bytes_up for h in plain.out.history]
