"""The one round driver on a scripted trainer: selection, early stopping and resume."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

from fedrec.core.contract import Trainable
from fedrec.core.driver import run_rounds
from fedrec.errors import FedrecError
from fedrec.results import RoundRecord

#: validation figure after each round: best at round 3, then worse
VALID = [0.1, 0.2, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1, 0.1, 0.1]


class Scripted(Trainable):
    """Reports `VALID`; its state is the number of rounds trained."""

    def __init__(self) -> None:
        self.trained = 0

    def train_round(self, r: int) -> RoundRecord:
        self.trained = r
        return RoundRecord(round=r, loss=1.0 / r, seconds=0.0)

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        value = VALID[self.trained - 1]
        return {"hr@10": value if stage == "valid" else value / 2}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return np.zeros((len(users), 1))

    def server_state_dict(self) -> dict[str, Any]:
        return {"trained": self.trained}

    def client_state_dict(self) -> dict[str, Any]:
        return {}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.trained = blob["trained"]

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        pass


def _run(rounds: int, **kw: Any) -> tuple[Scripted, Any]:
    model = Scripted()
    return model, run_rounds(model, None, select="hr@10", rounds=rounds, **kw)


def test_test_figures_come_from_the_best_validation_round_and_the_best_model_is_kept():
    model, out = _run(8, keep_best=True)
    assert (out.best_round, out.valid_at_best, out.test) == (3, {"hr@10": 0.5}, {"hr@10": 0.25})
    assert model.trained == 3  # left in the state of the round whose figures are reported


def test_a_resumed_early_stopped_run_trains_no_further(tmp_path):
    ckpt = tmp_path / "c.ckpt"
    _, first = _run(10, patience=3, checkpoint=ckpt, checkpoint_every=1)
    assert len(first.history) == 6  # rounds 4, 5, 6 did not beat round 3
    model, again = _run(10, patience=3, checkpoint=ckpt, checkpoint_every=1, resume=True)
    assert len(again.history) == 6 and model.trained == 6


def test_a_checkpoint_without_the_best_model_is_not_resumed_as_if_it_had_it(tmp_path):
    ckpt = tmp_path / "c.ckpt"
    _run(5, checkpoint=ckpt, checkpoint_every=1)
    with pytest.raises(FedrecError, match="no copy of the model of its best round"):
        _run(8, checkpoint=ckpt, checkpoint_every=1, resume=True, keep_best=True)
    model, out = _run(8, checkpoint=ckpt, checkpoint_every=1, resume=True)
    assert out.best_round == 3 and model.trained == 8


def test_resume_refuses_another_run_and_garbage(tmp_path):
    ckpt = tmp_path / "c.ckpt"
    _run(4, checkpoint=ckpt, checkpoint_every=1, fingerprint={"seed": 0, "rounds": 4})
    with pytest.raises(FedrecError, match=r"seed \(checkpoint 0, now 1\)"):
        _run(6, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={"seed": 1})
    with pytest.raises(FedrecError, match="past the 3 rounds"):
        _run(3, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={"seed": 0})
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(FedrecError, match="not a fedrec checkpoint"):
        _run(6, checkpoint=ckpt, resume=True)


def test_a_checkpoint_is_compared_on_its_data_files_sha256_when_it_holds_one(tmp_path):
    """A checkpoint holds the sha256 of its data file: another file's is refused; one written
    before checkpoints held it is not compared on it."""
    ckpt = tmp_path / "c.ckpt"
    _run(3, checkpoint=ckpt, checkpoint_every=1, fingerprint={"seed": 0, "data_sha256": "aa"})
    with pytest.raises(FedrecError, match=r"data_sha256 \(checkpoint 'aa', now 'bb'\)"):
        _run(4, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={"seed": 0, "data_sha256": "bb"})
    _run(3, checkpoint=ckpt, checkpoint_every=1, fingerprint={"seed": 0})
    model, out = _run(4, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={"seed": 0, "data_sha256": "bb"})
    assert out.resumed_at == [3] and model.trained == 4


def test_a_checkpoint_holding_its_events_digest_is_compared_on_it_not_on_the_files_bytes(tmp_path):
    """Where both hold the events' content digest, a copy of the same events in another file
    (another sha256) resumes and other events are refused; a checkpoint written before
    checkpoints held the digest is compared on the file's sha256."""
    ckpt = tmp_path / "c.ckpt"
    both = {"seed": 0, "data_sha256": "aa", "data_content": "c1"}
    _run(3, checkpoint=ckpt, checkpoint_every=1, fingerprint=both)
    _, out = _run(4, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={**both, "data_sha256": "bb"})
    assert out.resumed_at == [3]
    with pytest.raises(FedrecError, match=r"data_content \(checkpoint 'c1', now 'c2'\)"):
        _run(5, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={**both, "data_content": "c2"})
    _run(3, checkpoint=ckpt, checkpoint_every=1, fingerprint={"seed": 0, "data_sha256": "aa"})
    with pytest.raises(FedrecError, match=r"data_sha256 \(checkpoint 'aa', now 'bb'\)"):
        _run(4, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={**both, "data_sha256": "bb"})
    _, out = _run(4, checkpoint=ckpt, checkpoint_every=1, resume=True, fingerprint={**both, "data_content": "c9"})
    assert out.resumed_at == [3]


