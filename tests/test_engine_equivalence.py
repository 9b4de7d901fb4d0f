"""The cohort-vectorised engine agrees with the one-client-at-a-time reference.

The reference (`tests/reference_engine.py`) trains each client with its own ``nn.Module`` and
``torch.optim.SGD``; the engine trains a whole cohort in lockstep. Both start from the same
state and the same `CohortBatches`, so their results may differ only by float32 rounding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from reference_engine import (
    ReferenceState,
    client_rows,
    reference_round,
    reference_scores,
    reference_train,
)

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.eval.evaluate import evaluate
from fedrec.federated import engine
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.federated.family.spec import FamilySpec
from fedrec.federated.family.state import FamilyState
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds import step_graphs
from fedrec.rounds.cohort import build_cohort, order_by_activity
from fedrec.rounds.upload import UploadPath
from fedrec.train.centralised import TrainOutcome

SEED = 1
TOL = {"rtol": 1e-5, "atol": 1e-5}
SCORE_TOL = {"rtol": 1e-5, "atol": 1e-4}
CFG = FederatedConfig(rounds=2, clients_per_round=0.5, local_epochs=2, batch_size=8, lr=0.1,
                      lr_item=2.0, negatives=4)
CASES = [
    ("fedmf", {}, {}),
    ("fedncf", {}, {}),
    ("fedncf", {}, {"local_epochs": 1, "clients_per_round": 1.0}),
    ("fedrecon", {"reconstruct_epochs": 2}, {}),
    ("pfedrec", {}, {}),
    ("fedmf", {"dual": True}, {}),
    ("fedncf", {"dual": True}, {}),
    ("fedrecon", {"dual": True}, {}),
    ("fedmf", {}, {"clip": 0.05, "lr_item": None}),
]


@pytest.fixture(scope="module")
def split() -> Split:
    """60 users x 80 items; 1 to ~30 training items a user, so batch counts differ widely."""
    x = to_implicit(synthetic(60, 80, mean_interactions=8, min_interactions=3, seed=3))
    return make_split(x, "loo-full", seed=0)


def _spec(split: Split, name: str, opts: dict[str, Any]) -> FamilySpec:
    alg = get_algorithm(name)
    return alg.build(split, {**alg.defaults, **opts, "dim": 8})


def _lr_item(split: Split, cfg: FederatedConfig) -> float:
    return cfg.lr_item if cfg.lr_item is not None else cfg.lr * split.n_items * 80.0


def _initial(spec: FamilySpec, split: Split, cfg: FederatedConfig) -> FamilyState:
    return FamilyState.create(spec, split.n_users, split.n_items, lr=cfg.lr,
                              lr_item=_lr_item(split, cfg), item_std=cfg.item_std, seed=SEED)


def _run_engine(spec: FamilySpec, split: Split, cfg: FederatedConfig,
                monkeypatch: pytest.MonkeyPatch) -> tuple[FamilyState, TrainOutcome]:
    """`run_federated`, and the state it trained (captured where the engine creates it)."""
    made: list[FamilyState] = []
    create = FamilyState.create

    def capture(*args: Any, **kwargs: Any) -> FamilyState:
        made.append(create(*args, **kwargs))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(FamilyState, "create", staticmethod(capture))
        out = run_federated(spec, split, cfg, seed=SEED)
    return made[0], out


def _run_reference(spec: FamilySpec, split: Split, cfg: FederatedConfig) -> ReferenceState:
    state = ReferenceState.of(_initial(spec, split, cfg))
    for r in range(1, cfg.rounds + 1):
        state = reference_round(state, split, cfg, SEED, r)
    return state


def _seen_rows(state: FamilyState, client: int, items: np.ndarray) -> torch.Tensor:
    """The rows the engine scores ``client``'s ``items`` with (personal rows for dual)."""
    base = state.round_start_items if state.spec.dual else state.items
    v = base[torch.as_tensor(items)][None].clone()
    if state.spec.dual:
        state.personal.override(v, np.array([client]), items[None])
    return v[0]


def _assert_same_state(a: FamilyState, b: ReferenceState, **tol: float) -> None:
    torch.testing.assert_close(a.items, b.items, **tol)
    assert a.shared.keys() == b.shared.keys() and a.private.keys() == b.private.keys()
    for k in a.shared:
        torch.testing.assert_close(a.shared[k], b.shared[k], **tol)
    for k in a.private:
        torch.testing.assert_close(a.private[k], b.private[k], **tol)
    if a.spec.dual:
        torch.testing.assert_close(a.round_start_items, b.round_start_items, **tol)
        every = np.arange(a.items.shape[0])
        for u in range(a.private["user" if "user" in a.private else "w"].shape[0]):
            torch.testing.assert_close(_seen_rows(a, u, every), client_rows(b, u, every), **tol)


