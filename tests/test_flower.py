"""fedrec on Flower, in one process: the deployment's message flow equals the simulator; bad
uploads and silent nodes are dropped with a logged reason; attackers and defences on nodes; what
the app refuses; the deployment's ports, credentials and guard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flower_support import (
    AE,
    CIA,
    DAE,
    assert_same_outcome,
    engine_outcome,
    make_run,
)

from fedrec.experiment import RunConfig, prepare_split, train
from fedrec.flower.dispatch import run_in_process
from fedrec.flower.roles import Node, Server


@pytest.mark.parametrize(("alg", "engine"), [
    ("pfedrec", {}),
    ("fedmf", {"clients_per_round": 0.5}),
    ("fedncf", {}),
    ("fedrecon", {"clients_per_round": 0.3, "local_epochs": 2}),
    ("fedrap", {"clients_per_round": 0.5, "lr_item": 1.0}),
    ("colr", {"clients_per_round": 0.5, "model": {"rank": 3}}),  # rows travel as r coordinates
    # cluster tables and the users' vectors travel beside the global rows
    ("perfedrec", {"clients_per_round": 0.5, "rounds": 3, "model": {"clusters": 3}}),
    # the papers' rule: a cluster's rows divided by its clients that came back
    ("perfedrec", {"aggregation": "clients", "rounds": 3, "model": {"clusters": 3}}),
    ("metamf", {"clients_per_round": 0.5, "item_lr_scale": 3000.0,
                "model": {"hidden": 16, "memory": 12}}),
    # a squared error on the ratings (no negatives)
    ("fedmf", {"clients_per_round": 0.5, "protocol": "ratio-rating", "negatives": 0, "lr_item": 0.5}),
    # each node predicts its own users' means for the items no training rating names
    ("fedmf", {"protocol": "ratio-rating", "negatives": 0, "lr_item": 0.5, "cold_items": "user-mean"}),
    # the rating baseline: each client's own mean, an item bias in the rows (fedrec's rule)
    ("fedmf-bias", {"protocol": "ratio-rating", "negatives": 0, "lr": 0.03, "item_lr_scale": 1.0,
                    "aggregation": "samples", "rating_baseline": "user-item"}),
    ("metamf", {"protocol": "ratio-rating", "negatives": 0, "lr": 0.01, "lr_item": 0.5,
                "model": {"hidden": 16, "memory": 12}}),
    ("personalfr", {"clients_per_round": 0.5, "model": AE, "protocol": "ratio-rating"}),
    ("personalfr", {"model": AE, "protocol": "ratio-rating", "rating_baseline": "user-item"}),
    ("personalfr", {"model": AE, "protocol": "ratio-rating-implicit"}),
    ("fedavg-ae", {"clients_per_round": 0.5, "model": AE, "protocol": "ratio-rating-implicit"}),
    # FedCIA: grouped clients of every backbone, each aggregation and upload form
    ("fedcia", {"model": {**CIA, "backbone": "mixed"}, "protocol": "ratio-full"}),
    ("fedcia", {"model": {**CIA, "scope": "local"}, "protocol": "ratio-full"}),
    ("fedcia", {"model": {**CIA, "upload_rank": 3}, "protocol": "ratio-full"}),
    ("stacked", {"model": {**CIA, "aggregation": "waa", "dims": "4/8"}, "protocol": "ratio-full"}),
    ("fedcia-gfcf", {"model": {"clients": 6}, "protocol": "ratio-full"}),
    # FedDAE: the server's Adam step on the nodes' sums of accumulated gradients
    ("feddae", {"clients_per_round": 0.5, "model": DAE}),
    ("fedvae", {"model": DAE, "protocol": "loo-full"}),
    # FedCA: the aggregated clients' new models wait on the server for their node's next message
    ("fedca", {"clients_per_round": 0.5, "rounds": 4, "model": {"aggregated": 0.6}}),
    ("fedca-ncf", {"eval_every": 2, "rounds": 4}),
    ("fedca-avg", {"protocol": "loo-full"}),
    # FedPerGNN: the server relays the published user vectors (the paper's third party)
    ("fedpergnn", {"clients_per_round": 0.5, "rounds": 4, "model": {"neighbours": 5}}),
    # the paper's schedule: a client is expanded at its first round after the warm-up, and keeps them
    ("fedpergnn", {"clients_per_round": 0.5, "rounds": 4, "model": {"neighbours": 5, "warmup": 1,
                                                                     "expansion": "once"}}),
    ("fedpergnn", {"aggregation": "clients", "clip": None, "model": {"neighbours": 3}}),
    ("fedpergnn", {"protocol": "ratio-rating", "negatives": 0, "rating_baseline": "user-item"}),
])
def test_three_nodes_make_the_simulators_run(alg: str, engine: dict[str, Any]) -> None:
    """Each node trains its own block of users with keyed draws; the server sums node uploads."""
    run = make_run(alg, **engine)
    assert_same_outcome(run_in_process(run, 3).out, engine_outcome(run))


def test_a_deployment_takes_the_runs_further_cutoffs() -> None:
    """Under `--ks` the server combines the nodes' figures at every cut-off as the simulator
    scores them: F1@20 from the pooled precision and recall, not the nodes' mean F1."""
    from dataclasses import replace

    run = replace(make_run("fedcia", model=CIA, protocol="ratio-full"), ks=(20,))
    deployed, simulated = run_in_process(run, 3).out, engine_outcome(run)
    assert {"f1@10", "f1@20", "precision@20", "recall@20"} <= set(simulated.test)
    assert_same_outcome(deployed, simulated)


