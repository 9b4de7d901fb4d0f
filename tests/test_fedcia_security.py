"""Attacks and defences on FedCIA (`fedrec.federated.cia.algorithm.CIAAlgorithm`): the security layer
reads an uploaded similarity matrix as an item table whose row j is item j's similarities.

A defended round's average is the per-coordinate rule over the clients' uploads written out; an
unbounded norm-bound run ends as the plain run; the attacker is a share of the clients, its
crafted rows no longer than the boost times the round's median honest row change, and they enter
the average as one more upload each (under ``upload_rank``, the rank-L upload nearest them); a
deployed defence is taken, and what is not built is refused in one line."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from robust_reference import median

from fedrec.algorithms import get_algorithm
from fedrec.core.contract import ClientUpload, RoundPlan
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.cia.algorithm import CIAAlgorithm, _factored
from fedrec.federated.cia.state import dense_upload
from fedrec.federated.family.model import ITEMS
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.security.adversary import Security, attach


@pytest.fixture(scope="module")
def split() -> Split:
    return make_split(synthetic(40, 30, mean_interactions=8, min_interactions=4, seed=6), "ratio-full", seed=0)


def _algorithm(split: Split, model: dict | None = None, **engine) -> CIAAlgorithm:  # type: ignore[no-untyped-def]
    cfg = federated_config("fedcia", **{"local_epochs": 1, **engine})
    spec = get_algorithm("fedcia").build(split, {"clients": 8, "dim": 6, **(model or {})})
    alg = spec.algorithm(split, cfg, seed=3)
    attach(alg, split, cfg, seed=3)
    return alg


def _round(alg: CIAAlgorithm, r: int = 1):  # type: ignore[no-untyped-def]
    plan = RoundPlan(r, np.arange(alg.n_clients), torch.Generator(), np.random.default_rng(r))
    ups = alg.local_update(plan)
    return ups, plan


@pytest.mark.parametrize("rank", [0, 3])
def test_a_defended_average_is_the_coordinate_wise_median_of_the_uploads(split: Split, rank: int) -> None:
    """Every client uploads every row, so under the median the new average is, coordinate by
    coordinate, the median of the clients' similarity matrices (a rank-L upload read as the
    matrix its factors rebuild); the clients then fine-tune towards it."""
    alg = _algorithm(split, {"upload_rank": rank}, defence="median")
    ups, plan = _round(alg)
    assert ups.per_client is not None and len(ups.per_client) == alg.n_clients
    if rank:
        assert "p" in ups.per_client[0].tensors
    want = median(torch.stack([dense_upload(u) for u in ups.per_client]))
    alg.aggregate(ups, plan)
    assert alg.global_similarity is not None
    torch.testing.assert_close(alg.global_similarity, want, rtol=1e-5, atol=1e-6)


def test_an_unbounded_norm_bound_run_ends_as_the_plain_run() -> None:
    """The per-client path (each upload less the last average, summed by the rule) rebuilds the
    plain average: three rounds end with the plain run's figures."""
    def run(**opts):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full", model={"clients": 6},
                        federated=federated_config("fedcia", rounds=3, **opts))
        return train(cfg)

    plain, bounded = run(targets=1), run(defence="norm-bound", norm_bound=1e9)
    assert bounded.result.test == pytest.approx(plain.result.test)
    for a, b in zip(plain.model.state.stacks, bounded.model.state.stacks, strict=True):
        torch.testing.assert_close(b.params["item"], a.params["item"], rtol=1e-3, atol=1e-3)


