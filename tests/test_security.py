"""Attacks, per-row robust aggregation and exposure: each does what its paper says on tiny data."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedrec.core.contract import ClientUpload
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.model import ITEMS
from fedrec.protocols import make_split
from fedrec.security.adversary import attach
from fedrec.security.exposure import exposure
from fedrec.security.robust import RobustRule


def _uploads(seed: int = 0, n_clients: int = 12, n_items: int = 9, width: int = 3) -> list[ClientUpload]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n_clients):
        items = np.sort(rng.choice(n_items, rng.integers(1, n_items), replace=False))
        out.append(ClientUpload(c, items, {ITEMS: torch.as_tensor(rng.normal(size=(len(items), width)), dtype=torch.float32)}))
    return out


def _per_row(uploads: list[ClientUpload], n_items: int, width: int, fn) -> torch.Tensor:
    """Reference: ``count x fn(values)`` of each row, by a loop over rows."""
    out = torch.zeros(n_items, width)
    for i in range(n_items):
        vals = [u.tensors[ITEMS][list(u.items).index(i)].numpy() for u in uploads if u.accepted and i in u.items]
        if vals:
            out[i] = torch.as_tensor(len(vals) * fn(np.array(vals)), dtype=torch.float32)
    return out


def test_mean_rule_is_fedavg_sums():
    ups = _uploads()
    ups[3].accepted = False
    got, _, flagged = RobustRule("mean").aggregate(ups, 9, 3, {})
    want = torch.zeros(9, 3)
    for u in ups:
        if u.accepted:
            want.index_add_(0, torch.as_tensor(u.items), u.tensors[ITEMS])
    assert torch.allclose(got, want, atol=1e-5)
    assert not flagged.any()


@pytest.mark.parametrize("budget", [64.0, 1e-4])  # one block, and one group a block
def test_median_and_trimmed_mean_per_row(budget):
    ups = _uploads(1)
    med, _, _ = RobustRule("median", budget_mb=budget).aggregate(ups, 9, 3, {})
    assert torch.allclose(med, _per_row(ups, 9, 3, lambda v: np.median(v, 0)), atol=1e-5)

    def trimmed(v, share=0.25):
        k = min(int(np.floor(share * len(v))), (len(v) - 1) // 2)
        s = np.sort(v, 0)
        return s[k : len(v) - k].mean(0)

    tm, _, _ = RobustRule("trimmed-mean", trim=0.25, budget_mb=budget).aggregate(ups, 9, 3, {})
    assert torch.allclose(tm, _per_row(ups, 9, 3, trimmed), atol=1e-5)


def _colluding(n_honest=8, n_bad=2, width=4):
    """Honest clients near one row, attackers far away on the same item (and a second item
    only honest clients send)."""
    rng = np.random.default_rng(3)
    ups = []
    for c in range(n_honest):
        rows = torch.as_tensor(np.ones((2, width)) + 0.01 * rng.normal(size=(2, width)), dtype=torch.float32)
        ups.append(ClientUpload(c, np.array([0, 1]), {ITEMS: rows}))
    for c in range(n_bad):
        ups.append(ClientUpload(n_honest + c, np.array([0]), {ITEMS: torch.full((1, width), 50.0) + c}))
    return ups


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum", "multi-krum"])
def test_robust_rules_resist_outlying_rows(rule):
    ups = _colluding()
    got, _, flagged = RobustRule(rule, trim=0.2, byzantine=0.2).aggregate(ups, 2, 4, {})
    mean_row0 = got[0] / 10  # 10 clients sent row 0
    assert torch.allclose(mean_row0, torch.ones(4), atol=0.05), mean_row0
    plain, _, _ = RobustRule("mean").aggregate(ups, 2, 4, {})
    assert (plain[0] / 10 - 1).abs().min() > 5  # without a defence the attackers move the row
    if rule == "multi-krum":
        assert flagged[8:].all() and not flagged[:8].any()  # detection: precision = recall = 1


def test_norm_bound_scales_whole_updates():
    ups = _colluding()
    got, _, _ = RobustRule("norm-bound", norm_bound=1.0).aggregate(ups, 2, 4, {})
    for u in ups:
        assert u.tensors[ITEMS].norm() > 1.0
    # every client's whole update is scaled to norm 1: honest rows contribute 1/sqrt(2) each
    honest = sum(u.tensors[ITEMS][0] / u.tensors[ITEMS].norm() for u in ups[:8])
    bad = sum(u.tensors[ITEMS][0] / u.tensors[ITEMS].norm() for u in ups[8:])
    assert torch.allclose(got[0], honest + bad, atol=1e-5)


def test_exposure_against_a_hand_count():
    # 3 users x 6 items; target 5. User 0 knows item 5 (not eligible); user 1 ranks it 2nd
    # among unknown items; user 2 ranks it 4th
    scores = np.array([[0, 1, 2, 3, 4, 5], [9, 0, 0, 0, 0, 8], [9, 8, 7, 0, 1, 2]], float)
    known = sp.csr_matrix(np.array([[0, 0, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]], bool))
    out = exposure(lambda u, _: scores[u], known, np.array([5]), ks=(1, 2, 3, 4))
    assert out["er@1"] == 0.0 and out["er@2"] == 0.5 and out["er@3"] == 0.5 and out["er@4"] == 1.0
    assert out["target_ndcg@2"] == pytest.approx(0.5 * (1 / np.log2(3)))


def _run(rounds=12, **kw):
    cfg = RunConfig(algorithm="fedmf", dataset="synthetic:500x400", protocol="loo-sampled",
                    federated=federated_config("fedmf", rounds=rounds, **kw))
    return train(cfg).result


@pytest.fixture(scope="module")
def clean():
    return _run(targets=1)


@pytest.fixture(scope="module")
def attacked():
    return _run(attack="fedrecattack", prior_knowledge=0.2, boost=10.0)


def test_fedrecattack_raises_exposure_and_median_stops_it(clean, attacked):
    er = lambda res: res.history[-1].extra["er@10"]  # noqa: E731
    assert er(clean) < 0.05
    assert er(attacked) > 0.6  # the target reaches most users' top 10
    assert attacked.history[-1].extra["malicious_clients"] == 25.0
    defended = _run(attack="fedrecattack", prior_knowledge=0.2, boost=10.0, defence="median")
    assert er(defended) < er(attacked) / 3
    # the clean run measured the same target: exposure without an attack is the baseline
    assert clean.history[0].extra.keys() >= {"er@5", "er@10", "er@20", "target_ndcg@10"}


def test_explicit_boosting_fake_users_raise_exposure(clean):
    res = _run(attack="boost")
    assert max(h.extra["er@10"] for h in res.history) > clean.history[-1].extra["er@10"] + 0.1


@pytest.mark.parametrize(("algorithm", "options", "gain"), [
    # rows at 20 times an honest client's where 10 moves this small set too little to tell (random
    # fillers, UEA: ER@10 0.035 and 0.085 at 10 against 0.002 clean)
    ("fedmf", {"attack": "random", "malicious": 0.2, "boost": 20.0}, 0.04),  # FedRecAttack's baselines
    ("fedmf", {"attack": "bandwagon", "boost": 10.0}, 0.04),
    ("fedmf", {"attack": "popular", "boost": 10.0}, 0.04),
    ("fedmf", {"attack": "pipattack", "boost": 20.0, "prior_knowledge": 0.2}, 0.3),
    ("fedmf", {"attack": "pieck-ipe", "boost": 10.0}, 0.2),  # no prior knowledge: popular rows mined
    ("fedmf", {"attack": "pieck-uea", "boost": 20.0}, 0.2),
    ("fedmf", {"attack": "poisonfrs", "boost": 10.0}, 0.2),  # no prior knowledge: popular rows estimated
    ("fedncf", {"attack": "a-ra", "boost": 10.0}, 0.6),  # through the shared MLP
    ("fedncf", {"attack": "a-hum", "boost": 10.0}, 0.6),
])
def test_every_targeted_attack_raises_exposure_above_the_clean_run(algorithm, options, gain):
    def last_er(res):
        return res.history[-1].extra["er@10"]

    base = _clean_10(algorithm)
    attacked = RunConfig(algorithm=algorithm, dataset="synthetic:500x400", protocol="loo-sampled",
                         federated=federated_config(algorithm, rounds=10, **options))
    assert last_er(train(attacked).result) > last_er(base) + gain


@cache  # the cases of one method compare with its one clean run
def _clean_10(algorithm):
    cfg = RunConfig(algorithm=algorithm, dataset="synthetic:500x400", protocol="loo-sampled",
                    federated=federated_config(algorithm, rounds=10, targets=1))
    return train(cfg).result


def test_fedattack_degrades_the_model(clean):
    res = _run(attack="fedattack", malicious=0.1, boost=10.0)
    assert res.test["hr@10"] < clean.test["hr@10"] - 0.05


def test_security_options_are_checked_up_front():
    with pytest.raises(FedrecError, match="unknown --attack"):
        _run(attack="nope")
    with pytest.raises(FedrecError, match="describe an --attack"):
        _run(malicious=0.1)
    with pytest.raises(FedrecError, match="'fedmf' does not use --attacker-norm: its attackers always make"):
        _run(attacker_norm="own")
    with pytest.raises(FedrecError, match="--attacker-norm must be one of honest, own"):
        _run(attack="fedrecattack", attacker_norm="median")
    with pytest.raises(FedrecError, match="untargeted"):
        _run(attack="fedattack", targets=2)
    cfg = RunConfig(algorithm="centrap", dataset="synthetic:300x400",
                    federated=federated_config("centrap", rounds=1, defence="median"))
    with pytest.raises(FedrecError, match="server averages item rows"):
        train(cfg)


def test_fedrap_takes_attacks_and_defences_on_its_shared_c():
    cfg = RunConfig(algorithm="fedrap", dataset="synthetic:300x400",
                    federated=federated_config("fedrap", rounds=2, attack="fedrecattack", boost=10.0,
                                               defence="median"))
    res = train(cfg).result
    assert res.history[-1].extra["malicious_clients"] == 15.0 and "er@10" in res.history[-1].extra


def test_run_command_reports_the_attack(tmp_path):
    from typer.testing import CliRunner

    from fedrec.cli import app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", "fedmf", "-d", "synthetic:300x400", "--rounds", "2", "-q", "-o", str(out),
                                   "--attack", "fedrecattack", "--boost", "10", "--defence", "multi-krum"])
    assert res.exit_code == 0, res.output
    assert "exposure of the target items after round 2" in res.output and "multi-krum flagged" in res.output
    import json

    extra = json.loads(out.read_text())["history"][-1]["extra"]
    assert {"er@10", "flag_precision", "malicious_clients"} <= extra.keys()
    res = CliRunner().invoke(app, ["run", "mf", "-d", "synthetic:300x400", "--attack", "boost"])
    assert res.exit_code != 0 and "--attack does not apply" in str(res.exception)


def test_public_share_is_ceil_of_each_users_items():
    from fedrec.security.attacks import public_share

    train = sp.random(50, 80, density=0.2, format="csr", random_state=0)
    pub = public_share(train, 0.01, seed=0)
    per_user = np.diff(train.indptr)
    assert np.array_equal(np.diff(pub.indptr), np.ceil(per_user * 0.01).astype(int))
    assert (pub.multiply(train.astype(bool)) != pub).nnz == 0  # a subset of the training items


def test_fedrecattack_in_its_own_setting_promotes_the_target():
    from fedrec.data.synthetic import synthetic
    from fedrec.protocols import make_split
    from fedrec.security.legacy import run_legacy

    split = make_split(synthetic(400, 300, seed=1), "loo-sampled", seed=0)
    train = (split.train + split.valid.targets).tocsr()
    test = np.full(split.n_users, -1)
    t = split.test.targets.tocoo()
    test[t.row] = t.col
    target = np.array([int(np.argmin(np.asarray(train.sum(0)).ravel()))])  # a cold item
    clean = run_legacy(train, test, target, 3, seed=0, attack=None)
    attacked = run_legacy(train, test, target, 3, seed=0, attack="fedrecattack")
    assert clean[0] == attacked[0]  # the same start
    assert attacked[-1]["er@10"] > 0.3 > clean[-1]["er@10"] + 0.2


def test_attack_tables_render_fromcached_figures_runs(tmp_path):
    from fedrec.reproduce.attacks import AttackTables, to_markdown

    t = AttackTables(
        anchor=[{"iteration": 0, "seed": 0, "er@10": 0.01, "er@5": 0.0, "target_ndcg@10": 0.0, "hr@10": 0.1}],
        poisoning=[{"method": "fedmf", "attack": "boost", "defence": "none", "seed": s, "er@10": 0.1 * s}
                   for s in (1, 2)]
        + [{"method": "fedmf", "attack": "boost", "defence": "none", "seed": 1, "malicious": 0.01, "er@10": 0.02,
            "hr@10": 0.5}],
        inference=[{"method": "fedmf", "view": "none", "seed": 0, "rows_precision": 0.2, "rows_recall": 1.0,
                    "rows_f1": 0.3333, "rows_auc": 0.9, "random_precision": 0.05, "bytes_up": 2**20}])
    text = to_markdown(t)
    assert "| 0 | 0.0100 | 0.0054 |" in text  # ours beside FedRecAttack's README figure
    assert "0.1500 ± 0.0707" in text and "| fedmf | none | 0.2000 / 1.0000 / 0.3333 / 0.9000 |" in text
    # the share sweep: its own table, one column per share; the 5% runs stay in the main table only
    assert "| fedmf | boost | none | 0.0200 (0.5000) | 0.1500 (–) |" in text
    assert text.count("| fedmf | boost | none |") == 2


def test_attack_plots_draw_each_method_and_the_share_sweep(tmp_path):
    from fedrec.reproduce.attacks import AttackTables, plot

    curve = {"er@10_by_round": [0.0, 0.5], "hr@10": 0.5}
    t = AttackTables(
        poisoning=[{"method": "fedmf", "attack": "fedrecattack x10", "defence": d, "seed": 0, "malicious": p,
                    "er@10": e, **curve} for d, p, e in (("none", 0.05, 0.9), ("median", 0.05, 0.0),
                                                        ("none", 0.01, 0.5), ("median", 0.01, 0.0))],
        inference=[{"method": "fedmf", "view": v, "seed": 0, "rows_auc": 0.9, "direction_auc": a,
                    "rounds_auc": 0.6, "hr@10": h} for v, a, h in (("none", 0.99, 0.5), ("dp z=1", 0.5, 0.2))])
    written = plot(t, tmp_path)
    assert sorted(p.name for p in written) == ["attacks-fedmf.png", "privacy-fedmf.png"]
    assert all(p.stat().st_size > 10_000 for p in written)


def test_fedrecattack_gradient_stays_finite_when_scores_overflow_exp():
    # a table whose scores reach the hundreds: g(x) = e^x - 1 must not be evaluated past x = 0,
    # or its unused branch overflows and the gradient turns NaN (seen on ML-100K under a defence)
    from fedrec.security.attacks import Attack, Knowledge
    from fedrec.security.surrogate import Surrogate

    rng = np.random.default_rng(0)
    public = sp.csr_matrix((rng.random((20, 50)) < 0.2).astype(float))
    know = Knowledge(n_items=50, targets=np.array([3]), public=public, lr_item=0.1)
    attack = Attack("fedrecattack", know, n_malicious=2, seed=0, attack_items=10, init_std=10.0)
    table = torch.as_tensor(rng.normal(size=(50, 8)) * 30.0, dtype=torch.float32)
    sent = attack.uploads(table, np.array([0, 1]), 0, Surrogate.dot(8))
    assert all(torch.isfinite(p.rows).all() and 3 in p.items for p in sent)


@pytest.mark.parametrize("rule", ["mean", "median", "krum", "norm-bound"])
def test_uploads_without_rows_aggregate_to_zero(rule):
    ups = [ClientUpload(c, np.zeros(0, np.int64), {ITEMS: torch.zeros(0, 3), "w": torch.ones(2, 2) * c})
           for c in range(4)]
    items, shared, flagged = RobustRule(rule).aggregate(ups, 5, 3, {"w": torch.zeros(2, 2)})
    assert not items.any() and not flagged.any()
    assert shared["w"].shape == (2, 2)


def test_blocks_of_mixed_group_sizes_stay_within_the_budget_and_agree():
    # many rows with one uploader and one row with many: a block is sized by its largest group
    rng = np.random.default_rng(0)
    ups = [ClientUpload(c, np.array([0, 1 + c]), {ITEMS: torch.as_tensor(rng.normal(size=(2, 4)), dtype=torch.float32)})
           for c in range(300)]
    small, _, _ = RobustRule("median", budget_mb=0.01).aggregate(ups, 301, 4, {})
    large, _, _ = RobustRule("median", budget_mb=64).aggregate(ups, 301, 4, {})
    assert torch.allclose(small, large)
    assert torch.allclose(large, _per_row(ups, 301, 4, lambda v: np.median(v, 0)), atol=1e-5)


def test_exposure_never_counts_a_nan_score_as_recommended():
    scores = np.array([[np.nan, 1.0, 2.0, 0.0]])
    known = sp.csr_matrix((1, 4), dtype=bool)
    out = exposure(lambda u, _: scores[u], known, np.array([0]), ks=(1, 3))
    assert out["er@1"] == 0.0 and out["er@3"] == 0.0


@pytest.mark.parametrize("option", [{"attack": "a-ra"}, {"defence": "median"}, {"targets": 1}])
def test_an_algorithm_without_the_security_slot_refuses_it(option: dict) -> None:
    """An algorithm whose round has no upload stage the security layer plugs into (one
    registered from outside fedrec, say) refuses an attack, a defence or targets in one line,
    never ignores them."""
    class Bare:  # a round without the ``security`` slot (no ``takes_security``)
        pass

    split = make_split(synthetic(100, 300, seed=0), "loo-sampled", seed=0)
    cfg = federated_config("fedmf", rounds=1, **option)
    with pytest.raises(FedrecError, match="not on Bare yet"):
        attach(Bare(), split, cfg, seed=0)


def test_the_engine_alone_refuses_security_options() -> None:
    """The engine's `run_federated` trains without the security layer (it sits above it): given
    an attack it says where one plugs in, rather than training a clean run."""
    from fedrec.algorithms import get_algorithm
    from fedrec.experiment import prepare_split
    from fedrec.federated.engine import run_federated

    cfg = RunConfig(algorithm="fedmf", dataset="synthetic:100x300",
                    federated=federated_config("fedmf", rounds=1, attack="a-ra"))
    split = prepare_split(cfg)
    with pytest.raises(FedrecError, match="plug in where a run is built"):
        run_federated(get_algorithm("fedmf").build(split), split, cfg.federated)


def test_pieck_mines_the_rows_that_move_most_then_steps_the_targets_towards_them():
    """PIECK's attacker sends nothing while it mines: over three looks at the table it sums each
    row's change and takes the rows that moved most (targets left out), in that order; then IPE's
    step raises the targets' weighted cosine with them, UEA's their scores as the popular rows'
    users."""
    import torch

    from fedrec.security.attacks import Attack, Knowledge, Poisoned

    n, d = 30, 6
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(n, d, generator=gen)
    moves = torch.zeros(n)
    moves[[4, 9, 17, 2]] = torch.tensor([5.0, 4.0, 3.0, 50.0])  # row 2 is the target: never mined
    know = Knowledge(n, np.array([2]), sp.csr_matrix((100, n)), lr_item=1.0)
    for name, paper_n in (("pieck-ipe", 10), ("pieck-uea", 15)):
        attack = Attack(name, know, n_malicious=5, seed=0, mined=3)
        default = Attack(name, know, n_malicious=5, seed=0)  # the paper's N
        q = table.clone()
        for look in range(3):
            if look:
                q = q + moves[:, None] * torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
            ups = attack.uploads(q, np.array([0, 1]), look + 1, None, norm=0.05)  # type: ignore[arg-type]
            default.mine(q)
            if look < 2:
                assert all(isinstance(u, Poisoned) and len(u.items) == 0 for u in ups)
        assert attack._popular is not None and attack._popular.tolist() == [4, 9, 17]
        assert default._popular is not None and len(default._popular) == paper_n and 2 not in default._popular
        (up, _) = ups
        assert up.items.tolist() == [2] and float(up.rows.norm()) == pytest.approx(0.05)
        p, v = q[torch.as_tensor([4, 9, 17])], q[2]
        after = v + up.rows[0]
        if name == "pieck-ipe":
            w = torch.tensor([3.0, 2.0, 1.0])
            cos = torch.nn.functional.cosine_similarity
            assert float((w * cos(after[None], p)).sum()) > float((w * cos(v[None], p)).sum())
        else:
            bce = torch.nn.functional.softplus  # -log sigmoid(x) = softplus(-x)
            assert float(bce(-(p @ after)).mean()) < float(bce(-(p @ v)).mean())


def test_poisonfrs_waits_then_pulls_the_targets_to_the_popular_rows_and_the_rest_back():
    """PoisonFRS sends nothing for its first looks; at the third it takes as popular the rows
    least aligned with the mean row (targets left out) and fixes its target table: that look's
    table with the targets at λ x the popular rows' mean. Each fake user then sends W̃ − V on
    the targets and the rows where it is longest, held to the row budget, plus noise of its own."""
    import torch

    from fedrec.security.attacks import Attack, Knowledge

    n, d = 40, 8
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(n, d, generator=gen) * 0.1 + 1.0  # a mean row along (1, ..., 1)
    table[[5, 11, 23]] = -torch.ones(3, d) * torch.tensor([3.0, 2.0, 1.0])[:, None]  # least aligned
    table[7] = -10 * torch.ones(d)  # the target: never taken as popular
    know = Knowledge(n, np.array([7]), sp.csr_matrix((100, n)), lr_item=1.0)
    attack = Attack("poisonfrs", know, n_malicious=4, seed=0, mined=3, attack_items=6, scale=10.0)
    for look in (1, 2):
        ups = attack.uploads(table, np.array([0, 1]), look, None, norm=0.05)  # type: ignore[arg-type]
        assert all(len(u.items) == 0 for u in ups)
    ups = attack.uploads(table, np.array([0, 1]), 3, None, norm=0.05)  # type: ignore[arg-type]
    assert attack._popular is not None and sorted(attack._popular.tolist()) == [5, 11, 23]
    goal = attack._goal
    assert goal is not None and torch.allclose(goal[7], 10 * table[[5, 11, 23]].mean(0))
    assert torch.equal(goal[:7], table[:7])
    moved = table + 0.01 * torch.randn(n, d, generator=gen)
    moved[3] += 1.0  # the row that drifted most from the look's table
    a, b = attack.uploads(moved, np.array([0, 1]), 4, None, norm=0.05)  # type: ignore[arg-type]
    assert a.items.tolist() == b.items.tolist() and 7 in a.items and 3 in a.items and len(a.items) == 6
    assert not torch.allclose(a.rows, b.rows)  # each fake user's own noise
    bound = 0.05 * (1 + 0.5 + 1e-4)  # the held step, plus noise of half its length
    assert float(a.rows.norm(dim=1).max()) < bound
    # the two users' mean halves the noise: the rows point from the current table to the target one
    want = torch.nn.functional.normalize(goal[torch.as_tensor(a.items)] - moved[torch.as_tensor(a.items)], dim=1)
    mean_two = torch.nn.functional.normalize((a.rows + b.rows) / 2, dim=1)
    assert float((mean_two * want).sum(1).min()) > 0.5


@pytest.mark.parametrize(("alg", "attack", "data", "model"), [
    ("fedmf", "pieck-ipe", "synthetic:200x300", {}),
    ("fedmf", "fedrecattack", "synthetic:200x300", {}),
    # methods whose own state does not hold the attack's: the engine's checkpoint does
    ("fedca", "fedrecattack", "synthetic:100x150", {"dim": 8}),
    ("feddae", "fedrecattack", "synthetic:100x150", {"hidden": "16/8", "latent": 4, "gate_hidden": 8}),
])
def test_an_attacked_run_resumed_from_a_checkpoint_equals_an_uninterrupted_one(alg, attack, data, model, tmp_path):
    """The attacker's state (PIECK's mining, FedRecAttack's approximated users and rows) is in
    the checkpoint, whichever method, so a resumed attacked run goes on as if never stopped."""
    def cfg(rounds):
        return RunConfig(algorithm=alg, dataset=data, protocol="loo-full", seed=3, model=model,
                         federated=federated_config(alg, rounds=rounds, attack=attack, boost=10.0, malicious=0.1,
                                                    checkpoint_every=1))

    whole = train(cfg(6)).result
    ckpt = tmp_path / "run.ckpt"
    train(cfg(2), checkpoint=ckpt)
    resumed = train(cfg(6), checkpoint=ckpt, resume=True).result
    assert [h.extra["er@10"] for h in resumed.history] == [h.extra["er@10"] for h in whole.history]
    assert [h.loss for h in resumed.history] == [h.loss for h in whole.history]
    assert [h.valid for h in resumed.history] == [h.valid for h in whole.history]
    if alg == "fedmf":
        assert max(h.extra["er@10"] for h in whole.history[3:]) > 0  # the attack acts after the stop


def test_a_checkpoint_that_kept_the_attack_with_the_server_state_still_restores_it():
    """The item family's checkpoints once held the attack's state inside the server's: loading
    one restores the attacker as the engine's own layout does."""
    run = train(RunConfig(algorithm="fedmf", dataset="synthetic:200x300", protocol="loo-full",
                          federated=federated_config("fedmf", rounds=3, attack="pieck-ipe", boost=10.0)))
    alg = run.model
    blob = alg.state_dict()
    looks = alg.security.attack.state()["looks"]
    assert looks > 0
    blob["server"]["attack"] = blob.pop("attack")
    alg.security.attack._looks = 0
    alg.load_state_dict(blob)
    assert alg.security.attack.state()["looks"] == looks


