"""Named evaluation protocols and the `Split` they turn a data set into.

A protocol fixes everything that decides a reported figure: how held-out items are chosen,
what they are ranked against, which metrics are computed, and which one selects the model.
The split also owns the training-negative sampler, because which items may serve as training
negatives is part of the protocol's leak-freedom (see `NEGATIVE_POLICIES`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.split import (
    TEST,
    TRAIN,
    VALID,
    global_time_split,
    held_out_by,
    leave_one_out,
    ratio_split,
)


@dataclass(frozen=True)
class Protocol:
    """How a data set is split and scored.

    ``ranking`` is ``sampled`` (rank each target among ``eval_negatives`` items the user never
    interacted with), ``full`` (rank against every item the user did not train on) or
    ``rating`` (predict held-out explicit ratings; RMSE) or ``rated`` (binarised ratings: a
    rated item is positive when its rating is >= ``positive_at``; rank the user's held-out rated
    items, as PersonalFR's NDCG does, and rank every item the user did not rate in training).
    """

    name: str
    description: str
    split: str
    ranking: str
    metrics: tuple[str, ...]
    select: str
    ks: tuple[int, ...] = (10,)
    eval_negatives: int = 99
    implicit: bool = True
    test_ratio: float = 0.2
    valid_ratio: float = 0.1
    positive_at: float | None = None


#: FedCIA's top-K metrics, under its own split and the one its file fixes
FEDCIA_METRICS = ("precision", "recall", "f1", "mrr", "ndcg")

PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in [
        Protocol(
            "loo-sampled",
            "leave-one-out by time (last = test, second-to-last = validation); the target is "
            "ranked among 99 items the user never interacted with, drawn once by seed "
            "(distinct for validation and test). PFedRec, FedRAP, GFed-PP, GPFedRec.",
            split="loo", ranking="sampled", metrics=("hr", "ndcg"), select="ndcg@10",
        ),
        Protocol(
            "loo-full",
            "leave-one-out by time; the target is ranked against every item the user did not "
            "train on (the validation item is also removed when testing).",
            split="loo", ranking="full", metrics=("hr", "ndcg", "mrr"), select="ndcg@10",
        ),
        Protocol(
            "time-full",
            "global temporal split (Ji et al., TOIS 2023): one cut-off time for every user, so no "
            "training interaction is later than a test one; the latest 20% of all interactions "
            "are the test set, the latest 10% before them validation, the rest training. Full "
            "ranking against every item the user did not train on; users with no interaction "
            "before the cut are not evaluated.",
            split="time", ranking="full", metrics=("hr", "ndcg", "mrr", "recall"), select="ndcg@10",
        ),
        Protocol(
            "ratio-full",
            "per-user random 80/20 split, 10% of training held out for validation; full "
            "ranking against all items the user did not train on. FedCIA.",
            split="ratio", ranking="full",
            metrics=FEDCIA_METRICS, select="f1@10",
        ),
        Protocol(
            "given-full",
            "the train/validation/test split the data set's file fixes (FedCIA's published "
            "ML-1M split: ml-1m-fedcia); full ranking against all items the user did not train "
            "on, FedCIA's metrics.",
            split="given", ranking="full",
            metrics=FEDCIA_METRICS, select="f1@10",
        ),
        Protocol(
            "given-rating",
            "the train/validation/test split the data set's files fix (MetaMF's Ciao split: "
            "ciao); RMSE of predicted ratings.",
            split="given", ranking="rating", metrics=("rmse",), select="rmse", implicit=False,
        ),
        Protocol(
            "ratio-rating",
            "per-user random 80/20 split of explicit ratings, 10% of training for validation; "
            "RMSE of predicted ratings. PersonalFR.",
            split="ratio", ranking="rating", metrics=("rmse",), select="rmse", implicit=False,
        ),
        Protocol(
            "ratio-rating-implicit",
            "per-user random 80/20 split of ratings, 10% of training for validation; a rated item "
            "is positive when rated >= 3.5 (Anime: 8; --threshold to change) and "
            "negative otherwise. rated-ndcg@10 ranks the user's held-out rated items (PersonalFR's "
            "NDCG); ndcg@10 and recall@10 rank every item not rated in training.",
            split="ratio", ranking="rated", metrics=("rated-ndcg", "ndcg", "recall"),
            select="rated-ndcg@10", implicit=False, positive_at=3.5,
        ),
    ]
}

#: Rating at or above which a rated item counts as positive under binarised-rating protocols,
#: for data sets whose scale is not MovieLens' 1-5 (PersonalFR's official code: 8 for Anime's 1-10)
POSITIVE_AT: dict[str, float] = {"anime": 8.0}

NEGATIVE_POLICIES: dict[str, str] = {
    "leak-free": "the default: 'exclude-candidates' under sampled protocols, 'train-only' under "
    "full ranking",
    "exclude-candidates": "items outside the user's training items and outside every evaluation "
    "candidate of the user (targets and sampled negatives): evaluation never sees an item that "
    "training pushed down",
    "train-only": "items outside the user's training items; held-out targets and evaluation "
    "negatives are drawn alike, so no candidate is favoured",
    "legacy-exclude-heldout": "LEAKY, for reproducing published figures only: items outside all "
    "the user's interactions, as the official PFedRec/GPFedRec/FedRAP code does; the held-out "
    "target is never pushed down while the evaluation negatives are",
}
#: other names of a policy: ``legacy`` is how `fedrec reproduce --negatives` calls the leaky one;
#: a run records the policy's own name, so results and cached runs do not depend on the alias
NEGATIVE_ALIASES: dict[str, str] = {"legacy": "legacy-exclude-heldout"}


def negative_policy(name: str) -> str:
    """The training-negative policy ``name`` names (an alias resolved); an unknown name is one
    error that lists the known ones."""
    name = NEGATIVE_ALIASES.get(name, name)
    if name not in NEGATIVE_POLICIES:
        raise UnknownNameError("negative policy", name, [*NEGATIVE_POLICIES, *NEGATIVE_ALIASES])
    return name


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise UnknownNameError("protocol", name, list(PROTOCOLS))
    return PROTOCOLS[name]


#: the largest cut-off ``--ks`` takes (a top K past a data set's items is refused with the data)
MAX_CUTOFF = 1_000_000


def with_cutoffs(protocol: Protocol, ks: Iterable[int], flag: str = "--ks") -> Protocol:
    """``protocol`` with its ranking metrics also taken at the cut-offs ``ks`` (`--ks`), beside
    its own: a paper that reports HR@20 is compared at 20, while the model is still chosen by
    the protocol's ``select`` figure, so the training and every figure at its own cut-offs stay
    what they are without them."""
    ks = tuple(ks)
    if not ks:
        return protocol
    if protocol.ranking == "rating":
        raise FedrecError(f"{flag} sets the cut-offs of ranking metrics, and protocol '{protocol.name}' "
                          "scores predicted ratings (RMSE)")
    if protocol.ranking == "sampled" and max(ks) > protocol.eval_negatives:
        raise FedrecError(f"{flag} {max(ks)}: under '{protocol.name}' a target is ranked among "
                          f"{protocol.eval_negatives + 1} items, so a top {max(ks)} holds every one; "
                          f"give cut-offs up to {protocol.eval_negatives}")
    return replace(protocol, ks=tuple(sorted(set(protocol.ks) | set(ks))))


def check_cutoffs(ks: object, where: str = "--ks") -> tuple[int, ...]:
    """``ks`` (a list or tuple: a results file's, a bench file's, Python's or numpy's integers)
    as sorted whole numbers, once each; one `FedrecError` naming ``where`` for anything else."""
    import operator

    try:
        whole = [operator.index(k) for k in ks if not isinstance(k, bool | np.bool_)]  # type: ignore[attr-defined]
        ok = isinstance(ks, list | tuple) and len(whole) == len(ks) and all(1 <= k <= MAX_CUTOFF for k in whole)
    except TypeError:
        ok = False
    if not ok:
        raise FedrecError(f"{where} takes cut-offs K such as 20 or 5,20 (whole numbers from 1 to {MAX_CUTOFF:,}), "
                          f"not {ks!r}")
    return tuple(sorted(set(whole)))


def parse_cutoffs(text: str, protocol: str | None = None) -> tuple[int, ...]:
    """``--ks``'s cut-offs from ``20`` or ``5,20`` (`check_cutoffs`); with ``protocol``, checked
    against it (`with_cutoffs`) and less its own (``--ks 10`` is the run without them)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and 1 <= int(p) <= MAX_CUTOFF for p in parts):
        check_cutoffs(text)  # the one line, naming what was given
    ks = check_cutoffs([int(p) for p in parts])
    if protocol is None:
        return ks
    own = get_protocol(protocol)
    with_cutoffs(own, ks)
    return tuple(k for k in ks if k not in own.ks)


