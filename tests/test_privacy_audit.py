"""The privacy audit: what the server infers from uploads, under each defence; pseudo-item padding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrec.core.contract import Uploads
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, federated_config, train
from fedrec.federated.family.model import ITEMS
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES
from fedrec.security.inference import audit_privacy


def _audit(algorithm="fedmf", secagg=0, rounds=3, **kw):
    cfg = RunConfig(algorithm=algorithm, dataset="synthetic:300x400",
                    federated=federated_config(algorithm, rounds=rounds, **kw))
    return audit_privacy(cfg, secagg=secagg)


@pytest.fixture(scope="module")
def plain():
    return _audit()[1].summary()


def test_uploads_reveal_the_training_items(plain):
    # every positive is sent every round (recall 1); about one sent row in five is a positive
    assert plain["rows_recall"] == 1.0
    assert plain["rows_precision"] > 3 * plain["random_precision"]
    # the update directions separate positives from sampled negatives (IMIA-like)
    assert plain["direction_auc"] > 0.95 and plain["direction_f1"] > 0.9
    # over rounds the sampled negatives change, positives stay
    assert plain["rounds_precision"] > plain["rows_precision"]


def test_heavy_ldp_noise_leaves_the_server_at_chance(plain):
    noisy = _audit(ldp=1e5, backoffs=0)[1].summary()  # noise this heavy explodes the loss: no back-off
    assert abs(noisy["direction_auc"] - 0.5) < 0.05 and abs(noisy["rows_auc"] - 0.5) < 0.05
    assert noisy["rows_recall"] < 1.0 or noisy["rows_precision"] < 2 * noisy["random_precision"]


def test_secure_aggregation_hides_one_client_in_its_group(plain):
    with pytest.raises(FedrecError, match="group size >= 2"):  # a group of one is the upload as sent
        _audit(secagg=1)
    grouped = _audit(secagg=20)[1].summary()
    assert grouped["rows_precision"] < plain["rows_precision"] / 2
    assert grouped["direction_auc"] < plain["direction_auc"]


def test_pseudo_items_hide_which_rows_were_touched(plain):
    padded = _audit(pad_items=200)[1].summary()
    assert padded["rows_auc"] < plain["rows_auc"] - 0.2
    assert padded["rows_precision"] < plain["rows_precision"] / 2


def test_padding_rows_are_untouched_items_and_are_paid_for():
    seen: list[Uploads] = []

    def keep(trainable, split):
        trainable.keep_uploads = True
        trainable.observers = (lambda up, plan: seen.append(up),)

    base = RunConfig(algorithm="fedmf", dataset="synthetic:300x400", federated=federated_config("fedmf", rounds=1))
    plain = train(base, prepare=keep).result
    padded_cfg = RunConfig(algorithm="fedmf", dataset="synthetic:300x400",
                           federated=federated_config("fedmf", rounds=1, pad_items=7))
    padded = train(padded_cfg, prepare=keep).result
    before, after = seen
    width = before.per_client[0].tensors[ITEMS].shape[1]
    for a, b in zip(before.per_client, after.per_client, strict=True):
        extra = np.setdiff1d(b.items, a.items)
        assert len(extra) == 7 and len(b.items) == len(a.items) + 7  # new items only
        assert np.all(np.diff(b.items) > 0)
    assert padded.history[0].bytes_up - plain.history[0].bytes_up == 300 * 7 * (INDEX_BYTES + width * FLOAT_BYTES)
    # keyed by client: the chunking of the cohort does not change the pseudo rows
    small = RunConfig(algorithm="fedmf", dataset="synthetic:300x400",
                      federated=federated_config("fedmf", rounds=1, pad_items=7, memory_budget_mb=0.05))
    assert train(small).result.test == padded.test


def test_pseudo_rows_are_held_to_the_real_rows_bound():
    """Under ``--clip`` a pseudo row is held to the bound the real rows are: drawn with their
    spread, some would pass it, and a row longer than the bound would be a pseudo one. The
    bound here binds on most real rows."""
    seen: list[Uploads] = []

    def keep(trainable, split):
        trainable.keep_uploads = True
        trainable.observers = (lambda up, plan: seen.append(up),)

    def rows(**kw) -> np.ndarray:
        seen.clear()
        train(RunConfig(algorithm="fedmf", dataset="synthetic:300x400",
                        federated=federated_config("fedmf", rounds=1, pad_items=7, **kw)), prepare=keep)
        return np.concatenate([u.tensors[ITEMS].norm(dim=1).numpy() for u in seen[0].per_client])

    bound = float(np.median(rows()))
    held = rows(clip=bound)
    assert held.max() <= bound * (1 + 1e-5) and (held > bound * (1 - 1e-5)).mean() > 0.3


def test_padding_is_refused_where_it_means_nothing():
    with pytest.raises(FedrecError, match="dense or noised"):
        _audit(pad_items=5, ldp=0.1)
    with pytest.raises(FedrecError, match="centralised"):
        _audit(algorithm="mf")


def test_audit_privacy_command(tmp_path):
    from typer.testing import CliRunner

    from fedrec.cli import app

    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["audit-privacy", "fedmf", "-d", "synthetic:300x400", "--rounds", "2",
                                   "--secagg", "5", "--set", "dim=8", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "direction" in res.output and "random guess" in res.output and "aggregation of 5" in res.output
    blob = json.loads(out.read_text())
    assert len(blob["rounds"]) == 2 and 0.0 <= blob["summary"]["direction_auc"] <= 1.0
    assert blob["config"]["model"]["dim"] == 8


def test_secure_aggregation_never_leaves_a_client_alone():
    import scipy.sparse as sp
    import torch

    from fedrec.core.contract import ClientUpload
    from fedrec.security.inference import PrivacyAudit, ServerView

    ups = [ClientUpload(c, np.array([c]), {ITEMS: torch.full((1, 2), 2.0**c)}) for c in range(7)]
    audit = PrivacyAudit(sp.csr_matrix((7, 7)), 4, ServerView(secagg=3), seed=0)
    seen = audit._received(ups, 7, np.random.default_rng(0))
    # each client is seen as a sum of at least 3 uploads (7 = 3 + 4: the remainder joins a group)
    members = [int((t[:, 0] > 0).sum()) for t in seen]
    assert sorted(members) == [3, 3, 3, 4, 4, 4, 4]


def test_a_shared_weight_is_never_read_as_item_rows():
    import torch

    from fedrec.core.contract import ClientUpload
    from fedrec.security.inference import _row_tensor

    # 4 items and a shared (4, 8) MLP weight: only the item rows are the client's rows
    up = ClientUpload(0, np.arange(4), {ITEMS: torch.ones(4, 3), "W0": torch.zeros(4, 8)})
    assert _row_tensor(up).shape == (4, 3)


def test_imia_recovers_a_clients_positives_when_its_model_is_known(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """IMIA's mechanism (`fedrec.security.imia`): a client's step simulated under the right
    labels is closest to the step it sent. Told the client's private user vector (which the
    server never has), it finds the positives; not told, it is near chance on FedMF's steps
    (docs/security.md)."""
    import numpy as np
    import torch

    import fedrec.security.imia as imia
    from fedrec.federated.family.spec import FamilySpec

    spec = FamilySpec(score="dot", dim=8)
    gen = torch.Generator().manual_seed(0)
    user = torch.randn(1, 8, generator=gen)
    start = torch.randn(60, 8, generator=gen) * 0.5
    truth = np.zeros(60, bool)
    truth[:12] = True
    attack = imia.IMIA(spec, lambda items: start[items], {}, lr=0.1, lr_item=0.5, per_sample=False,
                       epochs=2, batch_size=16, positive_share=0.2, confirm=0.05)
    monkeypatch.setattr(imia, "init_params", lambda *a: {"user": user.clone()})
    sent = attack.simulate(start, torch.as_tensor(truth, dtype=torch.float32), torch.Generator().manual_seed(9))
    told = attack.guess(start, sent, seed=[1])
    assert told.sum() >= 4 and (told & truth).sum() / told.sum() > 0.8
    monkeypatch.setattr(imia, "init_params", lambda *a: {"user": torch.randn(1, 8, generator=gen)})
    blind = attack.guess(start, sent, seed=[1])
    assert (blind & truth).sum() / max(blind.sum(), 1) < (told & truth).sum() / told.sum()


def test_a_similarity_upload_is_read_back_as_the_rows_it_was_made_of():
    """FedCIA sends S = E Eᵀ (or its eigen-factors): the rows read back are E up to a rotation,
    so every row's norm and every Gram entry are E's."""
    import torch

    from fedrec.core.contract import ClientUpload
    from fedrec.security.inference import _row_tensor

    e = np.random.default_rng(0).standard_normal((60, 8))
    e[::3] = 0.0  # untouched rows stay exactly at zero norm up to round-off
    rows = _row_tensor(ClientUpload(4, np.arange(60), {"similarity": torch.as_tensor(e @ e.T, dtype=torch.float32)}))
    np.testing.assert_allclose(rows @ rows.T, e @ e.T, atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), np.linalg.norm(e, axis=1), atol=2e-3)
    p, s, _ = np.linalg.svd(e, full_matrices=False)
    factored = _row_tensor(ClientUpload(4, np.arange(60), {"p": torch.as_tensor(p), "lam": torch.as_tensor(s**2)}))
    np.testing.assert_allclose(factored @ factored.T, e @ e.T, atol=1e-4)
    with pytest.raises(FedrecError, match="sends lam"):  # one factor alone is not rows
        _row_tensor(ClientUpload(4, np.arange(60), {"lam": torch.ones(3)}))


def test_a_grouped_clients_items_are_its_users_union():
    import scipy.sparse as sp

    from fedrec.partition import Partition
    from fedrec.security.inference import client_items

    train = sp.csr_matrix(np.array([[1, 0, 0, 2], [0, 3, 0, 1], [0, 0, 4, 0]], np.float32))
    union = client_items(train, Partition(np.array([1, 0, 1]), 2))
    assert union.toarray().tolist() == [[0, 1, 0, 1], [1, 0, 1, 1]]
    assert client_items(train) is train


def test_personalfr_names_its_clients_items_and_fedcia_hides_them_in_a_dense_similarity():
    """PersonalFR sends the decoder rows of its clients' items only: the ids give the items away
    (precision and recall 1, the truth being every item of the client's users). FedCIA's
    similarity covers every item, so a row's presence says nothing (precision = density); its
    LDP is in what it sent, so the audit adds none and noise brings the attacks to chance."""
    def summary(algorithm, protocol, **kw):  # type: ignore[no-untyped-def]
        cfg = RunConfig(algorithm=algorithm, dataset="synthetic:120x200", protocol=protocol, model={"clients": 12},
                        federated=federated_config(algorithm, rounds=1, **kw))
        return audit_privacy(cfg)[1].summary()

    pfr = summary("personalfr", "ratio-rating")
    assert pfr["rows_precision"] == 1.0 and pfr["rows_recall"] == 1.0 and pfr["random_precision"] < 0.5
    cia = summary("fedcia", "ratio-full")
    assert cia["rows_precision"] == pytest.approx(cia["random_precision"]) and cia["rows_recall"] == 1.0
    loud = summary("fedcia", "ratio-full", ldp=10.0)
    assert abs(loud["direction_auc"] - 0.5) < 0.1 and abs(loud["rows_auc"] - 0.5) < 0.1


def test_an_algorithm_that_sends_nothing_is_refused_in_one_line(tmp_path, capsys):
    from fedrec.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["audit-privacy", "lightgcn", "-d", "synthetic:100x200", "-p", "ratio-full", "--rounds", "1",
              "-o", str(tmp_path / "a")])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "send their server nothing" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists()
