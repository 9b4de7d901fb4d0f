"""CoLR (`fedrec.federated.colr`): a round is each client trained on the official code's
low-rank parameters (a frozen table E, E + A B with A from zero, B the round's orthonormal rows
times sqrt(d/r), A's gradient times sqrt(r/d), plain SGD); its upload is r coordinates a row,
counted as such; rank = dim is FedMF."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from client_alone import small_split, whole_cohort

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.federated.colr import CoLRState, round_basis
from fedrec.federated.family.state import FamilyState
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES, UploadPath

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, LR_ITEM, BATCH, EPOCHS, DIM, RANK = 0.3, 5.0, 8, 2, 8, 3


@pytest.fixture(scope="module")
def split() -> Split:
    return small_split()


def _cohort(split: Split) -> CohortBatches:
    return whole_cohort(split, BATCH, EPOCHS)


def _state(split: Split, name: str = "colr", **model: int) -> FamilyState:
    alg = get_algorithm(name)
    spec = alg.build(split, {**alg.defaults, "dim": DIM, **model})
    return spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=LR_ITEM, item_std=0.5, seed=2)


def _official_client(user: torch.Tensor, table: torch.Tensor, basis: torch.Tensor, cohort: CohortBatches,
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``k`` as the official code trains it: E frozen, A (rows x r) from zero, B the
    basis times sqrt(d/r), A's gradient times sqrt(r/d); mean BCE a batch, plain SGD. Returns
    the user vector and A."""
    d, r = basis.shape[1], basis.shape[0]
    b = basis * math.sqrt(d / r)
    a = torch.zeros(len(table), r)
    mine = cohort.sample_client == k
    rows, labels = cohort.sample_row[mine] - cohort.row_ptr[k], cohort.sample_label[mine]
    per_epoch = len(rows) // EPOCHS
    for e in range(EPOCHS):
        for s in range(0, per_epoch, BATCH):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + BATCH, per_epoch))
            u, aa = user.detach().requires_grad_(True), a.detach().requires_grad_(True)
            v = (table + aa @ b)[torch.as_tensor(rows[sl])]
            loss = F.binary_cross_entropy_with_logits(v @ u, torch.as_tensor(labels[sl]))
            gu, ga = torch.autograd.grad(loss, [u, aa])
            user, a = u - LR * gu, aa - LR_ITEM * math.sqrt(r / d) * ga
    return user.detach(), a.detach()


def test_a_round_is_each_client_trained_on_the_official_low_rank_parameters(split: Split) -> None:
    state, before = _state(split, rank=RANK), _state(split, rank=RANK)
    assert isinstance(state, CoLRState)
    cohort = _cohort(split)
    state.begin_round(1)
    up = state.local_update(cohort, UploadPath())
    basis = round_basis(2, 1, DIM, RANK)
    torch.testing.assert_close(state.basis, basis)
    torch.testing.assert_close(basis @ basis.T, torch.eye(RANK), rtol=0, atol=1e-6)
    b = basis * math.sqrt(DIM / RANK)
    for k, client in enumerate(cohort.clients):
        rows = torch.as_tensor(cohort.row_items[cohort.rows_of(k)])
        user, a = _official_client(before.private["user"][int(client)].clone(), before.items[rows].clone(),
                                   basis, cohort, k)
        torch.testing.assert_close(state.private["user"][int(client)], user, **TOL)
        torch.testing.assert_close(up.delta[cohort.rows_of(k)], a @ b, **TOL)
    # what travels is r numbers a row (the official A, times sqrt(d/r)), from which the server
    # rebuilds the rows' change
    coords = state.wire_rows(up.delta)
    assert coords.shape == (len(cohort.row_items), RANK)
    torch.testing.assert_close(state.unwire_rows(coords), up.delta, **TOL)
    assert up.bytes_up == len(cohort.row_items) * (INDEX_BYTES + RANK * FLOAT_BYTES)
    assert float(up.delta.abs().max()) > 1e-3  # the rows moved


