"""PersonalFR, FedAvg and Joint autoencoders.

The stacked round (all clients at once, row tables, prefix optimiser steps, closed-form weight
decay of untouched rows) is checked against each client trained alone as a plain dense
`nn.Module` with `torch.optim`, and the server step against the paper's average (Equation 5).
The payload test proves partial compression is applied: only the rows of a client's items
travel.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fedrec.algorithms import get_algorithm
from fedrec.data.synthetic import synthetic
from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate
from fedrec.experiment import RunConfig, federated_config, run
from fedrec.federated.ae.spec import AESpec
from fedrec.federated.ae.state import AEState
from fedrec.federated.engine import FederatedConfig, run_federated
from fedrec.protocols import make_split
from fedrec.protocols.protocol import EvalSet, Split, get_protocol

HIDDEN = (6, 4)


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    return synthetic(24, 30, mean_interactions=8, min_interactions=4, seed=3)


@pytest.fixture(scope="module")
def explicit(data) -> Split:  # type: ignore[no-untyped-def]
    return make_split(data, "ratio-rating", seed=0)


@pytest.fixture(scope="module")
def implicit(data) -> Split:  # type: ignore[no-untyped-def]
    return make_split(data, "ratio-rating-implicit", seed=0)


class DenseAE(nn.Module):
    """The same autoencoder as plain layers on dense rating vectors (the reference)."""

    def __init__(self, p: dict[str, torch.Tensor]) -> None:
        super().__init__()
        n, h0 = p["enc.in"].shape
        h1 = HIDDEN[1]
        self.enc_in, self.enc_1 = nn.Linear(n, h0), nn.Linear(h0, h1)
        self.dec_1, self.dec_out = nn.Linear(h1, h0), nn.Linear(h0, n)
        self.norms = nn.ModuleList([nn.GroupNorm(1, w) for w in (h0, h1, h0)])
        with torch.no_grad():
            self.enc_in.weight.copy_(p["enc.in"].T)
            self.enc_in.bias.copy_(p["enc.in.b"])
            for layer, name in ((self.enc_1, "enc.1"), (self.dec_1, "dec.1")):
                layer.weight.copy_(p[f"{name}.W"].T)
                layer.bias.copy_(p[f"{name}.b"])
            self.dec_out.weight.copy_(p["dec.out"])
            self.dec_out.bias.copy_(p["dec.out.b"])
            for norm, name in zip(self.norms, ("enc.in", "enc.1", "dec.1"), strict=True):
                norm.weight.copy_(p[f"{name}.g"])
                norm.bias.copy_(p[f"{name}.s"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norms[0](self.enc_in(x)))
        h = torch.tanh(self.norms[1](self.enc_1(h)))
        h = torch.tanh(self.norms[2](self.dec_1(h)))
        return self.dec_out(h)

    def params(self) -> dict[str, torch.Tensor]:
        out = {"enc.in": self.enc_in.weight.T, "enc.in.b": self.enc_in.bias,
               "dec.out": self.dec_out.weight, "dec.out.b": self.dec_out.bias}
        for layer, name in ((self.enc_1, "enc.1"), (self.dec_1, "dec.1")):
            out[f"{name}.W"], out[f"{name}.b"] = layer.weight.T, layer.bias
        for norm, name in zip(self.norms, ("enc.in", "enc.1", "dec.1"), strict=True):
            out[f"{name}.g"], out[f"{name}.s"] = norm.weight, norm.bias
        return {k: v.detach().clone() for k, v in out.items()}


CASES = {
    "personalfr-adam-implicit": (AESpec(share="decoder", clients=4, hidden=HIDDEN, dropout=0.0), "implicit", 0.01),
    "personalfr-sgd-clip": (AESpec(share="decoder", clients=4, hidden=HIDDEN, dropout=0.0, optimizer="sgd",
                                   weight_decay=0.01, clip=0.5), "explicit", 0.05),
    "fedavg-sgd-full": (AESpec(share="all", clients=4, hidden=HIDDEN, dropout=0.0, optimizer="sgd",
                               weight_decay=0.01, compression=False, clip=0.5), "explicit", 0.05),
}


@pytest.mark.parametrize("case", list(CASES))
def test_round_equals_clients_trained_alone(case: str, request: pytest.FixtureRequest) -> None:
    spec, which, lr = CASES[case]
    split = request.getfixturevalue(which)
    state = AEState(spec, split, spec.partition(split.n_users, 0), seed=1)
    cfg = FederatedConfig(batch_size=2, local_epochs=2, lr=lr)
    sizes = state.partition.sizes()
    cohort = np.argsort(-sizes, kind="stable")  # every client; most local steps first
    glob0 = {k: v.clone() for k, v in state.glob.items()}
    priv0 = {k: v.clone() for k, v in state.priv.items()}
    payload, items = state.download(cohort)
    upload, _ = state.local_update(cohort, payload, cfg, 7)
    _, table = state._batches(cohort, cfg.batch_size, cfg.local_epochs, 7)
    state.aggregate(cohort, items, upload, (table >= 0).any(2).sum(1), lr)

    x = torch.from_numpy(split.train.toarray()).float()
    observed = torch.from_numpy((split.train != 0).toarray())
    if which == "implicit":
        x = (x >= split.protocol.positive_at).float() * observed
    models = []
    for k, m in enumerate(cohort):
        mine = state.row_item[state.row_ptr[m] : state.row_ptr[m + 1]]
        p = dict(glob0)
        for name, v in priv0.items():
            if name == "enc.in":
                full = glob0.get("enc.in", torch.zeros(split.n_items, HIDDEN[0])).clone()
                full[mine] = v[state.row_ptr[m] : state.row_ptr[m + 1]]
                p[name] = full
            else:
                p[name] = v[m]
        if "enc.in" not in p:
            p["enc.in"] = torch.zeros(split.n_items, HIDDEN[0])
        model = DenseAE(p)
        if spec.optimizer == "adam":
            opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=spec.momentum,
                                  weight_decay=spec.decay, nesterov=spec.nesterov)
        for t in range(table.shape[1]):
            users = table[k, t][table[k, t] >= 0]
            if len(users) == 0:
                break
            pred, target, mask = model(x[users]), x[users], observed[users]
            if which == "implicit":
                err = F.binary_cross_entropy_with_logits(pred, target, reduction="none")
            else:
                err = (pred - target) ** 2
            opt.zero_grad()
            (err[mask].sum() / mask.sum().clamp(min=1)).backward()
            if spec.clip:
                nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
            opt.step()
        trained = model.params()
        if spec.compression:  # Equation (5): rows the client does not have keep the global value
            others = np.setdiff1d(np.arange(split.n_items), mine)
            for name in ("dec.out", "dec.out.b", "enc.in"):
                if name in glob0:
                    trained[name][others] = glob0[name][others]
        models.append(trained)
        for name, v in state.priv.items():  # the private encoder stays on the client, as trained
            got = v[state.row_ptr[m] : state.row_ptr[m + 1]] if name == "enc.in" else v[m]
            want = trained[name][mine] if name == "enc.in" else trained[name]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for name, v in state.glob.items():
        want = torch.stack([mdl[name] for mdl in models]).mean(0)
        torch.testing.assert_close(v, want, rtol=1e-4, atol=1e-5, msg=f"{case}: {name}")


def test_kept_codes_are_recomputed_for_the_clients_that_trained(explicit: Split) -> None:
    """PersonalFR keeps each user's code (its private encoder's output) between scorings: after
    rounds in which some clients train, every user's last hidden layer equals one computed
    afresh from the ratings (to float32 rounding: the encoder's batched products group users as
    the call does), its trained clients' users included; new private parameters forget them."""
    spec = AESpec(share="decoder", clients=4, hidden=HIDDEN, dropout=0.0)
    state = AEState(spec, explicit, spec.partition(explicit.n_users, 0), seed=1)
    cfg = FederatedConfig(batch_size=2, local_epochs=2, lr=0.05)
    users = np.arange(explicit.n_users)
    state._codes(users)  # every code kept
    assert state._code_fresh.all()
    for r, cohort in enumerate(([0, 2], [1], [3, 2]), start=1):
        cohort = np.asarray(cohort)
        before = state._code.clone()
        payload, items = state.download(cohort)
        upload, _ = state.local_update(cohort, payload, cfg, r)
        trained = np.isin(state.partition.client_of_user, cohort)
        assert not state._code_fresh[trained].any() and state._code_fresh[~trained].all()
        got = state._codes(users[::2])  # a subset first: only its stale users are encoded
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(state._grouped(users[::2])),
                                   rtol=0, atol=1e-5)
        got = state._codes(users)
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(state._grouped(users)), rtol=0, atol=1e-5)
        moved = (state._code - before).abs().amax(1) > 1e-4
        assert moved[torch.as_tensor(trained)].all() and not moved[torch.as_tensor(~trained)].any()
    state.priv = {k: v.clone() for k, v in state.priv.items()}
    assert not state._code_fresh.any()
    shared = AESpec(share="all", clients=4, hidden=HIDDEN, dropout=0.0, compression=False)
    assert AEState(shared, explicit, shared.partition(explicit.n_users, 0), seed=1)._code is None


