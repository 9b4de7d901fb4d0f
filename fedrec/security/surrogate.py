"""The attacker's model of a user's score: the run's own score function.

A malicious client is a client: it downloads the global item table and, for methods that
average their score function (FedNCF's MLP and head, MetaMF's generator), those shared weights
too. What it does not know are the benign users' private parameters (user vectors, PFedRec's
private linear layer). So the attacker scores an item for an *approximated* user by the run's
own score function (`fedrec.federated.family.scores`) with the approximated private parameters and
the global shared weights: a dot product for FedMF and FedRecon, PFedRec's linear layer, NeuMF
for FedNCF. Everything here is differentiable, so the attacks take their gradients by autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedrec.federated.family.model import score
from fedrec.federated.family.scores import get_score
from fedrec.federated.family.spec import FamilySpec


@dataclass
class Surrogate:
    """The run's score function with the global shared weights (``shared``, possibly empty)."""

    spec: FamilySpec
    shared: dict[str, torch.Tensor]

    @staticmethod
    def dot(dim: int) -> Surrogate:
        """Matrix factorisation's score (FedRecAttack's own model)."""
        return Surrogate(FamilySpec(score="dot", private_score=False, dual=False, dim=dim), {})

    @property
    def names(self) -> list[str]:
        """The private parameters an attacker has to approximate."""
        return self.spec.private_names()

    def draw(self, n: int, rng: np.random.Generator, std: float | None = None) -> dict[str, torch.Tensor]:
        """``n`` users drawn as the run draws a new client's private parameters (U(-b, b) with the
        model's bound, N(0, 1) where it uses that), or N(0, ``std``²) when ``std`` is given."""
        scorer = get_score(self.spec.score)
        shapes = {**self.spec.user_shapes(), **self.spec.score_shapes()}
        out = {}
        for name in self.names:
            shape = (n, *shapes[name])
            bound = scorer.init(self.spec, name)
            if std is not None:
                x = rng.normal(0.0, std, shape)
            elif bound is None:
                x = rng.normal(0.0, 1.0, shape)
            else:
                x = rng.uniform(-bound, bound, shape)
            out[name] = torch.as_tensor(x, dtype=torch.float32)
        return out

    def logits(self, users: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Scores ``(U, B)`` of item rows ``(U, B, width)`` (or ``(B, width)``, the same rows for
        every user) for ``users`` (each ``(U, ...)``)."""
        n = next(iter(users.values())).shape[0]
        if rows.dim() == 2:
            rows = rows.expand(n, *rows.shape)
        p = dict(users)
        p.update({k: v.expand(n, *v.shape) for k, v in self.shared.items()})
        return score(self.spec, p, rows)

    def fit(self, users: dict[str, torch.Tensor], q: torch.Tensor, known: sp.csr_matrix, steps: int,
            rng: np.random.Generator, lr: float) -> dict[str, torch.Tensor]:
        """``users`` fitted by BPR to the interactions in ``known`` with the item rows ``q`` fixed
        (FedRecAttack's approximation: ``steps`` Adam steps, one random negative a positive);
        users without known interactions keep their parameters."""
        coo = known.tocoo()
        if coo.nnz == 0 or steps == 0:
            return users
        u_idx = torch.as_tensor(coo.row.astype(np.int64))
        pos = torch.as_tensor(coo.col.astype(np.int64))
        leaves = {k: v.clone().requires_grad_(True) for k, v in users.items()}
        opt = torch.optim.Adam(list(leaves.values()), lr=lr)
        for _ in range(steps):
            neg = torch.as_tensor(rng.integers(0, q.shape[0], coo.nnz))
            with torch.enable_grad():
                p = {k: v[u_idx] for k, v in leaves.items()}
                rows = torch.stack([q[pos], q[neg]], dim=1)  # (P, 2, width)
                s = self.logits(p, rows)
                loss = F.softplus(-(s[:, 0] - s[:, 1])).sum()
                opt.zero_grad()
                loss.backward()
            opt.step()
        return {k: v.detach() for k, v in leaves.items()}
