"""FedAvgM: FedMF exactly without momentum; with it, the server steps by the buffered update."""

from __future__ import annotations

import torch

from fedrec.algorithms import get_algorithm
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.server_opt import Momentum


def _run(name: str, **options) -> torch.Tensor:  # type: ignore[no-untyped-def]
    cfg = RunConfig(name, dataset="synthetic:120x300", seed=1, model={"dim": 8, **options},
                    federated=federated_config(name, rounds=2))
    done = train(cfg)
    return done.model.state.items, done.result


def test_without_momentum_it_is_fedmf():
    a, ra = _run("fedavgm", momentum=0.0, server_lr=1.0)
    b, rb = _run("fedmf")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [h.valid for h in ra.history] == [h.valid for h in rb.history]


def test_momentum_buffers_the_pseudo_gradient():
    opt = Momentum(server_lr=0.5, momentum=0.9)
    x = torch.zeros(3)
    x1 = opt.update("items", x, torch.tensor([1.0, 2.0, 3.0]))  # m = d1
    torch.testing.assert_close(x1, torch.tensor([0.5, 1.0, 1.5]))
    x2 = opt.update("items", x1, x1 + 1.0)  # m = 0.9 d1 + 1
    torch.testing.assert_close(x2, x1 + 0.5 * (0.9 * torch.tensor([1.0, 2.0, 3.0]) + 1.0))
    again = Momentum(0.5, 0.9)
    again.load_state_dict(opt.state_dict())
    torch.testing.assert_close(again.update("items", x2, x2), x2 + 0.5 * 0.9 * opt.buffers["items"])


def test_options_are_typed_and_checked():
    spec = get_algorithm("fedavgm")
    assert spec.parse({"momentum": "0.5"}).momentum == 0.5
    import pytest

    from fedrec.errors import FedrecError

    with pytest.raises(FedrecError, match="momentum must be in"):
        spec.parse({"momentum": 1.5})
