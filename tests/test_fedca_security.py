"""Attacks and defences on FedCA (`fedrec.federated.ca.state.CAAlgorithm`): the server mixes the
aggregated clients' own tables, so attackers are clients with models of their own that join the
aggregation, and a defence admits each client's table before the weights.

A median round equals the reference written out (each item row's steps against the server's
copies, over the clients that moved the row, every one replaced by their median, then the
weights and mixtures of the admitted tables); an unbounded norm bound ends where the plain run
ends; the attackers join at the users' share with their table plus crafted rows at the honest
norm and the honest median training size, and a mining attack (PIECK) watches the mean of their
tables; under ``--attacker-norm own`` they know neither honest figure, and a malicious Flower
node needs it (the deployments are `tests/test_flower.py`'s)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from robust_reference import clamped_to_median

from fedrec.algorithms import get_algorithm
from fedrec.core.contract import RoundPlan
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.ca.state import CAAlgorithm, mix_weights, mixtures
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import attach


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(to_implicit(synthetic(30, 120, mean_interactions=10, min_interactions=4, seed=7)), "loo-full",
                      seed=0)


def _algorithm(split: Split, name: str = "fedca", model: dict | None = None,  # type: ignore[no-untyped-def]
               **engine) -> CAAlgorithm:
    cfg = federated_config(name, **{"lr": 0.05, "local_epochs": 2, "batch_size": 8, "negatives": 2,
                                    "clients_per_round": 1.0, **engine})
    alg = get_algorithm(name).build(split, {"dim": 6, **(model or {})}).algorithm(split, cfg, seed=3)
    attach(alg, split, cfg, seed=3)
    return alg


def _plan(r: int) -> RoundPlan:
    return RoundPlan(r, np.arange(30), torch.Generator(), np.random.default_rng(r))


@pytest.mark.parametrize("name", ["fedca", "fedca-ncf"])
def test_a_median_round_admits_each_row_by_its_movers_median(split: Split, name: str) -> None:
    """Two rounds under the median: in the second each aggregated client's table is the
    server's copy (what it computed for the client at round 1) plus, on each row it moved, its
    step clamped between the middle steps of the clients that moved that row (`RobustRule.admit`);
    the weights and mixtures are then those of the admitted tables."""
    alg = _algorithm(split, name, defence="median")
    st = alg.state
    alg.aggregate(alg.local_update(_plan(1)), _plan(1))
    known = st.tables.clone()  # what the server computed for every (aggregated) client
    ups = alg.local_update(_plan(2))
    members, up, honest = ups.payload
    assert honest == len(members) == 30
    sent = {k: v.clone() for k, v in up.items()}
    steps = sent["tables"] - known[torch.as_tensor(members)]
    admitted = known[torch.as_tensor(members)].clone()
    for j in range(split.n_items):
        movers = torch.nonzero(steps[:, j].abs().sum(1) > 0).flatten()
        if len(movers):
            admitted[movers, j] += clamped_to_median(steps[movers, j])
    alg.aggregate(ups, _plan(2))
    want = mixtures(st.spec, {**sent, "tables": admitted}, mix_weights(st.spec, {**sent, "tables": admitted}, st.start))
    torch.testing.assert_close(st.tables[torch.as_tensor(members)], want["tables"], rtol=1e-5, atol=1e-6)


def test_an_unbounded_norm_bound_run_is_the_plain_run() -> None:
    """Admission rebuilds every table from the server's copy and the client's steps: with a
    bound no client reaches, three rounds end where the plain rounds end."""
    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="fedca", dataset="synthetic:60x120", protocol="loo-full", model={"dim": 6},
                        federated=federated_config("fedca", rounds=3, clients_per_round=0.5, **opts))
        return train(cfg)

    plain, bounded = run(targets=1), run(defence="norm-bound", norm_bound=1e9)
    torch.testing.assert_close(bounded.model.state.tables, plain.model.state.tables, rtol=1e-5, atol=1e-6)
    assert [h.loss for h in bounded.result.history] == pytest.approx([h.loss for h in plain.result.history])


@pytest.mark.parametrize("name", ["fedca", "fedca-avg"])
def test_attackers_join_the_aggregation_with_crafted_rows_at_the_honest_norm(split: Split, name: str) -> None:
    """``--malicious`` of the users become clients with models (ids after the users, the common
    start); each sampled one uploads its table plus crafted rows no longer than the boost x the
    honest aggregated clients' median row step, claims their median training size, takes its
    mixture, and counts in the round's bytes and the attackers' weight."""
    alg = _algorithm(split, name, attack="fedrecattack", boost=3.0, malicious=0.2)
    st, sec = alg.state, alg.security
    assert sec is not None and sec.n_malicious == 6 and st.tables.shape[0] == 36
    torch.testing.assert_close(st.tables[30:], st.start.expand(6, *st.start.shape))
    clean = _algorithm(split, name, targets=1)
    before = st.tables.clone()
    ups = alg.local_update(_plan(1))
    members, up, honest = ups.payload
    bad = members[honest:]
    assert honest == 30 and len(bad) == len(sec.malicious_clients(1)) > 0 and (bad >= 30).all()
    steps = (up["tables"][:honest] - before[:30]).norm(dim=2)
    norm = float(steps[steps > 0].median())
    crafted = (up["tables"][honest:] - before[torch.as_tensor(bad)]).norm(dim=2)
    assert float(crafted.max()) <= 3.0 * norm * (1 + 1e-5) and int((crafted > 0).sum(1).min()) >= 1
    assert ups.extra["attacker_row_norm"] == pytest.approx(norm)  # the round records the budget
    assert torch.equal(up["samples"][honest:], up["samples"][:honest].median().expand(len(bad)))
    assert ups.bytes_up > clean.local_update(_plan(1)).bytes_up
    alg.aggregate(ups, _plan(1))
    assert not torch.equal(st.tables[torch.as_tensor(bad)], before[torch.as_tensor(bad)])  # took its mixture
    assert 0 <= ups.extra["attacker_weight"] <= 1
    assert set(alg.round_extra()) >= {"er@10", "malicious_clients"}


def test_attackers_of_their_own_norm_know_no_honest_figure(split: Split) -> None:
    """Under ``--attacker-norm own`` a sampled attacker's crafted rows go at the boost x the
    attack's own estimate (an Adam client's step bound on every coordinate) and it claims the
    users' median training size, whatever the honest clients of the round did."""
    from fedrec.federated.ca.state import step_bound, typical_size

    alg = _algorithm(split, attack="fedrecattack", boost=3.0, malicious=0.2, attacker_norm="own")
    before = alg.state.tables.clone()
    members, up, honest = alg.local_update(_plan(1)).payload
    bad = members[honest:]
    assert len(bad) > 0
    crafted = (up["tables"][honest:] - before[torch.as_tensor(bad)]).norm(dim=2)
    own = step_bound(split.train, alg.cfg) * 6 ** 0.5  # dim 6: every coordinate at the bound
    assert float(crafted.max()) == pytest.approx(3.0 * own, rel=1e-4)
    steps = (up["tables"][:honest] - before[torch.as_tensor(members[:honest])]).norm(dim=2)
    assert float(steps[steps > 0].median()) != pytest.approx(own, rel=0.1)
    assert up["samples"][honest:].tolist() == [typical_size(split.train)] * len(bad)
    assert "attacker_row_norm" not in alg.local_update(_plan(2)).extra  # no honest figure was given