def test_clusterattack_pulls_sampled_rows_towards_their_centroids_at_honest_lengths():
    """ClusterAttack's rows: each towards its k-means centroid, drawn in proportion to its squared
    distance there, of a length in [μ, μ + 3σ] of the honest norms x boost; each fake client
    draws its own rows and lengths."""
    from fedrec.security.attacks import Attack, Knowledge

    gen = torch.Generator().manual_seed(3)
    n, d = 60, 4
    table = torch.cat([torch.randn(30, d, generator=gen) * 0.3 + 2, torch.randn(30, d, generator=gen) * 0.3 - 2])
    know = Knowledge(n, np.zeros(0, np.int64), sp.csr_matrix((10, n)), lr_item=1.0)
    attack = Attack("clusterattack", know, n_malicious=3, seed=0, attack_items=12, boost=2.0)
    pull = attack._cluster_pull(table, 1)
    centroid = table + pull
    # two clusters found: the centroids are the two groups' means
    assert torch.allclose(centroid[:30], table[:30].mean(0).expand(30, d), atol=1e-5)
    assert torch.allclose(centroid[30:], table[30:].mean(0).expand(30, d), atol=1e-5)
    norms = torch.tensor([1.0, 2.0, 3.0])
    a, b = attack._collapse(pull, norms, 0, 1), attack._collapse(pull, norms, 1, 1)
    assert len(a.items) == 12 and len(set(a.items.tolist())) == 12 and a.items.tolist() != b.items.tolist()
    cos = torch.nn.functional.cosine_similarity(a.rows, pull[torch.as_tensor(a.items)])
    assert torch.allclose(cos, torch.ones(12), atol=1e-5)
    length = a.rows.norm(dim=1) / 2.0  # boost 2
    assert float(length.min()) >= 2.0 - 1e-5 and float(length.max()) <= 2.0 + 3 * 1.0 + 1e-5