def test_every_party_draws_the_rounds_basis_and_it_changes_each_round() -> None:
    first, again, second = round_basis(5, 1, 16, 4), round_basis(5, 1, 16, 4), round_basis(5, 2, 16, 4)
    assert torch.equal(first, again)
    # the subspaces differ: their principal cosines are below 1
    assert float(torch.linalg.svdvals(first @ second.T).max()) < 0.99


def test_a_dense_upload_is_the_whole_table_of_coordinates(split: Split) -> None:
    state, cohort = _state(split, rank=RANK), _cohort(split)
    state.begin_round(1)
    up = state.local_update(cohort, UploadPath(encoding="dense"))
    assert up.bytes_up == len(cohort.clients) * split.n_items * RANK * FLOAT_BYTES


def test_rank_equal_to_dim_is_fedmf(split: Split) -> None:
    colr, fedmf, cohort = _state(split, rank=DIM), _state(split, "fedmf"), _cohort(split)
    for state in (colr, fedmf):
        acc = state.begin_round(1)
        state.accumulate(acc, state.local_update(cohort, UploadPath()))
        state.aggregate(acc, UploadPath(), torch.Generator())
    torch.testing.assert_close(colr.items, fedmf.items, **TOL)
    torch.testing.assert_close(colr.private["user"], fedmf.private["user"], **TOL)


@pytest.mark.parametrize(("model", "says"), [
    ({"rank": 0}, "rank must be in 1..dim"),
    ({"rank": 40}, "rank must be in 1..dim"),
    ({"dual": True}, "dual"),
])
def test_bad_options_are_one_line(split: Split, model: dict[str, int], says: str) -> None:
    alg = get_algorithm("colr")
    with pytest.raises(FedrecError, match=says):
        alg.build(split, {**alg.defaults, "dim": 32, **model})


def test_ldp_noise_is_drawn_on_the_coordinates_and_lands_in_the_rounds_subspace(split: Split) -> None:
    """Under --ldp a client sends its n_items x r coordinates with Laplace noise on each: the
    table moves by the noise-free mean plus noise that lies in the round's subspace, each
    coordinate of it Laplace(λ) summed over the round's clients and divided by them."""
    cohort = _cohort(split)
    tables = {}
    for name, path in (("plain", UploadPath()), ("ldp", UploadPath(ldp=0.5))):
        state = _state(split, rank=RANK)
        state.per_row = False  # the papers' rule: noise is a round's clients' (the engine's check)
        acc = state.begin_round(1)
        state.accumulate(acc, state.local_update(cohort, path))
        state.aggregate(acc, path, torch.Generator().manual_seed(5))
        tables[name] = state.items
        basis = state.basis
    n = len(cohort.clients)
    noise = (tables["ldp"] - tables["plain"]) * n  # the clients' summed noise
    assert basis is not None
    coords = noise @ basis.T
    torch.testing.assert_close(coords @ basis, noise, rtol=1e-4, atol=1e-4)  # in the subspace
    # a sum of n Laplace(0.5) has variance 2 x 0.5² x n
    assert float(coords.var()) == pytest.approx(2 * 0.25 * n, rel=0.1)


def test_the_audit_refuses_colr_under_noise() -> None:
    from fedrec.experiment import RunConfig, federated_config
    from fedrec.security.inference import audit_privacy

    cfg = RunConfig(algorithm="colr", dataset="synthetic:200x300", protocol="loo-full",
                    federated=federated_config("colr", rounds=1, ldp=0.1, aggregation="clients"))
    with pytest.raises(FedrecError, match="is not modelled"):
        audit_privacy(cfg)


