"""The server's rule for item rows (`FederatedConfig.aggregation`): the papers' FedAvg over the
round's clients, or each row over the clients that sent it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split, train
from fedrec.federated.family.model import ITEMS


def _algorithm(name: str, aggregation: str, **engine: object):  # type: ignore[no-untyped-def]
    cfg = RunConfig(algorithm=name, dataset="synthetic:60x120", protocol="loo-full",
                    federated=federated_config(name, rounds=1, aggregation=aggregation, **engine))
    split = prepare_split(cfg)
    return build_trainable(cfg, split)[1]


ATTACKED = {"attack": "fedrecattack", "boost": 10.0, "malicious": 0.1}


@pytest.mark.parametrize(("name", "attack"), [("fedmf", {}), ("pfedrec", {}), ("fedmf", ATTACKED)])
def test_contributors_divide_each_row_by_the_clients_that_sent_it(name: str, attack: dict[str, object]) -> None:
    """Each row's summed deltas over the clients that sent it, an attacker's crafted rows
    counted as any client's."""
    kept = _algorithm(name, "contributors", clients_per_round=5, lr_item=960.0, **attack)
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
    n_users = kept.split.n_users
    assert any(u.client >= n_users for u in uploads.per_client) == bool(attack)
    kept.aggregate(uploads, plan)
    sent = senders > 0
    assert 0 < int(sent.sum()) < before.shape[0]  # rows sent by one client or several, some by none
    assert senders.max() > 1 and (senders == 1).any()
    expected = before.clone()
    expected[sent] += total[sent] / senders[sent, None]
    torch.testing.assert_close(kept.state.items, expected, rtol=1e-5, atol=1e-6)
    # the papers' rule on the same round divides by every client instead
    plain = _algorithm(name, "clients", clients_per_round=5, lr_item=960.0, **attack)
    plain.train_round(1)
    torch.testing.assert_close(plain.state.items, before + total / len(uploads.per_client), rtol=1e-5, atol=1e-6)


def test_the_papers_rule_keeps_keys_and_figures() -> None:
    """The papers' setting leaves ``aggregation`` out of a run's identity (keys made before
    the rule existed still match), and asking for the papers' rule by name trains the same."""
    from fedrec.federated.engine import FederatedConfig

    paper = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                      federated=federated_config("fedmf", rounds=2, paper=True))
    assert "aggregation" not in FederatedConfig.identity(paper.federated.__dict__)
    named = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                      federated=federated_config("fedmf", rounds=2, aggregation="clients"))
    assert named.federated.item_lr(120) == paper.federated.item_lr(120) == 0.1 * 120 * 80
    assert train(paper).result.history[-1].valid == train(named).result.history[-1].valid
    ours = RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                     federated=federated_config("fedmf", rounds=2))
    assert FederatedConfig.identity(ours.federated.__dict__)["aggregation"] == "samples"


def test_a_robust_rule_under_contributors_steps_each_row_by_its_estimate_over_the_rows_senders() -> None:
    """Under fedrec's item-row rules a defended row moves by the rule's estimate of its mean
    delta over the clients that sent it (here the coordinate-wise median, attackers among them)."""
    alg = _algorithm("fedmf", "contributors", clients_per_round=5, lr_item=960.0, defence="median", **ATTACKED)
    before = alg.state.items.clone()
    plan = alg.plan(1)
    alg.begin_round(plan)
    uploads = alg.local_update(plan)
    assert any(u.client >= alg.split.n_users for u in uploads.per_client)
    alg.aggregate(uploads, plan)
    expected = before.clone()
    by_row: dict[int, list[torch.Tensor]] = {}
    for u in uploads.per_client:
        for i, row in zip(u.items.tolist(), u.tensors[ITEMS], strict=True):
            by_row.setdefault(i, []).append(row)
    for i, rows in by_row.items():
        expected[i] += torch.quantile(torch.stack(rows), 0.5, dim=0)  # the middle one, or the two's mean
    assert any(len(rows) > 2 for rows in by_row.values())
    torch.testing.assert_close(alg.state.items, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("aggregation", "batch_size"),
                         [("clients", 256), ("contributors", 256), ("samples", 256), ("clients", 16), ("samples", 16)])
