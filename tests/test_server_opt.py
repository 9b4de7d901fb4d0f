"""The server optimiser as a part of every item-family member (``--server-opt``): FedYogi's
step, the option's parsing, FedAvgM/FedAdam/FedYogi as FedMF with theirs, PFedRec and MetaMF
with one, on Flower as in the simulator, and the refusals."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.engine import FederatedConfig
from fedrec.federated.family.server_opt import Adam, ServerOpt, Yogi


def test_yogi_moves_its_second_moment_additively_towards_the_squared_update():
    yogi, adam = Yogi(0.1, 0.9, 0.99, 1e-3), Adam(0.1, 0.9, 0.99, 1e-3)
    x = torch.tensor([0.0, 0.0])
    first = torch.tensor([3.0, 0.01])
    for opt in (yogi, adam):
        opt.update("items", x, x + first)
    v0 = 1e-6 + 0.01 * first**2 * torch.sign(first**2 - 1e-6)  # v < d² at the start: both grow alike
    torch.testing.assert_close(yogi.moments["items"][1], v0)
    torch.testing.assert_close(adam.moments["items"][1], 0.99 * 1e-6 + 0.01 * first**2)
    # a small update next: Yogi's v shrinks by (1 - b2) d² where v > d², Adam's decays by b2
    d = torch.tensor([0.001, 0.001])
    v_yogi, v_adam = yogi.moments["items"][1].clone(), adam.moments["items"][1].clone()
    y1 = yogi.update("items", x, x + d)
    adam.update("items", x, x + d)
    want = v_yogi - 0.01 * d**2 * torch.sign(v_yogi - d**2)
    torch.testing.assert_close(yogi.moments["items"][1], want)
    torch.testing.assert_close(adam.moments["items"][1], 0.99 * v_adam + 0.01 * d**2)
    m = 0.9 * 0.1 * first + 0.1 * d
    torch.testing.assert_close(y1, x + 0.1 * m / (want.sqrt() + 1e-3))


@pytest.mark.parametrize("kind", [Adam, Yogi])
def test_union_reads_an_adaptive_servers_next_step_with_one_clients_change_as_the_rounds(kind):
    """`row_step` is the next `update` with the round's mean one client's table (current + its
    change), on a copy: rows the client did not send move by their moments alone, and the
    optimiser's moments are not touched. FedAvg and FedAvgM leave it to UNION's share."""
    opt = kind(0.1, 0.9, 0.99, 1e-3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 3, generator=gen)
    rows = torch.tensor([1, 4])
    change = torch.randn(2, 3, generator=gen).double()
    fresh = opt.row_step("items")(x[rows].double(), rows, change)  # no moments yet
    first = kind(0.1, 0.9, 0.99, 1e-3).update("items", x[rows].clone(), x[rows] + change.float())
    torch.testing.assert_close(fresh, first.double(), rtol=1e-5, atol=1e-7)
    opt.update("items", x, x + torch.randn(6, 3, generator=gen))  # moments of a first round
    kept = [t.clone() for t in opt.moments["items"]]
    mean = x.clone()
    mean[rows] += change.float()
    want = copy.deepcopy(opt).update("items", x.clone(), mean)
    step = opt.row_step("items")
    torch.testing.assert_close(step(x[rows].double(), rows, change), want[rows].double(), rtol=1e-5, atol=1e-7)
    others = torch.tensor([0, 2, 3, 5])
    torch.testing.assert_close(step(x[others].double(), others, None), want[others].double(), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(want[others], x[others])  # the moments alone move them
    assert all(torch.equal(a, b) for a, b in zip(kept, opt.moments["items"], strict=True))
    assert ServerOpt("avg").make().row_step("items") is None and ServerOpt("avgm").make().row_step("items") is None


def test_the_option_parses_checks_and_prints_back():
    opt = ServerOpt.parse("yogi:lr=0.05, tau=0.01")
    assert (opt.name, opt.lr, opt.tau) == ("yogi", 0.05, 0.01)
    assert ServerOpt.parse(opt.text()) == opt and ServerOpt.parse("avgm").text() == "avgm"
    assert ServerOpt.parse("avgm").lr == 0.1 and ServerOpt().lr == 1.0
    assert ServerOpt("avgm", lr=0.1) == ServerOpt.parse("avgm")  # they step alike
    for bad, message in [("sgd", "must be one of avg, avgm, adam, yogi"), ("adam:lrr=1", "unknown --server-opt adam lrr"),
                         ("adam:lr", "KEY=VALUE"), ("adam:lr=-1", "lr must be > 0"),
                         ("avgm:momentum=1", "momentum must be in"), ("adam:lr=x", "lr")]:
        with pytest.raises(FedrecError, match=message):
            ServerOpt.parse(bad)
    with pytest.raises(FedrecError, match="must be one of"):
        FederatedConfig(server_opt="sgd").validate()
    # no server optimiser named: the engine's identity (cache and cell keys) leaves the option out
    assert "server_opt" not in FederatedConfig.identity(dataclasses.asdict(FederatedConfig()))


def _run(name: str, rounds: int = 3, **engine: object):  # type: ignore[no-untyped-def]
    cfg = RunConfig(name, dataset="synthetic:120x300", seed=1, model={"dim": 8},
                    federated=federated_config(name, rounds=rounds, **engine))
    return train(cfg)


@pytest.mark.parametrize(("name", "server"), [("fedavgm", "avgm"), ("fedadam", "adam"), ("fedyogi", "yogi")])
def test_the_named_methods_are_fedmf_with_their_server_optimiser(name: str, server: str):
    a, b = _run(name), _run("fedmf", server_opt=server)
    assert [h.valid for h in a.result.history] == [h.valid for h in b.result.history]
    assert torch.equal(a.model.state.items, b.model.state.items)
    assert a.model.server_state_dict()["server_optimizer"].keys() == {"moments" if server != "avgm" else "buffers"}


@pytest.mark.parametrize("name", ["pfedrec", "metamf"])
def test_pfedrec_and_metamf_take_a_server_optimiser(name: str):
    plain, yogi = _run(name), _run(name, server_opt="yogi")
    moments = yogi.model.server_state_dict()["server_optimizer"]["moments"]
    assert "items" in moments and (name != "metamf" or len(moments) > 1)  # MetaMF's shared weights too
    assert [h.valid for h in plain.result.history] != [h.valid for h in yogi.result.history]
    assert "server_optimizer" not in yogi.model.client_state_dict()


def test_avg_at_its_default_step_is_fedavg_and_a_smaller_step_moves_less():
    base, avg = _run("fedmf", rounds=1), _run("fedmf", rounds=1, server_opt="avg")
    half = _run("fedmf", rounds=1, server_opt="avg:lr=0.5")
    assert torch.equal(base.model.state.items, avg.model.state.items)
    start = _run("fedmf", rounds=1, lr=1e-12).model.state.items  # (no client moves: the initial table)
    torch.testing.assert_close(half.model.state.items - start, 0.5 * (base.model.state.items - start),
                               rtol=1e-4, atol=1e-6)


def test_flower_in_process_equals_the_simulator_with_a_server_optimiser():
    from fedrec.flower.dispatch import run_in_process

    cfg = RunConfig("pfedrec", dataset="synthetic:120x300", seed=1, model={"dim": 8},
                    federated=federated_config("pfedrec", rounds=2, clients_per_round=0.5, server_opt="adam"))
    sim = train(cfg).result
    got = run_in_process(cfg, 3).out
    for x, y in zip(got.history, sim.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-6, abs=1e-9)
    assert got.test == pytest.approx(sim.test, rel=1e-6)


def test_union_takes_the_server_optimisers_step_in_the_simulator_and_on_flower(monkeypatch):
    """Under ``--union-step server`` UNION judges each client at the server optimiser's own step,
    in the simulator and on a deployment's server; by default at the share of a plain average."""
    from fedrec.flower.dispatch import run_in_process
    from fedrec.security import robust

    steps = []
    real = robust.union_filter

    def spy(uploads, table, byzantine, key=(), step=None):  # type: ignore[no-untyped-def]
        steps.append(step)
        return real(uploads, table, byzantine, key, step)

    monkeypatch.setattr(robust, "union_filter", spy)
    cfg = RunConfig("fedmf", dataset="synthetic:120x300", seed=1, model={"dim": 8},
                    federated=federated_config("fedmf", rounds=2, clients_per_round=0.5, server_opt="adam",
                                               defence="union", union_step="server"))
    train(cfg)
    run_in_process(cfg, 2)
    assert len(steps) == 4 and all(s is not None and s.__qualname__.startswith("Adam.row_step") for s in steps)
    steps.clear()
    train(dataclasses.replace(cfg, federated=dataclasses.replace(cfg.federated, union_step="share")))
    assert steps == [None, None]


def test_refusals():
    with pytest.raises(FedrecError, match="fedrap aggregates its own way"):
        _run("fedrap", rounds=1, server_opt="adam")
    with pytest.raises(FedrecError, match="FedMF with avgm.*run fedmf --server-opt adam"):
        _run("fedavgm", rounds=1, server_opt="adam")
    _run("fedavgm", rounds=1, server_opt="avgm")  # its own, named: nothing to refuse