@pytest.mark.parametrize(("alg", "engine"), [
    ("fedmf", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1}),
    # under fedrec's item-row rules the attacker's node counts each row's senders too
    ("fedmf", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "aggregation": "contributors"}),
    ("pfedrec", {"attack": "a-ra", "malicious": 0.1, "clients_per_round": 0.5, "aggregation": "samples"}),
    ("fedncf", {"attack": "a-ra", "clients_per_round": 0.5, "malicious": 0.1}),  # poisons shared weights
    # crafted rows travel as the round's r coordinates
    ("colr", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "model": {"rank": 3}}),
    # the autoencoders' attacker: crafted decoder rows, the rest sent back as it came
    ("personalfr", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.2, "model": AE,
                    "protocol": "ratio-rating-implicit"}),
    # the graph methods' attackers are users of the graph: q_g (or their own table) plus their steps
    ("gpfedrec", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "model": {"dim": 32}}),
    ("gfedpp", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                "model": {"dim": 32, "public_ratio": 0.5, "public_attackers": True}}),
    # PerFedRec's attackers send forged user vectors too, and join their clusters' tables
    ("perfedrec", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "clients_per_round": 0.5,
                   "rounds": 4, "model": {"clusters": 3}}),
    # FedPerGNN's attackers send crafted rows and no graph-layer step, and publish no user vector
    ("fedpergnn", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "clients_per_round": 0.5,
                   "model": {"neighbours": 3}}),
    # FedCA's attackers keep models of their own, join the aggregation and take their mixtures;
    # a mining attack watches the mean of their tables
    ("fedca", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "attacker_norm": "own",
               "clients_per_round": 0.5, "rounds": 4, "model": {"aggregated": 0.6}}),
    ("fedca-ncf", {"attack": "pieck-ipe", "malicious": 0.1, "attacker_norm": "own"}),
    # FedDAE's attackers have empty bags: crafted output rows as gradients, zero for the rest
    ("feddae", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "attacker_norm": "own",
                "clients_per_round": 0.5, "lr": 0.05, "model": DAE}),
    # FedCIA's attackers craft rows against the last average, which the server sends them, at
    # their cover client's budget; the server reads them client by client
    ("fedcia", {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.34, "attacker_norm": "own",
                "model": CIA, "protocol": "ratio-full"}),
])
def test_a_malicious_node_makes_the_simulators_attacked_run(alg: str, engine: dict[str, Any]) -> None:
    """The attacker is one more node holding the clients after the users; fresh nodes each
    message, so its state travels as its clients' private state."""
    run = make_run(alg, **engine)
    attacked = engine_outcome(run)
    assert_same_outcome(run_in_process(run, 2).out, attacked)
    # (an attack runs the papers' item-row rule; so does the clean run it is compared with)
    clean = engine_outcome(make_run(alg, aggregation="clients", **{
        k: v for k, v in engine.items() if k in ("clients_per_round", "lr", "model")}))
    assert attacked.history[-1].bytes_up > clean.history[-1].bytes_up  # the attacker's uploads count
    assert [h.valid for h in attacked.history] != [h.valid for h in clean.history]  # and move the model


def test_a_graph_server_refuses_a_declaration_that_does_not_fit_its_attackers() -> None:
    """GFed-PP's public attackers join the user graph by the interactions their node declares:
    one row of item ids a declared client, or one clear line."""
    from fedrec.errors import FedrecError
    from fedrec.federated.graph.sides import _Declared

    good = {"extra_clients": 2, "declared_ptr": np.array([0, 1, 3]), "declared_items": np.array([4, 0, 9])}
    assert _Declared.of({7: good}, 2, 10).declared().toarray().sum(1).tolist() == [1.0, 2.0]
    assert _Declared.of({7: {"extra_clients": 2}}, 2, 10) is None
    for bad in ({"declared_ptr": np.array([0, 3])}, {"declared_items": np.array([4, 0, 10])},
                {"declared_ptr": np.array([0, 2, 1])}, {"declared_items": np.array([4.0, 0.0, 9.0])}):
        with pytest.raises(FedrecError, match="node 7 declared interactions"):
            _Declared.of({7: {**good, **bad}}, 2, 10)