def user_means(train: sp.csr_matrix, rows: np.ndarray | None = None) -> np.ndarray:
    """Each of ``rows``' (None: every row's) mean rating in ``train``, float32; the mean of
    every rating in ``train`` for a row without one. A client computes its own from its ratings
    (the rating baseline's offset, the cold items' fallback)."""
    sub = train if rows is None else train[np.asarray(rows, dtype=np.int64)]
    counts = np.diff(sub.indptr)
    sums = np.asarray(sub.sum(axis=1), dtype=np.float64).ravel()
    overall = float(train.data.mean()) if train.nnz else 0.0
    return np.where(counts > 0, sums / np.maximum(counts, 1), overall).astype(np.float32)


@dataclass(frozen=True)
class ColdFallback:
    """Ratings predicted for items no training rating names (``cold``, a mask over items): each
    user's ``value`` (its training mean) in place of the model's score, which for such an item
    is its row's untrained initial value. Leak-free: both come from the training ratings alone;
    in a federation a client knows its own mean, and the server which rows nobody trained."""

    cold: np.ndarray
    value: np.ndarray

    @staticmethod
    def user_means(train: sp.csr_matrix) -> ColdFallback:
        """Each user's training mean (the global mean for a user without one) on the items
        ``train`` never names."""
        return ColdFallback(np.asarray(train.getnnz(axis=0) == 0), user_means(train))


