"""What a targeted poisoning attack achieves: the exposure of its target items.

Following FedRecAttack (Rong et al., ICDE 2022) and the attacks after it, a target item t is
*exposed* to a user u when t is in u's top-K over the items u has never interacted with. Only
users who never interacted with t (in training, validation or test) count: ER@K of a user is the
share of its eligible targets in its top-K, and the reported ER@K is the mean over users with at
least one eligible target. The targets' NDCG@K is the NDCG of that list with the eligible
targets as the relevant items (ideal DCG over min(#targets, K) places), as FedRecAttack's
``evaluate_ndcg`` defines it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp

EXPOSURE_KS = (5, 10, 20)


def known_interactions(split) -> sp.csr_matrix:  # type: ignore[no-untyped-def]
    """Every (user, item) a user interacted with: training plus validation and test targets."""
    known = split.train.astype(bool) + split.valid.targets.astype(bool) + split.test.targets.astype(bool)
    return sp.csr_matrix(known, dtype=bool)


def exposure(scores: Callable[[np.ndarray, np.ndarray | None], np.ndarray], known: sp.csr_matrix,
             targets: np.ndarray, ks: Sequence[int] = EXPOSURE_KS, users: np.ndarray | None = None,
             cells: int = 1 << 24) -> dict[str, float]:
    """ER@K and the targets' NDCG@K for each K in ``ks`` (see the module docstring).

    ``scores(users, None)`` scores every item for ``users`` (a `fedrec.core.Trainable`'s
    ``scores``); ``known`` is `known_interactions`; ``users`` default to every row of ``known``.
    The rank of a target is the number of unknown items scored strictly above it (ties in its
    favour, as ``torch.topk`` breaks them arbitrarily).
    """
    targets = np.asarray(targets, np.int64)
    users = np.arange(known.shape[0]) if users is None else np.asarray(users)
    kmax = max(ks)
    hits = {k: 0.0 for k in ks}
    ndcg = {k: 0.0 for k in ks}
    n_users = 0
    discount = 1.0 / np.log2(np.arange(2, kmax + 2))
    block = max(1, cells // max(1, len(targets) * known.shape[1]))
    for s in range(0, len(users), block):
        u = users[s : s + block]
        rows = known[u]
        eligible = ~np.asarray(rows[:, targets].todense(), bool)  # (B, T)
        keep = eligible.any(1)
        if not keep.any():
            continue
        u, rows, eligible = u[keep], rows[keep], eligible[keep]
        sc = np.nan_to_num(np.asarray(scores(u, None), np.float64), nan=-np.inf)  # a NaN is not a recommendation
        sc[rows.nonzero()] = -np.inf  # items the user knows are never recommended
        t_scores = sc[:, targets]  # (B, T)
        rank = (sc[:, None, :] > t_scores[:, :, None]).sum(-1)  # (B, T): items strictly above
        n_t = eligible.sum(1)
        place = discount[np.minimum(rank, kmax - 1)]
        for k in ks:
            shown = eligible & (rank < k)
            hits[k] += float((shown.sum(1) / n_t).sum())
            ideal = np.cumsum(discount)[np.minimum(n_t, k) - 1]
            ndcg[k] += float((np.where(shown, place, 0.0).sum(1) / ideal).sum())
        n_users += len(u)
    if n_users == 0:
        return {}
    return {**{f"er@{k}": hits[k] / n_users for k in ks},
            **{f"target_ndcg@{k}": ndcg[k] / n_users for k in ks}}
