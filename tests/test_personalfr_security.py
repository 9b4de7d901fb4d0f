"""Attacks and defences on PersonalFR (`fedrec.federated.ae.algorithm`): the security layer reads
the decoder's output rows and biases as an item table.

A defended round equals the per-client reference written out (each client's row deltas and
dense layers, a per-row median over the clients that sent the row, Equation 5 over the round's
uploads); an unbounded norm-bound run equals the plain run; the attacker is a share of the
partition's clients, at an Adam client's row norm; FedRecAttack exposes its target and the
median stops it; what is not built is refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from robust_reference import median

from fedrec.algorithms import get_algorithm
from fedrec.core.contract import RoundPlan
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.ae.algorithm import AEAlgorithm
from fedrec.federated.family.spec import FamilySpec
from fedrec.models.autoencoder import ROW_TABLES
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import Security, attach
from fedrec.security.surrogate import Surrogate

OPTIONS = {"clients": 6, "hidden": (6, 4)}


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(synthetic(36, 40, mean_interactions=9, min_interactions=4, seed=5), "ratio-rating-implicit",
                      seed=0)


def _algorithm(split: Split, name: str = "personalfr", **engine) -> AEAlgorithm:  # type: ignore[no-untyped-def]
    cfg = federated_config(name, **{"lr": 0.01, "clients_per_round": 1.0, "local_epochs": 2, **engine})
    spec = get_algorithm(name).build(split, OPTIONS)
    alg = spec.algorithm(split, cfg, seed=4)
    attach(alg, split, cfg, seed=4)
    return alg


@pytest.mark.parametrize("name", ["personalfr", "fedavg-ae"])
def test_a_defended_round_is_the_per_client_median_and_equation_5(split: Split, name: str) -> None:
    """Under the median, each item's row (output row and bias; under FedAvg the encoder's
    first-layer row too) moves by (its senders x their median delta) / the round's clients, and
    each shared dense layer becomes the median of the clients' layers; written out client by
    client from what each one trained."""
    alg = _algorithm(split, name, defence="median")
    st = alg.state
    plan = RoundPlan(1, np.arange(st.K), torch.Generator(), np.random.default_rng(1))
    before = {k: v.clone() for k, v in st.glob.items()}
    ups = alg.local_update(plan)
    cohort, items, upload, _ = ups.payload
    ptr = np.r_[0, np.cumsum(st.client_items[cohort])]
    mine = {int(c): (items[ptr[k]:ptr[k + 1]], k) for k, c in enumerate(cohort)}
    alg.aggregate(ups, plan)

    tables = [k for k in ("dec.out", "dec.out.b", "enc.in") if k in before]
    assert ("enc.in" in tables) == (name == "fedavg-ae")

    def row(t: dict[str, torch.Tensor], p: int) -> torch.Tensor:
        return torch.cat([t[k][p].reshape(-1) for k in tables])

    n = len(cohort)
    for j in range(split.n_items):
        deltas = []
        for its, k in mine.values():
            at = np.flatnonzero(its == j)
            if len(at):
                deltas.append(row(upload, ptr[k] + int(at[0])) - row(before, j))
        want = row(before, j)
        if deltas:
            want = want + len(deltas) * median(torch.stack(deltas)) / n
        torch.testing.assert_close(row(st.glob, j), want, rtol=1e-5, atol=1e-6)
    dense = [k for k in before if k not in ROW_TABLES]
    assert dense and any(k.startswith("enc.") for k in dense) == (name == "fedavg-ae")
    for k in dense:
        torch.testing.assert_close(st.glob[k], median(upload[k]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["personalfr", "fedavg-ae"])
def test_an_unbounded_norm_bound_run_is_the_plain_run(name: str) -> None:
    """The per-client path (each client's deltas summed by the rule) rebuilds Equation 5: with a
    bound no client reaches, three rounds end where the plain rounds end."""
    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm=name, dataset="synthetic:60x80", protocol="ratio-rating-implicit",
                        model={"clients": 10, "hidden": (8, 4)},
                        federated=federated_config(name, rounds=3, clients_per_round=0.5, **opts))
        return train(cfg)

    plain, bounded = run(targets=1), run(defence="norm-bound", norm_bound=1e9)
    for k, v in plain.model.state.glob.items():
        torch.testing.assert_close(bounded.model.state.glob[k], v, rtol=1e-5, atol=1e-6)
    assert [h.loss for h in bounded.result.history] == pytest.approx([h.loss for h in plain.result.history])


def test_the_attacker_is_a_share_of_the_partitions_clients_at_an_adam_clients_norm(split: Split) -> None:
    """The malicious clients are ``--malicious`` of the K clients (ids K..), not of the users;
    their crafted rows of the output table are no longer than the boost times an Adam client's
    row (each coordinate moving by the rate x the local steps); exposure is measured over every
    user."""
    alg = _algorithm(split, attack="fedrecattack", boost=3.0, malicious=0.34)
    sec, st = alg.security, alg.state
    assert isinstance(sec, Security) and sec.n_benign == st.K == 6 and sec.n_malicious == 2
    assert sec.n_users == split.n_users
    bound = 0.01 * 2 * np.ceil(split.n_users / st.K / alg.cfg.batch_size)
    assert alg.step_bound == pytest.approx(bound)
    table = st.out_table()
    model = Surrogate(FamilySpec(score="dot", private_score=False, dual=False, dim=table.shape[1]), {})
    assert sec.attack is not None
    assert sec.attack.budget(table, 1, model) == pytest.approx(bound * np.sqrt(table.shape[1]), rel=1e-5)
    bad, n_bytes = sec.malicious_uploads(model.spec, table, {}, 1, clients=np.arange(2))
    assert [u.client for u in bad] == [6, 7] and n_bytes > 0
    for u in bad:
        assert float(u.tensors["items"].norm(dim=1).max()) <= 3.0 * bound * np.sqrt(table.shape[1]) * (1 + 1e-5)
    assert set(sec.figures(alg.scores)) >= {"er@10", "malicious_clients"}


def test_fedrecattack_exposes_its_target_and_the_median_stops_it() -> None:
    """Boosted crafted rows of the output table put the target in a quarter of the users' top 10
    in eight rounds; the per-row median keeps it where the clean run has it."""
    def last(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="personalfr", dataset="synthetic:200x150", protocol="ratio-rating-implicit",
                        model={"clients": 20, "hidden": (16, 8)},
                        federated=federated_config("personalfr", rounds=8, clients_per_round=0.5, lr=0.01,
                                                   backoffs=0, **opts))
        return train(cfg).result.history[-1].extra

    clean = last(targets=1)
    attacked = last(attack="fedrecattack", boost=10.0, malicious=0.1)
    defended = last(attack="fedrecattack", boost=10.0, malicious=0.1, defence="median")
    assert attacked["er@10"] > clean["er@10"] + 0.2  # 0.28 against 0
    assert defended["er@10"] <= clean["er@10"] + 0.02


@pytest.mark.parametrize(("name", "option", "why"), [
    ("ae", {"defence": "median"}, "not on ae's aggregation yet"),
    ("personalfr", {"pad_items": 5}, "take no --pad-items"),
])
def test_what_is_not_built_is_refused_in_one_line(name: str, option: dict, why: str) -> None:
    """The Joint model has one client: no attack or defence there; no autoencoder draws pseudo
    rows."""
    cfg = RunConfig(algorithm=name, dataset="synthetic:150x80", protocol="ratio-rating-implicit",
                    federated=federated_config(name, rounds=1, **option))
    with pytest.raises(FedrecError, match=why):
        train(cfg)


def test_flower_runs_its_defence_and_its_attacker_node(split: Split) -> None:
    """On Flower a defended round asks the nodes for each client's upload, and the attacker's
    node declares clients after the partition's that download the whole decoder (the
    simulator's figures: `tests/test_flower.py`)."""
    from fedrec.flower.malicious import AEMaliciousNode, malicious_node
    from fedrec.flower.roles import check_deployable

    run = RunConfig(algorithm="personalfr", dataset="synthetic:60x80", protocol="ratio-rating-implicit",
                    model={"clients": 6}, federated=federated_config("personalfr", rounds=1, defence="median"))
    check_deployable(run, split=split)
    attacked = dataclasses.replace(run, federated=federated_config("personalfr", rounds=1, attack="fedrecattack"))
    node = malicious_node(attacked, split)
    assert isinstance(node, AEMaliciousNode)
    hello = node.hello()
    k = int(hello["n_clients"])
    assert hello["whole_table"] and hello["clients"].tolist() == list(range(k, k + node.security.n_malicious))
