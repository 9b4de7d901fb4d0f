"""Client objectives: a term added to every client's local loss beside its data term, the
public client hook of the item-embedding family and MetaMF (``--client-objective``).

A term sees what a client downloaded from the server (its item rows and the shared weights) at
each local step, as they are now and as the round sent them, and returns its gradient; the
client steps by it at the tensor's own rate after the data term's step (its item rows at the
item rate, on the rows of the clients still training that step), or by the term's own `step`. FedProx's proximal term
(`Proximal`; the method ``fedprox``, `fedrec.algorithms.fedprox`) is one: (mu / 2) ||w - w_round||²,
gradient mu (w - w_round). A term is a frozen dataclass whose fields are its settings;
registering it by name (`register_objective`, in a module imported before a run names it, as
an algorithm's module is) makes it ``--client-objective NAME[:KEY=VALUE,...]`` for every
member, and a method that is defined by one takes it in its spec
(`fedrec.federated.family.spec.FamilySpec.objective`).
The gradient is not clipped by ``--set clip=``, which bounds the data term's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from fedrec.core.plan import cohort_size
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.options import parse_named, typed
from fedrec.rounds import draws
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES

#: the registered terms, by name (`register_objective`)
OBJECTIVES: dict[str, type[ClientObjective]] = {}


@dataclass(frozen=True)
class ClientObjective:
    """A term of each client's local objective (see the module docstring)."""

    #: its ``--client-objective`` name
    name: ClassVar[str] = ""
    #: whether it reads each client's own rows and each step's slots (`rows_step`, on what
    #: `cohort_rows` made of the cohort once)
    reads_rows: ClassVar[bool] = False
    #: whether it keeps what it saw of the server's table from round to round (`observe`)
    observes_table: ClassVar[bool] = False
    #: whether it also steps each client's user vector (`user_step`)
    steps_user: ClassVar[bool] = False

    def gradient(self, tensor: str, current: torch.Tensor, sent: torch.Tensor) -> torch.Tensor | None:
        """The term's gradient w.r.t. downloaded ``tensor`` (``items`` for the item rows, else a
        shared weight's name), given its ``current`` value and the value the round ``sent``
        (broadcastable to ``current``); None: the term does not involve it."""
        return None

    def step(self, tensor: str, current: torch.Tensor, sent: torch.Tensor, lr: float) -> torch.Tensor | None:
        """What a client subtracts from ``current`` for this term at rate ``lr``: ``lr`` times
        its `gradient` (a term may take its exact proximal step instead)."""
        g = self.gradient(tensor, current, sent)
        return None if g is None else g.mul_(lr)

    def check(self) -> None:
        """Reject impossible settings with one `FedrecError` (override)."""

    def refusal(self, spec: Any) -> str | None:
        """Why this term cannot train the member ``spec`` (a `FamilySpec`), or None."""
        return None

    def for_clients(self, n_clients: int, per_round: float) -> ClientObjective:
        """This term in a federation of ``n_clients`` of which ``per_round`` train a round (a
        fraction <= 1 or a count, as ``--clients-per-round``): a setting it derives from the
        participation resolved (the server's and the simulator's alike)."""
        return self

    def observe(self, table: torch.Tensor, memo: dict[str, torch.Tensor], r: int) -> None:
        """See the server's ``table`` at the start of round ``r`` and keep what the term needs
        in ``memo`` (the server's, kept in its checkpoints and sent to a Flower node's clients)."""

    def cohort_rows(self, row_ptr: np.ndarray, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                    row_items: np.ndarray, memo: Mapping[str, torch.Tensor], table: torch.Tensor,
                    summed: bool = False) -> Any:
        """What `rows_step` and `user_step` read of a cohort (its clients' local rows between
        ``row_ptr`` entries, of items ``row_items``; its ``steps``), made once; None: the term
        does nothing for it. ``table``: the server's table as the round sent it; ``summed``:
        the item rows step on the batch's summed loss, not its mean (``--aggregation samples``)."""
        return ClientRows.of(row_ptr, steps)

    def rows_step(self, rows: torch.Tensor, view: Any, step: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  ids: np.ndarray, key: tuple[int, ...], lr: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The term's step at ``rows`` for one lockstep step (the active clients' slots ``step``;
        ``view``: `cohort_rows`'; ``ids``: the run's id of each of the cohort's clients, the
        draws' keys): the local rows it moves and what is added to each (``-lr`` times the
        gradient), or None."""
        return None

    def user_step(self, view: Any, user: torch.Tensor, lr: float) -> torch.Tensor | None:
        """What the step's active clients subtract from their ``user`` vectors (as they were
        when the step began) for this term, at rate ``lr``; None: nothing."""
        return None

    def download_bytes(self, view: Any, row_ptr: np.ndarray, width: int) -> int:
        """What the cohort (its clients' local rows between ``row_ptr`` entries, of ``width``
        numbers) downloads for this term beyond its own rows."""
        return 0

    def text(self) -> str:
        """The ``--client-objective`` string that parses back to this term."""
        settings = ",".join(f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self))
        return self.name + (":" + settings if settings else "")


def register_objective(cls: type[ClientObjective]) -> type[ClientObjective]:
    """Make ``cls`` a ``--client-objective`` (a class decorator)."""
    if not cls.name or cls.name in OBJECTIVES:
        raise ValueError(f"client objective {cls.__name__} needs a name of its own (got {cls.name!r})")
    OBJECTIVES[cls.name] = cls
    return cls


def parse_objective(text: str) -> ClientObjective:
    """``NAME`` or ``NAME:KEY=VALUE,...`` (e.g. ``prox:mu=0.01``) as a term; one `FedrecError`
    line for a bad name, key or value."""
    name, values = parse_named(text, "--client-objective")
    if name not in OBJECTIVES:
        raise UnknownNameError("client objective", name, list(OBJECTIVES))
    settings = {f.name for f in dataclasses.fields(OBJECTIVES[name])}
    term = OBJECTIVES[name](**typed(OBJECTIVES[name], values, f"--client-objective {name}", only=settings))
    term.check()
    return term


@register_objective
@dataclass(frozen=True)
class Proximal(ClientObjective):
    """FedProx's proximal term (Li et al., MLSys 2020): (mu / 2) ||w - w_round||² over what the
    client downloaded, which holds its local steps near the round's model."""

    name: ClassVar[str] = "prox"
    #: the term's weight (0: FedAvg)
    mu: float = 0.01

    def check(self) -> None:
        if not self.mu >= 0:
            raise FedrecError(f"--client-objective prox: mu must be >= 0 (got {self.mu})")

    def gradient(self, tensor: str, current: torch.Tensor, sent: torch.Tensor) -> torch.Tensor | None:
        return (current - sent).mul_(self.mu)

    def step(self, tensor: str, current: torch.Tensor, sent: torch.Tensor, lr: float) -> torch.Tensor | None:
        """The term's exact proximal step, w <- (w + lr mu w_round) / (1 + lr mu): it moves w
        towards the round's value by lr mu / (1 + lr mu) of the gap, never past it, where a
        gradient step (lr mu of the gap) overshoots once lr mu > 1; and item rates here run to
        30 and more (fedrec's rule) or thousands (the papers')."""
        shrink = lr * self.mu / (1.0 + lr * self.mu)
        return (current - sent).mul_(shrink)