def test_union_uniformity_matches_the_mean_pairwise_distance_written_out():
    from fedrec.security.robust import share as share_of
    from fedrec.security.robust import uniformities

    ups = _uploads(4, n_clients=5, n_items=9, width=3)
    table = torch.randn(9, 3, generator=torch.Generator().manual_seed(4))
    sample = np.array([0, 2, 3, 5, 8])
    drift = torch.arange(27, dtype=torch.float64).reshape(9, 3) / 10

    def drifting(rows, at, change):  # a server that moves every row, and a client's rows more
        return rows + drift[at] + (0 if change is None else 0.5 * change)

    for step, moving, share in ((share_of(1), False, 1.0), (share_of(4), False, 0.25), (drifting, True, 0.5)):
        got = uniformities(ups, table, sample, step)
        for u, g in zip(ups, got, strict=True):
            after = table.clone().double() + (drift if moving else 0)
            after[torch.as_tensor(u.items)] += share * u.tensors[ITEMS].double()
            x = after[torch.as_tensor(sample)]
            want = float(torch.cdist(x, x).sum()) / (len(sample) * (len(sample) - 1))
            assert g == pytest.approx(want, rel=1e-9)
    # a server that averages each row over its senders: a client's change / the row's senders
    from fedrec.security.robust import row_senders, row_share

    senders = row_senders(ups, 9)
    assert senders.tolist() == [sum(i in u.items for u in ups) for i in range(9)] and senders.max() > 1
    for u, g in zip(ups, uniformities(ups, table, sample, row_share(senders)), strict=True):
        after = table.clone().double()
        after[torch.as_tensor(u.items)] += u.tensors[ITEMS].double() / senders[torch.as_tensor(u.items), None].double()
        x = after[torch.as_tensor(sample)]
        assert g == pytest.approx(float(torch.cdist(x, x).sum()) / (len(sample) * (len(sample) - 1)), rel=1e-9)


