"""FedDAE: a round of the vectorised clients against one client trained alone with dense
layers and ``torch.optim.Adam``; the server's step; runs end to end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.federated.dae.state import (
    _DROP_GATE,
    _DROP_GLOBAL,
    _DROP_LOCAL,
    _NOISE_GLOBAL,
    _NOISE_LOCAL,
    DAEState,
    _Bags,
)
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(30, 80, mean_interactions=10, min_interactions=4, seed=5))
    return make_split(x, "loo-full", seed=0)


def _spec(name: str = "feddae", **opts: Any) -> Any:
    alg = get_algorithm(name)
    return alg.build(None, {**alg.defaults, "latent": 6, "hidden": (10, 8), "gate_hidden": 5, **opts})  # type: ignore[arg-type]


def _cfg(**kw: Any) -> FederatedConfig:
    return FederatedConfig(**{"lr": 0.01, "local_epochs": 3, "rounds": 2, **kw})


def _alone(state: DAEState, user: int, r: int, lr: float, epochs: int) -> dict[str, torch.Tensor]:
    """``user`` trained alone: every layer dense (its private first layers as whole tables, the
    rows of other items never used), one ``torch.optim.Adam`` over all of them, the same draws;
    returns its parameters after the round and its summed gradients of the global parts."""
    spec, m = state.spec, state.matrix.shape[1]
    bag = state.matrix.indices[state.matrix.indptr[user]:state.matrix.indptr[user + 1]]
    x = torch.zeros(m)
    x[torch.as_tensor(bag)] = 1.0
    p = {k: v.clone() for k, v in state.glob.items()}
    for k, v in state.priv.items():
        if k.endswith(".W0"):
            full = torch.zeros(m, v.shape[1])
            full[torch.as_tensor(bag)] = v[state.matrix.indptr[user]:state.matrix.indptr[user + 1]]
            p[k] = full
        else:
            p[k] = v[user].clone()
    for v in p.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(p.values()), lr=lr, weight_decay=spec.weight_decay)
    acc = {k: torch.zeros_like(p[k]) for k in state.glob}
    bags = _Bags.of(state.matrix, np.array([user]))
    n_layers = len(spec.hidden) + 1

    def mlp(prefix: str, h: torch.Tensor, last_plain: bool = True) -> torch.Tensor:
        for j in range(n_layers):
            h = h @ p[f"{prefix}.W{j}"] + p[f"{prefix}.b{j}"]
            if j < n_layers - 1:
                h = torch.tanh(h)
        return h

    for e in range(epochs):
        noise = state._noise(bags, r, e)
        codes = []
        for prefix, drop, eps in (("l", _DROP_LOCAL, _NOISE_LOCAL), ("g", _DROP_GLOBAL, _NOISE_GLOBAL)):
            if f"{prefix}.W0" not in p:
                continue
            keep = torch.zeros(m)
            keep[torch.as_tensor(bag)] = noise[drop]
            h = mlp(prefix, F.normalize(x, dim=0) * keep)
            mu, logvar = h[: spec.latent], h[spec.latent :]
            codes.append((mu + noise[eps][0] * torch.exp(0.5 * logvar), mu, logvar))
        if spec.encoders == "dual":
            a = F.relu(x @ p["a.W0"] + p["a.b0"]) * noise[_DROP_GATE][0]
            w = torch.softmax(a @ p["a.W1"] + p["a.b1"], dim=0)
            (z1, mu1, lv1), (z2, mu2, lv2) = codes
            z, mu = w[0] * z1 + w[1] * z2, w[0] * mu1 + w[1] * mu2
            logvar = torch.log(w[0] ** 2 * lv1.exp() + w[1] ** 2 * lv2.exp())
        else:
            z, mu, logvar = codes[0]
        logits = mlp("d", z)
        loss = -(F.log_softmax(logits, dim=0) * x).sum() + state.beta(r) * (-0.5) * (1 + logvar - mu**2 - logvar.exp()).sum()
        opt.zero_grad()
        loss.backward()
        for k in acc:
            acc[k] += p[k].grad
        opt.step()
    return {**{k: v.detach() for k, v in p.items()}, **{f"acc.{k}": v for k, v in acc.items()}, "bag": torch.as_tensor(bag)}


@pytest.mark.parametrize("name", ["feddae", "fedvae"])
def test_a_round_trains_each_client_as_adam_on_its_dense_model(split: Split, name: str) -> None:
    spec, cfg = _spec(name), _cfg()
    state = DAEState(spec, split, seed=1)
    clients = np.arange(0, split.n_users, 3)
    ref = {int(u): _alone(state, int(u), r=2, lr=cfg.lr, epochs=cfg.local_epochs) for u in clients[[0, -1]]}
    sums, _, n = state.train(clients, cfg, r=2)
    assert n == len(clients)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    for u, want in ref.items():
        a, b = state.matrix.indptr[u], state.matrix.indptr[u + 1]
        for k, v in state.priv.items():
            got = v[a:b] if k.endswith(".W0") else v[u]
            torch.testing.assert_close(got, want[k][want["bag"]] if k.endswith(".W0") else want[k], **tol)
    # the server's sums are the clients' accumulated gradients: check them against the references
    # by training only those two clients
    two = DAEState(spec, split, seed=1)
    sums, _, n = two.train(np.array(sorted(ref)), cfg, r=2)
    for k, s in sums.items():
        want = sum(r[f"acc.{k}"] for r in ref.values())
        torch.testing.assert_close(s, want, **tol)


def test_the_server_steps_once_on_the_mean(split: Split) -> None:
    state = DAEState(_spec(), split, seed=0)
    before = {k: v.clone() for k, v in state.glob.items()}
    sums = {k: torch.ones_like(v) for k, v in state.glob.items()}
    state.server_step(sums, 4, lr=0.01)
    # Adam's first step moves every entry by lr against the sign of its gradient (plus decay)
    for k, v in state.glob.items():
        assert torch.allclose(before[k] - v, torch.full_like(v, 0.01), atol=1e-4)


def test_runs_end_to_end_learns_and_refuses_what_it_cannot_take(split: Split) -> None:
    out = run_federated(_spec(beta=0.0), split, _cfg(rounds=6), seed=0)  # the loss is the NLL alone
    assert len(out.history) == 6 and all(math.isfinite(h.loss) for h in out.history)
    assert out.history[-1].loss < out.history[0].loss
    assert out.history[0].bytes_up > 0
    with pytest.raises(FedrecError, match="no noise"):
        _spec().algorithm(split, _cfg(ldp=1.0), seed=0)
    with pytest.raises(FedrecError, match="encoders"):
        _spec(encoders="both")
