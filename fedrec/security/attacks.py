"""Poisoning attacks by malicious clients, each a client of the engine that uploads item rows.

The attacker controls ``m`` extra clients (ids after the benign ones). Each round every sampled
malicious client downloads the global item table like any client and uploads row deltas for
at most ``attack_items`` rows (κ in FedRecAttack), so on the wire it looks like a benign
upload; each row's L2 norm is held to (at most) ``norm x boost``, ``norm`` the median row norm
of an honest step of the attacker's own cover client (`Attack.budget`), its few samples in a
batch of the run's size as an honest client's are (docs/security.md measures it against the
honest clients' rows).
The attacker scores items for the users it approximates with the run's own score function and
the global shared weights (`fedrec.security.surrogate`): MF's dot product, PFedRec's linear
layer, NeuMF for FedNCF.

Targeted (promote ``targets``):

* ``fedrecattack`` — FedRecAttack (Rong et al., ICDE 2022): user vectors approximated each round
  from the public share ``prior_knowledge`` of the interactions (BPR with the global table
  fixed), then the rows' gradient of Σ_u Σ_t g(s(u, k-th of u's top-K) - s(u, t)),
  g(x) = x for x >= 0 and e^x - 1 below, is uploaded as a descent step; each malicious
  client sends the targets and rows drawn once in proportion to their gradient norm;
* ``a-ra`` / ``a-hum`` — the attacks without prior knowledge of Rong, He and Chen (IJCAI 2022,
  "Poisoning deep learning based recommender model in federated learning scenarios"): the
  targets are made to score 1 for a few random users (``a-ra``), or for "hard" random users
  first trained to score them 0 (``a-hum``), by steps on the target rows *and the shared
  weights* (FedNCF's MLP and head). Under a dot product (FedMF, PFedRec) there are no shared
  weights and random users average out: these attacks are meant for deep models;
* ``pipattack`` — popularity in the spirit of PipAttack (Zhang et al., WSDM 2022): the target
  rows are pulled towards the direction of the items popular in the public interactions, at
  their typical length (a step of at most the row budget, so they settle there), and inherit
  what makes popular items recommended;
* ``pieck-ipe`` / ``pieck-uea`` — PIECK (Zhang et al., ICDE 2024; official code
  junzhang-zj/PIECK, read at dce13ce): no prior knowledge at all. The attacker mines the
  popular items from the table it downloads: over its first three looks it sums each row's
  change (the D-norm; popular items are trained by many clients, so their rows move most) and
  takes the top ``mined`` (the paper's N: 10 for IPE, 15 for UEA), sending nothing meanwhile.
  Then IPE pulls the targets towards the popular rows (it raises the mean positive and the mean
  negative of the rank-weighted cosines, w_k ∝ N − k + 1; the official τ only scales the
  step, whose length the row budget sets here) and UEA treats the popular rows as users who must like the targets (mean
  BCE of σ(v_p · v_t) against 1). Each uploads the descent direction on the target rows, at the
  row budget (the official code sends the raw gradient to a server that sums at rate 1, and its
  UEA adds up un-zeroed gradients: here the clean mean);
* ``poisonfrs`` — PoisonFRS (Yin, Xu, Fang and Gong, WWW 2024; official code mingyin1/PoisonFRS,
  read at 4bfdd0e): fake users with no prior knowledge. While the attacker's first `MINING_LOOKS`
  looks pass it sends nothing (the official code waits 50 of its 300 epochs for a trained
  table); then it estimates the popular items from the table alone, as the ``mined`` (5) rows
  with the *smallest* inner product with the mean row (the mean row points away from the users:
  rarely trained items are mostly sampled negatives), and fixes a target table W̃: the table of
  that look with each target's row set to ``scale`` (λ, 10) x the popular rows' mean. Each
  round every fake user uploads W̃ − V on the targets and on the ``attack_items`` − |T| other
  rows where it is longest (so the others are pulled back to the look's table), each row held
  to at most the row budget x ``boost`` (the official code sends it unbounded, a model
  replacement of the target row under the mean), plus its own Gaussian noise, standardised per
  row and of half the row budget's length (the official code's unit-variance noise is about
  half its target step at λ 10), so no two fake uploads are alike;
* ``boost`` — explicit boosting (Bhagoji et al., ICML 2019) by fake users: each trains an own
  user vector on a profile of the targets plus random filler items and scales its upload by
  ``boost``; ``random`` / ``bandwagon`` / ``popular`` — FedRecAttack's data-poisoning baselines,
  the same fake users unboosted, with fillers drawn at random, from popular items, or the
  popular items themselves.

Untargeted:

* ``clusterattack`` — ClusterAttack (Yu et al., AAAI 2023; official code yflyl613/FedRec, read at
  f45cecb): each round the attacker clusters the table it downloads into ``clusters`` groups
  (k-means, squared L2, starts drawn among the rows; the official code starts at 2 and its rule
  to change the count, which needs a net 100 rounds of one trend, stops at an undefined option
  when it first fires, so it is kept at 2 here) and uploads the descent step of the mean
  within-cluster distance: each row pulled towards its centroid. A row's length is drawn in
  [μ, μ + 3σ] of the honest row norms (those of the attacker's cover step, `Attack.budget`) x
  ``boost``, as the official code draws it (which may carry a row past its centroid); the
  official μ and σ are over every row of a dense gradient, most of them near zero, and here
  over the cover step's rows, so fedrec's lengths are longer. The official clients upload every row (its weight decay
  makes honest uploads dense); here each fake client sends ``attack_items`` rows drawn in
  proportion to their share of the loss, so it sends what a benign client sends;
* ``fedattack`` — FedAttack (Wu et al., 2022): each malicious client infers its user vector from
  a profile, labels the items it scores highest as negatives and those it scores lowest as
  positives ("globally hardest samples") and uploads the resulting step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedrec.federated.threats import ATTACKS, UNTARGETED
from fedrec.security.surrogate import Surrogate

__all__ = ["ATTACKS", "BUDGET_RULE", "UNTARGETED", "Attack", "Knowledge", "choose_targets", "public_share"]

#: how `Attack.budget` sizes its cover client's step: each sample a 1/`Knowledge.batch` share of
#: the loss, as in an honest client's batch. Recorded in every attacked cell of the attack
#: tables (`fedrec.reproduce.attacks.budget_change`); a cell without it was made when the
#: cover's own samples were its batch ("cover batch"), its x1 rows 4.5 to 6.9 times an
#: honest client's on ML-100K under the papers' rule
BUDGET_RULE = "honest batch"


@dataclass
class Knowledge:
    """What the attacker knows: the item count, its targets (sorted), the public interactions
    (a share of each user's training interactions, FedRecAttack's ξ) and the protocol's item
    rate."""

    n_items: int
    targets: np.ndarray
    public: sp.csr_matrix
    lr_item: float
    lr: float = 0.0  # the rate of the shared weights (FedNCF's MLP), for attacks that poison them
    #: the protocol's bound on an uploaded row step (``--clip``; None: none): no honest row is
    #: longer, so the attacker's honest-norm budget is held to it too (`Attack.budget`)
    row_clip: float | None = None
    #: how far an honest client's round moves a row's coordinate when its optimiser is Adam
    #: (PersonalFR: the rate x the local steps; an Adam step moves a coordinate by about the
    #: rate, in the sign of a steady gradient); None: one SGD step at ``lr_item``
    step_bound: float | None = None
    #: an honest client steps its item rows on its batch's summed loss, not its mean
    #: (``--aggregation samples``, `fedrec.federated.family.state.FamilyState.per_sample`)
    per_sample: bool = False
    #: how many samples an honest client's batch holds (`fedrec.security.adversary.honest_batch`):
    #: its loss is a mean over batches of this many, so the cover client's step
    #: (`Attack.budget`) gives each of its samples a 1/batch share too, as if its samples were
    #: spread over such batches; None: the cover's own samples are one batch
    batch: int | None = None

    def honest_step(self, grad: torch.Tensor, batch: int) -> torch.Tensor:
        """The row step an honest client takes on ``grad``, the gradient of a ``batch``-sample
        batch's mean loss: ``-lr_item x grad`` (``x batch`` under ``per_sample``: the summed
        loss's gradient), or under Adam (``step_bound``) ``-step_bound x sign(grad)``, the
        round's movement of a coordinate whose gradient keeps its sign."""
        if self.step_bound is not None:
            return -self.step_bound * grad.sign()
        return -self.lr_item * (grad * batch if self.per_sample else grad)

    @property
    def popularity(self) -> np.ndarray:
        """Interaction counts of the items in the public share."""
        return np.asarray(self.public.sum(0)).ravel()