def test_union_drops_the_clients_that_collapse_the_table_and_keeps_a_clean_round():
    """Three clients pull every row they send towards one point: their uniformity falls apart
    from the honest clients', the gap statistic finds two groups, and exactly they are dropped
    (flagged) and left out of the sums and the count; a round of honest clients alone keeps all."""
    from fedrec.security.adversary import Security
    from fedrec.security.robust import union_filter

    rng = np.random.default_rng(5)
    n_items, width = 80, 4
    table = torch.as_tensor(rng.normal(size=(n_items, width)), dtype=torch.float32)
    honest = []
    for c in range(30):
        items = np.sort(rng.choice(n_items, 20, replace=False))
        honest.append(ClientUpload(c, items, {ITEMS: torch.as_tensor(rng.normal(scale=0.05, size=(20, width)),
                                                                      dtype=torch.float32)}))
    bad = []
    for c in range(30, 33):
        items = np.sort(rng.choice(n_items, 20, replace=False))
        bad.append(ClientUpload(c, items, {ITEMS: -0.8 * table[torch.as_tensor(items)]}))
    assert not union_filter(honest, table, byzantine=0.0).any()
    ups = honest[:10] + bad + honest[10:]
    dropped = union_filter(ups, table, byzantine=0.0)  # no fallback: the gap statistic decides
    assert dropped.tolist() == [False] * 10 + [True] * 3 + [False] * 20
    sec = Security.defence(RunConfigLike(), 30, 3, n_items, seed=0)
    item_sum, _, n = sec.sums(ups, n_items, width, {}, table)
    want = torch.zeros(n_items, width)
    for u in honest:
        want.index_add_(0, torch.as_tensor(u.items), u.tensors[ITEMS])
    assert n == 30 and torch.allclose(item_sum, want, atol=1e-5)
    assert sec.last["flag_precision"] == 1.0 and sec.last["flag_recall"] == 1.0
    # where the server divides each row by its senders, judged at each row's share, the same
    # clients are dropped and the senders counted are the kept uploads'
    senders = torch.full((n_items,), -1.0)
    item_sum, _, n = sec.sums(ups, n_items, width, {}, table, senders=senders)
    assert n == 30 and torch.allclose(item_sum, want, atol=1e-5) and sec.last["flag_recall"] == 1.0
    kept = np.concatenate([u.items for u in honest])
    assert senders.tolist() == np.bincount(kept, minlength=n_items).tolist()


