"""FedMF with a private per-user bias: the bias is a per-user parameter, trained in closed form."""

from __future__ import annotations

import torch

from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.model import batch_loss, linear_grads
from fedrec.federated.family.spec import FamilySpec


def test_closed_form_gradients_equal_autograd():
    spec = FamilySpec(score="dot-bias", private_score=False, dual=False, dim=4)
    gen = torch.Generator().manual_seed(0)
    p = {"user": torch.randn(3, 4, generator=gen), "user_bias": torch.randn(3, generator=gen)}
    v = torch.randn(3, 5, 4, generator=gen)
    y = (torch.rand(3, 5, generator=gen) > 0.5).float()
    m = torch.ones(3, 5)
    loss_t, grads = linear_grads(spec, p, v, y, m, ["user", "user_bias"], items=True)
    loss = float(loss_t)
    leaves = {k: t.clone().requires_grad_(True) for k, t in p.items()}
    vv = v.clone().requires_grad_(True)
    ref = batch_loss(spec, leaves, vv, y, m)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-5
    for k in p:
        torch.testing.assert_close(grads[k], leaves[k].grad)
    torch.testing.assert_close(grads["items"], vv.grad)


def test_bias_is_private_and_moves():
    cfg = RunConfig("fedmf-bias", dataset="synthetic:120x300", seed=1, model={"dim": 8},
                    federated=federated_config("fedmf-bias", rounds=2))
    model = train(cfg).model
    private = model.client_state_dict()["private"]
    assert private["user_bias"].shape == (120,)
    assert model.state.spec.score == "dot-bias"
    # the bias starts in U(+-1/sqrt(8)); training moves some past that
    assert float(private["user_bias"].abs().max()) > 1 / 8**0.5
    assert "user_bias" not in model.server_state_dict()["shared"]
