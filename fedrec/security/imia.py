"""IMIA: the interaction-level membership inference attack of Yuan et al. (WWW 2023; official
code hi-weiyuan/FedRec_IMIA, read at commit 0483d02, never copied).

An honest-but-curious server holds what it sent a client (the item rows, the shared weights)
and what came back (the rows' step). It does not know which of the client's rows are its
positives, nor the client's private parameters. It guesses: it labels a share of the rows
positive (the share the protocol's negatives imply, 1 / (1 + k)), trains a fresh copy of the
client's model on the guessed labels with the client's own settings, and compares each row's
simulated step with the step the client sent. A row whose two steps are close was labelled
right: a guessed positive is confirmed positive, a guessed negative negative. The closest
``confirm`` share of the rows is confirmed each pass; the unconfirmed rest is guessed again
(confirmed positives kept) until the expected number of positives is confirmed.

The simulation is the item family's plain local update (`fedrec.federated.family.state`): its
score function from freshly drawn private parameters, one joint SGD step a minibatch on the
batch-mean BCE, item steps at the item rate (times the batch's slots under the ``samples`` row
rule). It sees each row once a pass, where the client saw a negative as often as it was drawn;
PFedRec's two phases a batch are simulated as one. (The official attack trains with Adam and
compares whole tables; the family's clients step with SGD, which the attacker, who sets the
protocol, knows.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.federated.family.model import init_params


@dataclass
class IMIA:
    """The attack against one algorithm's clients (``spec``: its `FamilySpec`; ``shared``: the
    weights the server sends every client; the rates and batches its clients use)."""

    spec: Any
    #: the rows the server sent for the given items this round (read before it aggregates)
    rows_sent: Callable[[np.ndarray], torch.Tensor]
    shared: dict[str, torch.Tensor]
    lr: float
    lr_item: float
    per_sample: bool
    epochs: int
    batch_size: int
    #: the share of a client's rows guessed positive: 1 / (1 + negatives a positive)
    positive_share: float
    #: the share of the rows confirmed a pass (the official code's lam)
    confirm: float = 0.9
    #: passes at most
    passes: int = 10

    def guess(self, start: torch.Tensor, sent: torch.Tensor, seed: list[int]) -> np.ndarray:
        """Which of a client's rows (downloaded ``start``, sent step ``sent``, both ``(L,
        width)``) are its positives."""
        n = len(start)
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        expect = max(1, int(round(self.positive_share * n)))
        label = np.zeros(n, np.int8)  # confirmed: 1 positive, -1 negative, 0 not yet
        guessed = np.zeros(n, bool)
        guessed[rng.permutation(n)[:expect]] = True
        for _ in range(self.passes):
            step = self.simulate(start, torch.as_tensor(guessed, dtype=start.dtype), gen)
            distance = torch.linalg.vector_norm(step - sent, dim=1).cpu().numpy()
            budget = int(self.confirm * n)
            for row in np.argsort(distance, kind="stable"):
                if budget <= 0:
                    break
                if label[row] == 0:
                    label[row] = 1 if guessed[row] else -1
                    budget -= 1
            confirmed = int((label == 1).sum())
            if confirmed >= expect or not (label == 0).any():
                break
            open_rows = rng.permutation(np.flatnonzero(label == 0))
            guessed = label == 1
            guessed[open_rows[: expect - confirmed]] = True
        return label == 1

    def simulate(self, start: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The step a fresh client would send after training on ``labels`` from ``start``."""
        spec = self.spec
        params = init_params(spec, spec.private_names(), 1, gen)
        params.update({k: v[None].clone() for k, v in self.shared.items()})
        rows = start.clone()
        n = len(rows)
        for _ in range(self.epochs):
            order = torch.randperm(n, generator=gen, device="cpu")
            for s in range(0, n, self.batch_size):
                b = order[s : s + self.batch_size]
                leaves = {k: t.detach().requires_grad_(True) for k, t in params.items()}
                v = rows[b][None].requires_grad_(True)
                with torch.enable_grad():
                    logits = spec.scorer.logits(spec, leaves, v)
                    loss = F.binary_cross_entropy_with_logits(logits[0], labels[b])
                    got = torch.autograd.grad(loss, [v, *leaves.values()])
                scale = len(b) if self.per_sample else 1
                rows[b] -= self.lr_item * scale * got[0][0]
                for (k, t), g in zip(params.items(), got[1:], strict=True):
                    params[k] = t - self.lr * g
        return rows - start


def for_algorithm(algorithm: Any, negatives: int) -> IMIA | None:
    """The attack against ``algorithm``'s clients: the item family's, whose clients start a
    round from the global rows and rank with BCE (None for any other algorithm: FedRAP's and the
    graph methods' clients start from rows of their own, which it does not model)."""
    from fedrec.federated.family.state import FamilyState

    state = getattr(algorithm, "state", None)
    if type(state) is not FamilyState or state.spec.loss != "bce":
        return None
    cfg = algorithm.cfg

    def rows_sent(items: np.ndarray) -> torch.Tensor:
        return state.items[torch.as_tensor(items)].detach().float()

    return IMIA(state.spec, rows_sent, {k: v.detach() for k, v in state.shared.items()},
                float(state.lr), float(state.lr_item), bool(state.per_sample), int(cfg.local_epochs),
                int(cfg.batch_size), 1.0 / (1 + max(negatives, 0)))
