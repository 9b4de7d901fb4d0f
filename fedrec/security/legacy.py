"""FedRecAttack's own federated setting, to reproduce its published anchor with fedrec's attack.

FedRecAttack (Rong et al., ICDE 2022) is measured on a federated BPR matrix factorisation that
differs from every method fedrec runs, and its headline figure (ML-100K, 5% malicious clients,
1% public interactions: ER@10 from 0.0054 to 0.7192 in 5 iterations) is a property of that
setting. This module simulates the setting as the paper and its code describe it, vectorised
over each server batch (our code, written from the description):

* items N(0, 0.01²), user vectors N(0, 0.01²), dimension 32;
* each client keeps one negative per training positive, drawn once at the start;
* an *iteration* shuffles all clients (benign and malicious) and walks them in batches of 256;
  each client of a batch takes the current table, computes the gradient of its summed BPR loss
  with L2 (0.1/2 on its user vector and the rows it holds), steps its user vector (lr 0.01) and
  uploads its row gradients; the server clips every row gradient to L2 norm 1, *sums* them, and
  steps the table by lr 0.01 x the sum;
* the malicious clients (``int(0.05 x n_users)``) upload FedRecAttack's rows
  (`fedrec.security.attacks.Attack`, ``fedrecattack``; the user approximation retrained once
  a batch from ceil(1%) of each user's training items);
* evaluation after each iteration: sampled HR@10 (the test item against 99 items outside the
  user's training items) and ER@5, ER@10 and the target's NDCG@10 over the users who never
  interacted with the target, items of the user's training and test sets never recommended.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.security.attacks import Attack, Knowledge, public_share
from fedrec.security.exposure import exposure
from fedrec.security.surrogate import Surrogate


@dataclass(frozen=True)
class LegacySetting:
    """FedRecAttack's hyper-parameters (its ``parse.py`` defaults)."""

    dim: int = 32
    lr: float = 0.01
    reg: float = 0.1
    grad_limit: float = 1.0
    batch_clients: int = 256
    init_std: float = 0.01
    malicious: float = 0.05
    items_limit: int = 60
    prior_knowledge: float = 0.01
    attack_lr: float = 0.01


def run_legacy(train: sp.csr_matrix, test_item: np.ndarray, targets: np.ndarray, iterations: int,
               seed: int = 0, attack: str | None = "fedrecattack",
               setting: LegacySetting = LegacySetting()) -> list[dict[str, float]]:
    """Iteration-by-iteration figures (iteration 0 = before training) of FedRecAttack's setting
    on ``train`` (users x items) with one test item per user (``test_item``, -1 for none)."""
    s = setting
    n_users, n_items = train.shape
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_items, s.dim, generator=gen, device="cpu") * s.init_std
    u = torch.randn(n_users, s.dim, generator=gen, device="cpu") * s.init_std
    train = sp.csr_matrix(train)
    counts = np.diff(train.indptr)
    owner = np.repeat(np.arange(n_users), counts)
    pos = train.indices.astype(np.int64)
    neg = _fixed_negatives(train, rng)
    n_mal = int(n_users * s.malicious) if attack else 0
    adversary = None
    model = Surrogate.dot(s.dim)
    if attack:
        know = Knowledge(n_items, np.asarray(targets, np.int64), public_share(train, s.prior_knowledge, seed), 1.0)
        adversary = Attack(attack, know, n_mal, seed, attack_items=s.items_limit, fit_steps=1, fit_lr=s.attack_lr,
                           init_std=s.init_std)
    test_known = train.copy().astype(bool).tolil()
    for user, item in enumerate(test_item):
        if item >= 0:
            test_known[user, item] = True
    known = sp.csr_matrix(test_known)
    figures = [_evaluate(u, q, train, known, test_item, targets, rng)]
    step = 0
    for _ in range(iterations):
        order = rng.permutation(n_users + n_mal)
        for b in range(0, len(order), s.batch_clients):
            batch = order[b : b + s.batch_clients]
            benign = np.sort(batch[batch < n_users])
            grad = _benign_grads(u, q, benign, counts, owner, pos, neg, s)
            if adversary is not None:
                bad = np.sort(batch[batch >= n_users] - n_users)
                for p in adversary.uploads(q, bad, step, model, norm=s.grad_limit):
                    grad.index_add_(0, torch.as_tensor(p.items), -p.rows)  # a delta is minus a gradient
            q -= s.lr * grad
            step += 1
        figures.append(_evaluate(u, q, train, known, test_item, targets, rng))
    return figures


def _fixed_negatives(train: sp.csr_matrix, rng: np.random.Generator) -> np.ndarray:
    """One negative per training positive, outside the user's training items, drawn once."""
    n_items = train.shape[1]
    out = np.empty(train.nnz, np.int64)
    for user in range(train.shape[0]):
        lo, hi = train.indptr[user], train.indptr[user + 1]
        allowed = np.setdiff1d(np.arange(n_items), train.indices[lo:hi])
        out[lo:hi] = rng.choice(allowed, hi - lo)
    return out


def _benign_grads(u: torch.Tensor, q: torch.Tensor, clients: np.ndarray, counts: np.ndarray, owner: np.ndarray,
                  pos: np.ndarray, neg: np.ndarray, s: LegacySetting) -> torch.Tensor:
    """The server's sum of the clients' clipped row gradients; steps their user vectors."""
    n_items = q.shape[0]
    sel = np.isin(owner, clients)
    o, p, n = torch.as_tensor(owner[sel]), torch.as_tensor(pos[sel]), torch.as_tensor(neg[sel])
    uo = u[o]
    x = (uo * (q[p] - q[n])).sum(1)
    dx = -torch.sigmoid(-x)  # d(-log sigmoid(x))/dx
    grad_u = torch.zeros_like(u).index_add_(0, o, dx[:, None] * (q[p] - q[n]))
    # each client's rows (positives and its negatives, once each) and their gradients
    keys = torch.cat([o * n_items + p, o * n_items + n])
    vals = torch.cat([dx[:, None] * uo, -dx[:, None] * uo])
    uniq, inv = torch.unique(keys, return_inverse=True)
    rows = torch.zeros(len(uniq), q.shape[1]).index_add_(0, inv, vals)
    row_item = uniq % n_items
    rows += s.reg * q[row_item]
    norms = rows.norm(dim=1, keepdim=True)
    rows = rows * (s.grad_limit / norms.clamp_min(1e-12)).clamp(max=1.0)
    c = torch.as_tensor(clients)
    grad_u[c] += s.reg * u[c]
    u[c] -= s.lr * grad_u[c]
    return torch.zeros_like(q).index_add_(0, row_item, rows)


def _evaluate(u: torch.Tensor, q: torch.Tensor, train: sp.csr_matrix, known: sp.csr_matrix, test_item: np.ndarray,
              targets: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    scores = (u @ q.T).cpu().numpy()
    users = np.flatnonzero(test_item >= 0)
    hits = 0
    for user in users:
        allowed = np.setdiff1d(np.arange(q.shape[0]), train.indices[train.indptr[user]:train.indptr[user + 1]])
        allowed = allowed[allowed != test_item[user]]
        cand = np.concatenate([[test_item[user]], rng.choice(allowed, 99, replace=False)])
        s = scores[user, cand]
        hits += int((s[1:] > s[0]).sum() < 10)
    out = {"hr@10": hits / max(len(users), 1)}
    out.update(exposure(lambda us, _: scores[us], known, np.asarray(targets), ks=(5, 10)))
    return out


