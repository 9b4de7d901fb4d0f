"""Poisoning attacks by malicious clients, each a client of the engine that uploads item rows.

The attacker controls ``m`` extra clients (ids after the benign ones). Each round every sampled
malicious client downloads the global item table like any client and uploads row deltas for
at most ``attack_items`` rows (κ in FedRecAttack), so on the wire it looks like a benign
upload; unless the attack boosts on purpose, each row's L2 norm is held to ``norm``, the median
row norm of the round's benign uploads (the attacker matches what normal clients send). The
attacker's surrogate of a user's score is the dot product of a user vector with the item row,
as in FedRecAttack (for PFedRec's linear score it is the same ranking).

Targeted (promote ``targets``):

* ``fedrecattack`` — FedRecAttack (Rong et al., ICDE 2022): user vectors approximated each round
  from the public share ``prior_knowledge`` of the interactions (BPR with the global table
  fixed), then the rows' gradient of Σ_u Σ_t g(s(u, k-th of u's top-K) - s(u, t)),
  g(x) = x for x >= 0 and e^x - 1 below, is uploaded as a descent step; each malicious
  client sends the targets and rows drawn once in proportion to their gradient norm;
* ``a-ra`` / ``a-hum`` — the attacks without prior knowledge of PSMU (Yin et al., SIGIR 2023):
  the same promotion loss over synthetic users drawn at random (``a-ra``), or mined as the users
  the targets rank worst for, by gradient steps from random draws (``a-hum``);
* ``pipattack`` — popularity in the spirit of PipAttack (Zhang et al., WSDM 2022): the target
  rows are pulled towards the mean row of the items popular in the public interactions (a
  step of at most the row budget, so they settle there), and inherit what makes popular items
  recommended;
* ``boost`` — explicit boosting (Bhagoji et al., ICML 2019) by fake users: each trains an own
  user vector on a profile of the targets plus random filler items and scales its upload by
  ``boost``; ``random`` / ``bandwagon`` / ``popular`` — FedRecAttack's data-poisoning baselines,
  the same fake users unboosted, with fillers drawn at random, from popular items, or the
  popular items themselves.

Untargeted:

* ``fedattack`` — FedAttack (Wu et al., 2022): each malicious client infers its user vector from
  a profile, labels the items it scores highest as negatives and those it scores lowest as
  positives ("globally hardest samples") and uploads the resulting step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

ATTACKS = ("fedrecattack", "a-ra", "a-hum", "pipattack", "boost", "random", "bandwagon", "popular",
           "fedattack")
UNTARGETED = ("fedattack",)


@dataclass
class Knowledge:
    """What the attacker knows: the item count, its targets (sorted), the public interactions
    (a share of each user's training interactions, FedRecAttack's ξ) and the protocol's item
    rate."""

    n_items: int
    targets: np.ndarray
    public: sp.csr_matrix
    lr_item: float

    @property
    def popularity(self) -> np.ndarray:
        """Interaction counts of the items in the public share."""
        return np.asarray(self.public.sum(0)).ravel()


@dataclass
class Attack:
    """One attack: ``uploads`` gives every sampled malicious client's (items, row deltas)."""

    name: str
    know: Knowledge
    n_malicious: int
    seed: int
    attack_items: int = 60
    boost: float = 1.0
    top_k: int = 10
    synthetic_users: int = 256
    fit_steps: int = 5
    fit_lr: float = 0.05
    init_std: float = 0.1
    _users: torch.Tensor | None = field(default=None, repr=False)
    _rows: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _own: torch.Tensor | None = field(default=None, repr=False)
    _profiles: list[np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name not in ATTACKS:
            raise ValueError(f"unknown attack '{self.name}'; known: {', '.join(ATTACKS)}")

    @property
    def targeted(self) -> bool:
        return self.name not in UNTARGETED

    def rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, 0xA77AC, *key])

    # -- the round ------------------------------------------------------------------------

    def uploads(self, table: torch.Tensor, clients: np.ndarray, r: int,
                norm: float) -> list[tuple[np.ndarray, torch.Tensor]]:
        """Round ``r``'s uploads of the sampled malicious ``clients`` (0-based among the
        malicious), given the global ``table`` they downloaded and the row-norm budget."""
        if len(clients) == 0:
            return []
        q = table.detach().float().cpu()
        if self.name in ("fedrecattack", "a-ra", "a-hum"):
            grad = self._promotion_grad(q, r)
            return [self._send(grad, int(c), norm) for c in clients]
        if self.name == "pipattack":
            return [self._popularity(q, norm) for _ in clients]
        if self.name == "fedattack":
            return [self._hardest(q, int(c), r, norm) for c in clients]
        return [self._fake_user(q, int(c), r, norm) for c in clients]

    def _send(self, grad: torch.Tensor, c: int, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        """The targets and κ - T rows drawn once per client in proportion to their gradient
        norm (FedRecAttack), as a descent step clipped to ``norm x boost`` per row (the
        promotion gradients are far longer, so the rows go at the bound)."""
        if c not in self._rows:
            t = self.know.targets
            p = grad.norm(dim=1).double().numpy()
            p[t] = 0.0
            n_other = min(max(self.attack_items - len(t), 0), int((p > 0).sum()))
            other = (self.rng(1, c).choice(len(p), n_other, replace=False, p=p / p.sum())
                     if n_other else np.zeros(0, np.int64))
            self._rows[c] = np.sort(np.concatenate([t, other])).astype(np.int64)
        items = self._rows[c]
        return items, _clipped(-grad[torch.as_tensor(items)], norm * self.boost)

    def _promotion_grad(self, q: torch.Tensor, r: int) -> torch.Tensor:
        """Gradient w.r.t. the item rows of the promotion loss over the approximated users."""
        users, known = self._approximate(q, r)
        t = torch.as_tensor(self.know.targets)
        scores = users @ q.T
        masked = scores.clone()
        if known is not None:
            rows, cols = known.nonzero()
            masked[torch.as_tensor(rows), torch.as_tensor(cols)] = -torch.inf
        masked[:, t] = -torch.inf
        kth = masked.topk(self.top_k, dim=1).indices[:, -1]  # the item a target must beat
        x = scores.gather(1, kth[:, None]) - scores[:, t]  # (U, T)
        slope = torch.where(x >= 0, torch.ones_like(x), x.exp())  # g'(x)
        if known is not None:  # a user who already has a target is not a target of the attack
            slope = slope * torch.as_tensor(~np.asarray(known[:, self.know.targets].todense(), bool))
        grad = torch.zeros_like(q)
        grad.index_add_(0, t, -(slope.T @ users))
        grad.index_add_(0, kth, slope.sum(1, keepdim=True) * users)
        return grad

    def _approximate(self, q: torch.Tensor, r: int) -> tuple[torch.Tensor, sp.csr_matrix | None]:
        """The users the promotion loss is over, and what the attacker knows they interacted
        with (None for synthetic users)."""
        d = q.shape[1]
        if self.name == "fedrecattack":
            pub = self.know.public
            if self._users is None:
                self._users = torch.as_tensor(self.rng(2).normal(0, self.init_std, (pub.shape[0], d)),
                                              dtype=torch.float32)
            self._users = fit_users(self._users, q, pub, self.fit_steps, self.rng(3, r), self.fit_lr)
            return self._users, pub
        u = torch.as_tensor(self.rng(4, r).normal(0, 1, (self.synthetic_users, d)), dtype=torch.float32)
        u = u / u.norm(dim=1, keepdim=True)
        if self.name == "a-hum":  # mine hard users: lower the targets' scores against the top items
            t = torch.as_tensor(self.know.targets)
            for _ in range(self.fit_steps):
                u = u.detach().requires_grad_(True)
                s = u @ q.T
                gap = s[:, t].mean(1) - s.topk(self.top_k, dim=1).values.mean(1)
                (g,) = torch.autograd.grad(gap.sum(), u)
                with torch.no_grad():
                    u = u - 0.1 * g * u.norm(dim=1, keepdim=True) / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
            u = u.detach()
        return u, None

    def _popularity(self, q: torch.Tensor, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        pop = self.know.popularity.copy()
        pop[self.know.targets] = -1
        top = np.argsort(-pop, kind="stable")[: max(1, len(pop) // 10)]
        t = self.know.targets
        pull = q[torch.as_tensor(top)].mean(0, keepdim=True) - q[torch.as_tensor(t)]
        return t, _clipped(pull, norm * self.boost)

    def _fake_user(self, q: torch.Tensor, c: int, r: int, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        """One full-batch BCE step of a fake user on its profile (positives) and as many random
        negatives, its item step scaled by ``boost`` (explicit boosting when boost > 1)."""
        if self._profiles is None:
            self._profiles = [self._profile(k) for k in range(self.n_malicious)]
            self._own = torch.as_tensor(self.rng(5).uniform(-1, 1, (self.n_malicious, q.shape[1])) / q.shape[1] ** 0.5,
                                        dtype=torch.float32)
        pos = self._profiles[c]
        neg = self.rng(6, r, c).choice(np.setdiff1d(np.arange(self.know.n_items), pos), len(pos), replace=False)
        items = np.concatenate([pos, neg]).astype(np.int64)
        labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
        return self._bce_step(q, c, items, labels, None if self.name == "boost" else norm)

    def _profile(self, c: int) -> np.ndarray:
        rng, t, n = self.rng(7, c), self.know.targets, self.know.n_items
        size = max(self.attack_items // 2 - len(t), 0)
        pop = self.know.popularity.astype(float)
        pop[t] = -np.inf
        popular = np.argsort(-pop, kind="stable")[: max(size, n // 10)]
        if self.name == "popular":
            return np.unique(np.concatenate([t, popular[:size]]))
        pool = popular if self.name == "bandwagon" else np.setdiff1d(np.arange(n), t)
        return np.unique(np.concatenate([t, rng.choice(pool, min(size, len(pool)), replace=False)]))

    def _hardest(self, q: torch.Tensor, c: int, r: int, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        """FedAttack: the client's user vector is inferred from its profile (here the mean row
        of its profile items, drawn once in proportion to public popularity, as a compromised
        ordinary user holds), then the items it scores highest are labelled negative and those
        it scores lowest positive."""
        if self._profiles is None:
            pop = self.know.popularity.astype(float) + 1.0
            self._profiles = [self.rng(8, k).choice(self.know.n_items, min(20, self.know.n_items), replace=False,
                                                    p=pop / pop.sum()) for k in range(self.n_malicious)]
            self._own = torch.zeros(self.n_malicious, q.shape[1])
        assert self._own is not None
        self._own[c] = q[torch.as_tensor(self._profiles[c])].mean(0)
        s = q @ self._own[c]
        half = max(1, self.attack_items // 2)
        order = torch.argsort(s, descending=True)
        hard_neg, hard_pos = order[:half], order[-half:]
        items = torch.cat([hard_pos, hard_neg]).numpy().astype(np.int64)
        labels = torch.cat([torch.ones(half), torch.zeros(half)])
        return self._bce_step(q, c, items, labels, norm)

    def _bce_step(self, q: torch.Tensor, c: int, items: np.ndarray, labels: torch.Tensor,
                  norm: float | None) -> tuple[np.ndarray, torch.Tensor]:
        """The item step (and the own user vector's step) of the batch-mean BCE, as a
        benign client of the engine takes it; held to ``norm x boost`` per row when ``norm`` is
        given, else multiplied by ``boost``."""
        assert self._own is not None
        v = q[torch.as_tensor(items)]
        u = self._own[c]
        g = (torch.sigmoid(v @ u) - labels) / len(items)
        self._own[c] = u - 0.1 * (g @ v)
        delta = -self.know.lr_item * g[:, None] * u[None, :]
        order = np.argsort(items)
        delta = delta[torch.as_tensor(order)]
        return items[order], (_held(delta, norm * self.boost) if norm is not None else delta * self.boost)


def _clipped(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """``rows`` each scaled down to L2 norm <= ``bound`` (a pull that must not overshoot)."""
    return rows * (bound / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)


def _held(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """``rows`` each scaled to L2 norm ``bound`` (a direction sent at the budget's length)."""
    return rows * (bound / rows.norm(dim=1, keepdim=True).clamp_min(1e-12))


def fit_users(users: torch.Tensor, q: torch.Tensor, public: sp.csr_matrix, steps: int,
              rng: np.random.Generator, lr: float = 0.05) -> torch.Tensor:
    """User vectors fitted by BPR to their public interactions with the item rows ``q`` fixed
    (FedRecAttack's approximation; warm-started from ``users``, ``steps`` Adam steps, one
    random negative a positive). Users without public interactions keep their vectors."""
    coo = public.tocoo()
    if coo.nnz == 0:
        return users
    u_idx, pos = torch.as_tensor(coo.row.astype(np.int64)), torch.as_tensor(coo.col.astype(np.int64))
    users = users.clone().requires_grad_(True)
    opt = torch.optim.Adam([users], lr=lr)
    for _ in range(steps):
        neg = torch.as_tensor(rng.integers(0, q.shape[0], coo.nnz))
        with torch.enable_grad():
            uv = users[u_idx]
            loss = F.softplus(-(uv * (q[pos] - q[neg])).sum(1)).sum()
            opt.zero_grad()
            loss.backward()
        opt.step()
    return users.detach()


def public_share(train: sp.csr_matrix, share: float, seed: int) -> sp.csr_matrix:
    """The attacker's prior knowledge: ceil(``share`` x n_u) of each user's training items,
    drawn at random (seeded), as FedRecAttack's ``train.part-ξ%`` files are made (so every user
    with an interaction has at least one public one when ``share`` > 0)."""
    train = sp.csr_matrix(train)
    counts = np.diff(train.indptr)
    take = np.ceil(counts * share).astype(np.int64)
    rank = np.empty(train.nnz, np.int64)
    keys = np.random.default_rng([seed, 0x9B11C]).random(train.nnz)
    owner = np.repeat(np.arange(train.shape[0]), counts)
    order = np.lexsort((keys, owner))  # each user's entries in a random order
    rank[order] = np.arange(train.nnz) - np.repeat(train.indptr[:-1], counts)
    keep = rank < np.repeat(take, counts)
    return sp.csr_matrix((np.ones(int(keep.sum()), bool), (owner[keep], train.indices[keep])), shape=train.shape)


def choose_targets(train: sp.csr_matrix, n: int, seed: int) -> np.ndarray:
    """``n`` target items drawn uniformly among the items (FedRecAttack draws them at random)."""
    return np.sort(np.random.default_rng([seed, 0x7A26E7]).choice(train.shape[1], n, replace=False)).astype(np.int64)
