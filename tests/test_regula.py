"""PIECK's defence (``--client-objective regula``, `fedrec.federated.family.objective.Regula`):
the popular items are the rows that moved most over the first window; a round equals each client
trained alone on its BCE plus the IPE term on its unpopular slots and the UEA term on its user
vector, written out with torch's cosine and KL divergence as the official client writes them;
weights 0 are FedMF exactly; the mined items reach a Flower node and a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from client_alone import small_split, whole_cohort

from fedrec.algorithms import get_algorithm
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.objective import Regula, parse_objective
from fedrec.federated.family.state import use_aggregation
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-4, "atol": 1e-5}
LR, BATCH, EPOCHS, DIM, SIZE, IPE, UEA = 0.3, 8, 2, 8, 5, 0.7, 2.0
SEED, ROUND = 2, 3


def _state(split, objective: str | None, aggregation: str = "clients"):  # type: ignore[no-untyped-def]
    alg = get_algorithm("fedmf")
    spec = alg.build(split, {**alg.defaults, "dim": DIM})
    spec = spec.configured(federated_config("fedmf", client_objective=objective)).for_clients(split.n_users, 1.0)
    lr_item = 2.0 if aggregation == "clients" else 0.2
    state = spec.create_state(split.n_users, split.n_items, lr=LR, lr_item=lr_item, item_std=0.5, seed=SEED)
    use_aggregation(state, aggregation)
    state.begin_round(ROUND)
    return state


def _popular(split) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The items most users train: many clients have slots of them and slots of others."""
    return np.argsort(-np.bincount(split.train.indices, minlength=split.n_items), kind="stable")[:SIZE]


def _alone(user: torch.Tensor, table: torch.Tensor, items: np.ndarray, popular_rows: torch.Tensor,
           popular: np.ndarray, cohort, k: int, lr_item: float, summed: bool):  # type: ignore[no-untyped-def]
    """Client ``k`` trained alone, one plain SGD step a batch on BCE + IPE x the IPE term + UEA x
    the UEA term as the official client writes them (its batch's mean; under ``summed`` the rows
    step on the sums of BCE and of IPE's cosines, the user vector on the means)."""
    mine = cohort.sample_client == k
    rows, labels = cohort.sample_row[mine] - cohort.row_ptr[k], cohort.sample_label[mine]
    w = torch.arange(SIZE, 0, -1, dtype=torch.float64) ** 2
    w = (w / w.sum()).float()
    per_epoch = len(rows) // EPOCHS
    for e in range(EPOCHS):
        for s in range(0, per_epoch, BATCH):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + BATCH, per_epoch))
            u, v = user.detach().requires_grad_(True), table.detach().requires_grad_(True)
            batch = torch.as_tensor(rows[sl])
            bce = F.binary_cross_entropy_with_logits(v[batch] @ u, torch.as_tensor(labels[sl]), reduction="none")
            unpopular = batch[torch.as_tensor(~np.isin(items[rows[sl]], popular))]
            cos = torch.cosine_similarity(popular_rows[:, None], v[unpopular][None], dim=2)
            uea = -(w * F.kl_div(F.log_softmax(popular_rows, dim=1), F.softmax(u, 0).expand_as(popular_rows),
                                 reduction="none").mean(1)).sum()
            on_rows = bce.sum() - IPE * (w * cos.sum(1)).sum() if summed else bce.mean() - IPE * (w * cos.mean(1)).sum()
            gv = torch.autograd.grad(on_rows if len(unpopular) else bce.sum() if summed else bce.mean(), v,
                                     retain_graph=True)[0]
            gu = torch.autograd.grad(bce.mean() + UEA * uea, u)[0]
            user, table = u - LR * gu, v - lr_item * gv
    return user.detach(), table.detach()


@pytest.mark.parametrize("aggregation", ["clients", "samples"])
def test_a_round_is_each_client_trained_alone_on_its_loss_and_both_terms(aggregation: str) -> None:
    split = small_split()
    cohort = whole_cohort(split, BATCH, EPOCHS)
    term = f"regula:size={SIZE},ipe={IPE},uea={UEA}"
    state, before = _state(split, term, aggregation), _state(split, None, aggregation)
    popular = _popular(split)
    state.memo = {"popular": torch.as_tensor(popular)}
    up = state.local_update(cohort, UploadPath())
    plain = _state(split, None, aggregation).local_update(cohort, UploadPath())
    moved = 0
    for k, client in enumerate(cohort.clients):
        items = cohort.row_items[cohort.rows_of(k)]
        user, table = _alone(before.private["user"][int(client)].clone(), before.items[torch.as_tensor(items)].clone(),
                             items, before.items[torch.as_tensor(popular)], popular, cohort, k, state.lr_item,
                             summed=aggregation == "samples")
        torch.testing.assert_close(state.private["user"][int(client)], user, **TOL)
        torch.testing.assert_close(up.delta[cohort.rows_of(k)], table - before.items[torch.as_tensor(items)], **TOL)
        moved += not torch.allclose(up.delta[cohort.rows_of(k)], plain.delta[cohort.rows_of(k)])
    assert moved > len(cohort.clients) // 2  # the terms changed most clients' rows
    # each client also downloads the popular ids, and the popular rows it does not hold
    held = int(np.isin(cohort.row_items, popular).sum())
    assert 0 < held < len(cohort.clients) * SIZE
    assert up.bytes_down - plain.bytes_down == len(cohort.clients) * SIZE * 4 + (len(cohort.clients) * SIZE - held) * 4 * DIM