class ScoresNaNFromRoundFour(Scripted):
    """A model whose scores turn NaN in round 4 while its loss stays finite (GPFedRec at a high
    rate did so on Lastfm-2K), ranked by the real metrics."""

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        from fedrec.eval.metrics import ranking_metrics

        scores = np.full((2, 5), np.nan if self.trained >= 4 else 0.5)
        ranking_metrics(scores, np.eye(2, 5, dtype=bool), ks=(1,), metrics=("hr",))
        return super().evaluate(stage, split, users)


def test_nan_scores_under_a_finite_loss_are_a_divergence_not_a_crash():
    """A run reports the divergence (a `FedrecError`, which `fedrec tune` scores as a diverged
    trial) instead of the metrics' error escaping from deep in the evaluation."""
    with pytest.raises(FedrecError, match=r"diverged in round 4 \(its scores are NaN"):
        run_rounds(ScoresNaNFromRoundFour(), None, select="hr@10", rounds=6)


class _Copy:
    """A stand-in for a state's tensors that counts how many copies of it are alive at once."""

    alive: weakref.WeakSet[_Copy] = weakref.WeakSet()
    most = made = 0

    def __init__(self) -> None:
        _Copy.alive.add(self)
        _Copy.most, _Copy.made = max(_Copy.most, len(_Copy.alive)), _Copy.made + 1

    def __deepcopy__(self, memo: dict[int, Any]) -> _Copy:
        return _Copy()


class Improving(Scripted):
    """Better on validation every round: every round is a best round."""

    def __init__(self) -> None:
        super().__init__()
        self.state = _Copy()

    def evaluate(self, stage: str, split: Any, users: np.ndarray | None = None) -> dict[str, float]:
        return {"hr@10": self.trained / 100}

    def server_state_dict(self) -> dict[str, Any]:
        return {"trained": self.trained, "state": self.state}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.trained, self.state = blob["trained"], blob["state"]


def test_the_driver_holds_at_most_four_copies_of_the_state():
    """Live, initial, the back-off's and the best round's: a new copy is made once the one it
    replaces is let go (a state of 2.9 GB, FedDAE's on ML-100K, held a fifth copy for a moment),
    and a round whose state is both the back-off's and the best round's is copied once."""
    model = Improving()
    _Copy.alive, _Copy.most, _Copy.made = weakref.WeakSet([model.state]), 1, 0
    out = run_rounds(model, None, select="hr@10", rounds=12, keep_best=True, backoffs=3)
    assert out.best_round == 12 and model.trained == 12
    assert _Copy.most == 4
    # the initial copy, one a best round (12), the back-off's at rounds 5 and 10 shared with them
    assert _Copy.made == 13
