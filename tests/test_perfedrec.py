"""PerFedRec (`fedrec.federated.perfedrec`): each client trains from its cluster's rows; the
global table averages the rows as they came back, each cluster's table its own clients'
changes (a row none sent keeps its value; a cluster none came back from takes the global
table); the users are clustered by the vectors they
uploaded, a cluster keeping its number; a score is the mean of the global, cluster and own
models' scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.federated.family.model import score
from fedrec.federated.perfedrec import PerFedRecState
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity
from fedrec.rounds.upload import UploadPath

TOL = {"rtol": 1e-5, "atol": 1e-6}
CLUSTERS = 3


@pytest.fixture(scope="module")
def split() -> Split:
    x = to_implicit(synthetic(60, 150, mean_interactions=8, min_interactions=3, seed=4))
    return make_split(x, "loo-sampled", seed=0)


def _cohort(split: Split, r: int) -> CohortBatches:
    rng = np.random.default_rng(r)
    clients = order_by_activity(split.train, rng.permutation(split.n_users)[: split.n_users * 2 // 3])
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    return build_cohort(split.train, clients, negs, 8, rng.random((1, int(counts.sum()) * 5)))


def _state(split: Split) -> PerFedRecState:
    alg = get_algorithm("perfedrec")
    spec = alg.build(split, {**alg.defaults, "dim": 6, "clusters": CLUSTERS})
    state = spec.create_state(split.n_users, split.n_items, lr=0.2, lr_item=2.0, item_std=0.5, seed=1)
    assert isinstance(state, PerFedRecState)
    state.per_row = True  # fedrec's item-row rule, FedMF's default
    return state


def _round(state: PerFedRecState, cohort: CohortBatches, r: int) -> list:  # type: ignore[type-arg]
    acc = state.begin_round(r)
    up = state.local_update(cohort, UploadPath())
    state.accumulate(acc, up)
    state.aggregate(acc, UploadPath(), torch.Generator())
    return up.per_client()


@pytest.mark.parametrize("per_row", [True, False])
def test_two_rounds_are_the_global_and_cluster_means_of_what_clients_sent(split: Split, per_row: bool) -> None:
    """Under fedrec's item-row rule (``per_row``) a row moves by the mean over its senders, in
    the global table and in each cluster's; under the papers' rule by the sum over the round's
    clients (a cluster's: over its clients that came back) divided by their number. A client's
    own upload is read against the global table."""
    state = _state(split)
    state.per_row = per_row
    first = _cohort(split, 1)
    _round(state, first, 1)
    # after the first round: every cluster's table is the global one; the clients heard are clustered
    assert state.cluster_items is not None and state.labels is not None
    for k in range(CLUSTERS):
        torch.testing.assert_close(state.cluster_items[k], state.items)
    assert (state.labels[first.clients] >= 0).all() and (np.delete(state.labels, first.clients) == -1).all()
    torch.testing.assert_close(state.server_users[torch.as_tensor(first.clients)],
                               state.private["user"][torch.as_tensor(first.clients)])

    glob, tables, labels = state.items.clone(), state.cluster_items.clone(), state.labels.copy()
    second = _cohort(split, 2)
    uploads = _round(state, second, 2)
    sums = torch.zeros_like(glob)
    counts = torch.zeros(len(glob))
    cluster_sums = torch.zeros_like(tables)
    cluster_counts = torch.zeros(tables.shape[:2])
    members = np.zeros(CLUSTERS)
    for u in uploads:
        k = int(labels[u.client])
        at = torch.as_tensor(u.items)
        start = glob[at] if k < 0 else tables[k][at]
        sums[u.items] += u.tensors["items"]  # the row as it came back less the global row
        counts[u.items] += 1
        if k >= 0:
            cluster_sums[k, u.items] += u.tensors["items"] - (start - glob[at])  # its own change
            cluster_counts[k, u.items] += 1
            members[k] += 1
    assert ((labels[second.clients] < 0).any() and (labels[second.clients] >= 0).any()), \
        "the second round must hold clients clustered and not"
    want = glob + sums / (counts.clamp(min=1)[:, None] if per_row else len(uploads))
    torch.testing.assert_close(state.items, want, **TOL)
    sent = cluster_counts > 0
    want_tables = want.expand_as(tables).clone()
    for k in np.flatnonzero(members):  # a cluster whose clients came back keeps the rows they did not send
        want_tables[k] = tables[k]
    divisor = cluster_counts if per_row else torch.as_tensor(members, dtype=torch.float32)[:, None].expand_as(sent)
    want_tables[sent] = tables[sent] + cluster_sums[sent] / divisor[sent][:, None]
    torch.testing.assert_close(state.cluster_items, want_tables, **TOL)
    assert bool(sent.any()) and bool((~sent).any())
    # the kept rows differ from the global ones: a cluster's own rows survive a round they sat out
    unsent = ~sent[int(np.flatnonzero(members)[0])]
    assert not torch.allclose(state.cluster_items[int(np.flatnonzero(members)[0])][unsent], state.items[unsent])


def test_a_cluster_keeps_rows_its_clients_did_not_send_and_an_absent_cluster_takes_the_global_table(
        split: Split) -> None:
    """Round 3 trains every clustered client but cluster 0's: cluster 0 then takes the global
    table; another cluster keeps, in the rows none of its clients sent, its own rows from
    before the round (which differ from the old and the new global rows)."""
    state = _state(split)
    for r in (1, 2):
        _round(state, _cohort(split, r), r)
    assert state.cluster_items is not None and state.labels is not None
    before, glob_before, labels = state.cluster_items.clone(), state.items.clone(), state.labels.copy()
    rng = np.random.default_rng(3)
    clients = order_by_activity(split.train, np.flatnonzero(labels > 0))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    third = build_cohort(split.train, clients, negs, 8, rng.random((1, int(counts.sum()) * 5)))
    uploads = _round(state, third, 3)
    torch.testing.assert_close(state.cluster_items[0], state.items)
    k = int(labels[clients[0]])
    sent = np.zeros(split.n_items, bool)
    for u in uploads:
        if labels[u.client] == k:
            sent[u.items] = True
    unsent = torch.as_tensor(~sent)
    assert bool(unsent.any())
    torch.testing.assert_close(state.cluster_items[k][unsent], before[k][unsent])
    assert not torch.allclose(before[k][unsent], glob_before[unsent])  # its own rows, not the old global ones
    assert not torch.allclose(state.cluster_items[k][unsent], state.items[unsent])


def test_under_the_papers_rule_a_cluster_divides_by_the_members_union_kept(split: Split) -> None:
    """UNION drops a member's upload from its cluster's sums: under the papers' rule the
    cluster's sent rows then move by the kept members' summed change over the kept members (as
    the global table divides by the clients it kept), not over every member back."""
    from fedrec.federated.family.model import ITEMS

    state = _state(split)
    state.per_row = False
    _round(state, _cohort(split, 1), 1)
    assert state.cluster_items is not None and state.labels is not None
    tables, labels = state.cluster_items.clone(), state.labels.copy()

    class DropFirst:  # UNION's shape: flags the first upload it is given, sums the others
        name = "union"

        def aggregate(self, ups, n_items, width, shared, table, key, per_row=None):  # type: ignore[no-untyped-def]
            assert per_row is False  # UNION judges a member at its share of the cluster's plain average
            total = torch.zeros(n_items, width)
            for u in ups[1:]:
                total[torch.as_tensor(u.items)] += u.tensors[ITEMS]
            return total, {}, np.array([True] + [False] * (len(ups) - 1))

    acc = state.begin_round(2)
    up = state.local_update(_cohort(split, 2), UploadPath())
    state.accumulate(acc, up)
    uploads = [u for u in up.per_client() if u.accepted]
    state.guard_clusters(uploads, DropFirst(), (0, 2))
    assert state._cluster_sum is not None and state._cluster_count is not None
    n_items = split.n_items
    k = next(c for c in range(CLUSTERS) if sum(labels[u.client] == c for u in uploads) >= 3)
    kept = sum(labels[u.client] == k for u in uploads) - 1
    total = state._cluster_sum[k * n_items:(k + 1) * n_items].clone()
    sent = state._cluster_count[k * n_items:(k + 1) * n_items] > 0
    state.aggregate(acc, UploadPath(), torch.Generator())
    assert bool(sent.any())
    torch.testing.assert_close(state.cluster_items[k][sent], tables[k][sent] + total[sent] / kept, **TOL)


def test_a_cluster_keeps_its_number_when_the_users_do_not_move(split: Split) -> None:
    """Users in three tight groups: k-means from other starts finds the same groups in another
    order, and the matching on centroids gives each its old number."""
    state = _state(split)
    _round(state, _cohort(split, 1), 1)
    heard = np.flatnonzero(state.heard)
    group = np.arange(len(heard)) % CLUSTERS
    centres = torch.eye(6)[:CLUSTERS] * 10
    state.server_users[torch.as_tensor(heard)] = centres[torch.as_tensor(group)] + 0.01 * torch.randn(len(heard), 6)
    state.centroids = None
    state._recluster()
    before = state.labels.copy()
    assert len(np.unique(before[heard])) == CLUSTERS
    assert all(len(np.unique(before[heard][group == g])) == 1 for g in range(CLUSTERS))
    for r in range(2, 12):  # other k-means starts: other orders of the same groups
        state._round = r
        state._recluster()
        np.testing.assert_array_equal(state.labels, before)


def test_a_score_is_the_mean_of_the_global_cluster_and_own_models(split: Split) -> None:
    state = _state(split)
    _round(state, _cohort(split, 1), 1)
    glob0, tables0, labels0 = state.items.clone(), state.cluster_items.clone(), state.labels.copy()
    uploads = _round(state, _cohort(split, 2), 2)
    mine = next(u for u in uploads if labels0[u.client] >= 0)  # trained from its cluster's rows
    me = mine.client
    fresh = next(c for c in range(split.n_users) if not state.trained[c])
    clients, items = np.array([me, fresh]), np.tile(np.arange(40), (2, 1))
    got = torch.as_tensor(state.scores(clients, items))

    idx = torch.as_tensor(items[0])
    user = state.private["user"][torch.as_tensor(clients)]

    def under(c: int, rows: torch.Tensor) -> torch.Tensor:
        return score(state.spec, {"user": user[c][None]}, rows[None])[0]

    def table(c: int) -> torch.Tensor:
        k = int(state.labels[c])
        return state.items if k < 0 else state.cluster_items[k]

    # the client's own model: its cluster's table, with the rows it trained last round (what it
    # downloaded then plus its change)
    own = table(me)[idx].clone()
    start = tables0[int(labels0[me])]
    for j, item in enumerate(items[0]):
        hit = np.flatnonzero(mine.items == item)
        if len(hit):
            own[j] = start[item] + mine.tensors["items"][hit[0]]
    assert not torch.equal(own, table(me)[idx]), "some of the scored items must be the client's own rows"
    want = (under(0, state.items[idx]) + under(0, table(me)[idx]) + under(0, own)) / 3
    torch.testing.assert_close(got[0], want, **TOL)
    torch.testing.assert_close(got[1], (under(1, state.items[idx]) + under(1, table(fresh)[idx])) / 2, **TOL)
    del glob0
    # full ranking scores every item the same way
    full = torch.as_tensor(state.scores(clients, None))
    torch.testing.assert_close(full[:, :40], got, **TOL)


@pytest.mark.parametrize(("model", "says"), [({"clusters": 0}, "clusters must be >= 1"), ({"dual": True}, "dual")])
def test_bad_options_are_one_line(split: Split, model: dict[str, int], says: str) -> None:
    alg = get_algorithm("perfedrec")
    with pytest.raises(FedrecError, match=says):
        alg.build(split, {**alg.defaults, **model})


def test_under_fedrecs_rule_a_rule_judges_cluster_members_at_each_rows_share(split: Split) -> None:
    """Under fedrec's item-row rules a cluster's row is averaged over its senders, so the rule
    guarding a cluster's table is told so (UNION then judges a member at `row_share`)."""
    state = _state(split)
    assert state.per_row
    _round(state, _cohort(split, 1), 1)
    seen = []

    class Spy:
        name = "mean"

        def aggregate(self, ups, n_items, width, shared, table, key, per_row=None):  # type: ignore[no-untyped-def]
            seen.append(per_row)
            return torch.zeros(n_items, width), {}, np.zeros(len(ups), bool)

    acc = state.begin_round(2)
    up = state.local_update(_cohort(split, 2), UploadPath())
    state.accumulate(acc, up)
    state.guard_clusters([u for u in up.per_client() if u.accepted], Spy(), (0, 2))
    assert seen and all(p is True for p in seen)


def test_attacks_join_clusters_and_the_defences_guard_every_table() -> None:
    """An attack and a defence take the papers' item-row rule, as on FedMF. The malicious clients
    send forged user vectors, so the server clusters them and their crafted rows reach their
    clusters' tables as well as the global one: FedRecAttack then exposes its target more than
    on FedMF. The per-row median on every table holds it below the undefended run, and UNION,
    in the rounds it flags, flags every ClusterAttack client."""
    from fedrec.experiment import RunConfig, federated_config, train

    def rounds(alg: str = "perfedrec", **opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm=alg, dataset="synthetic:300x400", protocol="loo-sampled",
                        federated=federated_config(alg, rounds=12, backoffs=0, **opts))
        assert cfg.federated.aggregation == "clients"
        return [h.extra for h in train(cfg).result.history]

    def run(alg: str = "perfedrec", **opts):  # type: ignore[no-untyped-def]
        return rounds(alg, **opts)[-1]

    clean = run(targets=1, aggregation="clients")
    attacked = run(attack="fedrecattack", boost=10.0)
    on_fedmf = run("fedmf", attack="fedrecattack", boost=10.0)
    assert clean["er@10"] < on_fedmf["er@10"] < attacked["er@10"]  # 0.003 < 0.60 < 0.93
    assert run(attack="fedrecattack", boost=10.0, defence="median")["er@10"] < attacked["er@10"] - 0.2
    # UNION's gap statistic flags in some rounds only; where it flags, it flags every attacker,
    # and in the first rounds the attackers alone
    union = rounds(attack="clusterattack", boost=10.0, defence="union")
    assert all(r["flag_recall"] == 1.0 for r in union if r["flagged"] > 0)
    assert all(r["flag_precision"] == 1.0 and r["flagged"] == r["malicious_clients"] for r in union[:4])


def test_attackers_are_clustered_and_their_rows_join_their_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The malicious clients' forged vectors are an approximated user's each; the server keeps
    and clusters them, and a clustered attacker's crafted rows join its cluster's sums, exactly."""
    from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split

    cfg = RunConfig(algorithm="perfedrec", dataset="synthetic:200x150", protocol="loo-full",
                    federated=federated_config("perfedrec", rounds=3, attack="fedrecattack", boost=10.0,
                                               malicious=0.1, clients_per_round=0.5))
    split = prepare_split(cfg)
    _, alg = build_trainable(cfg, split)
    st, sec = alg.state, alg.security
    n = split.n_users
    assert len(st.labels) == len(st.server_users) == len(st.heard) == n + sec.n_malicious
    seen: dict[str, object] = {}
    real = PerFedRecState.join_attackers

    def spy(self, ids, users, uploads):  # type: ignore[no-untyped-def]
        before, labels = self._cluster_sum.clone(), self.labels.copy()
        out = real(self, ids, users, uploads)
        want = before.clone()
        for u in uploads:
            if labels[u.client] >= 0:
                want.index_add_(0, torch.as_tensor(labels[u.client] * split.n_items + u.items), u.tensors["items"])
        seen.update(ids=ids, labels=labels, before=before, want=want, after=self._cluster_sum.clone())
        return out

    monkeypatch.setattr(PerFedRecState, "join_attackers", spy)
    for r in (1, 2):
        alg.train_round(r)
        ids = seen["ids"]
        assert list(ids) == list(sec.malicious_clients(r) + n)
        forged = sec.attack._users["user"]
        for c in ids:  # each sent one approximated user's vector
            assert any(torch.equal(st.server_users[c], v) for v in forged)
        torch.testing.assert_close(seen["after"], seen["want"])
        if r == 2:  # those sampled in round 1 were clustered then, so their rows changed the sums
            assert (seen["labels"][ids] >= 0).any() and not torch.equal(seen["want"], seen["before"])


def test_a_flower_server_samples_and_checks_clients_a_node_declares_beyond_the_users() -> None:
    """A node may declare clients beyond the data's users (an attacker's); the server keeps a
    cluster label and a vector slot for each, sends them their message, and rejects a reply
    that lacks the user vectors and cluster sums, rather than failing."""
    from fedrec.experiment import RunConfig, federated_config, prepare_split
    from fedrec.flower.roles import Node, Server

    run = RunConfig(algorithm="perfedrec", dataset="synthetic:60x200", protocol="loo-full",
                    federated=federated_config("perfedrec", rounds=2, clients_per_round=0.5))
    split = prepare_split(run)
    node = Node(run, 0, 1, split)
    stranger = {"clients": np.arange(60, 66), "n_clients": 60, "n_items": split.n_items, "extra_clients": 6,
                "want_round": 0, "want_items": np.zeros(0, np.int32)}
    server = Server(run, {0: node.hello(), 1: stranger})
    assert len(server.side.state.labels) == 66
    messages = server.train_messages(1)
    assert 1 in messages  # the stranger's clients are sampled like the users
    record = server.finish_round(1, {0: node.train(messages[0]), 1: {"item_sum": np.zeros(3)}})
    assert record.extra["rejected_nodes"] == 1.0
