"""One client trained alone, the plain way, for the lockstep engine's reference tests
(tests/test_metamf.py, tests/test_family_clip.py, tests/test_colr.py): its own parameters and item rows, mean BCE a
batch, each step's gradient clipped as ``clip_grad_norm_`` clips one model, plain SGD. It shares
nothing with the engine but the cohort's layout (which samples, rows and labels are the
client's, in the order it draws them)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.protocols import make_split
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import CohortBatches, build_cohort, order_by_activity


def small_split() -> Split:
    """40 users and 200 items, 3 or more interactions each: clients of several batch counts."""
    return make_split(to_implicit(synthetic(40, 200, mean_interactions=8, min_interactions=3, seed=4)),
                      "loo-sampled", seed=0)


def whole_cohort(split: Split, batch: int, epochs: int) -> CohortBatches:
    """Every user as one cohort, ordered by activity, 4 negatives a positive, ``epochs`` shuffles."""
    rng = np.random.default_rng(6)
    clients = order_by_activity(split.train, np.arange(split.n_users))
    counts = np.diff(split.train.indptr)[clients]
    negs = split.sample_negatives(np.repeat(clients, counts), 4, rng)
    return build_cohort(split.train, clients, negs, batch, rng.random((epochs, int(counts.sum()) * 5)))


def train_alone(params: dict[str, torch.Tensor], table: torch.Tensor, cohort: CohortBatches, k: int,
                forward: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor], *,
                lr: float, lr_item: float, batch: int, epochs: int, clip: float = 0.0,
                clipped: list[bool] | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Client ``k`` of ``cohort`` from ``params`` and its item rows ``table`` (in its row order):
    ``forward(params, rows)`` gives the logits of a batch's item rows. Each step's gradient over
    the parameters and the rows is clipped to ``clip`` (0: off; ``clipped`` gets whether it
    bound). Returns the trained parameters and rows."""
    mine = cohort.sample_client == k
    rows, labels = cohort.sample_row[mine] - cohort.row_ptr[k], cohort.sample_label[mine]
    per_epoch = len(rows) // epochs
    for e in range(epochs):
        for s in range(0, per_epoch, batch):
            sl = slice(e * per_epoch + s, e * per_epoch + min(s + batch, per_epoch))
            leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
            v = table.detach().requires_grad_(True)
            logits = forward(leaves, v[torch.as_tensor(rows[sl])])
            loss = F.binary_cross_entropy_with_logits(logits, torch.as_tensor(labels[sl]))
            grads = torch.autograd.grad(loss, [*leaves.values(), v])
            if clip:
                norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
                coef = float(clip / (norm + 1e-6))
                grads = tuple(g * min(coef, 1.0) for g in grads)
                if clipped is not None:
                    clipped.append(coef < 1.0)
            params = {n: t - lr * g for (n, t), g in zip(leaves.items(), grads[:-1], strict=True)}
            table = table - lr_item * grads[-1]
    return {n: t.detach() for n, t in params.items()}, table.detach()
