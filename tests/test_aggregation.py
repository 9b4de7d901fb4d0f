"""The server's rule for item rows (`FederatedConfig.aggregation`): the papers' FedAvg over the
round's clients, or each row over the clients that sent it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split, train
from fedrec.federated.family import ITEMS


def _algorithm(name: str, aggregation: str, **engine: object):  # type: ignore[no-untyped-def]
    cfg = RunConfig(algorithm=name, dataset="synthetic:60x120", protocol="loo-full",
                    federated=federated_config(name, rounds=1, aggregation=aggregation, **engine))
    split = prepare_split(cfg)
    return build_trainable(cfg, split)[1]


@pytest.mark.parametrize("name", ["fedmf", "pfedrec"])
def test_contributors_divide_each_row_by_the_clients_that_sent_it(name: str) -> None:
    kept = _algorithm(name, "contributors", clients_per_round=5)
    kept.keep_uploads = True
    before = kept.state.items.clone()
    plan = kept.plan(1)
    kept.begin_round(plan)
    uploads = kept.local_update(plan)
    total = torch.zeros_like(before)
    senders = torch.zeros(before.shape[0])
    for u in uploads.per_client:
        total.index_add_(0, torch.as_tensor(u.items), u.tensors[ITEMS])
        senders.index_add_(0, torch.as_tensor(u.items), torch.ones(len(u.items)))
    kept.aggregate(uploads, plan)
    sent = senders > 0
    assert 0 < int(sent.sum()) < before.shape[0]  # rows sent by one client or several, some by none
    assert senders.max() > 1 and (senders == 1).any()
    expected = before.clone()
    expected[sent] += total[sent] / senders[sent, None]
    torch.testing.assert_close(kept.state.items, expected, rtol=1e-5, atol=1e-6)
    # the papers' rule on the same round divides by every client instead
    plain = _algorithm(name, "clients", clients_per_round=5)
    plain.train_round(1)
    torch.testing.assert_close(plain.state.items, before + total / len(uploads.per_client), rtol=1e-5, atol=1e-6)


def test_the_default_rule_keeps_keys_and_figures() -> None:
    from fedrec.federated.engine import FederatedConfig

    default = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                        federated=federated_config("fedmf", rounds=2))
    assert "aggregation" not in FederatedConfig.identity(default.federated.__dict__)
    named = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                      federated=federated_config("fedmf", rounds=2, aggregation="clients"))
    assert train(default).result.history[-1].valid == train(named).result.history[-1].valid


def test_contributors_are_refused_where_they_do_not_apply() -> None:
    with pytest.raises(FedrecError, match="item-embedding family"):
        _algorithm("fedrap", "contributors")
    with pytest.raises(FedrecError, match="does not yet combine"):
        federated_config("fedmf", aggregation="contributors", ldp=0.1).validate()
    with pytest.raises(FedrecError, match="--aggregation must be one of"):
        federated_config("fedmf", aggregation="rows").validate()
    assert np.isfinite(train(RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                                       federated=federated_config("fedmf", rounds=2, aggregation="contributors",
                                                                  lr_item=10.0))).result.test["hr@10"])


def test_backoffs_go_back_a_round_halve_the_rates_and_go_on() -> None:
    from fedrec.errors import Diverged

    def config(backoffs: int) -> RunConfig:
        return RunConfig(algorithm="fedmf", dataset="synthetic:40x200", protocol="loo-full",
                         federated=federated_config("fedmf", rounds=6, lr=1e3, backoffs=backoffs))

    with pytest.raises(Diverged) as stopped:
        train(config(0))
    at = stopped.value.round
    done = train(config(30)).result
    assert done.status == "completed" and len(done.history) == 6
    rounds = done.extra["backoffs"]
    assert rounds[0] == at and rounds == sorted(rounds) and len(rounds) <= 30
    marked = {h.round: h.extra for h in done.history if "backoffs" in h.extra}
    assert sum(e["backoffs"] for e in marked.values()) == len(rounds)
    assert min(e["rate_scale"] for e in marked.values()) == 0.5 ** len(rounds)
    assert all(np.isfinite(h.loss) for h in done.history)
    with pytest.raises(FedrecError, match="--backoffs does not yet combine"):
        federated_config("fedmf", backoffs=2, checkpoint_every=1).validate()


def test_flower_refuses_the_rule_it_does_not_run_yet() -> None:
    pytest.importorskip("flwr")
    from fedrec.flower.roles import check_deployable

    run = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                    federated=federated_config("fedmf", rounds=1, aggregation="contributors"))
    with pytest.raises(FedrecError, match="simulator only"):
        check_deployable(run)


def test_samples_step_each_row_by_its_summed_slot_gradients() -> None:
    """One batch a client: the item step on the batch's summed loss is the mean loss's step times
    the client's real slots (positives and their negatives)."""
    uploads = {}
    for rule in ("contributors", "samples"):
        alg = _algorithm("fedmf", rule, clients_per_round=5)
        alg.keep_uploads = True
        plan = alg.plan(1)
        alg.begin_round(plan)
        uploads[rule] = alg.local_update(plan).per_client
    train_rows = alg.split.train
    negatives = alg.cfg.negatives
    for mean, summed in zip(uploads["contributors"], uploads["samples"], strict=True):
        slots = (train_rows.indptr[mean.client + 1] - train_rows.indptr[mean.client]) * (1 + negatives)
        assert slots <= alg.cfg.batch_size  # one batch: one step, linear in the rate
        torch.testing.assert_close(summed.tensors[ITEMS], mean.tensors[ITEMS] * slots, rtol=1e-4, atol=1e-6)