def test_small_case_has_uneven_and_short_batches(split: Split) -> None:
    """The data really exercises the lockstep layout: ragged batch counts, short last batches."""
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, np.random.default_rng(0))
    samples = counts * 5
    keys = np.random.default_rng(1).random((2, samples.sum()))
    cohort = build_cohort(split.train, clients, negs, 8, keys)
    n_batches = -(-samples // 8)
    assert len(np.unique(n_batches)) >= 5
    assert (samples % 8 != 0).sum() >= 10
    assert len(cohort.steps) == 2 * n_batches.max()
    assert [s.n_active for s in cohort.steps[: n_batches.max()]] == [
        int((n_batches > t).sum()) for t in range(n_batches.max())
    ]


@pytest.mark.parametrize("batch", [8, 40, 4096])
def test_each_step_holds_the_batches_the_shuffle_keys_make(split: Split, batch: int) -> None:
    """Step t of an epoch holds, for each client, its samples ranked t*B..(t+1)*B-1 by that
    epoch's shuffle keys, slots ordered by row; a client whose samples fit one batch trains on
    all of them every epoch, whatever its keys, and when every client does, each epoch's step
    is the same object (laid out once)."""
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, np.random.default_rng(0))
    samples = counts * 5
    keys = np.random.default_rng(1).random((2, samples.sum()))
    cohort = build_cohort(split.train, clients, negs, batch, keys)
    per_epoch = cohort.steps_per_epoch
    first = np.cumsum(samples) - samples
    rows = [_sample_rows(cohort, split, negs, clients, k) for k in range(len(clients))]
    for e in range(2):
        for k in range(len(clients)):
            ranked = np.argsort(keys[e, first[k]:first[k] + samples[k]], kind="stable")
            got_all = []
            for t, step in enumerate(cohort.steps[e * per_epoch:(e + 1) * per_epoch]):
                mine = step.flat_owner == k
                assert np.all(np.diff(step.flat_rows[mine]) >= 0)  # slots ordered by row
                got_all.append(step.flat_rows[mine])
                if samples[k] > batch:  # the keys decide which samples go in batch t
                    batch_rows = rows[k][ranked[t * batch:(t + 1) * batch]]
                    np.testing.assert_array_equal(step.flat_rows[mine], np.sort(batch_rows))
            np.testing.assert_array_equal(np.sort(np.concatenate(got_all)), np.sort(rows[k]))
    one_batch = samples <= batch
    assert one_batch.any()
    if one_batch.all():
        assert per_epoch == 1 and cohort.steps[0] is cohort.steps[1]


def _sample_rows(cohort: Any, split: Split, negs: np.ndarray, clients: np.ndarray, k: int) -> np.ndarray:
    """Client ``k``'s samples (its positives, then its negatives) as local rows, in canonical order."""
    counts = np.diff(split.train.indptr)[clients]
    pos = split.train.indices[split.train.indptr[clients[k]]:split.train.indptr[clients[k] + 1]]
    at = int(counts[:k].sum())
    items = np.concatenate([pos, negs[at:at + counts[k]].ravel()])
    mine = cohort.row_items[cohort.rows_of(k)]
    return cohort.row_ptr[k] + np.searchsorted(mine, items)


@pytest.mark.parametrize(("name", "opts", "overrides"), CASES,
                         ids=[f"{n}{'-dual' if o.get('dual') else ''}{'-' if c else ''}"
                              f"{'-'.join(c)}" for n, o, c in CASES])