@dataclass
class EvalSet:
    """One evaluation stage (validation or test).

    ``users`` are the users with a target. Sampled ranking: ``candidates[k]`` holds the items
    ranked for ``users[k]``, the target in column 0. Full ranking: ``exclude`` marks items never
    ranked (training items, and validation items when testing). Rating: ``targets`` values, and
    where given a ``fallback`` for items no training rating names (`ColdFallback`).
    Rated: ``targets`` holds the held-out ratings, ``exclude`` as under full ranking.
    """

    users: np.ndarray
    targets: sp.csr_matrix
    candidates: np.ndarray | None = None
    exclude: sp.csr_matrix | None = None
    fallback: ColdFallback | None = None


@dataclass
class Split:
    """A data set under a protocol: training matrix, evaluation sets, negative sampler."""

    protocol: Protocol
    data: Interactions
    label: np.ndarray
    train: sp.csr_matrix
    valid: EvalSet
    test: EvalSet
    negatives: str
    sampler: ComplementSampler = field(repr=False)
    #: how the held-out rows were picked: "time", "random" (seeded) or "file" (`held_out_by`)
    held_out_by: str = "time"
    #: what preprocessing left out of the data's file (repeated pairs, filtered users), one
    #: line each, for the command line to say (`fedrec.experiment.prepare_split`)
    notes: tuple[str, ...] = ()

    @property
    def n_users(self) -> int:
        return self.data.n_users

    @property
    def n_items(self) -> int:
        return self.data.n_items

    def train_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(users, items, ratings) of the training interactions, grouped by user."""
        coo = self.train.tocoo()
        order = np.lexsort((coo.col, coo.row))
        return coo.row[order].astype(np.int64), coo.col[order].astype(np.int64), coo.data[order]

    def sample_negatives(self, users: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` training negatives for each entry of ``users``, under the split's policy."""
        return self.sampler.sample(users, k, rng)


def _csr(x: Interactions, mask: np.ndarray) -> sp.csr_matrix:
    m = sp.csr_matrix(
        (x.ratings[mask].astype(np.float32), (x.users[mask], x.items[mask])),
        shape=(x.n_users, x.n_items),
    )
    m.sum_duplicates()
    m.sort_indices()
    return m