def test_an_attackers_row_budget_follows_the_honest_clients_step_under_every_rule(aggregation: str,
                                                                                  batch_size: int) -> None:
    """The attacker's honest-norm budget (its cover client's step) is of the size of the rows
    the round's honest clients send, whichever rule sets their step: under ``samples`` they
    step on the batch's summed loss, which a batch-mean cover step would undercut about
    sixty-fold; under the batch mean their batches hold ``--batch-size`` samples, so a cover
    step taken over its 60 samples as one batch would be about a quarter of theirs at 16."""
    from fedrec.security.surrogate import Surrogate

    cfg = RunConfig(algorithm="fedmf", dataset="synthetic:200x300", protocol="loo-full",
                    federated=federated_config("fedmf", rounds=1, aggregation=aggregation, attack="fedrecattack",
                                               malicious=0.1, batch_size=batch_size))
    alg = build_trainable(cfg, prepare_split(cfg))[1]
    alg.keep_uploads = True
    plan = alg.plan(1)
    alg.begin_round(plan)
    uploads = alg.local_update(plan)
    honest = torch.cat([u.tensors[ITEMS].norm(dim=1) for u in uploads.per_client if u.client < alg.split.n_users])
    budget = alg.security.attack.budget(alg.state.items, 1, Surrogate.dot(alg.state.items.shape[1]))
    assert 0.5 < budget / float(honest.median()) < 2.0


def test_contributors_are_refused_where_they_do_not_apply() -> None:
    with pytest.raises(FedrecError, match="aggregates its own way"):
        _algorithm("gpfedrec", "contributors")
    for noise in ({"ldp": 0.1}, {"dp_noise": 1.0, "dp_clip": 1.0}):
        with pytest.raises(FedrecError, match="does not yet combine"):
            federated_config("fedmf", aggregation="contributors", **noise).validate()
    with pytest.raises(FedrecError, match="--aggregation must be one of"):
        federated_config("fedmf", aggregation="rows").validate()
    assert np.isfinite(train(RunConfig(algorithm="fedmf", dataset="synthetic:60x120", protocol="loo-full",
                                       federated=federated_config("fedmf", rounds=2, aggregation="contributors",
                                                                  lr_item=10.0))).result.test["hr@10"])


def test_backoffs_go_back_a_round_halve_the_rates_and_go_on() -> None:
    from fedrec.errors import Diverged

    def config(backoffs: int) -> RunConfig:
        return RunConfig(algorithm="fedmf", dataset="synthetic:40x200", protocol="loo-full",
                         federated=federated_config("fedmf", rounds=6, lr=1e3, backoffs=backoffs, paper=True))

    with pytest.raises(Diverged) as stopped:
        train(config(0))
    at = stopped.value.round
    done = train(config(30)).result
    assert done.status == "completed" and len(done.history) == 6
    rounds = done.extra["backoffs"]
    # its loss explodes (finite) before the unguarded run's turns non-finite
    assert rounds[0] <= at and rounds == sorted(rounds) and len(rounds) <= 30
    marked = {h.round: h.extra for h in done.history if "backoffs" in h.extra}
    assert sum(e["backoffs"] for e in marked.values()) == len(rounds)
    assert min(e["rate_scale"] for e in marked.values()) == 0.5 ** len(rounds)
    assert all(np.isfinite(h.loss) for h in done.history)


