"""Attacks and defences on GPFedRec and GFed-PP (`fedrec.federated.graph.state.GraphState`): the
server keeps each client's table, so a malicious client is one more client of the graph and a
defence admits each client's rows before the graph step (`RobustRule.admit`).

A rule's admitted rows add up to what `RobustRule.aggregate` sums where the two agree (the mean,
norm bounding, the median, UNION), Krum keeps exactly the rows it keeps there and the trimmed
mean winsorises; the attackers' tables are q_g plus their crafted steps and enter q_g as one
client each; a defended round admits each row's steps by the rule; an unbounded norm bound ends
as the plain run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from robust_reference import median

from fedrec.algorithms import get_algorithm
from fedrec.core.contract import ClientUpload, RoundPlan
from fedrec.data.synthetic import synthetic
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.model import ITEMS
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import Security, attach
from fedrec.security.robust import RobustRule


def _uploads(seed: int = 0, n: int = 9, items: int = 6, width: int = 3) -> list[ClientUpload]:
    """Clients sending overlapping rows; client 0 sends large rows, client 3 is rejected."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        mine = np.sort(rng.choice(items, int(rng.integers(2, items + 1)), replace=False))
        rows = torch.as_tensor(rng.normal(size=(len(mine), width)), dtype=torch.float32) * (20.0 if c == 0 else 1.0)
        out.append(ClientUpload(c, mine, {ITEMS: rows}, accepted=c != 3))
    return out


def _row_sums(uploads: list[ClientUpload], rows: list[torch.Tensor], items: int) -> torch.Tensor:
    out = torch.zeros(items, rows[0].shape[1])
    for u, r in zip(uploads, rows, strict=True):
        out.index_add_(0, torch.as_tensor(u.items), r)
    return out


@pytest.mark.parametrize("name", ["mean", "norm-bound", "median", "union"])
def test_admitted_rows_add_up_to_the_rules_sums(name: str) -> None:
    """Where a client-by-client admission can give the rule's own sums, it does: each row's
    admitted steps add up to `aggregate`'s sum-equivalent (the median's count x median
    included); a rejected upload is admitted as zeros; UNION flags the same clients."""
    ups = _uploads()
    table = torch.as_tensor(np.random.default_rng(1).normal(size=(6, 3)), dtype=torch.float32)
    rule = RobustRule(name, byzantine=0.2)
    kept, flagged = rule.admit(ups, table, (0, 1))
    item_sum, _, flagged_sum = rule.aggregate(ups, 6, 3, {}, table, (0, 1))
    torch.testing.assert_close(_row_sums(ups, kept, 6), item_sum, rtol=1e-5, atol=1e-5)
    assert float(kept[3].abs().sum()) == 0.0
    np.testing.assert_array_equal(flagged, flagged_sum)
    if name == "mean":
        assert all(torch.equal(k, u.tensors[ITEMS]) for k, u in zip(kept, ups, strict=True) if u.accepted)
    if name == "median":  # the large client is clamped, not passed
        assert float(kept[0].abs().max()) < float(ups[0].tensors[ITEMS].abs().max())


@pytest.mark.parametrize("name", ["krum", "multi-krum"])
def test_krum_admits_the_rows_it_keeps_and_zeroes_the_rest(name: str) -> None:
    ups = _uploads(seed=2)
    rule = RobustRule(name, byzantine=0.2)
    kept, flagged = rule.admit(ups, None, ())
    _, _, flagged_sum = rule.aggregate(ups, 6, 3, {})
    np.testing.assert_array_equal(flagged, flagged_sum)
    senders = np.zeros(6, int)
    kept_rows = np.zeros(6, int)
    for u, k in zip(ups, kept, strict=True):
        if not u.accepted:
            continue
        same = (k == u.tensors[ITEMS]).all(1)
        zero = (k == 0).all(1)
        assert bool((same | zero).all())  # a row is admitted whole or not at all
        np.add.at(senders, u.items, 1)
        np.add.at(kept_rows, u.items, same.numpy().astype(int))
    f = np.floor(0.2 * senders).astype(int)
    want = np.ones(6, int) if name == "krum" else np.maximum(senders - f, 1)
    np.testing.assert_array_equal(kept_rows[senders > 0], want[senders > 0])