def test_payload_holds_only_the_rows_of_the_clients_items(explicit: Split) -> None:
    """Partial compression is applied: a client receives (and returns) its items' output rows
    only, never the private encoder, and the bytes counted are those of the payload."""
    spec = AESpec(share="decoder", clients=4, hidden=HIDDEN)
    state = AEState(spec, explicit, spec.partition(explicit.n_users, 0), seed=0)
    cohort = np.array([2, 0])
    payload, items = state.download(cohort)
    rated = [np.unique(explicit.train[state.partition.users_of([c])].indices) for c in cohort]
    assert all(len(r) < explicit.n_items for r in rated)
    np.testing.assert_array_equal(items, np.concatenate(rated))
    assert not any(k.startswith("enc.") for k in payload)
    for name in ("dec.out", "dec.out.b"):
        assert payload[name].shape[0] == sum(len(r) for r in rated)
        torch.testing.assert_close(payload[name], state.glob[name][torch.from_numpy(items)])
    upload, _ = state.local_update(cohort, payload, FederatedConfig(batch_size=2, local_epochs=1, lr=0.01), 1)
    assert {k: v.shape for k, v in upload.items()} == {
        k: (v.shape if k in ("dec.out", "dec.out.b") else (len(cohort), *v.shape)) for k, v in payload.items()}
    dense = sum(v.numel() for k, v in payload.items() if k.startswith("dec.") and k not in ("dec.out", "dec.out.b"))
    up, down = state.round_bytes(cohort, first_round=False)
    assert down == up == 4 * sum(dense + len(r) * (HIDDEN[0] + 1) for r in rated)
    full = AESpec(share="all", clients=4, hidden=HIDDEN, compression=False)
    whole = AEState(full, explicit, full.partition(explicit.n_users, 0), seed=0)
    n_params = sum(v.numel() for v in whole.glob.values())
    assert whole.round_bytes(cohort, first_round=True) == (4 * n_params * 2, 4 * n_params * 2)


