"""UNION's client-side term (``--client-objective union``, `fedrec.federated.family.objective.Contrast`):
a round equals each client trained alone on its mean BCE plus alpha times the contrastive
cross-entropy of each positive against another positive and K of its negatives (one SGD step on
their sum); alpha 0 is FedMF exactly; a client's draws do not depend on the cohort; UNION as
published (filter and term) runs, and on Flower."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from client_alone import small_split, whole_cohort

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.objective import Contrast, parse_objective
from fedrec.rounds import draws
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, LR_ITEM, BATCH, EPOCHS, DIM, K, ALPHA = 0.3, 2.0, 8, 2, 8, 3, 0.7
SEED, ROUND = 2, 3


def _state(split, objective: str | None):  # type: ignore[no-untyped-def]
    alg = get_algorithm("fedmf")
    spec = alg.build(split, {**alg.defaults, "dim": DIM})
    spec = spec.configured(federated_config("fedmf", client_objective=objective))
    state = spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5, seed=SEED)
    state.begin_round(ROUND)
    return state


def _alone(user: torch.Tensor, table: torch.Tensor, cohort, k: int, client: int):  # type: ignore[no-untyped-def]
    """Client ``k`` (id ``client``) trained alone: mean BCE of a batch plus alpha times the mean
    over the batch's positives of the contrastive cross-entropy, one plain SGD step a batch."""
    mine = cohort.sample_client == k
    rows, labels = cohort.sample_row[mine] - cohort.row_ptr[k], cohort.sample_label[mine]
    positives = np.unique(rows[labels > 0])
    negatives = np.setdiff1d(np.arange(len(table)), positives)
    per_epoch = len(rows) // EPOCHS
    for e in range(EPOCHS):
        for b, s in enumerate(range(0, per_epoch, BATCH)):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + BATCH, per_epoch))
            u, v = user.detach().requires_grad_(True), table.detach().requires_grad_(True)
            loss = F.binary_cross_entropy_with_logits(v[torch.as_tensor(rows[sl])] @ u,
                                                      torch.as_tensor(labels[sl]))
            anchors = np.sort(rows[sl][labels[sl] > 0])  # in item order
            if len(positives) >= 2 and len(anchors):
                draw = draws.uniforms((SEED, draws.CONTRAST, ROUND, e, b), np.array([client]),
                                      len(anchors) * (1 + K)).reshape(len(anchors), 1 + K)
                terms = []
                for a, row in zip(anchors, draw, strict=True):
                    others = positives[positives != a]
                    candidates = [others[min(int(row[0] * len(others)), len(others) - 1)],
                                  *negatives[np.minimum((row[1:] * len(negatives)).astype(int), len(negatives) - 1)]]
                    scores = v[torch.as_tensor(candidates)] @ v[int(a)]
                    terms.append(torch.logsumexp(scores, 0) - scores[0])
                loss = loss + ALPHA * torch.stack(terms).mean()
            gu, gv = torch.autograd.grad(loss, [u, v])
            user, table = u - LR * gu, v - LR_ITEM * gv
    return user.detach(), table.detach()


def test_a_round_is_each_client_trained_alone_on_its_loss_and_the_term() -> None:
    split = small_split()
    cohort = whole_cohort(split, BATCH, EPOCHS)
    state, before = _state(split, f"union:alpha={ALPHA},negatives={K}"), _state(split, None)
    up = state.local_update(cohort, UploadPath())
    plain = _state(split, None).local_update(cohort, UploadPath())
    moved = 0
    for k, client in enumerate(cohort.clients):
        rows = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
        user, table = _alone(before.private["user"][int(client)].clone(), before.items[rows].clone(),
                             cohort, k, int(client))
        torch.testing.assert_close(state.private["user"][int(client)], user, **TOL)
        torch.testing.assert_close(up.delta[cohort.rows_of(k)], table - before.items[rows], **TOL)
        moved += not torch.allclose(up.delta[cohort.rows_of(k)], plain.delta[cohort.rows_of(k)])
    assert moved > len(cohort.clients) // 2  # the term changed most clients' rows


def test_alpha_zero_is_fedmf_and_a_clients_draws_ignore_its_cohort() -> None:
    split = small_split()
    cohort = whole_cohort(split, BATCH, EPOCHS)
    zero = _state(split, "union:alpha=0").local_update(cohort, UploadPath())
    plain = _state(split, None).local_update(cohort, UploadPath())
    assert torch.equal(zero.delta, plain.delta)
    # a client trained within a cohort of other clients sends what it sends alone
    term = f"union:alpha={ALPHA},negatives={K}"
    whole = _state(split, term).local_update(cohort, UploadPath())
    few = whole_cohort(split, BATCH, EPOCHS)  # the same layout, then only its first two clients trained
    alone = _state(split, term)
    two = alone.local_update(_first(few, 2), UploadPath())
    end = int(cohort.row_ptr[2])
    torch.testing.assert_close(two.delta, whole.delta[:end], rtol=0, atol=1e-6)


def _first(cohort, n: int):  # type: ignore[no-untyped-def]
    """The cohort's first ``n`` clients alone (their rows, steps and samples)."""
    from dataclasses import replace

    from fedrec.rounds.cohort import Step

    end = int(cohort.row_ptr[n])
    steps = []
    for s in cohort.steps:
        keep = s.flat_owner < n
        if keep.any():
            steps.append(Step(min(s.n_active, n), s.batch_size, s.flat_rows[keep], s.flat_owner[keep],
                              s.flat_labels[keep], s.flat_slot[keep]))
    mine = cohort.sample_client < n
    return replace(cohort, clients=cohort.clients[:n], row_items=cohort.row_items[:end], row_ptr=cohort.row_ptr[: n + 1],
                   steps=steps, sample_client=cohort.sample_client[mine], sample_row=cohort.sample_row[mine],
                   sample_label=cohort.sample_label[mine])


def test_union_runs_as_published_and_bad_settings_are_one_line() -> None:
    """UNION as published, the server filter with the term, still flags exactly
    ClusterAttack's clients; bad settings and a fit to ratings are refused in one line."""
    cfg = RunConfig(algorithm="fedmf", dataset="synthetic:300x400", protocol="loo-sampled",
                    federated=federated_config("fedmf", rounds=6, backoffs=0, attack="clusterattack", boost=10.0,
                                               defence="union", client_objective="union"))
    last = train(cfg).result.history[-1].extra
    assert last["flagged"] == last["malicious_clients"] and last["flag_precision"] == 1.0
    with pytest.raises(FedrecError, match="negatives >= 1"):
        parse_objective("union:negatives=0")
    assert parse_objective("union") == Contrast()
    with pytest.raises(FedrecError, match="no negatives"):
        train(RunConfig("fedmf", dataset="synthetic:60x200", protocol="ratio-rating",
                        federated=federated_config("fedmf", rounds=1, negatives=0, client_objective="union")))


def test_flower_in_process_equals_the_simulator_with_the_term() -> None:
    from fedrec.flower.dispatch import run_in_process

    cfg = RunConfig("fedmf", dataset="synthetic:60x300", seed=3, model={"dim": 8},
                    federated=federated_config("fedmf", rounds=3, clients_per_round=0.5, memory_budget_mb=0.05,
                                               client_objective="union"))
    done = train(cfg).result
    got = run_in_process(cfg, 3).out
    for x, y in zip(got.history, done.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-6, abs=1e-9)
    assert got.test == pytest.approx(done.test, rel=1e-6)