def test_the_trimmed_mean_winsorises_each_coordinate() -> None:
    """Each coordinate of a row's steps is clamped into the range of the values the trimmed
    mean keeps: with 5 senders and --trim 0.2, between the 2nd smallest and the 2nd largest."""
    rows = torch.tensor([[1.0, -5.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [50.0, 3.0]])
    ups = [ClientUpload(c, np.array([0]), {ITEMS: rows[c : c + 1]}) for c in range(5)]
    kept, _ = RobustRule("trimmed-mean", trim=0.2).admit(ups)
    got = torch.cat(kept)
    want = torch.tensor([[2.0, 0.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [4.0, 2.0]])
    torch.testing.assert_close(got, want)


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(synthetic(40, 60, mean_interactions=8, min_interactions=4, seed=6), "loo-full", seed=0)


def _algorithm(split: Split, name: str, model: dict[str, Any] | None = None, **engine: Any) -> Any:
    cfg = federated_config(name, **{"local_epochs": 1, **engine})
    spec = get_algorithm(name).build(split, {"dim": 32, **(model or {})})
    alg = spec.algorithm(split, cfg, seed=3)
    attach(alg, split, cfg, seed=3)
    return alg


def _round(alg: Any, r: int) -> tuple[Any, RoundPlan]:
    alg.begin_round(RoundPlan(r, np.arange(alg.split.n_users), torch.Generator().manual_seed(r),
                              np.random.default_rng(r)))
    plan = RoundPlan(r, np.arange(alg.split.n_users), torch.Generator().manual_seed(r), np.random.default_rng(r))
    return alg.local_update(plan), plan


@pytest.mark.parametrize(("name", "model"), [("gpfedrec", {}), ("gfedpp-no-ugc", {"public_ratio": 0.5})])
def test_attackers_join_the_graph_with_q_g_plus_their_crafted_steps(split: Split, name: str,
                                                                   model: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """10% of 40 users is 4 attackers (ids 40-43): each gets a place in the graph (GPFedRec: a
    table of its own; GFed-PP: a private user), sends q_g with its crafted rows, and q_g after
    the graph step counts it as one client (GFed-PP without the graph: the mean of all 44
    tables)."""
    alg = _algorithm(split, name, model, attack="fedrecattack", boost=10.0, malicious=0.1)
    st = alg.state
    assert isinstance(alg.security, Security) and alg.security.n_malicious == 4
    assert len(st.dense_of) == 44 and len(st.public) == 44 and not st.public[40:].any()
    if name == "gpfedrec":
        assert st.table is not None and st.table.shape[0] == 44
    seen: dict[str, Any] = {}
    real = Security.malicious_uploads

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(self, *args, **kwargs)
        seen["bad"] = out[0]
        return out

    monkeypatch.setattr(Security, "malicious_uploads", spy)
    ups, plan = _round(alg, 1)
    q_g = st.items.clone()
    tables = st.whole_tables()
    assert [u.client for u in seen["bad"]] == [40, 41, 42, 43]
    for u in seen["bad"]:
        want = q_g.clone()
        want[torch.as_tensor(u.items)] += u.tensors[ITEMS]
        torch.testing.assert_close(tables[u.client], want)
    alg.aggregate(ups, plan)
    _round(alg, 2)  # the graph step runs as round 2 begins
    if name == "gfedpp-no-ugc":
        torch.testing.assert_close(st.items, tables.mean(0), rtol=1e-5, atol=1e-6)
    else:
        assert st.table is not None
        torch.testing.assert_close(st.items, st.table.mean(0), rtol=1e-5, atol=1e-6)
        # the attackers' reach into the users' personalised tables is recorded
        assert 0.0 <= st.extra["attacker_weight"] <= st.extra["attacked_users"] <= 1.0
    assert st.user_groups() == {} or len(st.user_groups()["public"]) == 40


def test_a_defended_round_admits_each_rows_steps_by_the_median(split: Split) -> None:
    """Under the median, every sender of a row moves it by the row's median step: the admitted
    tables less their starts add up, row by row, to the senders' count x the median of their
    steps (the rule's own sums), the attackers' steps included."""
    alg = _algorithm(split, "gfedpp", {"public_ratio": 0.5}, attack="pipattack", boost=10.0, malicious=0.1,
                     defence="median")
    st = alg.state
    ups, plan = _round(alg, 1)
    owner, items, rows = st._flat_uploads()
    steps = rows - st._train_start(owner, items)
    want = torch.zeros_like(st.items)
    for j in np.unique(items):
        sent = steps[torch.as_tensor(items == j)]
        want[j] = len(sent) * median(sent)
    alg.aggregate(ups, plan)
    owner2, items2, rows2 = st._flat_uploads()
    got = torch.zeros_like(st.items).index_add_(0, torch.as_tensor(items2), rows2 - st._train_start(owner2, items2))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert sorted(set(owner2.tolist())) == list(range(44))


@pytest.mark.parametrize("name", ["gpfedrec", "gfedpp"])
def test_an_unbounded_norm_bound_run_ends_as_the_plain_run(name: str) -> None:
    def run(**opts: Any) -> Any:
        cfg = RunConfig(algorithm=name, dataset="synthetic:60x80", protocol="loo-full", model={"dim": 32},
                        federated=federated_config(name, rounds=3, **opts))
        return train(cfg).result

    plain, bounded = run(targets=1), run(defence="norm-bound", norm_bound=1e9)
    assert bounded.test == pytest.approx(plain.test, rel=1e-4, abs=1e-5)


def test_public_attackers_share_a_bandwagon_profile_and_join_the_user_graph(split: Split) -> None:
    """With ``public_attackers`` GFed-PP's attackers declare the targets and popular items as
    their interactions: they count as public users, the graph of public users is rebuilt with
    them as neighbours of the users who share those items, and their declared interactions are
    counted as shared."""
    private = _algorithm(split, "gfedpp", {"public_ratio": 0.5}, attack="fedrecattack", boost=10.0, malicious=0.1)
    alg = _algorithm(split, "gfedpp", {"public_ratio": 0.5, "public_attackers": True},
                     attack="fedrecattack", boost=10.0, malicious=0.1)
    st, sec = alg.state, alg.security
    assert st.public[40:].all() and st.public[:40].sum() == 20
    assert (st.dense_of[40:] >= 0).all() and st.table is not None and st.table.shape[0] == 24
    declared = sec.attack.declared()
    assert declared.shape == (4, split.n_items) and all(set(sec.targets) <= set(row.indices) for row in declared)
    assert st.shared_interactions == private.state.shared_interactions + declared.nnz
    a = st.adjacency.to_dense()  # dense, sparse or factored, by its density
    assert a.shape == (24, 24)
    assert float(a[20:, :20].abs().sum()) > 0  # the attackers (last four public users) neighbour benign ones
    assert private.state.adjacency is not None and tuple(private.state.adjacency.shape) == (20, 20)
