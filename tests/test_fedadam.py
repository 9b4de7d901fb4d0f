"""FedAdam: the server's Adam step on the pseudo-gradient (Reddi et al. 2021, no bias correction)."""

from __future__ import annotations

import torch

from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.server_opt import Adam


def test_server_step_is_adam_on_the_mean_update():
    opt = Adam(server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    x = torch.tensor([0.0, 1.0])
    d = torch.tensor([2.0, -0.5])
    x1 = opt.update("items", x, x + d)
    m, v = 0.1 * d, 0.99 * 1e-3**2 + 0.01 * d**2
    torch.testing.assert_close(x1, x + 0.1 * m / (v.sqrt() + 1e-3))
    # each coordinate moves by about server_lr (1 - b1) / sqrt(1 - b2) = 0.1 in the first round,
    # whatever the size of the clients' update
    assert torch.allclose((x1 - x).abs(), torch.full((2,), 0.1), atol=2e-3)


def test_fedadam_trains_and_keeps_its_moments_on_the_server():
    cfg = RunConfig("fedadam", dataset="synthetic:120x300", seed=1, model={"dim": 8},
                    federated=federated_config("fedadam", rounds=2))
    model = train(cfg).model
    moments = model.server_state_dict()["server_optimizer"]["moments"]
    assert set(moments) == {"items"}
    assert "server_optimizer" not in model.client_state_dict()