def test_a_crafted_upload_is_what_the_rounds_coordinates_carry(split: Split) -> None:
    """Under --attack a malicious client's rows are what r coordinates carry (the crafted
    direction projected onto the round's subspace, at the crafted norm) and cost r numbers a
    row; FedRecAttack still exposes its target, and the per-row median holds it back."""
    from fedrec.experiment import RunConfig, federated_config, train
    from fedrec.federated.family.model import ITEMS
    from fedrec.security.adversary import Security

    state = _state(split, rank=RANK)
    state.begin_round(1)
    cfg = federated_config("colr", attack="fedrecattack", malicious=0.2, aggregation="clients")
    security = Security.build(cfg, split, LR_ITEM, 2)
    assert security is not None
    seen = []  # the attack's own rows, before the wire
    attack = security.attack
    assert attack is not None
    crafted = attack.uploads
    object.__setattr__(attack, "uploads", lambda *a, **k: seen.extend(crafted(*a, **k)) or seen)  # (a frozen dataclass)
    bad, n_bytes = security.malicious_uploads(state.spec, state.items, state.shared, 1, wire=state)
    assert bad and all(len(u.items) for u in bad)
    q = state.basis
    assert q is not None
    rows = torch.cat([u.tensors[ITEMS] for u in bad])
    own = torch.cat([p.rows for p in seen])
    torch.testing.assert_close(rows, rows @ q.T @ q, **TOL)  # in the subspace
    torch.testing.assert_close(rows.norm(dim=1), own.norm(dim=1), **TOL)  # at the crafted norm
    cos = F.cosine_similarity(rows, own @ q.T @ q, dim=1)
    torch.testing.assert_close(cos[own.norm(dim=1) > 0], torch.ones_like(cos[own.norm(dim=1) > 0]), **TOL)
    assert n_bytes == len(rows) * (INDEX_BYTES + RANK * FLOAT_BYTES)

    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="colr", dataset="synthetic:300x400", protocol="loo-sampled",
                        federated=federated_config("colr", rounds=12, backoffs=0, **opts))
        assert cfg.federated.aggregation == "clients"  # an attack takes the papers' rule, as on FedMF
        return train(cfg).result.history[-1].extra

    clean = run(targets=1, aggregation="clients")
    attacked = run(attack="fedrecattack", boost=10.0)
    defended = run(attack="fedrecattack", boost=10.0, defence="median")
    assert attacked["er@10"] > clean["er@10"] + 0.4 and defended["er@10"] < 0.1


def test_pseudo_rows_are_drawn_in_the_rounds_coordinates() -> None:
    """Under --pad-items a client's pseudo rows lie in the round's subspace like its real ones
    (drawn as coordinates, at the spread of its real rows' coordinates), so the server cannot
    tell them apart by leaving it; each costs r numbers and an id."""
    from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split
    from fedrec.federated.family.model import ITEMS

    def round_one(pad: int) -> tuple[Any, Any]:
        run = RunConfig("colr", dataset="synthetic:60x300", seed=2, model={"dim": DIM, "rank": RANK},
                        federated=federated_config("colr", rounds=1, pad_items=pad))
        _, algorithm = build_trainable(run, prepare_split(run))
        algorithm.keep_uploads = True
        plan = algorithm.plan(1)
        algorithm.begin_round(plan)
        return algorithm, algorithm.local_update(plan)

    _, plain = round_one(0)
    algorithm, padded = round_one(5)
    q = algorithm.state.basis
    extra = 0
    for u, p in zip(sorted(padded.per_client, key=lambda u: u.client),
                    sorted(plain.per_client, key=lambda u: u.client), strict=True):
        rows = u.tensors[ITEMS]
        torch.testing.assert_close(rows, rows @ q.T @ q, **TOL)  # every row in the subspace
        fake = ~np.isin(u.items, p.items)
        assert fake.sum() == 5 and rows[torch.as_tensor(fake)].abs().max() > 0
        extra += int(fake.sum())
    assert padded.bytes_up - plain.bytes_up == extra * (INDEX_BYTES + RANK * FLOAT_BYTES)