def test_engine_matches_reference(split: Split, monkeypatch: pytest.MonkeyPatch, name: str,
                                  opts: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Two rounds of `run_federated` = two rounds of the reference: state, scores and metrics."""
    spec = _spec(split, name, opts)
    cfg = replace(CFG, **overrides)
    got, out = _run_engine(spec, split, cfg, monkeypatch)
    want = _run_reference(spec, split, cfg)

    start = _initial(spec, split, cfg)
    assert (want.items - start.items).abs().max() > 1e-3, "the case must actually train the items"
    for k in spec.private_names():
        assert (want.private[k] - start.private[k]).abs().max() > 1e-3
    _assert_same_state(got, want, **TOL)

    users = np.arange(split.n_users)
    np.testing.assert_allclose(got.scores(users, None), reference_scores(want, users, None),
                               **SCORE_TOL)
    cand = np.random.default_rng(0).integers(0, split.n_items, (split.n_users, 7))
    np.testing.assert_allclose(got.scores(users, cand), reference_scores(want, users, cand),
                               **SCORE_TOL)
    metrics = evaluate(lambda u, i: reference_scores(want, u, i), split.valid, split.protocol)
    assert out.history[-1].valid == pytest.approx(metrics, abs=1e-9)


@pytest.mark.parametrize(("name", "opts"), [("fedmf", {}), ("fedmf", {"dual": True}), ("fedncf", {}),
                                            ("pfedrec", {})])
def test_engine_matches_reference_on_ratings(monkeypatch: pytest.MonkeyPatch, name: str,
                                             opts: dict[str, Any]) -> None:
    """The squared error on observed ratings (``loss="mse"``, no negatives): the engine's
    closed-form and autograd paths = the reference's ``nn.MSELoss`` step by step."""
    ratings = make_split(synthetic(60, 80, mean_interactions=8, min_interactions=3, seed=3), "ratio-rating", seed=0)
    spec = replace(_spec(ratings, name, opts), loss="mse")
    cfg = replace(CFG, negatives=0, lr=0.02, lr_item=0.3)
    got, _ = _run_engine(spec, ratings, cfg, monkeypatch)
    want = _run_reference(spec, ratings, cfg)
    assert (want.items - _initial(spec, ratings, cfg).items).abs().max() > 1e-3
    _assert_same_state(got, want, **TOL)
    users = np.arange(ratings.n_users)
    np.testing.assert_allclose(got.scores(users, None), reference_scores(want, users, None), **SCORE_TOL)


@pytest.mark.parametrize("name", ["fedncf", "fedrecon", "pfedrec"])
def test_uploads_match_reference(split: Split, name: str) -> None:
    """`local_update`'s row deltas, shared weights and acceptance = each client's own upload."""
    spec = _spec(split, name, {})
    cfg = replace(CFG, clip=0.02)
    state = _initial(spec, split, cfg)
    ref = ReferenceState.of(state)
    rng = np.random.default_rng(5)
    clients = order_by_activity(split.train, np.arange(0, split.n_users, 3))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    keys = rng.random((2, int(counts.sum()) * 5))
    cohort = build_cohort(split.train, clients, negs, cfg.batch_size, keys)
    fresh = torch.randn(len(clients), spec.item_width) if spec.reconstruct_epochs else None

    acc = state.begin_round(1)
    up = state.local_update(cohort, cfg.upload_path(), fresh)
    state.accumulate(acc, up)
    state.aggregate(acc, cfg.upload_path(), torch.Generator())
    new, uploads = reference_train(ref, cohort, 2, cfg.batch_size, fresh, cfg.clip)

    assert bool(up.accepted.all()) and all(u.accepted for u in uploads)
    assert max(float(u.delta.norm(dim=1).max()) for u in uploads) == pytest.approx(0.02)
    for k, mine in enumerate(uploads):
        np.testing.assert_array_equal(cohort.row_items[cohort.rows_of(k)], mine.items)
        torch.testing.assert_close(up.delta[cohort.rows_of(k)], mine.delta, **TOL)
        for name_, v in up.shared.items():
            torch.testing.assert_close(v[k], mine.shared[name_], **TOL)
    _assert_same_state(state, new, **TOL)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", ["fedmf", "fedncf", "pfedrec"])
def test_a_diverged_client_is_rejected_alone(split: Split, name: str, padded: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose state is NaN is rejected without touching the other clients.

    The padding slots of a short batch are what it guards: pointed at local row 0 (another
    client's row), they would carry one client's NaN to every client with a short last batch.
    ``padded``: the steps of a GPU's graphs (`fedrec.rounds.step_graphs`), run uncaptured, with
    the NaN client last in the activity order, so that the second step already pads it (20
    clients at a bucket of 24, the 20th done) and later steps pad others: its padded slots must
    not carry its NaN onto the zero row the others' padded slots read.
    """
    monkeypatch.setattr(step_graphs, "PAD_ON_CPU", padded)
    spec = _spec(split, name, {})
    state = _initial(spec, split, CFG)
    rng = np.random.default_rng(5)
    clients = order_by_activity(split.train, np.arange(0, split.n_users, 3))
    bad = len(clients) - 1 if padded else 0
    state.private["w" if name == "pfedrec" else "user"][clients[bad]] = float("nan")
    ref = ReferenceState.of(state)
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    cohort = build_cohort(split.train, clients, negs, 8, rng.random((2, int(counts.sum()) * 5)))

    acc = state.begin_round(1)
    up = state.local_update(cohort, CFG.upload_path())
    state.accumulate(acc, up)
    state.aggregate(acc, CFG.upload_path(), torch.Generator())
    new, uploads = reference_train(ref, cohort, 2, 8)

    expected = [k != bad for k in range(len(clients))]
    assert up.accepted.tolist() == [u.accepted for u in uploads] == expected
    assert acc.rejected == 1
    _assert_same_state(state, new, equal_nan=True, **TOL)


def test_dual_scores_use_personal_rows(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dual client is scored with its post-tuned rows, not the round-start table."""
    got, _ = _run_engine(_spec(split, "pfedrec", {}), split, CFG, monkeypatch)
    ref = ReferenceState.of(got)
    users = np.array(sorted(ref.personal))
    np.testing.assert_allclose(got.scores(users, None), reference_scores(ref, users, None),
                               **SCORE_TOL)
    ref.personal = {}
    assert np.abs(got.scores(users, None) - reference_scores(ref, users, None)).max() > 1e-2


@pytest.mark.parametrize("name", ["fedncf", "fedrecon", "pfedrec"])
def test_chunking_does_not_change_the_result(split: Split, monkeypatch: pytest.MonkeyPatch,
                                             name: str) -> None:
    """A tiny memory budget (about one client a chunk) gives what one chunk gives."""
    spec = _spec(split, name, {})
    whole, out_whole = _run_engine(spec, split, CFG, monkeypatch)
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return build_cohort(*args, **kwargs)

    monkeypatch.setattr(engine, "build_cohort", counting)
    tiny = replace(CFG, memory_budget_mb=0.01)
    chunked, out_chunked = _run_engine(spec, split, tiny, monkeypatch)
    assert len(calls) >= 10 * CFG.rounds
    _assert_same_state(chunked, ReferenceState.of(whole), rtol=1e-6, atol=1e-6)
    for a, b in zip(out_chunked.history, out_whole.history, strict=True):
        assert a.valid == pytest.approx(b.valid, abs=1e-9)
        assert a.loss == pytest.approx(b.loss, rel=1e-6)
        assert (a.bytes_up, a.bytes_down) == (b.bytes_up, b.bytes_down)


def test_ldp_noise_is_replayed_by_reference(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    """LDP moves the table by the clients' mean Laplace noise, exactly as the reference does."""
    spec = _spec(split, "fedmf", {})
    cfg = replace(CFG, rounds=1)
    plain, _ = _run_engine(spec, split, cfg, monkeypatch)
    noisy, _ = _run_engine(spec, split, replace(cfg, ldp=0.05), monkeypatch)
    _assert_same_state(noisy, _run_reference(spec, split, replace(cfg, ldp=0.05)), **TOL)
    diff = noisy.items - plain.items
    n = round(cfg.clients_per_round * split.n_users)
    assert diff.std().item() == pytest.approx(0.05 * np.sqrt(2 / n), rel=0.15)
    for k in spec.private_names():
        torch.testing.assert_close(noisy.private[k], plain.private[k])


def test_aggregate_adds_noise_only_with_ldp() -> None:
    """With zero uploads, ``ldp=0`` leaves the table bit-identical; ``ldp>0`` adds Laplace/n."""
    spec = FamilySpec(score="dot", private_score=False, dual=False, dim=8)
    state = FamilyState.create(spec, 4, 500, lr=0.1, lr_item=1.0, item_std=1.0, seed=0)
    before = state.items.clone()
    for ldp in (0.0, 0.2):
        acc = state.begin_round(1)
        acc.n = 50
        state.aggregate(acc, UploadPath(ldp=ldp), torch.Generator().manual_seed(0))
        diff = state.items - before
        if ldp == 0:
            assert torch.equal(state.items, before)
        else:
            assert diff.mean().abs().item() < 0.1 * ldp * np.sqrt(2 / 50)
            assert diff.std().item() == pytest.approx(ldp * np.sqrt(2 / 50), rel=0.05)