def test_crafted_rows_are_a_share_of_the_clients_at_the_honest_row_budget(split: Split,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A 34% share of 8 clients is 2 malicious clients (ids 8 and 9). Each crafted row is at most boost x the
    round's median honest row change, and the average is the previous one plus the mean of the
    benign and crafted changes over every upload."""
    alg = _algorithm(split, attack="pipattack", boost=3.0, malicious=0.34)
    sec = alg.security
    assert isinstance(sec, Security) and (sec.n_benign, sec.n_malicious, sec.n_users) == (8, 2, split.n_users)
    seen: dict[str, object] = {}
    real = Security.malicious_uploads

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(self, *args, **kwargs)
        seen["bad"], seen["norm"] = out[0], kwargs["norm"]
        return out

    monkeypatch.setattr(Security, "malicious_uploads", spy)
    ups, plan = _round(alg)
    prev = alg.global_similarity.clone()
    assert ups.per_client is not None
    honest = [dense_upload(u) - prev for u in ups.per_client]
    alg.aggregate(ups, plan)
    bad = seen["bad"]
    assert [u.client for u in bad] == [8, 9]
    median = float(torch.cat([h.norm(dim=1) for h in honest]).median())
    assert seen["norm"] == pytest.approx(median, rel=1e-6)
    total = torch.stack(honest).sum(0)
    for u in bad:
        assert float(u.tensors[ITEMS].norm(dim=1).max()) <= 3.0 * median * (1 + 1e-5)
        total[torch.as_tensor(u.items)] += u.tensors[ITEMS]
    torch.testing.assert_close(alg.global_similarity, prev + total / 10, rtol=1e-5, atol=1e-5)


def test_under_own_the_budget_is_the_cover_clients_row_change(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--attacker-norm own``: the attacker runs a FedCIA client of its own (the first id after
    the honest clients, one user whose positives are the attack's cover items). It trains as an
    honest client does, and the median row norm of its upload less the last average is the
    budget; it then takes the server's step as every client does."""
    alg = _algorithm(split, attack="pipattack", boost=3.0, malicious=0.34, attacker_norm="own")
    seen: dict[str, object] = {}
    real = Security.malicious_uploads

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen["norm"], seen["table"] = kwargs["norm"], alg.cover.state.stacks[0].params["item"][0].clone()
        out = real(self, *args, **kwargs)
        seen["bad"] = out[0]
        return out

    monkeypatch.setattr(Security, "malicious_uploads", spy)
    ups, plan = _round(alg)
    prev = alg.global_similarity.clone()
    start = alg._cover().state.stacks[0].params["item"][0].clone()  # (made at its first use)
    alg.aggregate(ups, plan)
    cover = alg.cover.state
    assert cover.stacks[0].clients.tolist() == [8]
    assert cover.train_matrix.indices.tolist() == sorted(alg.security.attack.cover_items()[:15].tolist())  # half of 30
    e = seen["table"].double()
    assert not torch.equal(seen["table"], start)  # it trained
    want = float(((e @ e.T).float() - prev).norm(dim=1).median())
    assert seen["norm"] == pytest.approx(want, rel=1e-5)
    honest = float(torch.cat([(dense_upload(u) - prev).norm(dim=1) for u in ups.per_client]).median())
    assert seen["norm"] != pytest.approx(honest, rel=1e-3)  # not the honest clients' figure
    for u in seen["bad"]:
        assert float(u.tensors[ITEMS].norm(dim=1).max()) <= 3.0 * seen["norm"] * (1 + 1e-5)
    assert alg.cover.applied == 1 and not torch.equal(cover.stacks[0].params["item"][0], seen["table"])


def test_a_back_off_to_a_state_before_the_cover_existed_starts_it_afresh(split: Split) -> None:
    """The driver's back-off loads a state from before round 1, when the cover client did not
    exist yet: the retried round's budget is the first try's, not a budget from the cover's
    later model; a rate back-off slows the cover's fine-tune with the clients'."""
    alg = _algorithm(split, attack="pipattack", boost=3.0, malicious=0.34, attacker_norm="own")
    before = copy.deepcopy(alg.state_dict())  # as the driver keeps it
    ups, plan = _round(alg)
    alg.aggregate(ups, plan)
    first = ups.extra["attacker_row_norm"]
    alg.load_state_dict(before)
    assert alg.cover is None
    ups, plan = _round(alg)
    alg.aggregate(ups, plan)
    assert ups.extra["attacker_row_norm"] == first
    alg.scale_rates(0.5)
    assert alg.cover.state.spec.finetune_lr == alg.state.spec.finetune_lr == 0.05


def test_an_own_norm_run_resumed_from_a_checkpoint_equals_an_uninterrupted_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The cover client's model is in the checkpoint with the clients' state."""
    def cfg(rounds: int) -> RunConfig:
        return RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full", seed=3,
                         model={"clients": 6, "finetune_steps": 20},
                         federated=federated_config("fedcia", rounds=rounds, attack="fedrecattack", boost=10.0,
                                                    malicious=0.34, attacker_norm="own", checkpoint_every=1))

    whole = train(cfg(4)).result
    ckpt = tmp_path / "run.ckpt"
    train(cfg(2), checkpoint=ckpt)
    resumed = train(cfg(4), checkpoint=ckpt, resume=True).result
    assert [h.extra["er@10"] for h in resumed.history] == [h.extra["er@10"] for h in whole.history]
    assert [h.loss for h in resumed.history] == [h.loss for h in whole.history]
    assert [h.valid for h in resumed.history] == [h.valid for h in whole.history]


def test_a_rank_l_attacker_sends_the_rank_l_upload_nearest_its_crafted_matrix(split: Split) -> None:
    """Under ``upload_rank`` L a malicious client sends an eigen-upload as an honest one does:
    the matrix its crafted rows mean (the last average plus them), made symmetric, truncated to
    its top L eigenpairs with non-negative eigenvalues; the server reads it as every row's
    change, and the round's bytes count L factors of M and L eigenvalues per attacker."""
    rng = np.random.default_rng(0)
    a = torch.as_tensor(rng.normal(size=(12, 5)), dtype=torch.float32)
    prev = a @ a.T
    rows = torch.as_tensor(rng.normal(size=(2, 12)), dtype=torch.float32)
    crafted = ClientUpload(9, np.array([1, 4]), {ITEMS: rows})
    sent = _factored(crafted, prev, 3)
    assert np.array_equal(sent.items, np.arange(12))
    rebuilt = (prev + sent.tensors[ITEMS]).double()
    meant = prev.double().clone()
    meant[[1, 4]] += rows.double()
    lam, p = np.linalg.eigh(((meant + meant.T) / 2).numpy())
    top = np.argsort(lam)[::-1][:3]
    want = (p[:, top] * np.maximum(lam[top], 0)) @ p[:, top].T
    np.testing.assert_allclose(rebuilt.numpy(), want, rtol=1e-4, atol=1e-4)
    assert np.linalg.matrix_rank(rebuilt.numpy(), tol=1e-3) <= 3

    dense = _algorithm(split, attack="pipattack", boost=3.0, malicious=0.34)
    ranked = _algorithm(split, {"upload_rank": 3}, attack="pipattack", boost=3.0, malicious=0.34)
    spent = []
    for alg in (dense, ranked):
        ups, plan = _round(alg)
        before = ups.bytes_up
        alg.aggregate(ups, plan)
        spent.append(ups.bytes_up - before)
    m = split.n_items
    assert spent == [2 * m * m * 4, 2 * (m * 3 + 3) * 4]


@pytest.mark.parametrize(("name", "option", "why"), [
    ("fedcia", {"attack": "clusterattack"}, "craft similarity rows at a row budget"),
    ("fedcia", {"pad_items": 3}, "takes no --pad-items"),
    ("fedlightgcn", {"defence": "median"}, "not on fedlightgcn's aggregation yet"),
    ("fedcia-gfcf", {"attack": "pipattack"}, "not on fedcia-gfcf's aggregation yet"),
])
def test_what_is_not_built_is_refused_in_one_line(name: str, option: dict, why: str) -> None:
    """FedCIA takes the attacks whose rows go at a budget, dense or of rank L; parameter
    averaging (FedLightGCN) and GF-CF's one-shot filters take none yet."""
    model = option.pop("model", {"clients": 6})
    cfg = RunConfig(algorithm=name, dataset="synthetic:60x80", protocol="ratio-full", model=model,
                    federated=federated_config(name, rounds=1, **option))
    with pytest.raises(FedrecError, match=why):
        train(cfg)


def test_a_deployed_defence_judges_round_one_against_every_clients_start() -> None:
    """Nodes holding one client and two (4 clients on 3 nodes) each send their clients' start
    similarity, so norm bounding, which is not shift-invariant, ends with the simulator's
    figures; a node's malformed start is refused in one line when the server starts."""
    from fedrec.flower.dispatch import run_in_process
    from fedrec.flower.roles import Node, Server, wire

    run = RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full", seed=3,
                    model={"clients": 4, "finetune_steps": 20},
                    federated=federated_config("fedcia", rounds=2, defence="norm-bound", norm_bound=0.05))
    deployed = run_in_process(run, 3).out
    simulated = train(run).result
    for x, y in zip(deployed.history, simulated.history, strict=True):
        assert x.valid == pytest.approx(y.valid, rel=1e-6)
    from fedrec.experiment import prepare_split

    hellos = {i: wire(Node(run, i, 3, prepare_split(run)).hello()) for i in range(3)}
    hellos[1]["start_similarity"] = hellos[1]["start_similarity"][:5]
    with pytest.raises(FedrecError, match="node 1 sent a start similarity"):
        Server(run, hellos)