def test_union_judges_a_pull_at_the_servers_step_not_by_the_uploads_size():
    """Row changes larger than the table's rows (the papers' rule), the attackers' as long as the
    honest ones' but all pulled towards the table's centre (ClusterAttack at x1): taken whole,
    every change scatters the table and uniformity reads mostly the size, so the attackers mix
    with the honest clients; at the server's step (each client's share of the round's average) the pull shows, and
    exactly the attackers are dropped."""
    from fedrec.security import robust

    rng = np.random.default_rng(7)
    n_items, width = 120, 4
    table = torch.as_tensor(rng.normal(scale=0.3, size=(n_items, width)), dtype=torch.float32)

    def lengths() -> np.ndarray:
        return rng.lognormal(np.log(3.0), 0.6, size=(30, 1))

    ups = []
    for c in range(44):
        items = np.sort(rng.choice(n_items, 30, replace=False))
        way = (table.mean(0) - table[torch.as_tensor(items)]).numpy() if c >= 40 else rng.normal(size=(30, width))
        rows = way / np.linalg.norm(way, axis=1, keepdims=True) * lengths()
        ups.append(ClientUpload(c, items, {ITEMS: torch.as_tensor(rows, dtype=torch.float32)}))
    assert np.flatnonzero(robust.union_filter(ups, table, byzantine=0.0)).tolist() == [40, 41, 42, 43]
    sample = np.arange(n_items)
    whole, share = robust.uniformities(ups, table, sample), robust.uniformities(ups, table, sample, robust.share(44))
    assert whole[40:].max() > whole[:40].min()  # taken whole, the attackers mix with the honest
    assert share[40:].max() < share[:40].min()  # at the server's step it gathers it