@dataclass
class Poisoned:
    """One malicious upload: row deltas for ``items``, and deltas of shared weights by name
    (empty: the client sends the global weights back unchanged)."""

    items: np.ndarray
    rows: torch.Tensor
    shared: dict[str, torch.Tensor] = field(default_factory=dict)


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
    synthetic_users: int = 10
    hum_steps: int = 30
    fit_steps: int = 5
    fit_lr: float = 0.05
    #: std of the approximated users' start (FedRecAttack: N(0, std²)); None = the model's own
    init_std: float | None = None
    #: PIECK: the popular items it mines (None: the paper's N, 10 for IPE and 15 for UEA)
    mined: int | None = None
    _users: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _fit_round: int = field(default=-1, repr=False)  # the round ``_users`` were last fitted in
    _rows: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _own: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _profiles: list[np.ndarray] | None = field(default=None, repr=False)
    #: PIECK's mining: the last table seen, each row's summed change, the looks so far, the result
    _snapshot: torch.Tensor | None = field(default=None, repr=False)
    _moved: torch.Tensor | None = field(default=None, repr=False)
    _looks: int = 0
    _popular: np.ndarray | None = field(default=None, repr=False)
    #: PoisonFRS: λ, the target rows' length in popular rows' means, and its target table W̃
    scale: float = 10.0
    _goal: torch.Tensor | None = field(default=None, repr=False)
    #: ClusterAttack: the clusters it pulls the rows into
    clusters: int = 2

    def __post_init__(self) -> None:
        if self.name not in ATTACKS:
            raise ValueError(f"unknown attack '{self.name}'; known: {', '.join(ATTACKS)}")

    @property
    def targeted(self) -> bool:
        return self.name not in UNTARGETED

    def rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, 0xA77AC, *key])

    def state(self) -> dict[str, Any]:
        """What the attacker carries from round to round (a malicious Flower node keeps it)."""
        return {"users": self._users, "rows": self._rows, "own": self._own, "profiles": self._profiles,
                "snapshot": self._snapshot, "moved": self._moved, "looks": self._looks, "popular": self._popular,
                "goal": self._goal}

    def load_state(self, blob: dict[str, Any]) -> None:
        self._users, self._rows, self._own, self._profiles = (blob["users"], blob["rows"], blob["own"],
                                                              blob["profiles"])
        self._snapshot, self._moved = blob.get("snapshot"), blob.get("moved")
        self._looks, self._popular = int(blob.get("looks", 0)), blob.get("popular")
        self._goal = blob.get("goal")

    # -- the round ------------------------------------------------------------------------

    def uploads(self, table: torch.Tensor, clients: np.ndarray, r: int, model: Surrogate,
                norm: float | None = None) -> list[Poisoned]:
        """Round ``r``'s uploads of the sampled malicious ``clients`` (0-based among the
        malicious), given the global ``table`` they downloaded and the attacker's ``model`` of
        the score (`fedrec.security.surrogate`); ``norm``, the row-norm budget, defaults to
        `budget`."""
        if len(clients) == 0:
            return []
        q = table.detach().float().cpu()
        if self.name == "clusterattack":  # lengths from the honest norms' spread, not the budget
            pull = self._cluster_pull(q, r)
            norms = self._honest_norms(q, r, model)
            return [self._collapse(pull, norms, int(c), r) for c in clients]
        if norm is None:
            norm = self.budget(q, r, model)
        if self.name == "fedrecattack":
            grad = self._promotion_grad(q, r, model)
            return [Poisoned(*self._send(grad, int(c), norm)) for c in clients]
        if self.name in ("a-ra", "a-hum"):
            return [self._synthetic(q, int(c), r, norm, model) for c in clients]
        if self.name == "pipattack":
            return [Poisoned(*self._popularity(q, norm)) for _ in clients]
        if self.name in ("pieck-ipe", "pieck-uea"):
            popular = self.mine(q)
            if popular is None:  # still mining: an upload with no rows
                return [Poisoned(np.zeros(0, np.int64), q.new_zeros((0, q.shape[1]))) for _ in clients]
            step = self._pieck(q, popular, norm)
            return [Poisoned(self.know.targets, step.clone()) for _ in clients]
        if self.name == "poisonfrs":
            goal = self.goal(q)
            if goal is None:  # still waiting: an upload with no rows
                return [Poisoned(np.zeros(0, np.int64), q.new_zeros((0, q.shape[1]))) for _ in clients]
            return [self._replace(q, goal, int(c), r, norm) for c in clients]
        if self.name == "fedattack":
            return [Poisoned(*self._hardest(q, int(c), r, norm, model)) for c in clients]
        return [Poisoned(*self._fake_user(q, int(c), r, norm, model)) for c in clients]

    def forged_users(self, q: torch.Tensor, clients: np.ndarray, r: int, model: Surrogate
                     ) -> dict[str, torch.Tensor]:
        """The private parameters the malicious ``clients`` send where a method asks every client
        for them (PerFedRec's user vector, which the server clusters): each client sends those
        of one user it approximates from the public interactions (FedRecAttack's approximation,
        refitted once a round against the ``q`` it downloaded), a user with public interactions
        drawn once per client. The server then clusters it with the users like that one."""
        users, _ = self._approximate(q, r, model)
        public = np.flatnonzero(np.diff(self.know.public.indptr) > 0)
        pool = public if len(public) else np.arange(self.know.public.shape[0])
        pick = torch.as_tensor([int(self.rng(20, int(c)).choice(pool)) for c in clients], dtype=torch.int64)
        return {k: v[pick].clone() for k, v in users.items()}

    def _synthetic(self, q: torch.Tensor, c: int, r: int, norm: float, model: Surrogate) -> Poisoned:
        """A-ra / A-hum (Rong, He and Chen, IJCAI 2022): ``synthetic_users`` users drawn
        N(0, 0.01²) (A-hum: each first trained for ``hum_steps`` steps to score the targets 0,
        "hard users"), then the gradient of the mean BCE of the targets scored 1 for them, taken
        w.r.t. the target rows *and the shared weights*: through a shared MLP (FedNCF) the
        targets are made to score high whoever the user. Rows are sent as a step held to
        ``norm x boost``; the shared weights as a step of the run's rate x ``boost``."""
        t = torch.as_tensor(self.know.targets)
        users = model.draw(self.synthetic_users, self.rng(4, r, c), 0.01 if self.init_std is None else self.init_std)
        if self.name == "a-hum":
            for _ in range(self.hum_steps):
                leaves = {k: v.clone().requires_grad_(True) for k, v in users.items()}
                with torch.enable_grad():
                    s = model.logits(leaves, q[t])
                    loss = F.binary_cross_entropy_with_logits(s, torch.zeros_like(s))
                    grads = torch.autograd.grad(loss, list(leaves.values()))
                users = {k: (v - self.fit_lr * g).detach() for (k, v), g in zip(users.items(), grads, strict=True)}
        rows = q[t].clone().requires_grad_(True)
        shared = {k: v.detach().clone().requires_grad_(True) for k, v in model.shared.items()}
        with torch.enable_grad():
            s = Surrogate(model.spec, shared).logits(users, rows)
            loss = F.binary_cross_entropy_with_logits(s, torch.ones_like(s))
            grads = torch.autograd.grad(loss, [rows, *shared.values()])
        step = {k: -self.know.lr * self.boost * g for k, g in zip(shared, grads[1:], strict=True)}
        return Poisoned(self.know.targets, _held(-grads[0], norm * self.boost), step)

    def budget(self, q: torch.Tensor, r: int, model: Surrogate) -> float:
        """The row norm an honest client would send: the median row norm of the honest step of
        the attacker's *cover* client (`_honest_norms`)."""
        return float(self._honest_norms(q, r, model).median())

    def _honest_norms(self, q: torch.Tensor, r: int, model: Surrogate) -> torch.Tensor:
        """The row norms of the honest step of the attacker's *cover* client (a profile of κ/2
        random items as positives and as many random negatives, a user drawn as the run draws
        one, one BCE step at the run's item rate with each sample's loss a 1/batch share, as in
        an honest client's batch (`Knowledge.batch`; the cover's κ samples taken as the batch
        would make its rows about batch/κ times an honest client's) or, under
        ``--aggregation samples``, its summed loss (`Knowledge.honest_step`), each row held to
        the protocol's ``--clip`` as an honest client's is). It needs what any client holds and
        the data set's published statistics (the batch, `fedrec.security.adversary.honest_batch`),
        so a malicious Flower node computes the same norms as the simulator."""
        n = self.know.n_items
        pos = self.cover_items()
        free = np.setdiff1d(np.arange(n), pos)
        neg = self.rng(12, r).choice(free, min(len(pos), len(free)), replace=False)
        items = np.concatenate([pos, neg]).astype(np.int64)
        labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
        cover = model.draw(1, self.rng(13))
        batch = self.know.batch or len(items)  # each sample's share of an honest batch's mean loss
        v = q[torch.as_tensor(items)].clone().requires_grad_(True)
        with torch.enable_grad():
            loss = F.binary_cross_entropy_with_logits(model.logits(cover, v[None])[0], labels, reduction="sum") / batch
            (g,) = torch.autograd.grad(loss, [v])
        norms = self.know.honest_step(g, batch).norm(dim=1)
        return norms if self.know.row_clip is None else norms.clamp(max=self.know.row_clip)

    def cover_items(self) -> np.ndarray:
        """The positives of the attacker's *cover* client: κ/2 items drawn once from the
        attack's seed (unsorted, as drawn)."""
        n = self.know.n_items
        return self.rng(11).choice(n, min(max(1, self.attack_items // 2), n), replace=False)

    def _send(self, grad: torch.Tensor, c: int, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        """The targets and κ - T rows drawn once per client in proportion to their gradient
        norm (FedRecAttack), as a descent step clipped to ``norm x boost`` per row (the
        promotion gradients are far longer, so the rows go at the bound)."""
        if c not in self._rows:
            t = self.know.targets
            p = grad.norm(dim=1).double().cpu().numpy()
            p[t] = 0.0
            n_other = min(max(self.attack_items - len(t), 0), int((p > 0).sum()))
            other = (self.rng(1, c).choice(len(p), n_other, replace=False, p=p / p.sum())
                     if n_other else np.zeros(0, np.int64))
            self._rows[c] = np.sort(np.concatenate([t, other])).astype(np.int64)
        items = self._rows[c]
        return items, _clipped(-grad[torch.as_tensor(items)], norm * self.boost)

    def _promotion_grad(self, q: torch.Tensor, r: int, model: Surrogate) -> torch.Tensor:
        """Gradient w.r.t. the item rows of Σ_u Σ_t g(s(u, (K-t+1)-th of u's top K) - s(u, t)) over
        the approximated users (a user who already has a target is not its target)."""
        users, known = self._approximate(q, r, model)
        t = torch.as_tensor(self.know.targets)
        leaf = q.clone().requires_grad_(True)
        n = next(iter(users.values())).shape[0]
        block = max(1, (1 << 22) // max(1, q.numel()))
        for s0 in range(0, n, block):
            part = {k: v[s0 : s0 + block] for k, v in users.items()}
            with torch.enable_grad():
                s = model.logits(part, leaf)  # (b, n_items)
                masked = s.detach().clone()
                if known is not None:
                    rows, cols = known[s0 : s0 + block].nonzero()
                    masked[torch.as_tensor(rows), torch.as_tensor(cols)] = -torch.inf
                masked[:, t] = -torch.inf
                # the items the targets must beat: the K-th for the first target, the (K-1)-th for
                # the second, ... (FedRecAttack pops one of the user's top K per target)
                top = masked.topk(self.top_k, dim=1).indices
                beat = top[:, (self.top_k - 1 - torch.arange(len(t))).clamp(min=0)]  # (b, T)
                x = s.gather(1, beat) - s[:, t]  # (b, T)
                # g(x); exp of the clamped x: an overflowing exp in the unused branch would make the gradient NaN
                loss = torch.where(x >= 0, x, x.clamp(max=0).exp() - 1)
                if known is not None:
                    mine = np.asarray(known[s0 : s0 + block][:, self.know.targets].todense(), bool)
                    loss = loss * torch.as_tensor(~mine)
                loss.sum().backward()
        assert leaf.grad is not None
        return leaf.grad

    def _approximate(self, q: torch.Tensor, r: int, model: Surrogate
                     ) -> tuple[dict[str, torch.Tensor], sp.csr_matrix | None]:
        """FedRecAttack's approximated users (warm-started, refitted each round to the public
        interactions with the table fixed) and the interactions it knows they have."""
        pub = self.know.public
        if self._users is None:
            self._users = model.draw(pub.shape[0], self.rng(2), self.init_std)
        if self._fit_round != r:  # once a round, whoever asks first (the attack, `forged_users`)
            self._users = model.fit(self._users, q, pub, self.fit_steps, self.rng(3, r), self.fit_lr)
            self._fit_round = r
        return self._users, pub

    def _popularity(self, q: torch.Tensor, norm: float) -> tuple[np.ndarray, torch.Tensor]:
        pop = self.know.popularity.copy()
        pop[self.know.targets] = -1
        top = np.argsort(-pop, kind="stable")[: max(1, len(pop) // 10)]
        t = self.know.targets
        rows = q[torch.as_tensor(top)]
        centre = rows.mean(0, keepdim=True)  # the popular items' direction, at their typical length
        centre = centre * rows.norm(dim=1).mean() / centre.norm().clamp_min(1e-12)
        pull = centre - q[torch.as_tensor(t)]
        # boosted like any attack: the pull (and its cap) x boost, to outweigh the mean's dilution
        return t, _clipped(pull * self.boost, norm * self.boost)

    def mine(self, q: torch.Tensor) -> np.ndarray | None:
        """PIECK's popular items, from the tables the attacker downloads: each row's change
        summed over `MINING_LOOKS` - 1 consecutive looks, the top ``mined`` rows (targets left
        out) in decreasing order of change; None until the last look."""
        if self._popular is not None:
            return self._popular
        if self._snapshot is not None:
            moved = (q - self._snapshot).norm(dim=1)
            self._moved = moved if self._moved is None else self._moved + moved
        self._snapshot, self._looks = q.clone(), self._looks + 1
        if self._looks < MINING_LOOKS:
            return None
        assert self._moved is not None
        moved = self._moved.clone()
        moved[torch.as_tensor(self.know.targets)] = -torch.inf
        n = min(self.mined or (10 if self.name == "pieck-ipe" else 15), len(moved) - len(self.know.targets))
        self._popular = torch.argsort(moved, descending=True, stable=True)[:n].cpu().numpy().astype(np.int64)
        self._snapshot = self._moved = None
        return self._popular

    def _pieck(self, q: torch.Tensor, popular: np.ndarray, norm: float) -> torch.Tensor:
        """The target rows' step of PIECK's IPE or UEA loss (module docstring), held to the row
        budget x ``boost``."""
        p = q[torch.as_tensor(popular)]
        v = q[torch.as_tensor(self.know.targets)].clone().requires_grad_(True)
        with torch.enable_grad():
            if self.name == "pieck-ipe":
                n = len(popular)
                w = torch.arange(n, 0, -1, dtype=q.dtype) / (n * (n + 1) / 2)  # by decreasing change
                c = w[None, :] * F.cosine_similarity(v[:, None, :], p[None, :, :], dim=-1)  # (T, N)
                pos = (c > 0).to(c.dtype)
                # each subset's mean, or nothing where it is empty (the official τ scales this
                # loss, so only the step's length, which the row budget sets here)
                mean_pos = (c * pos).sum(1) / pos.sum(1).clamp(min=1)
                mean_neg = (c * (1 - pos)).sum(1) / (1 - pos).sum(1).clamp(min=1)
                loss = -(mean_pos + mean_neg).mean()
            else:
                s = p @ v.T  # the popular rows as users, (N, T)
                loss = F.binary_cross_entropy_with_logits(s, torch.ones_like(s))
            (g,) = torch.autograd.grad(loss, [v])
        return _held(-g, norm * self.boost)

    def goal(self, q: torch.Tensor) -> torch.Tensor | None:
        """PoisonFRS's target table W̃ (module docstring), fixed at the attacker's
        `MINING_LOOKS`-th look at the table ``q``; None before."""
        if self._goal is not None:
            return self._goal
        self._looks += 1
        if self._looks < MINING_LOOKS:
            return None
        t = torch.as_tensor(self.know.targets, device=q.device)
        s = q @ q.mean(0)
        s[t] = torch.inf
        n = min(self.mined or 5, len(s) - len(t))
        self._popular = torch.argsort(s, stable=True)[:n].cpu().numpy().astype(np.int64)
        goal = q.clone()
        goal[t] = self.scale * q[torch.as_tensor(self._popular, device=q.device)].mean(0)
        self._goal = goal
        return goal

    def _replace(self, q: torch.Tensor, goal: torch.Tensor, c: int, r: int, norm: float) -> Poisoned:
        """One fake user's PoisonFRS upload: W̃ − V on the targets and the rows where it is
        longest, each held to at most the row budget x ``boost``, plus the user's own noise."""
        delta = goal - q
        t = self.know.targets
        length = delta.norm(dim=1)
        length[torch.as_tensor(t, device=q.device)] = -torch.inf
        n_other = min(max(self.attack_items - len(t), 0), len(length) - len(t))
        other = torch.argsort(length, descending=True, stable=True)[:n_other].cpu().numpy()
        items = np.sort(np.concatenate([t, other])).astype(np.int64)
        bound = norm * self.boost
        rows = _clipped(delta[torch.as_tensor(items, device=q.device)], bound)
        gen = torch.Generator().manual_seed(int(self.rng(14, r, c).integers(2**62)))
        noise = torch.randn(rows.shape, generator=gen, dtype=rows.dtype, device="cpu").to(rows.device)
        noise = (noise - noise.mean(1, keepdim=True)) / noise.std(1, keepdim=True).clamp_min(1e-12)
        return Poisoned(items, rows + noise * (bound / (2 * rows.shape[1] ** 0.5)))

    def _cluster_pull(self, q: torch.Tensor, r: int) -> torch.Tensor:
        """Each row's pull towards its k-means centroid, c_l(i) − e_i (ClusterAttack's descent
        direction)."""
        from scipy.cluster.vq import kmeans2

        x = q.double().cpu().numpy()
        k = min(self.clusters, len(x))
        centroids, label = kmeans2(x, k, iter=50, minit="points", seed=self.rng(15, r))
        return torch.as_tensor(centroids[label] - x, dtype=q.dtype, device=q.device)

    def _collapse(self, pull: torch.Tensor, norms: torch.Tensor, c: int, r: int) -> Poisoned:
        """One fake client's ClusterAttack upload: ``attack_items`` rows drawn in proportion to
        their squared distance to their centroid, each a step towards it of a length drawn in
        [μ, μ + 3σ] of the honest row norms x ``boost``."""
        rng = self.rng(16, r, c)
        dist = pull.norm(dim=1).double().cpu().numpy()
        p = dist**2
        n = min(self.attack_items, int((p > 0).sum()))
        if not n:
            return Poisoned(np.zeros(0, np.int64), pull.new_zeros((0, pull.shape[1])))
        items = np.sort(rng.choice(len(p), n, replace=False, p=p / p.sum())).astype(np.int64)
        mu, sigma = float(norms.mean()), float(norms.std()) if len(norms) > 1 else 0.0
        length = torch.as_tensor((mu + rng.random(n) * 3.0 * sigma) * self.boost, dtype=pull.dtype,
                                 device=pull.device)
        rows = pull[torch.as_tensor(items, device=pull.device)]
        return Poisoned(items, rows * (length / rows.norm(dim=1).clamp_min(1e-12))[:, None])

    def _fake_user(self, q: torch.Tensor, c: int, r: int, norm: float,
                   model: Surrogate) -> tuple[np.ndarray, torch.Tensor]:
        """One full-batch BCE step of a fake user on its profile (positives) and as many random
        negatives, its item step scaled by ``boost`` (explicit boosting when boost > 1)."""
        if self._profiles is None:
            self._profiles = [self._profile(k) for k in range(self.n_malicious)]
            self._own = model.draw(self.n_malicious, self.rng(5))
        pos = self._profiles[c]
        neg = self.rng(6, r, c).choice(np.setdiff1d(np.arange(self.know.n_items), pos), len(pos), replace=False)
        items = np.concatenate([pos, neg]).astype(np.int64)
        labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
        return self._bce_step(q, c, items, labels, None if self.name == "boost" else norm, model, train_own=True)

    def declared(self) -> sp.csr_matrix:
        """The interactions each malicious client declares where a method's clients share
        theirs with the server (GFed-PP's public users), ``(n_malicious, n_items)``: a bandwagon
        profile, the targets and popular items it knows (`_profile`), so that it looks like
        the users who hold those items."""
        profiles = [self._profile(c, "bandwagon") for c in range(self.n_malicious)]
        rows = np.repeat(np.arange(self.n_malicious), [len(p) for p in profiles])
        cols = np.concatenate(profiles) if profiles else np.zeros(0, np.int64)
        return sp.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(self.n_malicious, self.know.n_items))

    def _profile(self, c: int, kind: str | None = None) -> np.ndarray:
        """Fake user ``c``'s positives by the shilling ``kind`` (default the attack's own name):
        the targets and ``attack_items`` / 2 items in all, the most popular known ones
        (popular), popular ones drawn at random (bandwagon) or any (random)."""
        kind = self.name if kind is None else kind
        rng, t, n = self.rng(7, c), self.know.targets, self.know.n_items
        size = max(self.attack_items // 2 - len(t), 0)
        pop = self.know.popularity.astype(float)
        pop[t] = -np.inf
        popular = np.argsort(-pop, kind="stable")[: max(size, n // 10)]
        if kind == "popular":
            return np.unique(np.concatenate([t, popular[:size]]))
        pool = popular if kind == "bandwagon" else np.setdiff1d(np.arange(n), t)
        return np.unique(np.concatenate([t, rng.choice(pool, min(size, len(pool)), replace=False)]))

    def _hardest(self, q: torch.Tensor, c: int, r: int, norm: float,
                 model: Surrogate) -> tuple[np.ndarray, torch.Tensor]:
        """FedAttack: the client's private parameters are inferred from its profile (20 items
        drawn once in proportion to public popularity, as a compromised ordinary user holds; BPR
        with the table fixed), then the items it scores highest are labelled negative and those
        it scores lowest positive."""
        if self._profiles is None:
            pop = self.know.popularity.astype(float) + 1.0
            self._profiles = [self.rng(8, k).choice(self.know.n_items, min(20, self.know.n_items), replace=False,
                                                    p=pop / pop.sum()) for k in range(self.n_malicious)]
            self._own = model.draw(self.n_malicious, self.rng(9))
        assert self._own is not None
        profile = sp.csr_matrix((np.ones(len(self._profiles[c])), (np.zeros(len(self._profiles[c]), int),
                                                                     self._profiles[c])), shape=(1, q.shape[0]))
        mine = model.fit({k: v[c : c + 1] for k, v in self._own.items()}, q, profile, self.fit_steps,
                         self.rng(10, r, c), self.fit_lr)
        for k, v in mine.items():
            self._own[k][c] = v[0]
        with torch.no_grad():
            s = model.logits(mine, q)[0]
        half = max(1, self.attack_items // 2)
        order = torch.argsort(s, descending=True)
        items = torch.cat([order[-half:], order[:half]]).cpu().numpy().astype(np.int64)
        labels = torch.cat([torch.ones(half), torch.zeros(half)])
        return self._bce_step(q, c, items, labels, norm, model, train_own=False)

    def _bce_step(self, q: torch.Tensor, c: int, items: np.ndarray, labels: torch.Tensor, norm: float | None,
                  model: Surrogate, train_own: bool) -> tuple[np.ndarray, torch.Tensor]:
        """The item step (and, with ``train_own``, the own parameters' step) of the batch-mean
        BCE (the item step on the summed BCE under ``--aggregation samples``), as a benign
        client of the engine takes it; held to ``norm x boost`` per row when
        ``norm`` is given, else multiplied by ``boost``."""
        assert self._own is not None
        order = np.argsort(items)
        items = items[order]
        labels = labels[torch.as_tensor(order)]
        v = q[torch.as_tensor(items)].clone().requires_grad_(True)
        own = {k: t[c : c + 1].clone().requires_grad_(True) for k, t in self._own.items()}
        with torch.enable_grad():
            loss = F.binary_cross_entropy_with_logits(model.logits(own, v[None])[0], labels)
            grads = torch.autograd.grad(loss, [v, *own.values()])
        if train_own:
            for (k, t), g in zip(own.items(), grads[1:], strict=True):
                self._own[k][c] = (t - 0.1 * g)[0].detach()
        delta = self.know.honest_step(grads[0], len(items))
        return items, (_held(delta, norm * self.boost) if norm is not None else delta * self.boost)


#: PIECK mines over this many looks at the table (the paper's R̃ = 2 changes, then it attacks);
#: PoisonFRS waits as many before it fixes its target table
MINING_LOOKS = 3


def _clipped(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """``rows`` each scaled down to L2 norm <= ``bound`` (a pull that must not overshoot)."""
    return rows * (bound / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)


def _held(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """``rows`` each scaled to L2 norm ``bound`` (a direction sent at the budget's length)."""
    return rows * (bound / rows.norm(dim=1, keepdim=True).clamp_min(1e-12))


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