@pytest.mark.parametrize(("alg", "engine"), [
    ("fedmf", {"defence": "trimmed-mean"}),
    ("pfedrec", {"defence": "median", "clients_per_round": 0.5}),
    ("fedncf", {"defence": "norm-bound", "norm_bound": 0.5}),
    ("fedrap", {"defence": "median", "clients_per_round": 0.5, "lr_item": 1.0}),
    ("fedmf", {"defence": "multi-krum", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1}),
    ("colr", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1, "model": {"rank": 3}}),
    ("gpfedrec", {"defence": "median", "model": {"dim": 32}}),
    ("gfedpp", {"defence": "krum", "model": {"dim": 32, "public_ratio": 0.5}}),
    ("gfedpp", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                "model": {"dim": 32, "public_ratio": 0.5}}),
    ("fedca", {"defence": "median", "rounds": 3}),
    ("fedca", {"defence": "median", "attack": "poisonfrs", "malicious": 0.1, "attacker_norm": "own"}),
    ("fedca-avg", {"defence": "krum", "protocol": "loo-full"}),
    # the autoencoders: each client's decoder rows (and FedAvg's encoder rows), dense layers whole
    ("personalfr", {"defence": "median", "clients_per_round": 0.5, "model": AE, "protocol": "ratio-rating"}),
    ("fedavg-ae", {"defence": "krum", "model": AE, "protocol": "ratio-rating-implicit"}),
    ("feddae", {"defence": "median", "clients_per_round": 0.5, "model": DAE}),
    ("feddae", {"defence": "union", "union_step": "server", "attack": "fedrecattack", "boost": 10.0,
                "malicious": 0.1, "attacker_norm": "own", "rounds": 3, "model": DAE}),
    ("feddae", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                "attacker_norm": "own", "model": DAE}),
    ("fedavg-ae", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.2, "model": AE,
                   "protocol": "ratio-rating-implicit"}),
    # FedCIA: each client's similarity rows, dense or as a rank-L eigen-upload
    ("fedcia", {"defence": "median", "model": CIA, "protocol": "ratio-full"}),
    ("fedcia", {"defence": "krum", "model": {**CIA, "upload_rank": 3}, "protocol": "ratio-full"}),
    ("fedcia", {"defence": "median", "attack": "pipattack", "boost": 10.0, "malicious": 0.34,
                "attacker_norm": "own", "model": {**CIA, "upload_rank": 3}, "protocol": "ratio-full"}),
    # PerFedRec: the global table from each client's upload, each cluster's from its members'
    ("perfedrec", {"defence": "median", "clients_per_round": 0.5, "rounds": 3, "model": {"clusters": 3}}),
    ("perfedrec", {"defence": "union", "aggregation": "clients", "rounds": 3, "model": {"clusters": 3}}),
    # FedPerGNN: each client's item rows and graph-layer steps (the server relays the neighbours)
    ("fedpergnn", {"defence": "median", "clients_per_round": 0.5, "rounds": 3, "model": {"neighbours": 3}}),
    ("fedpergnn", {"defence": "krum", "aggregation": "clients", "model": {"neighbours": 3}}),
    ("fedpergnn", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                   "model": {"neighbours": 3}}),
    ("perfedrec", {"defence": "median", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                   "rounds": 4, "model": {"clusters": 3}}),
    # fedrec's item-row rules: each row's estimate over its senders among the uploads kept
    ("pfedrec", {"defence": "median", "aggregation": "contributors", "clients_per_round": 0.5}),
    ("fedmf", {"defence": "union", "attack": "clusterattack", "boost": 10.0, "malicious": 0.1,
               "aggregation": "samples"}),
    ("fedpergnn", {"defence": "union", "attack": "fedrecattack", "boost": 10.0, "malicious": 0.1,
                   "aggregation": "contributors", "model": {"neighbours": 3}}),
])
def test_a_defended_deployment_makes_the_simulators_run(alg: str, engine: dict[str, Any]) -> None:
    """Under --defence the server side asks the nodes for each client's upload and aggregates
    them by the rule (the simulator's security slot, on the server's side); with an attack, the
    malicious node's clients are among them."""
    run = make_run(alg, **engine)
    deployed = run_in_process(run, 2 + (alg == "pfedrec"))
    simulated = train(run)
    assert_same_outcome(deployed.out, simulated.result)
    if engine["defence"] in ("multi-krum", "krum", "union"):  # the rule's detection figures are the simulator's
        for x, y in zip(deployed.out.history, simulated.result.history, strict=True):
            assert x.extra["flagged"] == y.extra["flagged"]
            np.testing.assert_equal(x.extra["flag_recall"], y.extra["flag_recall"])  # NaN without attackers


def test_a_defended_fedpergnn_node_without_an_uploading_client_is_not_refused() -> None:
    """Under a rule a FedPerGNN node whose sampled clients have no training item uploads
    nothing; its reply still states the rows' width, and the server folds it."""
    run = make_run("fedpergnn", rounds=1, defence="median", model={"neighbours": 3})
    split = prepare_split(run)
    nodes = {i: Node(run, i, 2, split) for i in range(2)}
    server = Server(run, {i: n.hello() for i, n in nodes.items()})
    msg = dict(server.train_messages(1)[0])
    msg.update({"clients": np.zeros(0, np.int32), "neighbours.vectors": np.zeros((0, 3, 8), np.float32),
                "neighbours.valid": np.zeros((0, 3), np.uint8), "neighbours.fresh": np.zeros(0, np.uint8)})
    reply = nodes[0].train(msg)
    assert reply["rows"].shape == (0, 8) and reply["n"] == 0
    assert server.side.check(reply, np.zeros(0, np.int64)) is None