def test_attackers_aggregated_without_an_honest_client_use_their_own_figures(split: Split) -> None:
    """In a round that aggregates no honest client (two train, 40% of them is none) there is no
    honest figure to give the attackers: 40% of the six sampled attackers, two, join with rows
    at the attack's own estimate and claim the users' median training size."""
    from fedrec.federated.ca.state import step_bound, typical_size

    alg = _algorithm(split, attack="fedrecattack", boost=3.0, malicious=0.2, model={"aggregated": 0.4})
    before = alg.state.tables.clone()
    plan = RoundPlan(1, np.arange(2), torch.Generator(), np.random.default_rng(1))
    ups = alg.local_update(plan)
    members, up, honest = ups.payload
    assert honest == 0 and len(members) == 2 and (members >= 30).all() and "attacker_row_norm" not in ups.extra
    crafted = (up["tables"] - before[torch.as_tensor(members)]).norm(dim=2)
    assert float(crafted.max()) == pytest.approx(3.0 * step_bound(split.train, alg.cfg) * 6 ** 0.5, rel=1e-4)
    assert up["samples"].tolist() == [typical_size(split.train)] * 2


def test_a_malicious_flower_node_needs_the_attackers_own_norm(split: Split) -> None:
    """A node cannot see the round's honest steps the simulator's attackers are given: FedCA's
    malicious node runs ``--attacker-norm own`` (its deployment equals the simulator's run so,
    `tests/test_flower.py`) and refuses the honest norm in one line."""
    from fedrec.flower.malicious import CAMaliciousNode, malicious_node

    def run(**opts):  # type: ignore[no-untyped-def]
        return RunConfig(algorithm="fedca", dataset="synthetic:60x120", protocol="loo-full",
                         federated=federated_config("fedca", rounds=1, attack="fedrecattack", **opts))

    with pytest.raises(FedrecError, match="deploy with --attacker-norm own"):
        malicious_node(run(), split)
    assert isinstance(malicious_node(run(attacker_norm="own"), split), CAMaliciousNode)