@pytest.mark.parametrize("keep_best", [False, True])
def test_a_large_state_backs_off_from_a_file_to_the_same_run(tmp_path, monkeypatch, keep_best) -> None:
    """A state over `SPILL_BYTES` waits for a back-off in a file beside the checkpoint, not as
    a copy in memory; the run backs off to the same states and ends as the run that kept them
    in memory, and leaves no file behind."""
    from fedrec.core import driver
    from fedrec.errors import Diverged

    def config() -> RunConfig:
        return RunConfig(algorithm="fedmf", dataset="synthetic:40x200", protocol="loo-full",
                         federated=federated_config("fedmf", rounds=12, lr=1e3, backoffs=30, paper=True,
                                                    checkpoint_every=1))

    in_memory = train(config(), keep_best=keep_best).result
    assert len(in_memory.extra["backoffs"]) >= 2  # a back-off to the initial state and to a later one
    monkeypatch.setattr(driver, "SPILL_BYTES", 0)
    ckpt = tmp_path / "run.ckpt"
    gone = tmp_path / ".run.ckpt.backoff-999999999-x"  # a killed process's (pids stop below this)
    gone.mkdir()
    (gone / "initial").write_bytes(b"0")
    beside: list[set[str]] = []

    def look(*_: object) -> None:
        beside.append({p.name for folder in tmp_path.glob(".run.ckpt.backoff-*") for p in folder.iterdir()})

    from_files = train(config(), checkpoint=ckpt, on_round=look, keep_best=keep_best).result
    assert from_files.extra["backoffs"] == in_memory.extra["backoffs"]
    assert [h.loss for h in from_files.history] == [h.loss for h in in_memory.history]
    assert from_files.test == in_memory.test and from_files.best_round == in_memory.best_round
    assert {"initial", "good"} in beside
    assert not list(tmp_path.glob(".run.ckpt.backoff-*"))  # its own folder, and the killed one's
    # two runs beside one checkpoint keep their states apart
    a, b = driver.BackoffStates(ckpt), driver.BackoffStates(ckpt)
    kept_a = a.keep({"w": torch.zeros(2)}, "initial")
    kept_b = b.keep({"w": torch.ones(2)}, "initial")
    assert kept_a.file != kept_b.file and a.restore(kept_a)["w"].sum() == 0 and b.restore(kept_b)["w"].sum() == 2
    a.remove(), b.remove()
    # a run that stops diverged removes its folder too
    with pytest.raises(Diverged):
        train(RunConfig(algorithm="fedmf", dataset="synthetic:40x200", protocol="loo-full",
                        federated=federated_config("fedmf", rounds=12, lr=1e3, backoffs=1, paper=True)),
              checkpoint=ckpt)
    assert not list(tmp_path.glob(".run.ckpt.backoff-*"))
    # a state the file cannot hold is kept in memory, as before, said once
    odd = driver.BackoffStates(ckpt)
    with pytest.warns(UserWarning, match="kept in memory"):
        kept = odd.keep({"w": torch.zeros(2), "tags": {"a"}}, "initial")
    assert kept.file is None and odd.restore(kept)["tags"] == {"a"}
    odd.remove()
    # without a checkpoint: a temporary folder of the run's own, removed when it ends
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("fedrec-backoff-*"))
    assert train(config()).result.extra["backoffs"] == in_memory.extra["backoffs"]
    assert set(Path(tempfile.gettempdir()).glob("fedrec-backoff-*")) == before


def test_a_resumed_run_keeps_the_rates_it_backed_off_to(tmp_path) -> None:
    def config(rounds: int) -> RunConfig:
        return RunConfig(algorithm="fedmf", dataset="synthetic:40x200", protocol="loo-full",
                         federated=federated_config("fedmf", rounds=rounds, lr=1e3, backoffs=30, paper=True,
                                                    checkpoint_every=1))

    ckpt = tmp_path / "run.ckpt"
    first = train(config(4), checkpoint=ckpt)
    halvings = len(first.result.extra["backoffs"])
    assert halvings >= 1
    assert first.model.state.lr == pytest.approx(1e3 * 0.5 ** halvings)
    resumed = train(config(6), checkpoint=ckpt, resume=True)
    assert resumed.result.extra["backoffs"][:halvings] == first.result.extra["backoffs"]
    later = len(resumed.result.extra["backoffs"]) - halvings
    assert resumed.model.state.lr == pytest.approx(1e3 * 0.5 ** (halvings + later))
    assert [h.round for h in resumed.result.history] == [1, 2, 3, 4, 5, 6]