def test_flower_takes_its_defence_not_on_a_variant_without_similarity_rows(split: Split) -> None:
    """On Flower a defended round asks the nodes for each client's upload (the simulator's
    figures: `tests/test_flower.py`); a variant whose server averages no similarity rows
    (``scope=local``) is refused there as in the simulator, in one line."""
    from fedrec.flower.dispatch import run_in_process
    from fedrec.flower.roles import check_deployable

    run = RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full", model={"clients": 6},
                    federated=federated_config("fedcia", rounds=1, defence="median"))
    check_deployable(run, split=split)
    local = RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full",
                      model={"clients": 6, "scope": "local"}, federated=federated_config("fedcia", rounds=1, defence="median"))
    with pytest.raises(FedrecError, match="not on 'fedcia'"):
        run_in_process(local, 2)


def test_a_malicious_node_runs_own_and_its_rows_are_checked() -> None:
    """FedCIA's malicious node refuses ``--attacker-norm honest`` in one line (no node sees the
    honest uploads); the server refuses crafted rows that are not M wide, and a plain run's
    checkpoint, without the last average, in one line."""
    from fedrec.experiment import prepare_split
    from fedrec.federated.cia.sides import CIAServer
    from fedrec.flower.malicious import CIAMaliciousNode, malicious_node
    from fedrec.flower.roles import Node, Server, wire

    def run(**opts) -> RunConfig:  # type: ignore[no-untyped-def]
        return RunConfig(algorithm="fedcia", dataset="synthetic:60x80", protocol="ratio-full", seed=3,
                         model={"clients": 4, "finetune_steps": 5},
                         federated=federated_config("fedcia", rounds=1, **{"attack": "pipattack", "malicious": 0.5,
                                                                           **opts}))

    split = prepare_split(run())
    with pytest.raises(FedrecError, match="deploy with --attacker-norm own"):
        malicious_node(run(), split)
    own = run(attacker_norm="own")
    bad_node = malicious_node(own, split)
    assert isinstance(bad_node, CIAMaliciousNode)
    nodes = {0: Node(own, 0, 1, split), 1: bad_node}
    server = Server(own, {i: wire(n.hello()) for i, n in nodes.items()})
    assert isinstance(server.side, CIAServer) and server.side.extra_nodes == {1}
    msgs = server.train_messages(1)
    assert "average" in msgs[1] and "average" not in msgs[0] and msgs[0]["per_client"] == 1
    reply = bad_node.train(wire(msgs[1]))
    assert server.side.check(reply, server.sent[1]) is None
    narrow = {**reply, "rows": reply["rows"][:, :5]}
    assert "rows have shape" in server.side.check(narrow, server.sent[1])
    assert "among the users" in server.side.check(reply, np.arange(len(server.sent[1])))
    with pytest.raises(FedrecError, match="craft similarity rows at a row budget"):
        malicious_node(run(attacker_norm="own", attack="a-ra"), split)
    server.side.global_similarity = None
    with pytest.raises(FedrecError, match="lacks"):
        server.side.message(2, 1, server.sent[1])