def test_a_fedpergnn_servers_save_keeps_whom_it_expanded() -> None:
    """Under ``expansion=once`` the server (the third party) must not expand again, after a
    resume, the clients it expanded before: its save carries their flags."""
    run = make_run("fedpergnn", clients_per_round=0.5, rounds=3,
                   model={"neighbours": 3, "warmup": 1, "expansion": "once"})
    side = run_in_process(run, 3).side
    assert 0 < side.expanded.sum() < len(side.expanded)  # some sampled in rounds 2-3, not all
    split = prepare_split(run)
    nodes = {i: Node(run, i, 3, split) for i in range(3)}
    fresh = Server(run, {i: n.hello() for i, n in nodes.items()}).side
    assert not fresh.expanded.any()
    fresh.load_state_dict(side.state_dict())
    np.testing.assert_array_equal(fresh.expanded, side.expanded)


def test_a_per_client_reply_that_repeats_an_item_or_garbles_a_count_is_refused() -> None:
    """A robust rule counts a row's uploads, so one client naming an item twice would be two
    votes; a count that is not one finite number would crash the fold."""
    from fedrec.core.contract import ClientUpload
    from fedrec.federated.family.sides import check_per_client, per_client_payload

    def reply(items: list[int], **counts: Any) -> dict[str, Any]:
        ups = [ClientUpload(0, np.asarray(items), {"items": torch.ones(len(items), 2)}),
               ClientUpload(1, np.asarray([0, 1]), {"items": torch.ones(2, 2)})]
        return {**per_client_payload(ups, np.array([5, 6]), {}), "n": 2, "rejected": 0, "loss_sum": 0.0,
                "client_batches": 2, "bytes_up": 8, "bytes_down": 8, "want_round": 0,
                "want_items": np.zeros(0, np.int32), **counts}

    clients = np.array([5, 6])
    assert check_per_client(reply([0, 1]), clients, 4, 2, {}) is None
    assert "twice" in check_per_client(reply([0, 0, 1]), clients, 4, 2, {})
    assert "finite number" in check_per_client(reply([0, 1], bytes_up="many"), clients, 4, 2, {})
    assert "finite number" in check_per_client(reply([0, 1], loss_sum=float("nan")), clients, 4, 2, {})


def test_what_a_deployed_defence_refuses_is_one_line() -> None:
    from fedrec.errors import FedrecError

    with pytest.raises(FedrecError, match="with --ldp/--dp-noise"):
        run_in_process(make_run("fedmf", rounds=1, defence="median", ldp=0.1), 2)


def test_a_node_downloads_only_the_rows_its_clients_touch() -> None:
    run = make_run("fedmf", clients_per_round=0.5)
    split = prepare_split(run)
    nodes = {i: Node(run, i, 3, split) for i in range(3)}
    server = Server(run, {i: n.hello() for i, n in nodes.items()})
    for r in (1, 2):
        messages = server.train_messages(r)
        for i, m in messages.items():
            rows = nodes[i].side.data.rows_of(m["clients"])
            touched = np.unique(split.train[nodes[i].side.data.users[rows]].indices)
            assert set(touched) <= set(m["items"].tolist())  # every trained row was sent
            assert len(m["items"]) < split.n_items  # and not the whole table
        server.finish_round(r, {i: nodes[i].train(m) for i, m in messages.items()})


def _round_with(run: RunConfig, tamper: dict[int, Any]) -> tuple[Server, Any, dict[int, Any]]:
    split = prepare_split(run)
    nodes = {i: Node(run, i, 3, split) for i in range(3)}
    server = Server(run, {i: n.hello() for i, n in nodes.items()})
    before = server.side.state.items.clone()
    messages = server.train_messages(1)
    replies = {i: nodes[i].train(m) for i, m in messages.items()}
    for i, change in tamper.items():
        if change is None:
            replies.pop(i)
        else:
            change(replies[i])
    good = {i: replies[i] for i in replies if i not in tamper}
    record = server.finish_round(1, replies)
    return server, record, {"before": before, "good": good, "sent": messages}


