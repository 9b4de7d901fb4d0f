"""Batched PyTorch training of a centralised recommender, driven by the one round driver.

Each epoch draws fresh training negatives for every positive (vectorised), shuffles, and
steps through minibatches. The driver (`fedrec.core.run_rounds`) evaluates on validation,
scores the test set when validation improves, and leaves the model at its best epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedrec.core.contract import Trainable
from fedrec.core.device import check as check_device
from fedrec.core.driver import run_rounds
from fedrec.core.selection import TrainOutcome
from fedrec.options import FLOAT32_MAX, check
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord


@dataclass
class TrainConfig:
    """Options of the centralised loop (names follow RecBole where it has one)."""

    epochs: int = 50
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    negatives: int = 4
    patience: int = 10
    eval_every: int = 1
    device: str = "cpu"
    checkpoint_every: int = 0

    @property
    def rounds(self) -> int:
        """The round driver's rounds: a centralised round is one epoch."""
        return self.epochs

    def validate(self) -> None:
        """Reject impossible options, each in one line."""
        check(
            (not all(math.isfinite(v) for v in (self.lr, self.weight_decay)), "--lr and --weight-decay must be finite numbers"),
            (self.epochs < 1, f"--epochs must be >= 1 (got {self.epochs})"),
            (self.batch_size < 1, f"--batch-size must be >= 1 (got {self.batch_size})"),
            (self.lr <= 0, f"--lr must be > 0 (got {self.lr})"),
            (self.lr > FLOAT32_MAX, f"--lr must be at most {FLOAT32_MAX:.3g}, the largest float32 (the tensors' type)"),
            (self.weight_decay < 0, f"--weight-decay must be >= 0 (got {self.weight_decay})"),
            (self.negatives < 1, f"--num-negatives must be >= 1 (got {self.negatives})"),
            (self.patience < 0, f"--patience must be >= 0 (got {self.patience})"),
            (self.eval_every < 1, f"--eval-every must be >= 1 (got {self.eval_every})"),
            (self.checkpoint_every < 0, f"--checkpoint-every must be >= 0 (got {self.checkpoint_every})"),
        )
        check_device(self.device)

    def driver(self) -> dict[str, Any]:
        """How the round driver (`fedrec.core.run_rounds`) runs these options: an epoch a round,
        ending at the best epoch (the centralised baselines do not back off)."""
        return {"rounds": self.epochs, "eval_every": self.eval_every, "patience": self.patience,
                "checkpoint_every": self.checkpoint_every, "keep_best": True}


def model_scorer(model: nn.Module, device: str) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """Wrap a model with ``forward(users, items)`` and ``score_all(users)`` as a `Scorer`."""

    def score(users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        with torch.no_grad():
            u = torch.as_tensor(users, dtype=torch.long, device=device)
            out = model.score_all(u) if items is None else model(u, torch.as_tensor(items, device=device))
        return out.float().cpu().numpy()

    return score


class CentralisedModel(Trainable):
    """A centralised model as the round driver sees it: a round is one epoch over all training
    data (fresh negatives, a shuffle, Adam steps). Everything lives on the server; the
    generators are part of its state, so a resumed run replays the same epochs."""

    def __init__(self, model: nn.Module, split: Split, config: TrainConfig, seed: int = 0) -> None:
        self.model, self.split, self.config = model.to(config.device), split, config
        self.rng = np.random.default_rng([seed, 2])
        self.gen = torch.Generator().manual_seed(seed)
        self.rating_task = split.protocol.ranking == "rating"
        self.loss_fn = nn.MSELoss() if self.rating_task else nn.BCEWithLogitsLoss()
        self.opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.pairs = split.train_pairs()
        self._score = model_scorer(model, config.device)

    def train_round(self, r: int) -> RoundRecord:
        config, device = self.config, self.config.device
        u_all, i_all, y_all = _epoch_samples(self.split, *self.pairs, config.negatives,
                                             self.rating_task, self.rng)
        perm = torch.randperm(len(u_all), generator=self.gen, device="cpu")
        u_t = torch.as_tensor(u_all)[perm].to(device)
        i_t = torch.as_tensor(i_all)[perm].to(device)
        y_t = torch.as_tensor(y_all)[perm].to(device)
        self.model.train()
        total = 0.0
        for s in range(0, len(u_t), config.batch_size):
            sl = slice(s, s + config.batch_size)
            loss = self.loss_fn(self.model(u_t[sl], i_t[sl]), y_t[sl])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            total += loss.item() * len(u_t[sl])
        return RoundRecord(round=r, loss=total / max(len(u_t), 1), seconds=0.0)

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        self.model.eval()
        return self._score(users, items)

    def server_state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "rng": self.rng.bit_generator.state, "gen": self.gen.get_state()}

    def client_state_dict(self) -> dict[str, Any]:
        return {}  # one server holds everything

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.model.load_state_dict(blob["model"])
        self.opt.load_state_dict(blob["opt"])
        self.rng.bit_generator.state = blob["rng"]
        self.gen.set_state(blob["gen"])

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        pass


def train_centralised(
    model: nn.Module,
    split: Split,
    config: TrainConfig,
    seed: int = 0,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    **driver: Any,
) -> TrainOutcome:
    """Train ``model`` on ``split.train`` with the one round driver; return history and test
    metrics at the best epoch, and leave ``model`` with its weights of that epoch."""
    return run_rounds(CentralisedModel(model, split, config, seed), split, rounds=config.epochs,
                      eval_every=config.eval_every, patience=config.patience, on_round=on_round,
                      keep_best=True, **driver)


def _epoch_samples(split: Split, users: np.ndarray, items: np.ndarray, ratings: np.ndarray,
                   k: int, rating_task: bool, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positives plus ``k`` fresh negatives each (labels 1/0); ratings as targets for regression."""
    if rating_task:
        return users, items, ratings.astype(np.float32)
    negs = split.sample_negatives(users, k, rng)
    u = np.concatenate([users, np.repeat(users, k)])
    i = np.concatenate([items, negs.ravel()])
    y = np.concatenate([np.ones(len(users), np.float32), np.zeros(negs.size, np.float32)])
    return u, i, y
