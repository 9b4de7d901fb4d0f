"""Batched PyTorch training of a centralised recommender with validation-based model selection.

Each epoch draws fresh training negatives for every positive (vectorised), shuffles, and
steps through minibatches. After each evaluation the model with the best validation figure is
kept in memory; the test set is scored once, at the end, with that model.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedrec.eval.evaluate import evaluate
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord
from fedrec.train.selection import Selection, TrainOutcome


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


def model_scorer(model: nn.Module, device: str) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """Wrap a model with ``forward(users, items)`` and ``score_all(users)`` as a `Scorer`."""

    def score(users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        with torch.no_grad():
            u = torch.as_tensor(users, dtype=torch.long, device=device)
            out = model.score_all(u) if items is None else model(u, torch.as_tensor(items, device=device))
        return out.float().cpu().numpy()

    return score


def train_centralised(
    model: nn.Module,
    split: Split,
    config: TrainConfig,
    seed: int = 0,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
) -> TrainOutcome:
    """Train ``model`` on ``split.train``; return history and test metrics at the best epoch."""
    device = config.device
    model.to(device)
    rng = np.random.default_rng([seed, 2])
    gen = torch.Generator().manual_seed(seed)
    rating_task = split.protocol.ranking == "rating"
    loss_fn = nn.MSELoss() if rating_task else nn.BCEWithLogitsLoss()
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    users, items, ratings = split.train_pairs()
    scorer = model_scorer(model, device)

    out = TrainOutcome()
    selection = Selection(split.protocol.select, config.patience, out)
    best_state = copy.deepcopy(model.state_dict())
    for epoch in range(1, config.epochs + 1):
        start = time.perf_counter()
        u_all, i_all, y_all = _epoch_samples(split, users, items, ratings, config.negatives, rating_task, rng)
        perm = torch.randperm(len(u_all), generator=gen)
        u_t = torch.as_tensor(u_all)[perm].to(device)
        i_t = torch.as_tensor(i_all)[perm].to(device)
        y_t = torch.as_tensor(y_all)[perm].to(device)
        model.train()
        total = 0.0
        for s in range(0, len(u_t), config.batch_size):
            sl = slice(s, s + config.batch_size)
            loss = loss_fn(model(u_t[sl], i_t[sl]), y_t[sl])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(u_t[sl])
        record = RoundRecord(round=epoch, loss=total / max(len(u_t), 1), seconds=0.0)
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            model.eval()
            record.valid = evaluate(scorer, split.valid, split.protocol)
            if selection.observe(epoch, record.valid):
                best_state = copy.deepcopy(model.state_dict())
        record.seconds = time.perf_counter() - start
        out.history.append(record)
        if on_round is not None:
            on_round(record, out.best_round, out.valid_at_best)
        if selection.should_stop:
            break
    model.load_state_dict(best_state)
    model.eval()
    out.test = evaluate(scorer, split.test, split.protocol)
    return out


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
