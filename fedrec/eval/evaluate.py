"""Run one evaluation stage of a protocol against any scorer."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol as TypingProtocol

import numpy as np
import scipy.sparse as sp

from fedrec.eval.metrics import ranking_metrics, rmse
from fedrec.protocols.protocol import EvalSet, Protocol


class Scorer(TypingProtocol):
    """Scores items for users: ``items`` is ``(n, C)`` item ids, or None for every item.

    Returns ``(n, C)`` (or ``(n, n_items)``) scores, higher = more recommended; under the
    rating protocol, predicted ratings.
    """

    def __call__(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray: ...


def evaluate(
    scorer: Scorer, stage: EvalSet, protocol: Protocol, *, chunk_users: int = 1024
) -> dict[str, float]:
    """Metrics of ``scorer`` on one stage (validation or test), averaged over its users."""
    users = stage.users
    if protocol.ranking == "rating":
        t = stage.targets[users].tocsr()
        if not t.nnz:  # nothing held out (a tuning trial's empty test stage): no RMSE to give
            return {"users": float(len(users))}
        pred, target, who, items = _held_out_ratings(scorer, users, t, chunk_users)
        if stage.fallback is not None:
            cold = stage.fallback.cold[items]
            pred = np.where(cold, stage.fallback.value[who], pred)
        return {"rmse": rmse(pred, target), "users": float(len(users))}
    if protocol.ranking == "sampled":
        scores = _chunked(scorer, users, stage.candidates, chunk_users)
        relevant = np.zeros_like(scores, dtype=bool)
        relevant[:, 0] = True
        return ranking_metrics(scores, relevant, ks=protocol.ks, metrics=protocol.metrics)
    sums: dict[str, float] = {}
    scored = 0
    for start in range(0, len(users), chunk_users):
        chunk = users[start : start + chunk_users]
        scores = np.asarray(scorer(chunk, None))  # float32 ranks as float64 does, at half the bytes
        exclude = stage.exclude[chunk].toarray() > 0 if stage.exclude is not None else None
        if protocol.ranking == "rated":
            m = _rated_metrics(scores, stage.targets[chunk], exclude, protocol)
        else:
            relevant = stage.targets[chunk].toarray() > 0
            m = ranking_metrics(scores, relevant, ks=protocol.ks, metrics=protocol.metrics, exclude=exclude)
        n = int(m.pop("users"))
        scored += n
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * n
    out = {k: v / max(scored, 1) for k, v in sums.items()}
    for k in protocol.ks:
        if f"f1@{k}" in out:  # F1 is the harmonic mean of the *overall* mean precision and recall
            p, r = out[f"precision@{k}"], out[f"recall@{k}"]
            out[f"f1@{k}"] = 2 * p * r / (p + r) if p + r > 0 else 0.0
    out["users"] = float(scored)
    return out


def _held_out_ratings(scorer: Scorer, users: np.ndarray, targets: sp.csr_matrix,
                      chunk_users: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Predicted and held-out ratings, with the user and item of each, each user's items scored
    as one row (``targets``: row k
    holds ``users[k]``'s held-out ratings). Users go most ratings first, in chunks of at most
    ``chunk_users`` whose rows hold more than half the chunk's widest, each padded to that width
    with its row's last item (scored, not counted: at most as many padded cells as real ones): a
    scorer that builds a model per user (MetaMF generates one) builds it once a user, not once a
    rating (MetaMF on Ciao's validation: 28,240 ratings of about 6,000 users)."""
    counts = np.diff(targets.indptr)
    order = np.argsort(-counts, kind="stable")
    order = order[counts[order] > 0]
    descending = -counts[order]
    pred, target, who, items = [], [], [], []
    start = 0
    while start < len(order):
        width = int(counts[order[start]])
        end = min(start + chunk_users, int(np.searchsorted(descending, -(width // 2), side="left")))
        rows, start = order[start:end], end
        slot = np.minimum(np.arange(width)[None, :], counts[rows][:, None] - 1)
        at = targets.indptr[rows][:, None] + slot
        real = np.arange(width)[None, :] < counts[rows][:, None]
        pred.append(np.asarray(scorer(users[rows], targets.indices[at].astype(np.int64)))[real])
        target.append(targets.data[at[real]])
        who.append(np.broadcast_to(users[rows][:, None], at.shape)[real])
        items.append(targets.indices[at[real]])
    return np.concatenate(pred), np.concatenate(target), np.concatenate(who), np.concatenate(items)


def _rated_metrics(scores: np.ndarray, ratings: sp.csr_matrix, exclude: np.ndarray | None,
                   protocol: Protocol) -> dict[str, float]:
    """Binarised ratings: positives are held-out items rated >= ``positive_at``. ``rated-*``
    metrics rank only the user's held-out rated items (PersonalFR's NDCG: positives against the
    items the user rated low); the others rank every item not rated in training."""
    rated = np.zeros(scores.shape, dtype=bool)
    rows = np.repeat(np.arange(ratings.shape[0]), np.diff(ratings.indptr))
    rated[rows, ratings.indices] = True
    positive = np.zeros_like(rated)
    pos = ratings.data >= protocol.positive_at
    positive[rows[pos], ratings.indices[pos]] = True
    inner = [m.removeprefix("rated-") for m in protocol.metrics if m.startswith("rated-")]
    full = [m for m in protocol.metrics if not m.startswith("rated-")]
    out = ranking_metrics(scores, positive, ks=protocol.ks, metrics=full, exclude=exclude)
    among = ranking_metrics(scores, positive, ks=protocol.ks, metrics=inner, exclude=~rated)
    out.update({f"rated-{k}": v for k, v in among.items() if k != "users"})
    return out


def restrict(stage: EvalSet, keep: np.ndarray) -> EvalSet:
    """The stage for the users marked in ``keep`` (a boolean mask over all user ids)."""
    rows = np.flatnonzero(keep[stage.users])
    return replace(stage, users=stage.users[rows],
                   candidates=None if stage.candidates is None else stage.candidates[rows])


def _chunked(scorer: Scorer, users: np.ndarray, items: np.ndarray, chunk: int) -> np.ndarray:
    """Scores of each user's candidates, ``chunk`` users at a time, written into one array (no
    concatenated copy). Candidates are stored compactly (int32); scorers get int64 ids. Float32
    scores stay float32: they rank as float64 does, at half the bytes."""
    out: np.ndarray | None = None
    for s in range(0, len(users), chunk):
        part = np.asarray(scorer(users[s : s + chunk], items[s : s + chunk].astype(np.int64)))
        if out is None:
            out = np.empty((len(users), items.shape[1]), np.float32 if part.dtype == np.float32 else np.float64)
        out[s : s + len(part)] = part
    return out if out is not None else np.zeros((0, items.shape[1]))
