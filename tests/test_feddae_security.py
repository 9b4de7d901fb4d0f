"""Attacks and defences on FedDAE (`fedrec.federated.dae.state.DAEAlgorithm`): the security layer
reads the decoder's output rows and the global encoder's first-layer rows as one item table, and
each client's accumulated gradients as steps.

A median round equals the per-client reference written out (each output row's median over every
client, each encoder row's over the clients whose bag holds the item, each dense layer's over
every client, then the server's Adam step on the mean); an unbounded norm bound and the mean
rule end where the plain run ends; the attackers are a share of the users, at the honest bag
rows' norm (or the attack's own estimate); FedRecAttack exposes its target and the median stops
it; Flower runs the defence, and a malicious node at the attack's own estimate only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from robust_reference import median

from fedrec.core.contract import RoundPlan
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.dae.spec import DAESpec
from fedrec.federated.dae.state import FIRST, DAEAlgorithm, server_step
from fedrec.federated.family.model import ITEMS
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import Security, attach

MODEL = {"latent": 6, "hidden": (10, 8), "gate_hidden": 5}


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(to_implicit(synthetic(30, 80, mean_interactions=10, min_interactions=4, seed=5)), "loo-full",
                      seed=0)


def _algorithm(split: Split, encoders: str = "dual", **engine) -> DAEAlgorithm:  # type: ignore[no-untyped-def]
    cfg = federated_config("feddae", **{"lr": 0.01, "clients_per_round": 1.0, "local_epochs": 2, **engine})
    alg = DAESpec(encoders=encoders, **MODEL).algorithm(split, cfg, seed=4)  # type: ignore[arg-type]
    attach(alg, split, cfg, seed=4)
    return alg


@pytest.mark.parametrize("encoders", ["dual", "local"])
def test_a_median_round_is_the_per_client_median_and_the_servers_adam_step(split: Split, encoders: str) -> None:
    """Under the median the server steps on, per output row and dense layer, every client's
    count x their median gradient, and per global encoder row (none with the local encoder
    alone), its senders' count x their median; written out from each client's accumulated
    gradients."""
    alg = _algorithm(split, encoders, defence="median")
    st = alg.state
    before = {k: v.clone() for k, v in st.glob.items()}
    moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in st.glob.items()}
    plan = RoundPlan(1, np.arange(split.n_users), torch.Generator(), np.random.default_rng(1))
    ups = alg.local_update(plan)
    kept = ups.per_client
    assert kept is not None and len(kept) == split.n_users
    alg.aggregate(ups, plan)

    n = len(kept)
    want = {k: n * median(torch.stack([u.tensors[k] for u in kept])) for k in before if k != FIRST}
    if FIRST in before:
        rows = torch.zeros_like(before[FIRST])
        for j in range(split.n_items):
            sent = [u.tensors[ITEMS][np.flatnonzero(u.items == j)[0]] for u in kept if j in u.items]
            if sent:
                rows[j] = len(sent) * median(torch.stack(sent))
        want[FIRST] = rows
    assert (FIRST in want) == (encoders == "dual")
    server_step(before, moments, 0, want, n, alg.cfg.lr, st.spec.weight_decay)
    for k, v in st.glob.items():
        torch.testing.assert_close(v, before[k], rtol=1e-5, atol=1e-6)


def test_union_judges_a_client_at_the_servers_adam_step_from_its_gradient_alone(split: Split) -> None:
    """UNION reads FedDAE's table after the server's Adam step with one client's accumulated
    gradient as the round's mean (the official UNION's form of its Adam server's step): written
    out by running that step on a copy of the server, after two rounds of moments. The rows the
    client did not send move by the moments alone."""
    alg = _algorithm(split, defence="union", union_step="server")
    st, lr = alg.state, alg.cfg.lr
    for r in (1, 2):
        plan = RoundPlan(r, np.arange(split.n_users), torch.Generator(), np.random.default_rng(r))
        alg.aggregate(alg.local_update(plan), plan)
    assert st.server_steps == 2
    plan = RoundPlan(3, np.arange(split.n_users), torch.Generator(), np.random.default_rng(3))
    kept = alg.local_update(plan).per_client
    assert kept is not None
    u = st.client_uploads(kept, lr)[1]
    step = st.adam_rows(st.moments, st.server_steps, lr)

    table = st.row_table()
    change = torch.zeros_like(table)
    change[torch.as_tensor(u.items)] = u.tensors[ITEMS]
    sums = st.gradient_sums(change, {k: torch.zeros_like(st.glob[k]) for k in st.dense_keys()}, lr)
    glob = {k: v.clone() for k, v in st.glob.items()}
    moments = {k: (m.clone(), v.clone()) for k, (m, v) in st.moments.items()}
    server_step(glob, moments, st.server_steps, sums, 1, lr, st.spec.weight_decay)
    after = st.table_rows(glob, torch.arange(len(table))).double()

    sent = torch.as_tensor(u.items)
    others = torch.as_tensor(np.setdiff1d(np.arange(len(table)), u.items))
    assert len(others) > 0 and len(sent) > split.n_items  # every output row and its bag's encoder rows
    base = table.double()
    torch.testing.assert_close(step(base[sent], sent, u.tensors[ITEMS].double()), after[sent], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(step(base[others], others, None), after[others], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(step(base[others], others, None), base[others])  # the moments move them


@pytest.mark.parametrize("option", [{"defence": "norm-bound", "norm_bound": 1e9}, {"defence": "mean"}])
def test_the_per_client_path_rebuilds_the_plain_run(option: dict) -> None:
    """The steps `client_uploads` lays out, summed by a rule that keeps every one, give the
    server the plain run's gradient sums: three rounds end where the plain rounds end."""
    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="feddae", dataset="synthetic:60x80", protocol="loo-full", model=MODEL,
                        federated=federated_config("feddae", rounds=3, clients_per_round=0.5, lr=0.01, **opts))
        return train(cfg)

    plain, kept = run(targets=1), run(**option)
    for k, v in plain.model.state.glob.items():
        torch.testing.assert_close(kept.model.state.glob[k], v, rtol=1e-5, atol=1e-6)
    assert [h.loss for h in kept.result.history] == pytest.approx([h.loss for h in plain.result.history])


