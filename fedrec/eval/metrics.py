"""Top-K ranking metrics (vectorised over users) and RMSE.

Each user has a row of candidate scores (all items for full ranking, or e.g. 100 sampled
candidates); the ranking is the candidates sorted by decreasing score. With ``hits`` the number
of relevant candidates in the top K and ``|rel|`` the number of relevant candidates:

* HR@K = 1 if any relevant candidate is in the top K, else 0.
* Precision@K = hits / K (K, not the row length, even when the row has fewer than K
  candidates).
* Recall@K = hits / |rel|.
* NDCG@K = DCG@K / IDCG@K with binary gains: DCG@K = sum over positions j < K (0-based) of
  rel_j / log2(j + 2); IDCG@K is the same sum over the first min(|rel|, K) positions.
* MRR@K = 1 / (1-based rank of the first relevant candidate) if that rank is <= K, else 0.
* F1@K = 2 P R / (P + R) where P and R are the *means* over users of Precision@K and
  Recall@K (the definition FedCIA uses), not the mean of per-user F1 values.

Users with no relevant candidate are skipped; the number scored is reported under ``"users"``.
Excluded candidates (e.g. a user's training items in full ranking) are removed from the row
before ranking, so they are never recommended and never relevant.

Ties. Equal scores are common (untrained or constant scorers, quantised models), and breaking
them by item index would silently favour or penalise whichever item the split put first. By
default (``ties="random"``) every metric is the exact expectation under uniformly random
tie-breaking, as scikit-learn's ``ndcg_score`` does for NDCG, so that a constant scorer gets
exactly chance level. ``ties="pessimistic"`` places relevant candidates below every candidate
they tie with (the convention of the official PFedRec/FedRAP evaluation code) and
``ties="optimistic"`` above them; these two bracket the random value.

How the expectation is computed without enumerating orderings: only the top K values per row
are sorted. Every group of equal scores strictly above the K-th value lies wholly inside the
top K; the group equal to the K-th value (the boundary group) is counted over the whole row.
In a group of n candidates with m relevant, each of its positions holds a relevant candidate
with probability m / n, which gives expected hits and DCG by linearity. The top K miss every
relevant candidate only if all groups above the boundary have m = 0 and the t boundary slots
draw none of its m relevant: probability C(n - m, t) / C(n, t). The first relevant candidate
lies in the first group with m > 0, at offset i from its start with probability
C(n - i - 1, m - 1) / C(n, m). Both ratios are evaluated as running products of factors <= 1
(never as binomials), so large groups neither overflow nor lose precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp

__all__ = ["ALL_METRICS", "ranking_metrics", "rmse"]

ALL_METRICS: tuple[str, ...] = ("hr", "ndcg", "mrr", "precision", "recall", "f1")
_TIES = ("random", "pessimistic", "optimistic")
# Rows per chunk are chosen so that a chunk holds about this many score cells (~16 MB float64):
# small enough to stay in cache-friendly memory, large enough that NumPy overhead is negligible.
_CHUNK_CELLS = 1 << 21


def ranking_metrics(
    scores: np.ndarray,
    relevant: np.ndarray | sp.spmatrix | sp.sparray,
    ks: Sequence[int] = (10,),
    metrics: Sequence[str] = ALL_METRICS,
    exclude: np.ndarray | sp.spmatrix | sp.sparray | None = None,
    per_user: bool = False,
    ties: Literal["random", "pessimistic", "optimistic"] = "random",
) -> dict[str, float | np.ndarray]:
    """Top-K metrics of score rows against relevant candidates; see the module docstring.

    ``scores`` is (n_users, n_candidates); ``relevant`` and ``exclude`` are boolean arrays or
    sparse matrices of the same shape (any non-zero counts as true). Returns ``"users"`` (the
    number of users with at least one non-excluded relevant candidate) and ``"<metric>@<k>"``
    for every metric and k: the mean over scored users, or with ``per_user=True`` an array of
    length n_users that is NaN for skipped users (``f1`` stays the scalar from the means).
    Means are NaN when no user is scored.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D (users x candidates), got shape {scores.shape}")
    if not np.issubdtype(scores.dtype, np.floating):
        scores = scores.astype(np.float64)
    elif scores.dtype.itemsize < 4:
        scores = scores.astype(np.float32)
    n_users, n_cand = scores.shape
    rel_rows = _as_bool_rows(relevant, scores.shape, "relevant")
    excl_rows = None if exclude is None else _as_bool_rows(exclude, scores.shape, "exclude")
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be a non-empty sequence of positive integers, got {ks}")
    metrics = list(metrics)
    unknown = sorted(set(metrics) - set(ALL_METRICS))
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(ALL_METRICS)}")
    if ties not in _TIES:
        raise ValueError(f"ties must be one of {', '.join(_TIES)}, got {ties!r}")

    # f1 is derived from the precision and recall means, so compute those whenever f1 is asked.
    needed = set(metrics) | ({"precision", "recall"} if "f1" in metrics else set())
    needed.discard("f1")
    per = {f"{name}@{k}": np.full(n_users, np.nan) for k in ks for name in needed}
    scored = np.zeros(n_users, dtype=bool)
    kmax = max(ks)
    step = max(1, _CHUNK_CELLS // max(n_cand, 1))
    single = _single_relevant(relevant) if excl_rows is None else None
    for lo in range(0, n_users, step):
        hi = min(lo + step, n_users)
        if single is not None:
            scored[lo:hi] = True
            above, tied = _target_counts(scores[lo:hi], single[lo:hi])  # once a chunk, for every k
            for k in ks:
                for name, values in _one_relevant_at_k(above, tied, n_cand, k, needed, ties).items():
                    per[f"{name}@{k}"][lo:hi] = values
            continue
        excl = None if excl_rows is None else excl_rows(lo, hi)
        stats = _group_stats(scores[lo:hi], rel_rows(lo, hi), excl, kmax)
        scored[lo:hi] = stats.n_rel > 0
        for k in ks:
            for name, values in _metrics_at_k(stats, k, needed, ties).items():
                per[f"{name}@{k}"][lo:hi] = np.where(stats.n_rel > 0, values, np.nan)

    n_scored = int(scored.sum())
    out: dict[str, float | np.ndarray] = {"users": n_scored}
    for k in ks:
        means = {
            name: float(per[f"{name}@{k}"][scored].mean()) if n_scored else float("nan")
            for name in needed
        }
        for name in metrics:
            key = f"{name}@{k}"
            if name == "f1":
                p, r = means["precision"], means["recall"]
                out[key] = 2 * p * r / (p + r) if p + r > 0 else (0.0 if n_scored else np.nan)
            else:
                out[key] = per[key] if per_user else means[name]
    return out


def rmse(pred: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Root mean squared error over all entries, or over the entries where ``mask`` is true."""
    pred = np.asarray(pred, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if pred.shape != target.shape:
        raise ValueError(f"pred shape {pred.shape} != target shape {target.shape}")
    err = pred - target
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != pred.shape:
            raise ValueError(f"mask shape {mask.shape} != pred shape {pred.shape}")
        err = err[mask]
    if err.size == 0:
        raise ValueError("rmse of zero entries is undefined")
    return float(np.sqrt(np.mean(np.square(err))))


class NaNScores(ValueError):
    """Scores with NaN among them, which rank nowhere: a diverged model's whose loss can still be
    finite (GPFedRec's tables at a high rate); a run reports it as divergence (`run_rounds`)."""


class _RowSource:
    """Dense boolean row blocks from a dense array or a CSR matrix, built one chunk at a time."""

    def __init__(self, data: np.ndarray | sp.csr_matrix) -> None:
        self.data = data

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        block = self.data[lo:hi]
        if sp.issparse(block):
            return block.toarray() != 0
        return block


def _as_bool_rows(
    x: np.ndarray | sp.spmatrix | sp.sparray, shape: tuple[int, ...], name: str
) -> _RowSource:
    """Check the shape and wrap so that chunks come out as dense booleans."""
    if sp.issparse(x):
        x = sp.csr_matrix(x)
    else:
        x = np.asarray(x)
        if x.dtype != np.bool_:
            x = x != 0
    if x.shape != shape:
        raise ValueError(f"{name} shape {x.shape} != scores shape {shape}")
    return _RowSource(x)


def _single_relevant(relevant: object) -> np.ndarray | None:
    """The relevant column of each row when every row of a dense ``relevant`` has exactly one
    (sampled ranking: the held-out item among its negatives), else None."""
    if sp.issparse(relevant):
        return None
    rel = np.asarray(relevant)
    if rel.ndim != 2 or rel.shape[1] == 0:
        return None
    col = np.argmax(rel != 0, axis=1)
    if (np.count_nonzero(rel, axis=1) != 1).any():
        return None
    return col


def _target_counts(s: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the candidates scored above the relevant one (at column ``col``), and the others
    scored equal to it."""
    target = s[np.arange(len(s)), col][:, None]
    if np.isnan(s).any():
        raise NaNScores("scores contain NaN")
    return np.count_nonzero(s > target, axis=1), np.count_nonzero(s == target, axis=1) - 1


def _one_relevant_at_k(g: np.ndarray, e: np.ndarray, n_cand: int, k: int, needed: set[str],
                       ties: str) -> dict[str, np.ndarray]:
    """Per-row metrics at ``k`` of rows with one relevant candidate, the values `_metrics_at_k`
    gives, from two counts a row (`_target_counts`) instead of a sort. With g candidates scored
    above it and e others equal to it, its 0-based position is g + e (pessimistic), g
    (optimistic), or uniform over g..g+e (random), so each metric is a mean over that range of
    positions: the number below k (HR, recall, precision x k), or the sum of 1/log2(p + 2)
    (NDCG, whose ideal is 1) or of 1/(p + 1) (MRR) below k, from running sums."""
    lo = g + e if ties == "pessimistic" else g
    hi = g if ties == "optimistic" else g + e  # positions lo..hi, each as likely
    last = np.minimum(hi, k - 1)
    width = (hi - lo + 1).astype(np.float64)
    upto = np.maximum(last + 1, lo)  # positions lo..upto-1 are the ones below k
    hits = (upto - lo) / width
    out: dict[str, np.ndarray] = {}
    if "precision" in needed:
        out["precision"] = hits / k
    if "recall" in needed:
        out["recall"] = hits
    if "hr" in needed:
        out["hr"] = hits
    positions = np.arange(n_cand + 1)
    if "ndcg" in needed:
        disc = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(positions + 2.0))])
        out["ndcg"] = (disc[upto] - disc[lo]) / width
    if "mrr" in needed:
        harm = np.concatenate([[0.0], np.cumsum(1.0 / (positions + 1.0))])
        out["mrr"] = (harm[upto] - harm[lo]) / width
    return out


@dataclass(frozen=True)
class _Stats:
    """Per-row tie-group statistics for each of the top positions (see ``_group_stats``)."""

    start: np.ndarray  # (B, kc) first position of the position's tie group
    n: np.ndarray  # (B, kc) size of that group over the whole row (non-excluded)
    m: np.ndarray  # (B, kc) relevant candidates in that group
    n_top: np.ndarray  # (B,) real positions available, min(kc, non-excluded candidates)
    n_rel: np.ndarray  # (B,) relevant non-excluded candidates


def _group_stats(s: np.ndarray, rel: np.ndarray, excl: np.ndarray | None, kmax: int) -> _Stats:
    """Sort the top ``kmax`` scores of each row and describe the tie group of every position.

    Groups above the last kept value lie wholly in the kept prefix, so their size and relevant
    count come from it; the group of the last kept value is counted over the whole row.
    """
    b, n_cand = s.shape
    if excl is not None:
        s = np.where(excl, -np.inf, s)
        rel = rel & ~excl
        n_valid = n_cand - excl.sum(axis=1)
    else:
        n_valid = np.full(b, n_cand)
    if np.isnan(s).any():
        raise NaNScores("scores contain NaN")
    n_rel = rel.sum(axis=1)
    kc = min(kmax, n_cand)
    if kc < n_cand:
        idx = np.argpartition(s, n_cand - kc, axis=1)[:, n_cand - kc :]
    else:
        idx = np.broadcast_to(np.arange(n_cand), (b, n_cand))
    top = np.take_along_axis(s, idx, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    v = np.take_along_axis(top, order, axis=1)
    rel_top = np.take_along_axis(rel, np.take_along_axis(idx, order, axis=1), axis=1)

    pos = np.arange(kc)
    new = np.ones((b, kc), dtype=bool)
    new[:, 1:] = v[:, 1:] != v[:, :-1]
    last = np.ones((b, kc), dtype=bool)
    last[:, :-1] = new[:, 1:]
    start = np.maximum.accumulate(np.where(new, pos, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, pos, kc - 1)[:, ::-1], axis=1)[:, ::-1]
    csum = np.cumsum(rel_top, axis=1)
    m_in = (
        np.take_along_axis(csum, end, axis=1)
        - np.take_along_axis(csum, start, axis=1)
        + np.take_along_axis(rel_top, start, axis=1)
    )
    n_top = np.minimum(kc, n_valid)
    v_last = v[np.arange(b), np.maximum(n_top - 1, 0)]
    in_last = (v == v_last[:, None]) & (pos < n_top[:, None])
    eq = s == v_last[:, None]
    n_last = (eq if excl is None else eq & ~excl).sum(axis=1)
    m_last = (eq & rel).sum(axis=1)
    n = np.where(in_last, n_last[:, None], end - start + 1)
    m = np.where(in_last, m_last[:, None], m_in)
    return _Stats(start=start, n=n, m=m, n_top=n_top, n_rel=n_rel)


def _metrics_at_k(st: _Stats, k: int, needed: set[str], ties: str) -> dict[str, np.ndarray]:
    """Per-row metric values at cutoff ``k`` (rows with no relevant candidate are garbage)."""
    b, kc = st.n.shape
    pos = np.arange(kc)
    rows = np.arange(b)
    lk = np.minimum(st.n_top, k)
    inside = pos < lk[:, None]
    offset = pos - st.start
    with np.errstate(divide="ignore", invalid="ignore"):
        if ties == "random":
            p = np.where(inside, st.m / st.n, 0.0)
        else:
            is_rel = offset >= st.n - st.m if ties == "pessimistic" else offset < st.m
            is_rel &= inside
            p = is_rel.astype(np.float64)
    disc = 1.0 / np.log2(pos + 2.0)
    hits = p.sum(axis=1)
    out: dict[str, np.ndarray] = {}
    if "precision" in needed:
        out["precision"] = hits / k
    if "recall" in needed:
        out["recall"] = hits / np.maximum(st.n_rel, 1)
    if "ndcg" in needed:
        ideal = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(k) + 2.0))])
        out["ndcg"] = (p * disc).sum(axis=1) / np.maximum(ideal[np.minimum(st.n_rel, k)], 1e-300)
    if ties != "random":
        any_rel = is_rel.any(axis=1)
        if "hr" in needed:
            out["hr"] = any_rel.astype(np.float64)
        if "mrr" in needed:
            out["mrr"] = np.where(any_rel, 1.0 / (np.argmax(is_rel, axis=1) + 1.0), 0.0)
        return out
    if "hr" in needed:
        # The group holding the k-th slot takes t = lk - start slots; all groups before it are
        # wholly inside the top k. P(its t slots miss all m relevant) = C(n - m, t) / C(n, t).
        bpos = np.maximum(lk - 1, 0)
        b_start = st.start[rows, bpos]
        b_n, b_m = st.n[rows, bpos, None], st.m[rows, bpos, None]
        t = (lk - b_start)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            miss = np.where(pos < t, np.maximum(b_n - b_m - pos, 0) / (b_n - pos), 1.0)
        before = ((st.m > 0) & (pos < b_start[:, None])).any(axis=1)
        out["hr"] = np.where(lk == 0, 0.0, np.where(before, 1.0, 1.0 - miss.prod(axis=1)))
    if "mrr" in needed:
        # In the first group with m > 0, the first relevant candidate is at offset i with
        # probability m / (n - i) * S(i), S(i) = prod_{j<i} (n - m - j) / (n - j) the chance that
        # offsets before i are all irrelevant; S is an exclusive running product along the row.
        has = (st.m > 0) & (pos < st.n_top[:, None])
        first_start = st.start[rows, np.argmax(has, axis=1)]
        in_first = has & (st.start == first_start[:, None])
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(in_first, np.maximum(st.n - st.m - offset, 0) / (st.n - offset), 1.0)
            p_first = np.where(in_first, st.m / (st.n - offset), 0.0)
        survive = np.ones_like(step)
        survive[:, 1:] = np.cumprod(step, axis=1)[:, :-1]
        out["mrr"] = np.where(in_first & inside, p_first * survive / (pos + 1.0), 0.0).sum(axis=1)
    return out