def test_union_takes_each_upload_at_its_share_of_the_accepted_uploads(monkeypatch):
    """The step UNION judges a client at is 1/n of its rows, n the uploads the server accepted
    (a rejected upload is neither judged nor counted)."""
    from fedrec.security import robust

    rng = np.random.default_rng(3)
    table = torch.as_tensor(rng.normal(size=(30, 4)), dtype=torch.float32)
    ups = [ClientUpload(c, np.arange(c, c + 5), {ITEMS: torch.ones(5, 4)}) for c in range(6)]
    ups[2] = ClientUpload(2, np.arange(5), {ITEMS: torch.ones(5, 4)}, accepted=False)
    seen = []
    real = robust.uniformities
    one = torch.ones(1, 1, dtype=torch.float64)
    monkeypatch.setattr(robust, "uniformities", lambda u, t, s, step: seen.append((len(u), float(step(0 * one, None, one))))
                        or real(u, t, s, step))
    robust.RobustRule("union").aggregate(ups, 30, 4, {}, table)
    robust.RobustRule("union").admit(ups, table)
    assert seen == [(5, pytest.approx(1 / 5)), (5, pytest.approx(1 / 5))]
    # where the server averages each row over its senders, 1/(the row's accepted senders):
    # row 4 is sent by clients 0, 1, 3 and 4 (2 is rejected), row 9 by 5 alone
    shares = []
    monkeypatch.setattr(robust, "uniformities", lambda u, t, s, step: shares.append(
        [float(step(0 * one, torch.tensor([i]), one)) for i in (4, 9)]) or real(u, t, s, step))
    robust.RobustRule("union").aggregate(ups, 30, 4, {}, table, per_row=True)
    assert shares == [[pytest.approx(1 / 4), pytest.approx(1.0)]]


class RunConfigLike:
    """The engine options `Security.defence` reads."""

    defence, trim, byzantine, norm_bound, clients_per_round, union_step = "union", 0.1, 0.0, None, 1.0, "share"