def test_rated_metrics_rank_held_out_rated_items_and_all_unrated() -> None:
    """rated-ndcg ranks the user's held-out rated items (positives: rated >= 3.5); ndcg ranks
    every item not rated in training."""
    protocol = get_protocol("ratio-rating-implicit")
    targets = sp.csr_matrix(np.array([[2.0, 0, 5.0, 4.0, 0]]))
    stage = EvalSet(np.array([0]), targets, exclude=sp.csr_matrix(np.array([[0, 1, 0, 0, 0]])))
    scores = np.array([[0.9, 0.99, 0.1, 0.5, 0.95]])
    got = evaluate(lambda users, items: scores[users], stage, protocol)
    rated = (1 / np.log2(3) + 1 / np.log2(4)) / (1 + 1 / np.log2(3))
    full = (1 / np.log2(4) + 1 / np.log2(5)) / (1 + 1 / np.log2(3))
    assert got["rated-ndcg@10"] == pytest.approx(rated)
    assert got["ndcg@10"] == pytest.approx(full)
    assert got["recall@10"] == pytest.approx(1.0)


def test_implicit_split_keeps_every_rating_and_threshold_overrides(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = RunConfig(algorithm="personalfr", dataset="synthetic:30x40", protocol="ratio-rating-implicit",
                    threshold=4.5, federated=federated_config("personalfr", rounds=2, clients_per_round=1.0),
                    model={"clients": 3, "hidden": "8/4"})
    result = run(cfg, out=tmp_path / "r.json")
    assert result.data["interactions"] > 0 and result.config["threshold"] == 4.5
    assert set(result.test) >= {"rated-ndcg@10", "ndcg@10", "recall@10"}
    with pytest.raises(FedrecError, match="cannot be evaluated"):
        run(RunConfig(algorithm="personalfr", dataset="synthetic:30x40", protocol="ratio-full",
                      federated=federated_config("personalfr", rounds=1)))
    with pytest.raises(FedrecError, match="cannot be evaluated"):
        run(RunConfig(algorithm="fedmf", dataset="synthetic:30x40", protocol="ratio-rating-implicit",
                      federated=federated_config("fedmf", rounds=1)))


def test_learns_held_out_ratings_and_resumes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Trained 20 rounds, PersonalFR's held-out RMSE falls from the untrained model's to near
    the training mean's (a user-based autoencoder needs far more users to beat it), and a run
    resumed from a checkpoint ends where an uninterrupted one does. (150 users: with 60 the
    validation set holds a handful of ratings and picks rounds by noise.)"""
    split = make_split(synthetic(150, 40, mean_interactions=15, min_interactions=4, seed=3), "ratio-rating", seed=0)
    spec = get_algorithm("personalfr").build(split, {"clients": 3, "hidden": "16/8", "dropout": 0.0})
    cfg = FederatedConfig(rounds=20, clients_per_round=1.0, local_epochs=2, batch_size=4, lr=0.03)
    whole = run_federated(spec, split, cfg, seed=0)
    untrained = AEState(spec, split, spec.partition(split.n_users, 0), seed=0)
    before = evaluate(untrained.scores, split.test, split.protocol)["rmse"]
    t = split.test.targets.tocoo()
    mean_rmse = float(np.sqrt(np.mean((t.data - split.train.data.mean()) ** 2)))
    assert before > 2.5 and whole.test["rmse"] < mean_rmse + 0.1
    ckpt = tmp_path / "ae.pt"
    run_federated(spec, split, dataclasses.replace(cfg, rounds=12, checkpoint_every=4), seed=0, checkpoint=ckpt)
    resumed = run_federated(spec, split, dataclasses.replace(cfg, checkpoint_every=4), seed=0,
                            checkpoint=ckpt, resume=True)
    assert resumed.test == whole.test and resumed.best_round == whole.best_round


def test_joint_one_user_per_client_and_options() -> None:
    joint = get_algorithm("ae")
    assert joint.engine["clients_per_round"] == 1.0 and joint.defaults["clients"] == 1
    spec = get_algorithm("personalfr").build(None, {"clients": 0, "optimizer": "sgd", "compression": "false"})  # type: ignore[arg-type]
    assert spec.partition(7, 0).n_clients == 7 and spec.decay == 5e-4 and not spec.compression
    with pytest.raises(FedrecError, match="fixes"):
        get_algorithm("fedavg-ae").build(None, {"share": "decoder"})  # type: ignore[arg-type]
    with pytest.raises(FedrecError, match="Adam with weight decay"):
        AESpec(optimizer="adam", weight_decay=1e-3, compression=False)


def test_the_rating_baseline_centres_each_users_ratings_and_adds_its_mean_back(
        explicit: Split, implicit: Split) -> None:
    """Under the rating baseline the encoder reads and the decoder fits each rating less the
    user's training mean, which every prediction gets back (the decoder's output bias is the
    item half); binarised ratings take none, and fedrec's rating defaults ask for it."""
    from fedrec.protocols.protocol import user_means

    spec = AESpec(share="decoder", clients=4, hidden=HIDDEN, baseline=True)
    state = AEState(spec, explicit, spec.partition(explicit.n_users, 0), seed=0)
    means = user_means(explicit.train)
    per_rating = np.repeat(means, np.diff(explicit.train.indptr))
    np.testing.assert_allclose(state.values.numpy(), explicit.train.data - per_rating, rtol=1e-6, atol=1e-6)
    state.glob["dec.out"].zero_()
    state.glob["dec.out.b"].copy_(torch.arange(explicit.n_items, dtype=torch.float32))
    users = np.arange(explicit.n_users)
    want = means[:, None] + np.arange(explicit.n_items)[None, :]
    np.testing.assert_allclose(state.scores(users, None), want, rtol=1e-6)
    np.testing.assert_allclose(state.scores(users, np.tile([4, 1], (len(users), 1))), want[:, [4, 1]], rtol=1e-6)
    assert AEState(spec, implicit, spec.partition(implicit.n_users, 0), seed=0).offsets is None
    assert federated_config("personalfr", protocol="ratio-rating").rating_baseline == "user-item"
    assert federated_config("personalfr", protocol="ratio-rating", paper=True).rating_baseline == "none"
    plain = dataclasses.replace(spec, baseline=False)
    assert plain.configured(FederatedConfig(rating_baseline="user-item")) == spec
    assert plain.configured(FederatedConfig()) is plain