def test_the_attackers_are_users_at_the_honest_bag_rows_norm(split: Split) -> None:
    """The malicious clients are ``--malicious`` of the users (ids after them); each sends every
    output row, zero but its crafted ones, which are no longer than the boost x the median norm
    of the honest clients' bag rows (as steps at the rate), and zero steps of every other part;
    the attack's uploads count in the round's bytes."""
    alg = _algorithm(split, attack="fedrecattack", boost=3.0, malicious=0.2)
    sec, st = alg.security, alg.state
    assert isinstance(sec, Security) and sec.n_benign == split.n_users and sec.n_malicious == 6
    plan = RoundPlan(1, np.arange(split.n_users), torch.Generator(), np.random.default_rng(1))
    ups = alg.local_update(plan)
    _, _, norms = ups.payload
    honest = alg.cfg.lr * float(torch.cat(norms).median())
    sent = alg.malicious_uploads(1, norms)
    clean = _algorithm(split, targets=1).local_update(plan)
    alg.aggregate(ups, plan)
    m = split.n_items
    for u in sent:
        rows = u.tensors[ITEMS]
        assert rows.shape == (m, st.row_table().shape[1]) and np.array_equal(u.items, np.arange(m))
        assert float(rows.norm(dim=1).max()) <= 3.0 * honest * (1 + 1e-5)
        assert int((rows.norm(dim=1) > 0).sum()) >= 1
        assert all(float(u.tensors[k].abs().max()) == 0 for k in st.dense_keys())
    assert ups.bytes_up > clean.bytes_up
    assert set(sec.figures(alg.scores)) >= {"er@10", "malicious_clients"}


def test_attackers_of_their_own_norm_go_at_the_attacks_estimate(split: Split) -> None:
    """Under ``--attacker-norm own`` the crafted rows are held to the boost x the attack's own
    estimate (`Attack.budget`), not to the honest bag rows the round measured."""
    alg = _algorithm(split, attack="fedrecattack", boost=3.0, malicious=0.2, attacker_norm="own")
    plan = RoundPlan(1, np.arange(split.n_users), torch.Generator(), np.random.default_rng(1))
    _, _, norms = alg.local_update(plan).payload
    assert norms  # measured, and not used
    sec = alg.security
    scoring = alg.state.out_table()
    from fedrec.federated.family.spec import FamilySpec
    from fedrec.security.attacks import Surrogate

    own = sec.attack.budget(scoring, 1, Surrogate(FamilySpec(score="dot", private_score=False, dual=False,
                                                             dim=scoring.shape[1]), {}))
    honest = alg.cfg.lr * float(torch.cat(norms).median())
    assert own != pytest.approx(honest, rel=0.1)
    longest = max(float(u.tensors[ITEMS].norm(dim=1).max()) for u in alg.malicious_uploads(1, norms))
    assert longest == pytest.approx(3.0 * own, rel=1e-4)


def test_fedrecattack_exposes_its_target_and_the_median_stops_it() -> None:
    """Boosted crafted output rows put the target in every user's top 10 within five of the
    server's Adam steps (seed 1: on this tiny set the target either climbs within a few rounds
    or not at all, by seed); the per-row median keeps it where the clean run has it."""
    def last(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="feddae", dataset="synthetic:200x150", protocol="loo-full", model=MODEL, seed=1,
                        federated=federated_config("feddae", rounds=5, clients_per_round=0.5, lr=0.03, backoffs=0,
                                                   **opts))
        return train(cfg).result.history[-1].extra

    clean = last(targets=1)
    attacked = last(attack="fedrecattack", boost=10.0, malicious=0.1)
    defended = last(attack="fedrecattack", boost=10.0, malicious=0.1, defence="median")
    assert attacked["er@10"] > clean["er@10"] + 0.5  # 1.0 against 0
    assert defended["er@10"] <= clean["er@10"] + 0.02


def test_flower_runs_its_defence_and_an_attacker_node_of_its_own_norm(split: Split) -> None:
    """On Flower a defended round asks the nodes for each client's steps, and the malicious
    node sends its crafted rows at the attack's own estimate (both end with the simulator's
    figures: `tests/test_flower.py`); a node cannot see the honest norm, so it refuses it in
    one line."""
    from fedrec.flower.malicious import DAEMaliciousNode, malicious_node
    from fedrec.flower.roles import check_deployable

    run = RunConfig(algorithm="feddae", dataset="synthetic:60x80", protocol="loo-full", model=MODEL,
                    federated=federated_config("feddae", rounds=1, defence="median"))
    check_deployable(run, split=split)
    attacked = dataclasses.replace(run, federated=federated_config("feddae", rounds=1, attack="fedrecattack"))
    with pytest.raises(FedrecError, match="deploy with --attacker-norm own"):
        malicious_node(attacked, split)
    own = dataclasses.replace(run, federated=federated_config("feddae", rounds=1, attack="fedrecattack",
                                                              attacker_norm="own"))
    assert isinstance(malicious_node(own, split), DAEMaliciousNode)