def test_attack_table_runs_reused_by_name_are_checked_against_their_settings(tmp_path):
    """An attack table's run is found by its file name, which does not hold every setting: a
    reused file's recorded config is compared with the run it stands for now (a changed default
    or rate is noted as stale, still used), and a file with no recorded config is counted."""
    from fedrec.reproduce.attacks import AttackTables, cached_figures, poison_config, poison_run

    args = ("fedmf", "none", None, "none", 0, 0.05, 2, None)
    path = tmp_path / "poison-fedmf-none-none-r2-s0.json"

    def made() -> dict:
        return poison_run(*args, dataset="synthetic:60x300")

    def planned() -> RunConfig:
        return poison_config(*args, dataset="synthetic:60x300")

    tables = AttackTables()
    first = cached_figures(path, made, True, planned, tables)
    assert first["config"]["federated"]["rounds"] == 2 and tables.stale == [] and tables.unchecked == 0
    assert cached_figures(path, made, True, planned, tables) == first and tables.stale == []
    blob = json.loads(path.read_text())
    blob["config"]["model"]["dim"] += 1  # as if made when the default was one more
    path.write_text(json.dumps(blob))
    again = cached_figures(path, made, True, planned, tables)
    dim = blob["config"]["model"]["dim"]
    assert again["er@10"] == first["er@10"] and tables.stale == [(path.name, {"model.dim": (dim, dim - 1)})]
    blob.pop("config")
    path.write_text(json.dumps(blob))
    cached_figures(path, made, True, planned, tables)
    assert tables.unchecked == 1


def test_attacked_cells_made_under_another_budget_rule_are_noted_as_stale(tmp_path):
    """An attacked cell records the rule its attacker's budget was sized by; one that records
    another (or none: made when the cover's own samples were its batch) is noted as stale,
    still used. A clean cell, and one under ``--aggregation samples`` (whose budget the rule
    does not move), are not."""
    from fedrec.reproduce.attacks import AttackTables, cached_figures, poison_config, poison_run
    from fedrec.security.attacks import BUDGET_RULE

    for attack, engine, noted in (("fedrecattack", {}, True), ("none", {}, False),
                                  ("fedrecattack", {"aggregation": "samples"}, False)):
        args = ("fedmf", attack, None, "none", 0, 0.1, 1, None)
        path = tmp_path / f"poison-fedmf-{attack}-{len(engine)}.json"
        made = lambda args=args, engine=engine: poison_run(*args, engine=engine, dataset="synthetic:60x300")  # noqa: E731
        planned = lambda args=args, engine=engine: poison_config(*args, engine=engine, dataset="synthetic:60x300")  # noqa: E731
        tables = AttackTables()
        first = cached_figures(path, made, True, planned, tables)
        assert first.get("budget_rule") == (BUDGET_RULE if attack != "none" else None) and tables.stale == []
        blob = json.loads(path.read_text())
        blob.pop("budget_rule", None)  # as a cell made before cells recorded it
        path.write_text(json.dumps(blob))
        cached_figures(path, made, True, planned, tables)
        assert tables.stale == ([(path.name, {"attack budget": ("cover batch", BUDGET_RULE)})] if noted else [])
        blob.pop("config")  # as most cells made before cells recorded their config
        path.write_text(json.dumps(blob))
        tables = AttackTables()
        cached_figures(path, made, True, planned, tables)
        assert tables.unchecked == 1
        assert tables.stale == ([(path.name, {"attack budget": ("cover batch", BUDGET_RULE)})] if noted else [])


def test_the_honest_batch_is_the_sample_weighted_median_of_the_clients_batches():
    """`honest_batch`: a client's batch is ``--batch-size`` or all its samples where fewer
    (positives and their negatives), the median taken over samples, not clients (the many
    small clients send few rows); a client without samples counts for nothing; ``whole``
    (clients stepping on all their samples, FedPerGNN's) drops the batch size."""
    from types import SimpleNamespace

    from fedrec.security.adversary import honest_batch

    positives = [1, 1, 1, 0, 20]  # samples with one negative each: 2, 2, 2, 0, 40
    train = sp.csr_matrix((np.ones(sum(positives)), (np.repeat(np.arange(5), positives), np.arange(sum(positives)))))
    assert honest_batch(SimpleNamespace(batch_size=64, negatives=1), train) == 40  # clients' median: 2
    assert honest_batch(SimpleNamespace(batch_size=16, negatives=1), train) == 16
    assert honest_batch(SimpleNamespace(batch_size=16, negatives=1), train, whole=True) == 40
    assert honest_batch(SimpleNamespace(batch_size=64, negatives=4), train) == 64  # 100 samples, held to 64
    assert honest_batch(SimpleNamespace(negatives=1), train) is None  # no batch size, no budget rule
    assert honest_batch(SimpleNamespace(batch_size=8, negatives=1), sp.csr_matrix((3, 5))) == 8


def test_fedpergnns_attacker_sizes_its_cover_step_to_a_whole_clients_samples():
    """FedPerGNN's clients step once on the mean over all their samples, so its attacker's
    cover batch is the clients' whole sample count, not ``--batch-size``."""
    from fedrec.experiment import build_trainable, prepare_split
    from fedrec.security.adversary import honest_batch

    cfg = RunConfig(algorithm="fedpergnn", dataset="synthetic:60x300", protocol="loo-full",
                    federated=federated_config("fedpergnn", rounds=1, attack="fedrecattack", malicious=0.1))
    cfg.federated.batch_size = 4  # not read by its training (refused on the command line): the cover ignores it too
    split = prepare_split(cfg)
    alg = build_trainable(cfg, split)[1]
    whole = honest_batch(cfg.federated, split.train, whole=True)
    assert alg.security.attack.know.batch == whole > honest_batch(cfg.federated, split.train) == 4