def test_the_popular_items_moved_most_over_the_window() -> None:
    term = Regula(size=3, window=2)
    start = torch.zeros(6, 2)
    memo: dict[str, torch.Tensor] = {}
    term.observe(start, memo, 1)
    term.observe(start + torch.tensor([[0.0, 9.0]] * 6), memo, 2)  # within the window: not yet
    assert "popular" not in memo
    moved = torch.tensor([[1.0, 0], [5, 0], [0, 2], [3, 4], [0, 2], [0, 0]])  # norms 1, 5, 2, 5, 2, 0
    term.observe(start + moved, memo, 3)
    assert memo["popular"].tolist() == [1, 3, 2]  # ties to the lower id
    assert "start" not in memo and "since" not in memo  # the snapshot is dropped once mined
    term.observe(start, memo, 4)
    assert memo["popular"].tolist() == [1, 3, 2]  # fixed from then on
    late: dict[str, torch.Tensor] = {}  # a run first seen in round 5 (a resume without the memo)
    term.observe(start, late, 5)
    term.observe(start + moved, late, 6)
    assert "popular" not in late
    term.observe(start + moved, late, 7)
    assert late["popular"].tolist() == [1, 3, 2]


def test_no_term_before_the_items_are_mined_and_zero_weights_are_fedmf() -> None:
    split = small_split()
    cohort = whole_cohort(split, BATCH, EPOCHS)
    plain = _state(split, None).local_update(cohort, UploadPath())
    early = _state(split, "regula")  # mined at the start of round 2: round 3 here, but no round 1 was seen
    assert "popular" not in early.memo
    assert torch.equal(early.local_update(cohort, UploadPath()).delta, plain.delta)
    zero = _state(split, "regula:ipe=0,uea=0")
    zero.memo = {"popular": torch.as_tensor(_popular(split))}
    up = zero.local_update(cohort, UploadPath())
    assert torch.equal(up.delta, plain.delta) and up.bytes_down == plain.bytes_down
    fedmf = _state(split, None)
    fedmf.local_update(cohort, UploadPath())
    assert torch.equal(zero.private["user"], fedmf.private["user"])


def test_the_default_window_is_one_pass_over_the_clients() -> None:
    """The official client mines over its first epoch, one pass over the clients: ``window`` 0
    is the rounds of a pass at the run's participation (a fraction or a count); a window given
    stays; a run mines once that many rounds have passed."""
    assert Regula().window == 0
    assert [Regula().for_clients(60, p).window for p in (1.0, 0.5, 0.1, 7, 60)] == [1, 2, 10, 9, 1]
    assert Regula(window=4).for_clients(60, 0.1).window == 4
    memos = []
    for rounds in (2, 3):
        cfg = RunConfig("fedmf", dataset="synthetic:60x300", seed=3, model={"dim": 8},
                        federated=federated_config("fedmf", rounds=rounds, clients_per_round=0.5,
                                                   client_objective="regula:size=4"))
        done = train(cfg)
        assert done.model.state.spec.objective.window == 2
        memos.append(dict(done.model.state.memo))
    assert "popular" not in memos[0] and len(memos[1]["popular"]) == 4  # mined at round 3's start


def test_mined_in_a_run_kept_in_checkpoints_and_bad_settings_are_one_line(tmp_path) -> None:
    def config(rounds: int, objective: str | None = "regula:size=4") -> RunConfig:
        return RunConfig("fedmf", dataset="synthetic:60x300", seed=3, model={"dim": 8},
                         federated=federated_config("fedmf", rounds=rounds, client_objective=objective,
                                                    checkpoint_every=1))

    done = train(config(4))
    plain = train(config(4, None))
    assert done.result.history[0].valid == plain.result.history[0].valid  # round 1: nothing mined yet
    assert done.result.history[3].valid != plain.result.history[3].valid
    memo = done.model.state.memo
    assert len(memo["popular"]) == 4 and "start" not in memo
    # a run resumed in round 2 mines from the snapshot its checkpoint kept; in round 3, keeps the items
    for stop in (1, 2):
        ckpt = tmp_path / f"run{stop}.ckpt"
        train(config(stop), checkpoint=ckpt)
        resumed = train(config(4), checkpoint=ckpt, resume=True)
        assert torch.equal(resumed.model.state.memo["popular"], memo["popular"])
        assert [h.valid for h in resumed.result.history] == [h.valid for h in done.result.history]
    assert parse_objective("regula") == Regula()
    assert parse_objective(Regula(size=4, ipe=0.5).text()) == Regula(size=4, ipe=0.5)
    with pytest.raises(FedrecError, match="size must be >= 1, window >= 0"):
        parse_objective("regula:size=0")
    with pytest.raises(FedrecError, match="window >= 0"):
        parse_objective("regula:window=-1")
    with pytest.raises(FedrecError, match="user vector"):
        train(RunConfig("pfedrec", dataset="synthetic:60x200",
                        federated=federated_config("pfedrec", rounds=1, client_objective="regula")))
    train(RunConfig("pfedrec", dataset="synthetic:60x200",  # IPE alone needs no user vector
                    federated=federated_config("pfedrec", rounds=2, client_objective="regula:uea=0")))


def test_flower_in_process_equals_the_simulator_with_the_terms() -> None:
    from fedrec.flower.dispatch import run_in_process

    cfg = RunConfig("fedmf", dataset="synthetic:60x300", seed=3, model={"dim": 8},
                    federated=federated_config("fedmf", rounds=3, clients_per_round=0.5, memory_budget_mb=0.05,
                                               client_objective="regula:size=4"))
    done = train(cfg).result
    got = run_in_process(cfg, 3).out
    for x, y in zip(got.history, done.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-6, abs=1e-9)
    assert got.test == pytest.approx(done.test, rel=1e-6)
