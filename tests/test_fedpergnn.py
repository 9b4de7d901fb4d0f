"""FedPerGNN (`fedrec.federated.pergnn.state`): a round equals each client computing its own gradient
alone, the plain way (a loop over its graph's nodes, a softmax, a mean BCE), and the server
averaging; a client's neighbours are users who share one of its items and have published; the
draws do not depend on how the round is chunked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrec.algorithms import get_algorithm
from fedrec.core.contract import RoundPlan
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.engine import client_negatives
from fedrec.federated.family.model import ITEMS
from fedrec.federated.pergnn import state as pergnn
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import attach
from tests.client_alone import small_split

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def split() -> Split:
    return small_split()


def _algorithm(split: Split, model: dict | None = None, **engine) -> pergnn.GNNAlgorithm:  # type: ignore[no-untyped-def]
    # a bound no step reaches (the default bounds rows at 0.5; the reference steps are unbounded)
    cfg = federated_config("fedpergnn", **{"lr": 0.5, "lr_item": 3.0, "item_std": 0.3, "clip": 1e6, **engine})
    spec = get_algorithm("fedpergnn").build(split, {"dim": 5, "neighbours": 4, "user_std": 0.3, **(model or {})})
    alg = spec.algorithm(split, cfg, seed=2)
    alg.state.a = torch.randn(10, generator=torch.Generator().manual_seed(3))  # attention that is not uniform
    alg.state.w = torch.eye(5) + 0.1 * torch.randn(5, 5, generator=torch.Generator().manual_seed(4))
    return alg


def _plan(split: Split, r: int, clients: np.ndarray) -> RoundPlan:
    return RoundPlan(r, clients, torch.Generator(), np.random.default_rng(r))


def _alone(st: pergnn.GNNState, u: int, negs: np.ndarray | None) -> dict[str, torch.Tensor]:
    """Client ``u``'s gradient, written out: its nodes one by one, a softmax, its mean BCE; on
    ratings (``negs`` None) its mean squared error, with its own training mean and the items'
    biases (the table's last column) under the rating baseline."""
    train = st.split.train
    pos = train.indices[train.indptr[u]:train.indptr[u + 1]]
    ratings = torch.as_tensor(train.data[train.indptr[u]:train.indptr[u + 1]], dtype=torch.float32)
    items = pos if negs is None else np.concatenate([pos, negs.reshape(-1)])
    table = st.items.clone().requires_grad_(True)
    e_u = st.users[u].clone().requires_grad_(True)
    w, a = st.w.clone().requires_grad_(True), st.a.clone().requires_grad_(True)
    d = e_u.shape[0]
    nodes = [e_u] + [table[i, :d] for i in pos] + [st.neighbour_vectors[u, j] for j in range(st.spec.neighbours)
                                                 if st.neighbour_valid[u, j]]
    z = [w.T @ x for x in nodes]  # x W, a row vector times W
    logits = torch.stack([F.leaky_relu(a[:d] @ z[0] + a[d:] @ zj, 0.2) for zj in z])
    alpha = torch.softmax(logits, 0)
    h = sum(al * zj for al, zj in zip(alpha, z, strict=True))
    s = torch.stack([h @ (w.T @ table[i, :d]) for i in items])
    if negs is None:
        if st.baseline:
            s = s + table[torch.as_tensor(pos), d] + float(ratings.mean())
        loss = ((s - ratings) ** 2).mean()
    else:
        loss = F.binary_cross_entropy_with_logits(s, torch.cat([torch.ones(len(pos)), torch.zeros(negs.size)]))
    g_table, g_u, g_w, g_a = torch.autograd.grad(loss, [table, e_u, w, a])
    return {"table": g_table, "user": g_u, "w": g_w, "a": g_a}


@pytest.mark.parametrize("rule", ["clients", "contributors"])
def test_a_round_is_each_client_alone_then_the_servers_mean(split: Split, rule: str) -> None:
    alg = _algorithm(split, aggregation=rule)
    st = alg.state
    clients = np.arange(0, split.n_users, 2)
    # a first round publishes vectors, so the second round's graphs have neighbours
    alg.aggregate(alg.local_update(_plan(split, 1, clients)), _plan(split, 1, clients))
    assert st.has_published[clients].all() and not st.has_published[1::2].any()
    clients = np.arange(split.n_users - 25, split.n_users)
    before = {k: getattr(st, k).clone() for k in ("items", "w", "a", "users")}
    st.expand(clients, 2)  # what the round draws (its draws are keyed, so drawing twice is the same)
    assert st.neighbour_valid[clients].any()
    negs = client_negatives(4, split.train, split.sampler, clients, clients, alg.seed, 2)
    counts = np.diff(split.train.indptr)[clients]
    starts = np.concatenate([[0], np.cumsum(counts)])
    snapshot = {"items": st.items, "w": st.w, "a": st.a}
    grads = []
    for k, u in enumerate(clients):
        grads.append(_alone(st, int(u), negs[starts[k]:starts[k + 1]]))
        for name, v in snapshot.items():
            assert torch.equal(getattr(st, name), v)
    alg.aggregate(alg.local_update(_plan(split, 2, clients)), _plan(split, 2, clients))
    n = len(clients)
    steps = torch.stack([-st.lr_item * g["table"] for g in grads])
    touched = torch.stack([(g["table"] != 0).any(1) for g in grads]).float()  # rows each client sent
    if rule == "clients":
        want_items = before["items"] + steps.sum(0) / n
    else:
        senders = torch.zeros(split.n_items)
        for k, u in enumerate(clients):
            sent = np.unique(np.concatenate([split.train.indices[split.train.indptr[u]:split.train.indptr[u + 1]],
                                             negs[starts[k]:starts[k + 1]].reshape(-1)]))
            senders[torch.as_tensor(sent)] += 1
        assert torch.all(touched.sum(0) <= senders)
        want_items = before["items"] + steps.sum(0) / senders.clamp_min(1)[:, None]
    torch.testing.assert_close(st.items, want_items, **TOL)
    torch.testing.assert_close(st.w, before["w"] - st.lr * sum(g["w"] for g in grads) / n, **TOL)
    torch.testing.assert_close(st.a, before["a"] - st.lr * sum(g["a"] for g in grads) / n, **TOL)
    want_users = before["users"].clone()
    for k, u in enumerate(clients):
        want_users[u] -= st.lr * grads[k]["user"]
    torch.testing.assert_close(st.users, want_users, **TOL)
    torch.testing.assert_close(st.published[torch.as_tensor(clients)], st.users[torch.as_tensor(clients)])


@pytest.mark.parametrize("baseline", ["none", "user-item"])
def test_on_ratings_a_round_is_each_client_fitting_its_ratings_alone(baseline: str) -> None:
    """Under a rating protocol each client's gradient is of its mean squared error on its
    ratings, no negatives; under the rating baseline its prediction adds its training mean and
    the item's bias, a column of the row sent and averaged with it; scores are those ratings."""
    split = make_split(synthetic(40, 60, mean_interactions=8, min_interactions=3, seed=5), "ratio-rating", seed=0)
    alg = _algorithm(split, aggregation="contributors", negatives=0, rating_baseline=baseline)
    st = alg.state
    assert st.rating and st.baseline == (baseline != "none")
    assert st.items.shape[1] == 5 + st.baseline
    if st.baseline:  # biases that are not zero, so the reference reads them
        st.items[:, -1] = torch.randn(split.n_items, generator=torch.Generator().manual_seed(6))
    everyone = np.arange(split.n_users)
    alg.aggregate(alg.local_update(_plan(split, 1, everyone)), _plan(split, 1, everyone))
    clients = np.arange(10, 30)
    before = {k: getattr(st, k).clone() for k in ("items", "users")}
    st.expand(clients, 2)
    assert st.neighbour_valid[clients].any()
    grads = [_alone(st, int(u), None) for u in clients]
    alg.aggregate(alg.local_update(_plan(split, 2, clients)), _plan(split, 2, clients))
    senders = torch.zeros(split.n_items)
    for u in clients:
        senders[torch.as_tensor(split.train.indices[split.train.indptr[u]:split.train.indptr[u + 1]])] += 1
    steps = torch.stack([-st.lr_item * g["table"] for g in grads]).sum(0)
    torch.testing.assert_close(st.items, before["items"] + steps / senders.clamp_min(1)[:, None], **TOL)
    want_users = before["users"].clone()
    for k, u in enumerate(clients):
        want_users[u] -= st.lr * grads[k]["user"]
    torch.testing.assert_close(st.users, want_users, **TOL)
    # a score is the predicted rating: the client's mean, the item's bias and the inner product
    u, items = 12, np.array([[0, 5, 7]])
    got = alg.scores(np.array([u]), items)[0]
    d, train = 5, split.train
    pos = train.indices[train.indptr[u]:train.indptr[u + 1]]
    h = pergnn.user_representation(st.users[[u]], st.items[torch.as_tensor(pos), :d],
                                   torch.zeros(len(pos), dtype=torch.int64), *st._neighbours(np.array([u])),
                                   st.w, st.a)[0]
    want = (st.items[torch.as_tensor(items[0]), :d] @ st.w) @ h
    if st.baseline:
        want = want + st.items[torch.as_tensor(items[0]), d] + float(train.data[train.indptr[u]:train.indptr[u + 1]].mean())
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_neighbours_share_an_item_are_not_the_client_and_have_published(split: Split) -> None:
    alg = _algorithm(split)
    st = alg.state
    st.has_published[:] = True
    st.has_published[::3] = False
    st.published = torch.randn_like(st.users)
    clients = np.arange(split.n_users)
    st.expand(clients, 1)
    items = [set(split.train.indices[split.train.indptr[u]:split.train.indptr[u + 1]].tolist()) for u in clients]
    found = 0
    for u in clients:
        for j in np.flatnonzero(st.neighbour_valid[u]):
            v = [c for c in range(split.n_users) if torch.equal(st.published[c], st.neighbour_vectors[u, j])]
            assert len(v) == 1 and v[0] != u and st.has_published[v[0]] and items[u] & items[v[0]]
            found += 1
        assert not st.neighbour_vectors[u, ~st.neighbour_valid[u]].any()
    assert found > split.n_users  # most draws land
    # the draws are the client's own: another cohort draws the same for it
    kept = st.neighbour_vectors[7].clone()
    st.expand(np.array([3, 7, 30]), 1)
    assert torch.equal(st.neighbour_vectors[7], kept)


@pytest.mark.parametrize("expansion", ["once", "every-round"])
def test_after_the_warm_up_a_client_is_expanded_once_or_every_round(split: Split, expansion: str) -> None:
    """No client has neighbours in the warm-up's rounds. After it, under ``once`` (the paper's
    Algorithm 1) a client is expanded at the first round it takes part in and keeps those
    vectors although their users publish new ones; under ``every-round`` it is redrawn each
    round, from the latest vectors."""
    alg = _algorithm(split, {"warmup": 2, "expansion": expansion})
    st, everyone = alg.state, np.arange(split.n_users)

    def round_(r: int, clients: np.ndarray) -> None:
        plan = _plan(split, r, clients)
        alg.aggregate(alg.local_update(plan), plan)

    for r in (1, 2):
        round_(r, everyone)
        assert not st.neighbour_valid.any()
    early, late = everyone[::2], everyone[1::2]
    round_(3, early)
    assert st.neighbour_valid[early].any(axis=1).mean() > 0.5 and not st.neighbour_valid[late].any()
    kept = st.neighbour_vectors[torch.as_tensor(early)].clone()
    round_(4, everyone)  # the early half's neighbours published new vectors in round 3
    assert st.neighbour_valid[late].any(axis=1).mean() > 0.5
    same = torch.equal(st.neighbour_vectors[torch.as_tensor(early)], kept)
    assert same == (expansion == "once")
    # a round downloads neighbours' vectors only to the clients expanded in it: none, under once
    plan = _plan(split, 5, everyone)
    alone = _algorithm(split, {"neighbours": 0}).local_update(plan).bytes_down
    sent = alg.local_update(plan).bytes_down - alone
    assert (sent == 0) == (expansion == "once") and sent >= 0
    if expansion == "once":  # the late half was drawn in round 4, as every-round draws it then
        other = _algorithm(split, {"warmup": 2})
        for r, clients in ((1, everyone), (2, everyone), (3, early)):
            plan = _plan(split, r, clients)
            other.aggregate(other.local_update(plan), plan)
        other.state.expand(late, 4)
        torch.testing.assert_close(st.neighbour_vectors[torch.as_tensor(late)],
                                   other.state.neighbour_vectors[torch.as_tensor(late)])
    with pytest.raises(FedrecError, match="expansion=once needs warmup >= 1"):
        get_algorithm("fedpergnn").build(split, {"expansion": "once"})
    with pytest.raises(FedrecError, match="expansion must be one of every-round, once"):
        get_algorithm("fedpergnn").build(split, {"expansion": "weekly"})


def test_a_round_is_the_same_in_chunks_and_with_privacy_noise_it_is_keyed_by_client(split: Split,
                                                                                     monkeypatch) -> None:
    """Pseudo items and Laplace noise are drawn per client: cutting the round in chunks of a few
    clients gives the same tables."""
    def run(chunk: int) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(pergnn, "CHUNK_SAMPLES", chunk)
        alg = _algorithm(split, ldp=0.05, pad_items=7, clip=0.5, aggregation="contributors")
        for r in (1, 2):
            plan = _plan(split, r, np.arange(split.n_users))
            up = alg.local_update(plan)
            alg.aggregate(up, plan)
        return {"items": alg.state.items, "w": alg.state.w, "users": alg.state.users}

    whole, parts = run(1 << 20), run(60)
    for k in whole:
        torch.testing.assert_close(parts[k], whole[k], **TOL)
    plan = _plan(split, 1, np.arange(split.n_users))
    padded = _algorithm(split, pad_items=7).local_update(plan)
    plain = _algorithm(split).local_update(plan)
    # each client also sent 7 pseudo rows of (4 + 4 x 5) bytes
    assert padded.bytes_up - plain.bytes_up == split.n_users * 7 * (4 + 4 * 5)


def test_clip_bounds_each_sent_row_and_ldp_noises_the_graph_layer_too(split: Split) -> None:
    """``--clip`` bounds the L2 norm of each item row a client sends (here below most rows'
    norm, so it binds), and leaves the graph layer's step as it is; ``--ldp`` noises the layer's
    step as well as the rows (docs/fedpergnn.md: the layer's step has no bound, so no epsilon
    holds for it)."""
    plan = _plan(split, 1, np.arange(split.n_users))
    free = _algorithm(split)
    free.keep_uploads = True
    unbounded = free.local_update(plan)
    loose = unbounded.per_client
    norms = torch.cat([u.tensors[ITEMS].norm(dim=1) for u in loose])
    bound = float(norms.median())
    clipped = _algorithm(split, clip=bound)
    clipped.keep_uploads = True
    up = clipped.local_update(plan)
    sent = torch.cat([u.tensors[ITEMS].norm(dim=1) for u in up.per_client])
    assert float(sent.max()) <= bound * (1 + 1e-5) and int((sent > bound * (1 - 1e-5)).sum()) >= len(sent) // 3
    torch.testing.assert_close(up.payload[3]["w"], unbounded.payload[3]["w"], **TOL)
    noised = _algorithm(split, ldp=0.05, aggregation="clients").local_update(plan)
    plain = _algorithm(split, aggregation="clients").local_update(plan)
    assert not torch.allclose(noised.payload[3]["w"], plain.payload[3]["w"])


def test_a_run_resumed_under_the_papers_schedule_keeps_whom_it_expanded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Under ``expansion=once`` a resumed run must not expand again the clients expanded
    before its save (the third party's flags travel in the checkpoint)."""
    def cfg(rounds: int) -> RunConfig:
        return RunConfig(algorithm="fedpergnn", dataset="synthetic:60x200", protocol="loo-sampled", seed=0,
                         model={"neighbours": 3, "warmup": 1, "expansion": "once"},
                         federated=federated_config("fedpergnn", rounds=rounds, clients_per_round=0.5,
                                                    checkpoint_every=1, patience=0))

    whole = train(cfg(5)).result
    ckpt = tmp_path / "run.ckpt"
    train(cfg(3), checkpoint=ckpt)
    resumed = train(cfg(5), checkpoint=ckpt, resume=True).result
    assert [h.loss for h in resumed.history] == [h.loss for h in whole.history]
    assert [h.valid for h in resumed.history] == [h.valid for h in whole.history]


def test_layer_clip_bounds_each_clients_graph_layer_step(split: Split) -> None:
    """``layer_clip`` bounds the L2 norm of each client's step of W and a together (here below
    most clients' norm, so it binds); the round's layer step is the sum of the bounded ones, and
    a bound no step reaches changes nothing."""
    clients = np.arange(split.n_users)

    def steps(bound: float | None) -> tuple[list, dict[str, torch.Tensor]]:  # type: ignore[type-arg]
        alg = _algorithm(split, {"layer_clip": bound})
        kept: list = []  # type: ignore[type-arg]
        out = alg.client_steps(clients, 1, kept, each_layer=True)
        return kept, out.layer_sum

    free, free_sum = steps(None)
    norms = torch.stack([torch.cat([u.tensors["w"].reshape(-1), u.tensors["a"]]).norm() for u in free])
    bound = float(norms.median())
    kept, layer_sum = steps(bound)
    sent = torch.stack([torch.cat([u.tensors["w"].reshape(-1), u.tensors["a"]]).norm() for u in kept])
    assert float(sent.max()) <= bound * (1 + 1e-5) and int((sent > bound * (1 - 1e-5)).sum()) >= len(sent) // 3
    for k in ("w", "a"):
        torch.testing.assert_close(layer_sum[k], torch.stack([u.tensors[k] for u in kept]).sum(0), **TOL)
        torch.testing.assert_close(steps(1e6)[1][k], free_sum[k], **TOL)
    assert not torch.allclose(layer_sum["w"], free_sum["w"])
    plain = _algorithm(split, {"layer_clip": bound}).client_steps(clients, 1)  # no rule: the sum alone
    for k in ("w", "a"):
        torch.testing.assert_close(plain.layer_sum[k], layer_sum[k], **TOL)
    with pytest.raises(FedrecError, match="layer_clip must be > 0"):
        get_algorithm("fedpergnn").build(split, {"layer_clip": 0.0})


def test_entry_clip_bounds_every_entry_of_every_step_sent(split: Split) -> None:
    """``entry_clip`` (the paper's δ) holds every entry of each client's item-row and
    graph-layer steps to [−δ, δ]; the bound binds on both (δ below the largest entries)."""
    clients = np.arange(split.n_users)

    def sent(model: dict) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[type-arg]
        alg = _algorithm(split, model)
        kept: list = []  # type: ignore[type-arg]
        alg.client_steps(clients, 1, kept, each_layer=True)
        return (torch.cat([u.tensors[ITEMS].reshape(-1) for u in kept]),
                torch.cat([torch.cat([u.tensors["w"].reshape(-1), u.tensors["a"]]) for u in kept]))

    rows, layer = sent({})
    delta = 0.5 * min(float(rows.abs().max()), float(layer.abs().max()))
    c_rows, c_layer = sent({"entry_clip": delta})
    for free, held in ((rows, c_rows), (layer, c_layer)):
        assert float(held.abs().max()) <= delta * (1 + 1e-6)
        torch.testing.assert_close(held, free.clamp(-delta, delta), **TOL)
    # pseudo rows are held to the same bounds (drawn with the bounded rows' spread, some would
    # pass them, and a row beyond the bounds would be a pseudo one)
    alg = _algorithm(split, {"entry_clip": delta}, pad_items=7, clip=0.8 * delta * 5 ** 0.5)
    kept = []  # type: ignore[var-annotated]
    alg.client_steps(clients, 1, kept)
    rows = torch.cat([u.tensors[ITEMS] for u in kept])
    assert len(rows) == len(c_rows) // 5 + 7 * split.n_users
    assert float(rows.abs().max()) <= delta * (1 + 1e-6)
    assert float(rows.norm(dim=1).max()) <= 0.8 * delta * 5 ** 0.5 * (1 + 1e-6)
    with pytest.raises(FedrecError, match="entry_clip must be > 0"):
        get_algorithm("fedpergnn").build(split, {"entry_clip": -1.0})


def test_fedpergnn_trains_above_chance_and_refuses_what_it_does_not_do() -> None:
    cfg = RunConfig(algorithm="fedpergnn", dataset="synthetic:500x400", protocol="loo-sampled",
                    federated=federated_config("fedpergnn", rounds=25, lr=1.0, lr_item=30.0,
                                               aggregation="contributors", backoffs=0))
    res = train(cfg).result
    assert res.test["hr@10"] > 0.4  # chance is 0.1 among 100 candidates
    with pytest.raises(FedrecError, match="cannot be evaluated under protocol"):
        train(RunConfig(algorithm="fedpergnn", dataset="synthetic:200x300", protocol="ratio-rating-implicit",
                        federated=federated_config("fedpergnn", rounds=1)))
    with pytest.raises(FedrecError, match="does not use --local-epochs"):
        federated_config("fedpergnn", local_epochs=3)
    with pytest.raises(FedrecError, match="averages item rows over the round's clients"):
        train(RunConfig(algorithm="fedpergnn", dataset="synthetic:200x300", protocol="loo-full",
                        federated=federated_config("fedpergnn", rounds=1, aggregation="samples")))
    with pytest.raises(FedrecError, match="neighbours must be >= 0"):
        get_algorithm("fedpergnn").build(None, {"neighbours": -1})  # type: ignore[arg-type]


def test_the_privacy_audit_reads_its_uploads_and_pseudo_items_hide_its_rows() -> None:
    from fedrec.security.inference import audit_privacy

    def rows_attack(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="fedpergnn", dataset="synthetic:200x300", protocol="loo-full",
                        federated=federated_config("fedpergnn", rounds=2, **opts))
        _, audit = audit_privacy(cfg)
        out = audit.summary()
        return out["rows_precision"], out["rows_recall"]

    (sent_p, sent_r), (pad_p, pad_r) = rows_attack(), rows_attack(pad_items=100)
    # every trained item is among the rows sent, beside 4 negatives a positive
    assert sent_r == 1.0 and 0.15 < sent_p < 0.3
    assert pad_r == 1.0 and pad_p < sent_p * 0.7  # the pseudo rows dilute the guess
    noisy = RunConfig(algorithm="fedpergnn", dataset="synthetic:200x300", protocol="loo-full",
                      federated=federated_config("fedpergnn", rounds=1, aggregation="clients", ldp=0.1))
    with pytest.raises(FedrecError, match="is not modelled"):
        audit_privacy(noisy)


def test_attacks_and_defences_plug_into_its_item_rows() -> None:
    """Its server averages item rows, so the security layer plugs in: FedRecAttack's crafted rows
    (against a dot product on the global rows) expose the target, the per-row median stops them,
    and UNION flags ClusterAttack's clients and nothing else. LDP, a defence or an attack switch
    to the papers' item-row rule at its rates (`PAPERS_RULE`)."""
    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="fedpergnn", dataset="synthetic:300x400", protocol="loo-sampled",
                        federated=federated_config("fedpergnn", rounds=4, backoffs=0, **opts))
        assert cfg.federated.aggregation == "clients" and cfg.federated.lr_item == 3000.0
        return train(cfg).result.history[-1].extra

    clean = run(targets=1, aggregation="clients")
    attacked = run(attack="fedrecattack", boost=10.0)
    defended = run(attack="fedrecattack", boost=10.0, defence="median")
    assert attacked["er@10"] > clean["er@10"] + 0.5 and defended["er@10"] < 0.1
    union = run(attack="clusterattack", boost=10.0, defence="union")
    assert union["flagged"] == union["malicious_clients"] and union["flag_precision"] == 1.0


@pytest.mark.parametrize("rule", ["median", "norm-bound"])
def test_a_robust_rule_judges_each_clients_graph_layer_step(split: Split, rule: str) -> None:
    """Under a robust rule each client's upload carries its own graph-layer step (−lr x its
    gradient of W and a, each client's alone), and the layer moves by the rule's location of
    them: the median coordinate by coordinate; ``norm-bound``, which bounds rows only, their
    mean."""
    alg = _algorithm(split, aggregation="clients", defence=rule, norm_bound=1e9)
    attach(alg, split, alg.cfg, seed=2)
    st = alg.state
    clients = np.arange(0, split.n_users, 2)
    alg.aggregate(alg.local_update(_plan(split, 1, clients)), _plan(split, 1, clients))
    clients = np.arange(split.n_users - 25, split.n_users)
    before = {k: getattr(st, k).clone() for k in ("w", "a")}
    st.expand(clients, 2)
    negs = client_negatives(4, split.train, split.sampler, clients, clients, alg.seed, 2)
    starts = np.concatenate([[0], np.cumsum(np.diff(split.train.indptr)[clients])])
    grads = [_alone(st, int(u), negs[starts[k]:starts[k + 1]]) for k, u in enumerate(clients)]
    ups = alg.local_update(_plan(split, 2, clients))
    assert [u.client for u in ups.per_client] == clients.tolist()
    steps = {}
    for name in ("w", "a"):
        sent = torch.stack([u.tensors[name] for u in ups.per_client])
        steps[name] = torch.stack([-st.lr * g[name] for g in grads])
        torch.testing.assert_close(sent, steps[name], **TOL)
    alg.aggregate(ups, _plan(split, 2, clients))
    for name in ("w", "a"):
        want = steps[name].median(0).values if rule == "median" else steps[name].mean(0)
        if rule == "median":  # an even count: the two middle values' mean
            srt = steps[name].sort(0).values
            want = (srt[len(srt) // 2 - 1] + srt[len(srt) // 2]) / 2 if len(srt) % 2 == 0 else want
        torch.testing.assert_close(getattr(st, name), before[name] + want, **TOL)


def test_an_attacker_sends_a_zero_graph_layer_step_under_a_rule(split: Split) -> None:
    """An attacker, which does not run the graph layer, sends a zero step of it."""
    alg = _algorithm(split, aggregation="clients", defence="median", attack="fedrecattack", malicious=0.1)
    attach(alg, split, alg.cfg, seed=2)
    ups = alg.local_update(_plan(split, 1, np.arange(split.n_users)))
    bad = [u for u in ups.per_client if u.client >= split.n_users]
    assert bad and all(not u.tensors["w"].any() and not u.tensors["a"].any() for u in bad)
    assert all(u.tensors["w"].shape == alg.state.w.shape for u in ups.per_client)


def test_owner_outer_sums_each_owners_outer_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each owner's Σ x_jᵀ g_j, whatever the rows' order, zero for an owner without rows, and
    the same when the outer products are formed one row at a time."""
    gen = torch.Generator().manual_seed(0)
    owner = torch.as_tensor(np.random.default_rng(1).choice([0, 2, 3, 5], size=40, p=[0.1, 0.5, 0.3, 0.1]))
    x, g = torch.randn(40, 3, generator=gen), torch.randn(40, 4, generator=gen)
    want = torch.zeros(6, 3, 4)
    for j in range(40):
        want[owner[j]] += torch.outer(x[j], g[j])
    torch.testing.assert_close(pergnn.owner_outer(x, g, owner, 6), want)
    monkeypatch.setattr(pergnn, "OUTER_CELLS", 1)
    torch.testing.assert_close(pergnn.owner_outer(x, g, owner, 6), want)