def test_cells_of_an_earlier_budget_rule_are_run_again_in_place_from_what_they_record(tmp_path):
    """``attacks_rows.py --rerun-stale``: each attacked cell of an earlier budget rule is run
    again from its file (the factor from its name, the rest from its record; with or without a
    recorded config) and ends with a fresh run's figures; a clean cell and a current one are
    left as they are."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from attacks_rows import rerun_stale

    from fedrec.reproduce.attacks import poison_run
    from fedrec.security.attacks import BUDGET_RULE

    data = "synthetic:60x300"
    cells = {  # file name: poison_run's arguments
        "poison-synthetic:60x300-fedmf-fedrecattack-b10-none-r2-s0.json": ("fedmf", "fedrecattack", 10.0, "none"),
        "poison-synthetic:60x300-fedmf-boost-b10-median-r2-s0.json": ("fedmf", "boost", 10.0, "median"),
        "poison-synthetic:60x300-fedmf-clusterattack-none-r2-s0.json": ("fedmf", "clusterattack", None, "none"),
        "poison-synthetic:60x300-fedmf-none-none-r2-s0.json": ("fedmf", "none", None, "none"),
    }
    fresh = {}
    for i, (name, (method, attack, boost, defence)) in enumerate(cells.items()):
        fresh[name] = poison_run(method, attack, boost, defence, 0, 0.1, 2, None, dataset=data)
        old = dict(fresh[name], **{"hr@10": -1.0})  # a figure a rerun must replace
        old.pop("budget_rule", None)
        if i == 1:
            old.pop("config")  # as most cells made before cells recorded their config
        (tmp_path / name).write_text(json.dumps(old))
    current = tmp_path / "poison-synthetic:60x300-fedmf-pieck-ipe-b10-none-r2-s0.json"
    current.write_text(json.dumps({"method": "fedmf", "attack": "pieck-ipe x10", "defence": "none", "seed": 0,
                                   "malicious": 0.1, "dataset": data, "budget_rule": BUDGET_RULE, "er@10": -1.0}))
    odd = tmp_path / "poison-synthetic:60x300-fedmf-renamed.json"  # a name that does not hold its run
    odd.write_text(json.dumps({"method": "fedmf", "attack": "fedrecattack x10", "defence": "none", "seed": 0,
                               "malicious": 0.1, "dataset": data, "hr@10": -1.0}))
    rerun_stale(tmp_path, data, None)
    assert json.loads(odd.read_text())["hr@10"] == -1.0  # left as it is, with a line
    for name, made in fresh.items():
        blob = json.loads((tmp_path / name).read_text())
        if made["attack"] == "none":
            assert blob["hr@10"] == -1.0 and "budget_rule" not in blob
        else:
            assert blob["budget_rule"] == BUDGET_RULE and blob["attack"] == made["attack"]
            assert (blob.get("er@10"), blob["hr@10"]) == (made.get("er@10"), made["hr@10"])
    assert json.loads(current.read_text())["er@10"] == -1.0


def test_attack_table_runs_read_from_other_events_are_set_aside_and_run_again(tmp_path, monkeypatch):
    """Nor does a file name say where the data's copy lives: a run records the digest of the
    events it read, and one read from other events than the copy at hand is set aside (kept
    under its digest, noted) and run again; one without a digest is reused as it is."""
    from tiny_ml100k import write_u_data

    from fedrec.data.registry import content_at_hand
    from fedrec.reproduce.attacks import AttackTables, cached_figures, poison_run

    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))  # nothing to fall back on
    data = tmp_path / "data"
    write_u_data(data)
    path = tmp_path / "poison-fedmf-none-none-r1-s0.json"
    runs: list[int] = []

    def made() -> dict:
        runs.append(1)
        return poison_run("fedmf", "none", None, "none", 0, 0.05, 1, str(data))

    first_events = content_at_hand("ml-100k", str(data))
    tables = AttackTables()
    first = cached_figures(path, made, True, None, tables, first_events)
    assert first["data"]["source"]["content"] == first_events and len(runs) == 1
    assert cached_figures(path, made, True, None, tables, first_events) == first and len(runs) == 1
    write_u_data(data, edited=True)
    edited_events = content_at_hand("ml-100k", str(data))
    assert cached_figures(path, made, False, None, tables, edited_events) is None  # --reuse-only: left out
    assert tables.set_aside == [(path.name, first_events, edited_events, "left out")]
    aside = path.with_name(f"{path.stem}.other-data-{first_events[:12]}.json")
    assert json.loads(path.read_text()) == first and not aside.exists()  # renamed nothing
    again = cached_figures(path, made, True, None, tables, edited_events)
    assert len(runs) == 2 and again["data"]["source"]["content"] == edited_events
    assert tables.set_aside[-1] == (path.name, first_events, edited_events, "run again")
    assert json.loads(aside.read_text()) == first
    # the first events back: their run is back, without running
    assert cached_figures(path, made, True, None, tables, first_events) == first and len(runs) == 2
    assert tables.set_aside[-1] == (path.name, edited_events, first_events, "given back")
    blob = json.loads(path.read_text())
    blob.pop("data")  # written before runs recorded their events: reused as it is
    path.write_text(json.dumps(blob))
    assert cached_figures(path, made, True, None, tables, edited_events) == blob and len(runs) == 2


def test_the_anchor_table_files_record_their_events_and_are_set_aside_as_the_others(tmp_path):
    """The anchor run's figures are kept beside the digest of the events it read: a file of
    other events is set aside and run again, the first events' file given back; a file of the
    figures alone (written before the anchor recorded its events) is reused as it is."""
    from fedrec.reproduce.attacks import AttackTables, anchor_figures

    path = tmp_path / "anchor-s0.json"
    runs: list[int] = []

    def made() -> list[dict[str, float]]:
        runs.append(1)
        return [{"er@10": 0.01 * len(runs), "hr@10": 0.5}]

    tables = AttackTables()
    first = anchor_figures(path, made, True, tables, "a" * 64)
    assert first == [{"er@10": 0.01, "hr@10": 0.5}]
    assert json.loads(path.read_text())["data"]["source"]["content"] == "a" * 64
    assert anchor_figures(path, made, True, tables, "a" * 64) == first and len(runs) == 1
    assert anchor_figures(path, made, False, tables, "b" * 64) is None  # --reuse-only: left out
    assert tables.set_aside == [(path.name, "a" * 64, "b" * 64, "left out")] and len(runs) == 1
    again = anchor_figures(path, made, True, tables, "b" * 64)
    assert again == [{"er@10": 0.02, "hr@10": 0.5}] and tables.set_aside[-1][3] == "run again"
    assert anchor_figures(path, made, True, tables, "a" * 64) == first and len(runs) == 2
    assert tables.set_aside[-1] == (path.name, "b" * 64, "a" * 64, "given back")
    path.write_text(json.dumps(first))  # the list alone: reused as it is
    assert anchor_figures(path, made, True, tables, "b" * 64) == first and len(runs) == 2