def test_a_defended_checkpoint_keeps_the_servers_copies(split: Split) -> None:
    """The server's copy of each client's table is server state under a defence: a run resumed
    from a checkpoint judges the next round's steps against the same copies, and continues as
    the uninterrupted run does."""
    a = _algorithm(split, defence="median", clients_per_round=0.5)
    a.train_round(1)
    blob = a.state_dict()
    assert "known" in blob["server"]
    b = _algorithm(split, defence="median", clients_per_round=0.5)
    b.load_state_dict(copy.deepcopy(blob))
    a.train_round(2)
    b.train_round(2)
    torch.testing.assert_close(a.state.tables, b.state.tables)


def test_a_mining_attack_watches_the_mean_of_the_attackers_tables(split: Split) -> None:
    """PIECK mines popular items from one table's movement: on FedCA the mean of every
    malicious client's table, looked at once a round. While it mines, each attacker uploads its
    table as it holds it; at the third look the mined items are the rows that moved most over
    the looks (targets left out), and each sampled attacker adds the same step, on the targets
    only, against the watched table, at the boost x the honest clients' median row step."""
    from fedrec.security.attacks import MINING_LOOKS

    # at half participation a different half of the attackers takes a mixture each round, so
    # their tables differ and the watched table is none of them
    alg = _algorithm(split, "fedca", attack="pieck-uea", boost=2.0, malicious=0.2, clients_per_round=0.5)
    st, sec = alg.state, alg.security
    assert sec is not None and sec.attack is not None
    looks, r = [], 0
    while len(looks) < MINING_LOOKS:
        r += 1
        before = st.tables.clone()
        ups = alg.local_update(_plan(r))
        members, up, honest = ups.payload
        bad = torch.as_tensor(members[honest:])
        if not len(bad):  # no attacker sampled: no look
            alg.aggregate(ups, _plan(r))
            continue
        looks.append(before[30:].mean(0))
        if len(looks) < MINING_LOOKS:  # still mining: the tables as they are held
            torch.testing.assert_close(up["tables"][honest:], before[bad])
            alg.aggregate(ups, _plan(r))
    assert not torch.equal(before[30], before[31]) or not torch.equal(before[30], before[32])
    torch.testing.assert_close(st.tables[30:].mean(0), looks[-1])  # (the attackers did not move yet)
    moved = sum((b - a).norm(dim=1) for a, b in zip(looks, looks[1:], strict=False))
    assert float(moved.min()) > 0  # the watched table moves by the mixtures it takes
    moved[torch.as_tensor(sec.targets)] = -torch.inf
    popular = torch.argsort(moved, descending=True, stable=True)[:15].numpy()
    np.testing.assert_array_equal(sec.attack.state()["popular"], popular)
    steps = (up["tables"][:honest] - before[torch.as_tensor(members[:honest])]).norm(dim=2)
    norm = float(steps[steps > 0].median())
    want = torch.zeros_like(before[0])
    want[torch.as_tensor(sec.targets)] = sec.attack._pieck(looks[-1], popular, norm)
    for j in range(len(bad)):
        torch.testing.assert_close(up["tables"][honest + j] - before[bad[j]], want, rtol=1e-5, atol=1e-6)
    assert 0 < float(want.norm(dim=1).max()) <= 2.0 * norm * (1 + 1e-5)