def test_server_rejects_bad_uploads_and_drops_silent_nodes(caplog: pytest.LogCaptureFixture) -> None:
    run = make_run("fedmf")

    def nan_rows(p: dict[str, Any]) -> None:
        p["rows"][0, 0] = np.nan

    with caplog.at_level(logging.WARNING, logger="fedrec.flower"):
        server, record, info = _round_with(run, {1: nan_rows, 2: None})
    assert "rejected the upload of node 1: rows hold non-finite values" in caplog.text
    assert "node 2 did not answer" in caplog.text
    assert record.extra["rejected_nodes"] == 1 and record.extra["dropped_nodes"] == 1
    assert record.rejected_uploads == len(info["sent"][1]["clients"])
    # the round went on with node 0 alone: global += each row's delta sum / the clients that
    # sent it (fedrec's rule; the papers' divides by all its clients, `test_secure_...`)
    p = info["good"][0]
    expect = info["before"].clone()
    senders = torch.as_tensor(p["senders"], dtype=expect.dtype)
    assert run.federated.aggregation == "samples" and 1 <= senders.min() and senders.max() <= p["n"]
    assert (senders < p["n"]).any()  # rows some of its clients did not send
    expect[torch.as_tensor(p["items"])] += torch.as_tensor(p["rows"]) / senders[:, None]
    torch.testing.assert_close(server.side.state.items, expect)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda p: p.__setitem__("rows", p["rows"][:, :3]), "rows have shape"),
    (lambda p: p.__setitem__("items", p["items"] + 10**6), "out of range"),
    (lambda p: p.__setitem__("n", p["n"] + 5), "do not add up"),
    (lambda p: p.pop("want_items"), "missing want_items"),
    (lambda p: p.__setitem__("rows", p["rows"].astype(np.float64)), "float32"),
])
def test_malformed_uploads_are_named(change: Any, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedrec.flower"):
        _, record, _ = _round_with(make_run("pfedrec", rounds=1), {0: change})
    assert reason in caplog.text
    assert record.extra["rejected_nodes"] == 1


def test_a_secure_sum_of_senders_outside_the_rounds_clients_is_refused() -> None:
    """Under fedrec's item-row rule the nodes mask each row's count of senders beside the rows:
    the server takes the sum's counts only as whole numbers within the round's clients, so a
    node cannot shrink everyone's rows by inflating a count."""
    run = make_run("colr", model={"rank": 3})
    split = prepare_split(run)
    nodes = {i: Node(run, i, 3, split) for i in range(3)}
    server = Server(run, {i: n.hello() for i, n in nodes.items()}, secure=True)
    messages = server.train_messages(1)
    replies = {i: nodes[i].train_secure(m) for i, m in messages.items()}
    summed = [sum(r[0][k] for r in replies.values()).astype(np.float64) for k in range(2)]
    counts = {i: r[1] for i, r in replies.items()}
    total = sum(len(m["clients"]) for m in messages.values())
    assert summed[0].shape == (split.n_items, 3)  # the nodes sent r coordinates a row
    side = server.side
    for bad, says in ((summed[1] * 100, "outside"), (summed[1] + 0.5, "not whole"), (-summed[1] - 1, "outside")):
        side.begin(1)
        why = side.fold_secure([summed[0], bad], counts, total)
        assert why is not None and "sender counts" in why and side.acc.rejected == total, says
    side.begin(1)
    assert side.fold_secure(summed, counts, total) is None
    torch.testing.assert_close(side.acc.item_count, torch.as_tensor(summed[1], dtype=side.acc.item_count.dtype))


@pytest.mark.parametrize(("run", "secure", "says"), [
    (RunConfig("lightgcn", protocol="ratio-full"), False, "runs in the simulator only"),
    (RunConfig("fedcia", protocol="ratio-full"), True, "secure aggregation"),
    (RunConfig("centrap"), False, "runs in the simulator only"),
    (RunConfig("mf"), False, "centralised"),
    (RunConfig("fedncf"), True, "averages shared weights"),
    (RunConfig("ae"), False, "simulator only"),
    (RunConfig("fedca"), True, "not a secure sum"),
    (RunConfig("perfedrec"), True, "clusters the users"),
    (RunConfig("feddae"), True, "every layer"),
    (RunConfig("feddae", protocol="ratio-rating"), False, "cannot be evaluated"),
    (RunConfig("personalfr", protocol="ratio-rating", model={"clients": 1}), False, "Joint"),
    (RunConfig("personalfr", protocol="loo-sampled"), False, "cannot be evaluated"),
    (RunConfig("personalfr", protocol="ratio-rating"), True, "shared weights"),
])
def test_what_the_flower_app_does_not_run_is_refused_clearly(run: RunConfig, secure: bool, says: str) -> None:
    from fedrec.errors import FedrecError
    from fedrec.flower.roles import check_deployable

    with pytest.raises(FedrecError, match=says):
        check_deployable(run, secure)


def test_fedcia_nodes_noise_their_own_similarities() -> None:
    """Under --ldp each node adds its clients' Laplace noise before the upload leaves; the
    server's sum then differs from the noiseless one by 6 clients' noise: variance 6 · 2b²."""
    from fedrec.flower.roles import Node, Server, wire

    b = 0.05
    sums = {}
    for ldp in (0.0, b):
        run = make_run("fedcia", rounds=1, protocol="ratio-full", model=CIA, ldp=ldp)
        split = prepare_split(run)
        nodes = {i: Node(run, i, 3, split) for i in range(3)}
        server = Server(run, {i: wire(n.hello()) for i, n in nodes.items()})
        messages = server.train_messages(1)
        sums[ldp] = sum(np.asarray(nodes[i].train(wire(m))["sum.similarity"]) for i, m in messages.items())
    noise = sums[b] - sums[0.0]
    assert abs(noise.mean()) < 0.01
    assert noise.var() == pytest.approx(6 * 2 * b * b, rel=0.05)


@pytest.mark.parametrize("alg", ["gpfedrec", "gfedpp"])
def test_graph_nodes_noise_each_clients_whole_table(alg: str) -> None:
    """Under --ldp a GPFedRec/GFed-PP node uploads each client's whole table (start + trained
    rows) with Laplace(b) noise on every entry, drawn on the node; the server adds none."""
    from fedrec.flower.roles import Node, Server, wire

    b = 0.05
    sent = {}
    for ldp in (0.0, b):
        run = make_run(alg, rounds=1, ldp=ldp, model={"dim": 32})
        split = prepare_split(run)
        nodes = {i: Node(run, i, 3, split) for i in range(3)}
        server = Server(run, {i: wire(n.hello()) for i, n in nodes.items()})
        assert server.side.path.ldp == 0.0
        replies = {i: nodes[i].train(wire(m)) for i, m in server.train_messages(1).items()}
        tables = {i: nodes[i].side.state.whole_tables().numpy() for i in nodes}
        sent[ldp] = (replies, tables)
    replies, _ = sent[b]
    _, clean = sent[0.0]
    for i, reply in replies.items():
        n, m, d = clean[i].shape
        rows = np.asarray(reply["rows"])
        assert rows.shape == (n * m, d)  # every row of every client's table
        noise = rows.reshape(n, m, d) - clean[i]
        assert abs(noise.mean()) < 0.01
        assert noise.var() == pytest.approx(2 * b * b, rel=0.1)
    out = run_in_process(make_run(alg, rounds=2, ldp=b, model={"dim": 32}), 3).out  # the server's graph step takes them
    assert len(out.history) == 2 and all(np.isfinite(list(h.valid.values())).all() for h in out.history)


@pytest.mark.parametrize(("alg", "engine"), [
    ("fedmf", {"pad_items": 7}),
    ("fedpergnn", {"pad_items": 7, "model": {"neighbours": 3}}),
    ("fedpergnn", {"ldp": 0.01, "clients_per_round": 0.5, "model": {"neighbours": 3}}),
])
def test_nodes_pad_and_noise_from_their_own_entropy(alg: str, engine: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A node keys its clients' pseudo rows (--pad-items), and FedPerGNN's its LDP noise, by its
    own entropy, never by the run's seed, which the server knows and could redraw them from.
    Given the seed as that entropy, a deployment makes the simulator's run: the server folds
    the pseudo rows and the noise as the simulator does."""
    from fedrec.flower.roles import Server, wire

    run = make_run(alg, **engine)
    split = prepare_split(run)
    own = Node(run, 0, 3, split)
    key = own.side.pad_seed if alg == "fedmf" else own.side.algorithm.noise_seed
    assert key is not None and key != run.seed
    monkeypatch.setattr("secrets.randbits", lambda bits: run.seed)
    by_seed = Node(run, 0, 3, split)
    server = Server(run, {0: wire(own.hello()), **{i: wire(Node(run, i, 3, split).hello()) for i in (1, 2)}})
    msg = server.train_messages(1)[0]
    a, b = own.train(wire(msg)), by_seed.train(wire(msg))
    assert a["rows"].shape != b["rows"].shape or not np.allclose(a["rows"], b["rows"])  # what it sends differs
    assert_same_outcome(run_in_process(run, 3, split).out, engine_outcome(run))


@pytest.mark.parametrize(("alg", "engine"), [
    ("fedcia", {"model": {"clients": 2, "finetune_steps": 5}, "protocol": "ratio-full"}),
    ("personalfr", {"model": {**AE, "clients": 2}, "protocol": "ratio-rating"}),
])
def test_a_node_without_clients_is_harmless(alg: str, engine: dict[str, Any]) -> None:
    """Three nodes for two grouped clients: the third holds none, answers with no figures."""
    run = make_run(alg, rounds=2, **engine)
    assert_same_outcome(run_in_process(run, 3).out, engine_outcome(run))


def test_what_stays_off_flower_is_a_one_client_baseline() -> None:
    """Every federated algorithm runs on Flower except the centralised baselines the papers
    train under the federated engine (one client holding every user, or one server); no
    method's options say why the app does not run it (``not_deployed``)."""
    from fedrec.algorithms import ALGORITHMS

    off = {n: a for n, a in ALGORITHMS.items() if a.kind == "federated" and not a.flower}
    baselines = {n: a for n, a in off.items() if not getattr(a.options, "not_deployed", None)}
    assert baselines and all(a.fixed.get("clients") == 1 or a.fixed.get("centralised") for a in baselines.values())
    assert off == baselines


def test_free_port_skips_ports_handed_out_or_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port handed out before is bound later by a child process, so free_port must not give it
    again; nor one another process holds."""
    import socket

    from fedrec.flower import launch

    picks = iter([5001, 5001, 5002, 5003])  # the random draws

    class Draws:
        def choice(self, _: range) -> int:
            return next(picks)

    class Fake:  # a host where 5002 is taken
        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            if address[1] == 5002:
                raise OSError("address in use")
            self.port = address[1]

        def getsockname(self) -> tuple[str, int]:
            return ("0.0.0.0", self.port)

    monkeypatch.setattr(launch, "_RNG", Draws())
    monkeypatch.setattr(launch, "_HANDED_OUT", set())
    monkeypatch.setattr(socket, "socket", Fake)
    assert [launch.free_port(), launch.free_port()] == [5001, 5003]


def test_free_ports_lie_below_the_kernels_own_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports the kernel never gives to a bind(0) or an outgoing connection, all different."""
    from fedrec.flower import launch

    monkeypatch.setattr(launch, "_HANDED_OUT", set())
    ports = [launch.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(p in launch._quiet_ports() for p in ports)


def test_the_guard_parses_its_addresses_and_refuses_other_paths() -> None:
    import asyncio

    from fedrec.flower.superlink import addresses, guard, split_args

    assert split_args(["--host", "10.0.0.5", "--port", "8000"]) == (
        ["127.0.0.1", "::1", "10.0.0.5"], ["--host", "10.0.0.5", "--port", "8000"])
    assert split_args(["--control-from", "10.0.0.9,10.0.0.8", "--insecure"]) == (["10.0.0.9", "10.0.0.8"], ["--insecure"])
    assert split_args(["--host=10.0.0.7"])[0] == ["127.0.0.1", "::1", "10.0.0.7"]
    assert addresses(["10.0.0.5", "localhost", "no-such-host.invalid"])[:2] == ["10.0.0.5", "127.0.0.1"]
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    guarded = guard(app, ["127.0.0.1"])
    for path, peer in (("/v1/fleet/pull", "10.1.1.1"), ("/v1/control/x", "::ffff:127.0.0.1"),
                       ("/v1/control/x", "10.1.1.1"), ("/v1/new-api/x", "10.1.1.1"), ("/v1/fleet", "10.1.1.1")):
        asyncio.run(guarded({"type": "http", "path": path, "client": (peer, 1)}, None, send))
    assert reached == ["/v1/fleet/pull", "/v1/control/x"]
    assert [m["status"] for m in sent if "status" in m] == [403, 403, 403]
    asyncio.run(guarded({"type": "websocket", "path": "/v1/control/x", "client": ("10.1.1.1", 1)}, None, send))
    assert sent[-1] == {"type": "websocket.close", "code": 1008} and len(reached) == 2


def test_credentials_chain_to_their_ca_name_their_hosts_and_keep_keys_private(tmp_path: Path) -> None:
    import ipaddress
    import stat

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    from fedrec.flower.tls import make_credentials

    creds = make_credentials(tmp_path / "c", 2, hosts=("10.1.2.3", "fl.example.org"))
    ca = x509.load_pem_x509_certificate(creds.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(creds.superlink_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert sans.get_values_for_type(x509.DNSName) == ["fl.example.org"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for i in range(2):
        key = load_ssh_private_key(creds.node_key(i).read_bytes(), password=None)
        assert key.public_key() == load_ssh_public_key(creds.node_public(i).read_bytes())
        assert creds.node_public(i).read_text().startswith("ecdsa-sha2-nistp384 ")
    for private in (creds.superlink_key, creds.node_key(0), creds.node_key(1)):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert sorted(p.name for p in creds.folder.iterdir()) == [
        "ca.pem", "node0.key", "node0.pub", "node1.key", "node1.pub", "superlink.key", "superlink.pem"]


def test_app_mode_writes_a_secure_deployment_beside_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The app directory holds no key (`flwr run` ships it to the SuperLink); the deployment
    folder beside it holds the credentials and a Flower config that trusts the CA; the printed
    commands register every node's key before any SuperNode starts. `--insecure` warns."""
    import tomllib

    from fedrec.cli import main

    monkeypatch.chdir(tmp_path)

    def cli(*args: str) -> tuple[int, str]:
        with pytest.raises(SystemExit) as done:
            main(["flower", "pfedrec", "--mode", "app", "--nodes", "2", "--rounds", "1", "-d", "synthetic:60x300",
                  *args])
        captured = capsys.readouterr()
        return int(done.value.code or 0), captured.out + captured.err

    code, said = cli("--app-dir", "app", "--tls-host", "10.1.2.3")
    assert code == 0, said
    assert sorted(p.name for p in (tmp_path / "app").iterdir()) == ["pyproject.toml"]
    deployment = tmp_path / "app-deployment"
    config = tomllib.loads((deployment / "flwr-home" / "config.toml").read_text())
    assert config["superlink"]["fedrec"] == {"address": "10.1.2.3:8000",
                                            "root-certificates": str(deployment / "credentials" / "ca.pem")}
    commands = [" ".join(line.split()) for line in said.splitlines() if line.startswith("  ")]
    registers = [i for i, c in enumerate(commands) if c.startswith("flwr supernode register")]
    nodes = [i for i, c in enumerate(commands) if c.startswith("flower-supernode")]
    assert len(registers) == len(nodes) == 2 and max(registers) < min(nodes)
    assert all("--auth-supernode-private-key" in commands[i] for i in nodes)
    assert "--enable-supernode-auth" in next(c for c in commands if c.startswith("fedrec-superlink"))
    code, said = cli("--app-dir", "plain", "--insecure")
    assert code == 0 and "warning: --insecure" in said and not (tmp_path / "plain-deployment" / "credentials").exists()
    assert "insecure = true" in (tmp_path / "plain-deployment" / "flwr-home" / "config.toml").read_text()
    code, said = cli("--app-dir", "at20", "--insecure", "--ks", "20")  # the cut-offs travel with the run
    assert code == 0 and '\\"ks\\": [20]' in (tmp_path / "at20" / "pyproject.toml").read_text()
    assert "-ks-20-rounds1-flower.json" in (tmp_path / "at20" / "pyproject.toml").read_text()
    code, said = cli("--app-dir", "x", "--mode", "loopback", "--tls-host", "h")
    assert code == 2 and "--tls-host applies to a secure --mode app" in said
    ca = (deployment / "credentials" / "ca.pem").read_bytes()
    (tmp_path / "r.json").write_text("{}")
    code, said = cli("--app-dir", "fresh", "-o", "r.json")  # the results an app would replace: said now too
    assert code == 2 and "--out r.json exists" in said and not (tmp_path / "fresh").exists()
    code, said = cli("--app-dir", "app")  # registered SuperNodes hold its keys: not replaced unasked
    assert code == 2 and "--app-dir app is not empty" in said and "--overwrite" in said
    assert (deployment / "credentials" / "ca.pem").read_bytes() == ca
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    code, said = cli("--app-dir", "mine")
    assert code == 2 and "mine/pyproject.toml" not in said and "is not empty" in said
    assert "'mine'" in (tmp_path / "mine" / "pyproject.toml").read_text()
    code, said = cli("--app-dir", "app", "--overwrite")
    assert code == 0 and (deployment / "credentials" / "ca.pem").read_bytes() != ca
    for nodes in ("0", "-1"):
        code, said = cli("--app-dir", "none", "--nodes", nodes)
        assert code == 2 and f"--nodes must be >= 1 (got {nodes})" in said and not (tmp_path / "none").exists()
    code, said = cli("--app-dir", "/proc/fedrec-app")
    assert code == 2 and "cannot write the app" in said and not (tmp_path / "runs").exists()


def test_a_deployment_checks_its_data_before_any_process_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Data too small for the protocol fails as `fedrec run` does, before a SuperLink starts."""
    from fedrec.cli import main
    from fedrec.flower import launch

    started: list[int] = []
    monkeypatch.setattr(launch.Loopback, "start", lambda self: started.append(1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["flower", "fedmf", "-d", "synthetic:100x120", "--rounds", "1", "--mode", "loopback"])
    said = capsys.readouterr().err
    assert done.value.code == 2 and "evaluation negatives" in said and started == []


def test_the_server_app_keeps_an_existing_results_file_before_any_round(tmp_path: Path) -> None:
    """An app written long before `flwr run` (perhaps on another machine) checks its --out when
    the ServerApp starts, not after the run: kept unless the app was written with --overwrite."""
    from fedrec.errors import FedrecError
    from fedrec.experiment import federated_config
    from fedrec.flower import launch
    from fedrec.flower.app import drive

    run = RunConfig("fedmf", dataset="synthetic:60x300", federated=federated_config("fedmf", "synthetic:60x300",
                                                                                     rounds=1))
    out = tmp_path / "r.json"
    out.write_text("{}")
    with pytest.raises(FedrecError, match="r.json exists .* --overwrite"):
        drive(None, launch.options(run, 2, out=out), None)  # type: ignore[arg-type]  # no grid is reached
    with pytest.raises(AttributeError):  # asked to replace it: on to the grid (here None)
        drive(None, launch.options(run, 2, out=out, overwrite=True), None)  # type: ignore[arg-type]
    assert out.read_text() == "{}"


def test_an_earlier_deployments_results_are_kept_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An existing --out is refused in one line before any process starts (as `fedrec run`
    refuses it); --overwrite, or --resume from a checkpoint, lets the deployment replace it."""
    from fedrec.cli import main
    from fedrec.flower import launch

    class Launched(Exception):
        """Stands for the deployment: the test needs only to know it was reached."""

    def simulate(run, nodes, **kw):  # type: ignore[no-untyped-def]
        raise Launched

    monkeypatch.setattr(launch, "simulate", simulate)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "ck").write_bytes(b"")
    base = ["flower", "fedmf", "-d", "synthetic:100x300", "--rounds", "1", "--mode", "simulation", "-o", "r.json"]
    with pytest.raises(SystemExit) as done:
        main(base)
    said = capsys.readouterr().err
    assert done.value.code == 2 and "--out r.json exists" in said and "--overwrite" in said
    assert (tmp_path / "r.json").read_text() == "{}"
    for extra in (["--overwrite"], ["--resume", "--checkpoint", "ck"]):
        with pytest.raises(Launched):
            main([*base, *extra])
    with pytest.raises(SystemExit) as done:  # --resume with no checkpoint to go on from replaces nothing
        main([*base, "--resume", "--checkpoint", "none"])
    assert done.value.code == 2 and "--out r.json exists" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # a node of no user: one line before any process starts
        main([*base, "--overwrite", "--nodes", "101"])
    assert done.value.code == 2 and "--nodes 101 is more than the data's 100 users" in capsys.readouterr().err


def test_each_clients_upload_crosses_flowers_records_intact() -> None:
    """A defended round's reply (each client's upload: ids, flags, pointers, rows, stacked
    shared weights) survives Flower's records as it survives the in-process transport."""
    from fedrec.core.contract import ClientUpload
    from fedrec.federated.family.sides import client_uploads, per_client_payload
    from fedrec.flower.records import from_record, to_record

    gen = torch.Generator().manual_seed(0)
    ups = [ClientUpload(k, np.sort(np.random.default_rng(k).choice(50, k + 1, replace=False)),
                        {"items": torch.randn(k + 1, 4, generator=gen), "w": torch.randn(3, 2, generator=gen)},
                        accepted=k != 1) for k in range(3)]
    ids = np.array([10, 20, 30])
    back = client_uploads(from_record(to_record(per_client_payload(ups, ids, {"w": torch.zeros(3, 2)}))), ["w"])
    assert [u.client for u in back] == [10, 20, 30] and [u.accepted for u in back] == [True, False, True]
    for a, b in zip(ups, back, strict=True):
        np.testing.assert_array_equal(a.items, b.items)
        for k in ("items", "w"):
            torch.testing.assert_close(a.tensors[k], b.tensors[k], rtol=0, atol=0)
