"""FedProx and the client-objective hook (``--client-objective``): mu 0 is FedMF exactly; an
overwhelming mu holds every client at the round's rows; the term combines with PFedRec and
MetaMF, on Flower as in the simulator."""

from __future__ import annotations

import pytest
import torch

from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.objective import Proximal


def _run(name: str, rounds: int = 2, model: dict | None = None, **engine: object):  # type: ignore[no-untyped-def]
    cfg = RunConfig(name, dataset="synthetic:120x300", seed=1, model={"dim": 8, **(model or {})},
                    federated=federated_config(name, rounds=rounds, **engine))
    return cfg, train(cfg)


def test_without_the_term_it_is_fedmf():
    _, a = _run("fedprox", model={"mu": 0.0})
    _, b = _run("fedmf")
    assert [h.valid for h in a.result.history] == [h.valid for h in b.result.history]
    assert torch.equal(a.model.state.items, b.model.state.items)


def test_the_proximal_step_pulls_towards_the_rounds_rows_and_never_past_them():
    term = Proximal(mu=0.5)
    current, sent = torch.tensor([3.0, -1.0]), torch.tensor([1.0, 1.0])
    d = term.step("items", current.clone(), sent, lr=4.0)  # lr mu = 2: a gradient step would overshoot
    torch.testing.assert_close(current - d, current - (2 / 3) * (current - sent))
    # an overwhelming mu keeps every item row where the round sent it: the table never moves
    _, start = _run("fedmf", rounds=1, lr=1e-12)
    _, held = _run("fedprox", rounds=2, model={"mu": 1e12})
    torch.testing.assert_close(held.model.state.items, start.model.state.items, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["pfedrec", "metamf"])
def test_pfedrec_and_metamf_take_the_term(name: str):
    _, plain = _run(name)
    _, zero = _run(name, client_objective="prox:mu=0")
    _, prox = _run(name, client_objective="prox:mu=1")
    for x, y in zip(plain.result.history, zero.result.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-5, abs=1e-7)
    assert [h.valid for h in prox.result.history] != [h.valid for h in plain.result.history]


def test_flower_in_process_equals_the_simulator_with_the_term():
    from fedrec.flower.dispatch import run_in_process

    cfg, done = _run("pfedrec", clients_per_round=0.5, client_objective="prox:mu=0.5")
    got = run_in_process(cfg, 3).out
    for x, y in zip(got.history, done.result.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-6, abs=1e-9)
    assert got.test == pytest.approx(done.result.test, rel=1e-6)