def test_an_exploding_loss_backs_off_before_it_turns_non_finite() -> None:
    """With back-offs on, a round whose loss is over 1,000 times the lowest before is a
    divergence; without them the run goes on as before."""
    from fedrec.core import driver

    class Spiking:
        """A trainer whose round-3 loss spikes a million-fold at full rate."""

        max_rounds = None
        divergence_hint = "lower the rate"

        def __init__(self) -> None:
            self.rate, self.params = 1.0, {"w": torch.zeros(1)}

        def user_groups(self):  # type: ignore[no-untyped-def]
            return {}

        def state_dict(self):  # type: ignore[no-untyped-def]
            return {"w": self.params["w"].clone()}

        def load_state_dict(self, state) -> None:  # type: ignore[no-untyped-def]
            self.params = {"w": state["w"].clone()}

        def scale_rates(self, factor: float) -> bool:
            self.rate *= factor
            return True

        def train_round(self, r: int):  # type: ignore[no-untyped-def]
            from fedrec.results import RoundRecord

            return RoundRecord(round=r, loss=1e6 if (r == 3 and self.rate == 1.0) else 0.5, seconds=0.0)

        def evaluate(self, stage, split, mask=None):  # type: ignore[no-untyped-def]
            return {"hr@10": 0.1}

        def run_extra(self):  # type: ignore[no-untyped-def]
            return {}

    class NoSplit:
        class protocol:
            select = "hr@10"

    out = driver.run_rounds(Spiking(), NoSplit(), rounds=5, backoffs=2)  # type: ignore[arg-type]
    assert out.extra["backoffs"] == [3] and max(h.loss for h in out.history) == 0.5
    kept = driver.run_rounds(Spiking(), NoSplit(), rounds=5)  # type: ignore[arg-type]
    assert "backoffs" not in kept.extra and kept.history[2].loss == 1e6


@pytest.mark.parametrize("name", ["fedmf", "fedrap"])
def test_samples_step_each_row_by_its_summed_slot_gradients(name: str) -> None:
    """One batch a client: the item step on the batch's summed loss is the mean loss's step times
    the client's real slots (positives and their negatives); for FedRAP, C's step (its round-1
    regularisers are zero, so the step is linear in the gradient)."""
    uploads = {}
    for rule in ("contributors", "samples"):
        alg = _algorithm(name, rule, clients_per_round=5, lr_item=960.0, local_epochs=1)
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


def test_the_runs_note_says_which_options_can_take_fedrecs_rule(tmp_path, monkeypatch) -> None:
    """Without --aggregation, an attack, a defence or noise runs under the papers' rule; the
    note offers fedrec's rule where the options take it (an attack, a defence), not for noise."""
    from cli_outcome import said

    base = ["run", "fedmf", "-d", "synthetic:60x120", "--protocol", "loo-full", "--rounds", "1"]
    code, out = said(*base, "--attack", "fedrecattack", "-o", str(tmp_path / "a.json"))
    assert code == 0 and "note: --attack runs under the papers' item-row rule" in out
    assert "give --aggregation samples to run --attack under fedrec's rule" in out
    code, out = said(*base, "--ldp", "0.1", "-o", str(tmp_path / "b.json"))
    assert code == 0 and "note: --ldp runs under the papers' item-row rule" in out and "give --aggregation" not in out
    code, out = said(*base, "--attack", "fedrecattack", "--aggregation", "samples", "-o", str(tmp_path / "c.json"))
    assert code == 0 and "note:" not in out
    monkeypatch.chdir(tmp_path)  # runs/NAME.json, named by the options given
    code, out = said(*base, "--defence", "median")
    assert code == 0 and "give --aggregation samples to run --defence under fedrec's rule" in out