def _rows_to_csr(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """The pattern (bool CSR) of ``cols[k]`` in row ``rows[k]``."""
    m = sp.csr_matrix((np.ones(cols.size, bool), (np.repeat(rows, cols.shape[1]), cols.ravel())), shape=shape)
    m.sum_duplicates()
    return m


def _union(train: sp.csr_matrix, *evals: EvalSet, block: int = 1 << 16) -> sp.csr_matrix:
    """The pattern (bool CSR) of each user's training items and sampled evaluation candidates,
    built a block of users at a time: a million users' 200 candidates each never pass through
    a full-size float or int64 COO."""
    parts = []
    for start in range(0, train.shape[0], block):
        stop = min(start + block, train.shape[0])
        shape = (stop - start, train.shape[1])
        part = sp.csr_matrix(train[start:stop], dtype=bool)
        for e in evals:
            lo, hi = np.searchsorted(e.users, [start, stop])
            part = part + _rows_to_csr(e.users[lo:hi] - start, e.candidates[lo:hi], shape)
        parts.append(part)
    union = sp.vstack(parts, format="csr") if parts else sp.csr_matrix(train.shape, dtype=bool)
    union.sort_indices()
    return union


def _binary(m: sp.csr_matrix) -> sp.csr_matrix:
    b = m.copy()
    b.data = np.ones_like(b.data)
    return b


def _draw_eval_negatives(
    sampler: ComplementSampler, users: np.ndarray, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``(len(users), 2n)``: n validation then n test negatives, distinct within each user.

    A user with fewer than 2n unseen items gets one set of n for both stages (as FedRAP's
    code does for everyone); fewer than n is an error naming the user.
    """
    short = sampler.n_allowed[users] < n
    if short.any():
        bad = users[np.argmax(short)]
        raise FedrecError(
            f"{sampler.named(bad)} has only {sampler.n_allowed[bad]} unseen items to draw the protocol's {n} "
            "evaluation negatives from; rank every item instead (a full-ranking protocol such as "
            "loo-full) or use a data set with more items")
    share = sampler.n_allowed[users] < 2 * n
    ids = _id_dtype(sampler.n_items)
    drawn = np.empty((len(users), 2 * n), dtype=ids)
    drawn[~share] = sampler.sample_distinct(users[~share], 2 * n, rng, ids)
    if share.any():
        once = sampler.sample_distinct(users[share], n, rng, ids)
        drawn[share] = np.concatenate([once, once], axis=1)
    return drawn


def _sampled_evalset(targets: sp.csr_matrix, users: np.ndarray, negs: np.ndarray) -> EvalSet:
    """Candidates = the user's single target in column 0, then its sampled negatives."""
    target = targets.indices[targets.indptr[users]]
    ids = _id_dtype(targets.shape[1])
    return EvalSet(users, targets, candidates=np.column_stack([target.astype(ids), negs.astype(ids)]))


def _id_dtype(n_items: int) -> type[np.integer]:
    """Item ids as stored in a split: int32 where they fit (half the memory of a million users'
    candidates); `fedrec.eval.evaluate` hands scorers int64, a chunk of users at a time."""
    return np.int32 if n_items < 2**31 else np.int64


def _too_little(p: Protocol) -> str:
    """Why a split of too little data holds nothing out, for the error that says so."""
    if p.split == "loo":
        return ("leave-one-out holds out a user's last two interactions, so it evaluates only "
                "users with at least 3, and the data has none")
    if p.split == "given":
        return "the data set's own split marks no row for it"
    if p.split == "time":
        return ("no user is active on both sides of the cut: each user the split evaluates needs an "
                "interaction before it (users who follow one another in time, as synthetic data's do, have none)")
    return ("a ratio split holds out a share of each user's interactions and always trains on one, so "
            "the data's users have too few to give this stage any (use users with more interactions)")


def make_split(
    x: Interactions,
    protocol: Protocol | str,
    *,
    seed: int = 0,
    negatives: str = "leak-free",
    tie_break: str = "later-row-later",
    repeats: bool = False,
) -> Split:
    """Apply ``protocol`` to preprocessed interactions (contiguous ids, one row per pair).

    ``repeats`` (legacy) splits the rows as they are, repeated (user, item) events included, as
    the official PFedRec, FedRAP and GFed-PP code splits Lastfm-2K's tag assignments: a user's
    held-out item may then also be one of its training positives, which a model that ranks its
    training items first hits without learning anything. Only for sampled leave-one-out (under
    full ranking such a target would be excluded from its own candidates); never the default.
    """
    p = get_protocol(protocol) if isinstance(protocol, str) else protocol
    negatives = negative_policy(negatives)
    if repeats and (p.split, p.ranking) != ("loo", "sampled"):
        raise FedrecError(f"splitting repeated events (legacy) needs a sampled leave-one-out "
                          f"protocol (loo-sampled), not {p.name}")
    pairs = x.users * x.n_items + x.items
    if not repeats and len(np.unique(pairs)) != len(pairs):
        raise FedrecError(
            "the data holds duplicate (user, item) pairs; deduplicate before splitting "
            "(a duplicate could put the same item in training and test)"
        )
    if p.split == "loo":
        label = leave_one_out(x, tie_break, seed)
    elif p.split == "given":
        if x.given_split is None:
            raise FedrecError(f"protocol {p.name} reads the split a data set's file fixes, and "
                              f"this data set has none ({'ciao' if p.ranking == 'rating' else 'ml-1m-fedcia'} has one)")
        label = x.given_split.astype(np.int8)
    elif p.split == "time":
        label = global_time_split(x, p.test_ratio, p.valid_ratio)
    else:
        label = ratio_split(x, p.test_ratio, p.valid_ratio, seed)
    train = _csr(x, label == TRAIN)
    if repeats:  # a pair's repeated training events are one positive (their sum is not a rating)
        train = _binary(train)
    valid_t = _csr(x, label == VALID)
    test_t = _csr(x, label == TEST)
    valid_users = np.flatnonzero(np.diff(valid_t.indptr))
    test_users = np.flatnonzero(np.diff(test_t.indptr))
    if p.split == "time":  # a user whose rows all fall after a cut has no history to rank from
        trained = np.diff(train.indptr) > 0
        valid_users, test_users = valid_users[trained[valid_users]], test_users[trained[test_users]]
    for stage, users, held in (("validation", valid_users, valid_t), ("test", test_users, test_t)):
        if len(users) == 0:  # nothing to select a round on or to report: said before training
            raise FedrecError(f"no user has a {stage} item under protocol {p.name}: {_too_little(p)}")
        if p.positive_at is not None and not (held.data >= p.positive_at).any():
            # a rated ranking looks for the held-out positives: without one every figure is NaN
            raise FedrecError(f"no {stage} rating is at or above {p.positive_at:g}, the positive threshold of "
                              f"protocol {p.name}, so there is nothing to rank; set the threshold with "
                              "--threshold T")
    train_b = _binary(train)
    rng = np.random.default_rng([seed, 1])

    if p.ranking == "sampled":
        if p.split != "loo":
            raise FedrecError("sampled ranking needs one target per user (a leave-one-out split)")
        everything = _binary(train + valid_t + test_t)
        users = np.union1d(valid_users, test_users)
        n = p.eval_negatives
        drawn = _draw_eval_negatives(ComplementSampler(everything, x.user_ids), users, n, rng)
        valid = _sampled_evalset(valid_t, valid_users, drawn[np.searchsorted(users, valid_users), :n])
        test = _sampled_evalset(test_t, test_users, drawn[np.searchsorted(users, test_users), n:])
    elif p.ranking in ("full", "rated"):
        valid = EvalSet(valid_users, valid_t, exclude=train_b)
        test = EvalSet(test_users, test_t, exclude=_binary(train + valid_t))
    else:
        valid = EvalSet(valid_users, valid_t)
        test = EvalSet(test_users, test_t)

    policy = negatives
    if policy == "leak-free":
        policy = "exclude-candidates" if p.ranking == "sampled" else "train-only"
    if policy == "exclude-candidates":
        if p.ranking != "sampled":
            raise FedrecError(
                "--negatives exclude-candidates needs sampled candidates; under full ranking "
                "every unseen item is a candidate (use train-only)"
            )
        forbidden = _union(train_b, valid, test)
    elif policy == "train-only":
        forbidden = train_b
    else:
        forbidden = train_b + _binary(valid_t) + _binary(test_t)
    sampler = ComplementSampler(forbidden, x.user_ids)
    return Split(p, x, label, train, valid, test, policy, sampler, held_out_by(x, p.split))
