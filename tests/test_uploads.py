"""The upload stage: noise added by the clients (a Flower node) equals in distribution the
noise sum the simulator draws in one pass, and a Flower deployment noises uploads on its nodes."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from fedrec.experiment import RunConfig, federated_config
from fedrec.rounds.upload import UploadPath


def _draws(path: UploadPath, parts: list[int], samples: int, seed: int) -> np.ndarray:
    """``samples`` draws of a round's noise (one entry), as the sum over nodes holding
    ``parts`` clients each."""
    n = sum(parts)
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros((samples, 1))
    for k in parts:
        total += path.local_noise(k, n, (samples, 1), gen)
    return total.numpy().ravel()


def test_nodes_local_noise_sums_to_the_simulators_noise_sum() -> None:
    for path in (UploadPath(ldp=0.3), UploadPath(dp_clip=0.5, dp_noise=1.2),
                 UploadPath(ldp=0.1, dp_clip=0.5, dp_noise=0.7)):
        one_pass = _draws(path, [10], 20000, seed=1)  # noise_sum(10, ...)
        by_nodes = _draws(path, [3, 5, 2], 20000, seed=2)
        assert stats.ks_2samp(one_pass, by_nodes).pvalue > 0.01
        var = 2 * path.ldp**2 * 10 + (2 * path.dp_noise * (path.dp_clip or 0)) ** 2
        assert np.isfinite(by_nodes).all()
        assert abs(np.var(by_nodes) / var - 1) < 0.05
    # and a wrong split of the Gaussian shares would be caught: k shares of n, not of k
    wrong = torch.zeros((20000, 1))
    gen = torch.Generator().manual_seed(3)
    for k in (3, 5, 2):
        wrong += UploadPath(dp_clip=0.5, dp_noise=1.2).local_noise(k, k, (20000, 1), gen)
    assert stats.ks_2samp(_draws(UploadPath(dp_clip=0.5, dp_noise=1.2), [10], 20000, 1),
                          wrong.numpy().ravel()).pvalue < 1e-6


def test_flower_nodes_add_the_ldp_noise_the_server_no_longer_adds() -> None:
    from fedrec.flower.dispatch import run_in_process

    def table(ldp: float) -> torch.Tensor:
        run = RunConfig("fedmf", dataset="synthetic:90x300", seed=4, model={"dim": 8},
                        federated=federated_config("fedmf", rounds=1, ldp=ldp, paper=True))
        return run_in_process(run, 3).side.state.items.clone()

    lam = 0.2
    diff = (table(lam) - table(0.0)).numpy()
    # every entry moved by the mean of 90 clients' Laplace(0, lam) noise: variance 2 lam^2 / 90
    assert abs(diff.var() / (2 * lam**2 / 90) - 1) < 0.1
    assert abs(diff.mean()) < 3 * (2 * lam**2 / 90 / diff.size) ** 0.5


def test_kept_uploads_are_each_clients_own_and_sum_to_the_folded_round() -> None:
    from fedrec.experiment import build_trainable, prepare_split

    run = RunConfig("fedmf", dataset="synthetic:120x300", seed=2, model={"dim": 8},
                    federated=federated_config("fedmf", rounds=1, clients_per_round=0.5,
                                               memory_budget_mb=0.05))
    split = prepare_split(run)
    _, algorithm = build_trainable(run, split)
    algorithm.keep_uploads = True
    plan = algorithm.plan(1)
    algorithm.begin_round(plan)
    uploads = algorithm.local_update(plan)
    clients = uploads.per_client
    assert len({id(c) for c in clients}) == len(plan.clients)
    assert sorted(u.client for u in clients) == sorted(plan.clients.tolist())
    total = torch.zeros_like(uploads.payload.item_sum)
    for u in clients:
        delta = u.tensors["items"]
        assert set(u.items) <= set(range(split.n_items)) and len(u.items) == len(delta)
        assert set(split.train[u.client].indices) <= set(u.items)  # its positives travel
        total.index_add_(0, torch.as_tensor(u.items), delta)
    torch.testing.assert_close(total, uploads.payload.item_sum)


def test_flower_reports_the_privacy_its_nodes_noise_buys() -> None:
    from fedrec.experiment import train
    from fedrec.flower.dispatch import run_in_process

    run = RunConfig("pfedrec", dataset="synthetic:90x300", seed=4, model={"dim": 8},
                    federated=federated_config("pfedrec", rounds=2, dp_clip=0.5, dp_noise=1.0))
    flower = run_in_process(run, 3).out.extra["privacy"]
    assert flower == train(run).result.extra["privacy"]  # the simulator's accounting
    assert flower["rounds"] == 2 and flower["epsilon"] > 0


def test_autoencoder_clients_send_only_their_items_rows() -> None:
    from fedrec.experiment import build_trainable, prepare_split

    run = RunConfig("personalfr", dataset="synthetic:120x300", protocol="ratio-rating", seed=2,
                    model={"clients": 12, "hidden": (16, 8)},
                    federated=federated_config("personalfr", rounds=1, clients_per_round=0.5))
    split = prepare_split(run)
    _, algorithm = build_trainable(run, split)
    algorithm.keep_uploads = True
    plan = algorithm.plan(1)
    uploads = algorithm.local_update(plan)
    state = algorithm.state
    assert sorted(u.client for u in uploads.per_client) == sorted(plan.clients.tolist())
    for u in uploads.per_client:
        users = state.partition.client_users[state.partition.client_ptr[u.client]:
                                             state.partition.client_ptr[u.client + 1]]
        assert set(u.items) == set(split.train[users].indices)  # exactly its users' rated items
        assert u.tensors["dec.out"].shape == (len(u.items), 16)
        assert "enc.in" not in u.tensors  # the encoder stays private
