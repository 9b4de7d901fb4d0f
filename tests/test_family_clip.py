"""``--set clip`` on the item family's closed-form members (FedMF, FedMF-bias, PFedRec, ...):
each client's gradient of a step, over its whole model, is clipped as ``clip_grad_norm_`` clips
one client's model trained alone. MetaMF's autograd path has its own test (tests/test_metamf.py);
this one covers the closed-form gradients (`fedrec.federated.family.model.linear_grads`) the option
reaches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from client_alone import small_split, train_alone, whole_cohort

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.federated.family.spec import FamilySpec
from fedrec.federated.family.state import FamilyState
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, LR_ITEM, BATCH, EPOCHS = 0.3, 40.0, 8, 2


@pytest.fixture(scope="module")
def split() -> Split:
    return small_split()


def _cohort(split: Split) -> CohortBatches:
    return whole_cohort(split, BATCH, EPOCHS)


def _reference_client(spec: FamilySpec, state: FamilyState, cohort: CohortBatches, k: int,
                      clipped: list[bool]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Client ``k`` alone (`client_alone.train_alone`): <u, q_j> + b_u, its step's gradient
    over (u, b_u, its item rows) clipped to ``spec.clip``."""
    client = int(cohort.clients[k])
    params = {n: state.private[n][client].clone() for n in spec.private_names()}
    table = state.items[torch.as_tensor(cohort.row_items[cohort.rows_of(k)])].clone()
    return train_alone(params, table, cohort, k, lambda p, rows: rows @ p["user"] + p["user_bias"], lr=LR,
                       lr_item=LR_ITEM, batch=BATCH, epochs=EPOCHS, clip=spec.clip, clipped=clipped)


def test_a_clipped_round_is_each_client_clipped_alone(split: Split) -> None:
    alg = get_algorithm("fedmf-bias")
    spec = alg.build(split, {**alg.defaults, "dim": 6, "clip": 0.5})
    assert spec.clip == 0.5 and spec.scorer.closed_form
    state, before = (FamilyState.create(spec, split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM,
                                        item_std=0.5, seed=2) for _ in range(2))
    cohort = _cohort(split)
    assert len({s.n_active for s in cohort.steps}) > 2, "batch counts must differ across clients"
    acc = state.begin_round(1)
    state.accumulate(acc, state.local_update(cohort, UploadPath()))
    state.aggregate(acc, UploadPath(), torch.Generator())

    items, clipped = before.items.clone(), []
    for k, client in enumerate(cohort.clients):
        params, table = _reference_client(spec, before, cohort, k, clipped)
        for name, value in params.items():
            torch.testing.assert_close(state.private[name][int(client)], value, **TOL)
        rows = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
        items[rows] += (table - before.items[rows]) / len(cohort.clients)
    torch.testing.assert_close(state.items, items, **TOL)
    assert 0.1 < np.mean(clipped) < 0.9, f"the clip must bind in some steps only: {np.mean(clipped):.2f}"


def _family_members() -> list[str]:
    """Every registered algorithm whose options are the family's (so a new member is tested
    without being listed here)."""
    from fedrec.algorithms import ALGORITHMS
    from fedrec.algorithms.federated import FamilyOptions

    return sorted(n for n, a in ALGORITHMS.items() if issubclass(a.options, FamilyOptions))


def test_the_family_is_found_from_the_registry() -> None:
    assert {"fedmf", "fedncf", "fedrecon", "pfedrec", "fedmf-bias", "fedavgm", "fedadam"} <= set(_family_members())


@pytest.mark.parametrize("name", _family_members())
def test_every_family_member_takes_the_clip(name: str) -> None:
    alg = get_algorithm(name)
    assert alg.build(None, {**alg.defaults, "clip": 2.0}).clip == 2.0
    assert alg.build(None, dict(alg.defaults)).clip == 0.0  # off unless asked: the papers' setting
    with pytest.raises(FedrecError, match="clip must be >= 0"):
        alg.build(None, {**alg.defaults, "clip": -1.0})