@dataclass
class ClientRows:
    """A cohort's local rows by role, for a term that reads each client's own rows (`Contrast`):
    each client's positives and negatives (local row indices, ascending, grouped by client:
    client k's at ``pos[pos_ptr[k]:pos_ptr[k+1]]``)."""

    pos: np.ndarray
    pos_ptr: np.ndarray
    neg: np.ndarray
    neg_ptr: np.ndarray

    @staticmethod
    def of(row_ptr: np.ndarray, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> ClientRows:
        """The roles from a round's steps: a local row is a positive where a real slot of it is
        labelled 1 (every positive is a slot of every epoch), a negative otherwise."""
        positive = np.zeros(int(row_ptr[-1]), bool)
        for idx, y, m in steps:
            take = ((y > 0) & (m > 0)).cpu().numpy()
            positive[idx.cpu().numpy()[take]] = True
        owner = np.repeat(np.arange(len(row_ptr) - 1), np.diff(row_ptr))

        def grouped(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            counts = np.bincount(owner[rows], minlength=len(row_ptr) - 1)
            return rows, np.concatenate([[0], np.cumsum(counts)])

        pos, pos_ptr = grouped(np.flatnonzero(positive))
        neg, neg_ptr = grouped(np.flatnonzero(~positive))
        return ClientRows(pos, pos_ptr, neg, neg_ptr)


@register_objective
@dataclass(frozen=True)
class Contrast(ClientObjective):
    """UNION's client-side term (Yu et al., "Untargeted Attack against Federated Recommendation
    Systems via Poisonous Item Embeddings and the Defense", AAAI 2023; official code
    yflyl613/FedRec, read at f45cecb, never copied): a contrastive task that spreads the item rows
    a client holds towards a uniform distribution, so that ClusterAttack's pull of the rows into
    a few dense clusters works against every honest client, and UNION's server filter
    (``--defence union``) can tell the attackers' tables apart by their uniformity.

    At each local step, every positive slot of a client's batch is an anchor a; its candidates
    are one other of the client's positives p and ``negatives`` K of its negatives n_1..n_K; the
    term is ``alpha`` times the cross-entropy of the scores <e_a, e_c> with p the right answer,
    averaged over the client's anchors of the step. Each anchor's draws are keyed by (seed,
    round, epoch, batch, client) and its place among the client's anchors of the batch in item
    order, so a client draws the same in any cohort, layout or process. Its gradient on the client's rows is taken at
    the rows the step starts from and applied with the data term's (one SGD step on their sum, as
    the official client does), at the item rate.

    One departure, for leak-free training: the official client draws the K negatives from every
    item the client never rated (validation and test items included); here they are drawn,
    with replacement, from the client's negatives of the round (the leak-free sampler's draws,
    rows it downloads anyway), so the term touches no row beyond the client's. A client with one
    positive has no anchor. UNION as published is
    ``--defence union --client-objective union``.
    """

    name: ClassVar[str] = "union"
    #: it reads each client's own rows and the step's slots (`rows_step`), not a tensor's value
    reads_rows: ClassVar[bool] = True
    #: the term's weight. The official ALPHA is 1, which diverges in the second round of FedMF on
    #: ML-100K under the papers' item-row rule (per-client item rate 13,456: the term's gradient
    #: grows with the rows, the data term's does not), 0.03 in round 12; 0.003 costs 0.011 of
    #: validation NDCG@10 over 100 rounds, 0.01 0.037 (docs/security.md)
    alpha: float = 0.003
    #: negatives a candidate set (the official K)
    negatives: int = 15

    def check(self) -> None:
        if not self.alpha >= 0 or self.negatives < 1:
            raise FedrecError(f"--client-objective union: alpha must be >= 0 and negatives >= 1 "
                              f"(got {self.alpha:g}, {self.negatives})")

    def text(self) -> str:
        return f"{self.name}:alpha={self.alpha:g},negatives={self.negatives}"

    def refusal(self, spec: Any) -> str | None:
        if spec.loss == "mse":
            return (f"--client-objective {self.name} contrasts a client's positives with its negatives; "
                    "a fit to ratings has no negatives")
        return None

    def rows_step(self, rows: torch.Tensor, roles: ClientRows, step: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  ids: np.ndarray, key: tuple[int, ...], lr: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        idx, y, m = step
        if self.alpha == 0:
            return None
        k_of, slot = torch.nonzero((y > 0) & (m > 0), as_tuple=True)
        anchors, k = idx[k_of, slot].cpu().numpy(), k_of.cpu().numpy()
        order = np.lexsort((anchors, k))  # client by client, each client's in item order (any layout's)
        anchors, k = anchors[order], k[order]
        n_pos = np.diff(roles.pos_ptr)[k]
        n_neg = np.diff(roles.neg_ptr)[k]
        ok = (n_pos >= 2) & (n_neg >= 1)
        if not ok.any():
            return None
        anchors, k, n_pos, n_neg = anchors[ok], k[ok], n_pos[ok], n_neg[ok]
        per_client = np.bincount(k)
        held = np.flatnonzero(per_client)
        u = draws.uniforms(key, ids[held], per_client[held] * (1 + self.negatives)).reshape(len(anchors), -1)
        # the positive: one of the client's others (its own index skipped)
        own = np.searchsorted(roles.pos, anchors) - roles.pos_ptr[k]
        j = np.minimum((u[:, 0] * (n_pos - 1)).astype(np.int64), n_pos - 2)
        positive = roles.pos[roles.pos_ptr[k] + j + (j >= own)]
        jn = np.minimum((u[:, 1:] * n_neg[:, None]).astype(np.int64), n_neg[:, None] - 1)
        candidates = np.concatenate([positive[:, None], roles.neg[roles.neg_ptr[k][:, None] + jn]], 1)
        at_a = torch.as_tensor(anchors, device=rows.device)
        at_c = torch.as_tensor(candidates, device=rows.device)
        with torch.enable_grad():
            va = rows[at_a].detach().requires_grad_(True)
            vc = rows[at_c].detach().requires_grad_(True)
            scores = (vc * va[:, None, :]).sum(-1)
            ce = torch.logsumexp(scores, 1) - scores[:, 0]
            weight = torch.as_tensor(1.0 / per_client[k], dtype=ce.dtype, device=ce.device)
            ga, gc = torch.autograd.grad(self.alpha * (ce * weight).sum(), [va, vc])
        return (torch.cat([at_a, at_c.reshape(-1)]),
                torch.cat([ga, gc.reshape(-1, gc.shape[-1])]).mul_(-lr))


@dataclass
class PopularView:
    """What `Regula` reads of a cohort: which local rows are of popular items, and the popular
    rows as the round sent them (their rank weights folded in)."""

    #: each local row: whether its item is one of the mined popular ones
    popular: torch.Tensor
    #: sum over the popular items of w_k times their unit row (the cosines' pull)
    pull: torch.Tensor
    #: the popular rows' log-softmax over the dimensions, one row a popular item
    log_q: torch.Tensor
    #: the rank weights w_k, most popular first
    weights: torch.Tensor
    #: the rows step on the batch's summed loss (IPE summed over the slots), not its mean
    summed: bool = False


@register_objective
@dataclass(frozen=True)
class Regula(ClientObjective):
    """PIECK's defence (Zhang et al., "Manipulating Federated Recommender Systems: Poisoning
    with Synthetic Users and Its Countermeasures", ICDE 2024; official code junzhang-zj/PIECK,
    ``FedRecClientDefense`` of MF-FRS, read at dce13ce, never copied): two client-side terms
    against PIECK's attacks, which mine the items whose rows move most (the popular ones) and
    pull the target's row towards them (IPE) or towards users approximated from them (UEA).

    * **Mining.** The popular items are the ``size`` items whose rows moved most over the first
      ``window`` rounds, ||E_(1+window) - E_1||. The official client measures its own first
      epoch, one pass over the clients, so ``window`` 0 (the default) is the rounds of a pass,
      ceil(clients / clients a round): one at full participation, ten at a tenth. The change
      of the table every client downloads alike gives every client the same items, so the
      server mines them once and sends their ids and the rows a client lacks (the official
      clients download the whole table each round). They stay fixed, and the terms start in
      round 1 + ``window``. (A run resumed from a checkpoint
      without the term's memo measures from the first round it sees.)
    * **IPE** (``ipe`` times) -sum_k w_k mean_j cos(e_pk, e_j): at each local step, over the
      client's slots of unpopular items in its batch, with the popular rows e_pk as the round
      sent them (a constant), so every row a client trains is drawn towards the popular ones
      and a target pulled there stands out no more. w_k = (size - k + 1)² / sum_i i², k = 1 the
      most popular.
    * **UEA** (``uea`` times) -sum_k w_k KL(softmax(u) || softmax(e_pk)) / dim on the client's
      user vector u only, which pushes u's profile away from the popular rows' (an attacker
      approximates users from them).

    Both gradients are taken where the step starts and applied with the data term's, at the
    item rate and the user rate (one SGD step on the sum, as the official client).

    Departures: the official client starts UEA in its first epoch against ``size`` arbitrary
    items (a top-k of zeros); here neither term acts before the items are mined. The official
    mean over a client's data becomes the mean over its batch, as the data term's; under
    fedrec's per-sample rule (``--aggregation samples``: the rows step on the batch's summed
    loss, the user vector on its mean) IPE is summed over the batch's slots too, so the two
    terms keep the official ratio to the data term.
    """

    name: ClassVar[str] = "regula"
    reads_rows: ClassVar[bool] = True
    observes_table: ClassVar[bool] = True
    steps_user: ClassVar[bool] = True
    #: popular items mined (the official ``regula_size``)
    size: int = 10
    #: the IPE term's weight (the official ``ipe_mu``)
    ipe: float = 1.0
    #: the UEA term's weight (the official ``uea_mu``)
    uea: float = 1.0
    #: rounds over which the rows' movement is measured; 0: the rounds of one pass over the
    #: clients at the run's participation (`for_clients`)
    window: int = 0

    def check(self) -> None:
        if self.size < 1 or self.window < 0 or not self.ipe >= 0 or not self.uea >= 0:
            raise FedrecError(f"--client-objective regula: size must be >= 1, window >= 0 (0: one pass over "
                              f"the clients), ipe and uea >= 0 (got {self.size}, {self.window}, {self.ipe:g}, "
                              f"{self.uea:g})")

    def text(self) -> str:
        return f"{self.name}:size={self.size},ipe={self.ipe:g},uea={self.uea:g},window={self.window}"

    def for_clients(self, n_clients: int, per_round: float) -> Regula:
        """``window`` 0 as the rounds of one pass over the clients."""
        if self.window:
            return self
        return replace(self, window=-(-n_clients // cohort_size(n_clients, per_round)))

    def refusal(self, spec: Any) -> str | None:
        if self.uea > 0 and spec.user_shapes().get("user") != (spec.item_width,):
            return (f"--client-objective {self.name}: its UEA term steps a user vector as wide as the item "
                    "rows, which this algorithm's clients do not hold (give uea=0 for IPE alone)")
        return None

    def weights(self) -> torch.Tensor:
        """w_k = (size - k + 1)² / sum_i i², most popular first."""
        w = torch.arange(self.size, 0, -1, dtype=torch.float64) ** 2
        return (w / w.sum()).float()

    def observe(self, table: torch.Tensor, memo: dict[str, torch.Tensor], r: int) -> None:
        assert self.window > 0, "a pass's window is resolved by `for_clients` before the first round"
        if "popular" in memo:
            return
        if "start" not in memo:
            memo["start"], memo["since"] = table.clone(), torch.tensor(r)
        elif r >= int(memo["since"]) + self.window:
            moved = torch.linalg.vector_norm(table - memo.pop("start"), dim=1).cpu().numpy()
            del memo["since"]
            order = np.argsort(-moved, kind="stable")[: self.size]  # ties to the lower id
            memo["popular"] = torch.as_tensor(order, dtype=torch.int64)

    def cohort_rows(self, row_ptr: np.ndarray, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                    row_items: np.ndarray, memo: Mapping[str, torch.Tensor], table: torch.Tensor,
                    summed: bool = False) -> PopularView | None:
        if "popular" not in memo or (self.ipe == 0 and self.uea == 0):
            return None
        ids = memo["popular"].cpu().numpy()
        e = table[memo["popular"].to(table.device)]
        w = self.weights()[: len(ids)].to(table.device)
        unit = e / torch.linalg.vector_norm(e, dim=1, keepdim=True).clamp_min(1e-8)
        popular = torch.as_tensor(np.isin(row_items, ids), device=table.device)
        return PopularView(popular, w @ unit, torch.log_softmax(e, 1), w, summed)

    def download_bytes(self, view: PopularView, row_ptr: np.ndarray, width: int) -> int:
        """Each client's ``size`` popular ids and the popular rows it does not hold already."""
        held = int(view.popular.sum())  # the cohort's local rows of popular items
        clients, size = len(row_ptr) - 1, len(view.weights)
        return clients * size * INDEX_BYTES + (clients * size - held) * width * FLOAT_BYTES

    def rows_step(self, rows: torch.Tensor, view: PopularView, step: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  ids: np.ndarray, key: tuple[int, ...], lr: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """IPE's step on the active clients' slots of unpopular items: the gradient of
        -w_k cos(e_pk, e) in e is -(q / |e| - (q . e) e / |e|³) summed over k (q = sum_k w_k e_pk
        / |e_pk|), divided by the client's count of such slots (the mean; summed under
        ``view.summed``, as the data term)."""
        idx, _, m = step
        if self.ipe == 0:
            return None
        take = (m > 0) & ~view.popular[idx]
        k_of, slot = torch.nonzero(take, as_tuple=True)
        if len(k_of) == 0:
            return None
        local = idx[k_of, slot]
        e = rows[local]
        norm = torch.linalg.vector_norm(e, dim=1, keepdim=True).clamp_min(1e-8)
        pull = view.pull[None, :] / norm - ((e @ view.pull)[:, None] / norm**3) * e
        if view.summed:
            return local, pull.mul_(lr * self.ipe)
        count = take.sum(1)[k_of].to(rows.dtype)
        return local, pull.mul_((lr * self.ipe / count)[:, None])

    def user_step(self, view: PopularView, user: torch.Tensor, lr: float) -> torch.Tensor | None:
        """UEA's step: KL(p || q_k) with p = softmax(u) has gradient p (log p - log q_k - KL) in u."""
        if self.uea == 0:
            return None
        log_p = torch.log_softmax(user, 1)
        p = log_p.exp()
        gap = log_p[:, None, :] - view.log_q[None]  # (clients, popular, dim)
        kl = (p[:, None, :] * gap).sum(-1, keepdim=True)
        grad = -(self.uea / user.shape[1]) * torch.einsum("k,ckd->cd", view.weights, p[:, None, :] * (gap - kl))
        return grad.mul_(lr)
