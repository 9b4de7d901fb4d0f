"""Train/validation/test splits, vectorised with lexsort instead of group-by loops: per user
(leave-one-out, ratio) or along one timeline for every user (`global_time_split`)."""

from __future__ import annotations

import numpy as np

from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError

TRAIN, VALID, TEST = 0, 1, 2
TIE_BREAKS = ("later-row-later", "earlier-row-later")


def _rank_within_user(users: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows visited in ``order`` (grouped by user), each row's 0-based rank and its user's count."""
    sorted_users = users[order]
    counts = np.bincount(users, minlength=int(users.max()) + 1 if len(users) else 0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_sorted = np.arange(len(order)) - starts[sorted_users]
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = rank_sorted
    return rank, counts[users]


def leave_one_out(x: Interactions, tie_break: str = "later-row-later", seed: int = 0) -> np.ndarray:
    """Label each row TRAIN/VALID/TEST: a user's latest row is TEST, the one before VALID.

    Rows are ordered by timestamp; rows with equal timestamps by their position in the source
    file. ``later-row-later`` (default) treats a later row as the later event.
    ``earlier-row-later`` reproduces the official PFedRec/GPFedRec/FedRAP code, whose
    ``rank(method='first', ascending=False)`` makes the *first* of the tied rows the test item.
    Users with fewer than 3 rows keep them all in training and are not evaluated.

    Data without a clock (``x.clock`` False: the source has no time column) have no "latest"
    row, and their row order may be anything (HetRec's ``user_artists.dat`` is sorted by artist
    id, so the "latest" would be each user's largest id, mostly unseen in training): a user's
    rows are then put in an order drawn with ``seed``, the same for every run with that seed.
    `held_out_by` names which of the two a split used.
    """
    if tie_break not in TIE_BREAKS:
        raise FedrecError(f"unknown tie break '{tie_break}'; known: {', '.join(TIE_BREAKS)}")
    if x.clock:
        tie_key = x.row_order if tie_break == "later-row-later" else -x.row_order
        order = np.lexsort((tie_key, x.timestamps, x.users))
    else:
        order = np.lexsort((np.random.default_rng([seed, 2]).random(len(x)), x.users))
    rank, count = _rank_within_user(x.users, order)
    from_end = count - 1 - rank
    label = np.full(len(x), TRAIN, dtype=np.int8)
    evaluable = count >= 3
    label[evaluable & (from_end == 0)] = TEST
    label[evaluable & (from_end == 1)] = VALID
    return label


def held_out_by(x: Interactions, split: str) -> str:
    """How a ``split`` ("loo", "ratio", "time" or "given") of ``x`` picks its held-out rows:
    "time" (each user's latest, or the latest of all), "random" (seeded) or "file" (the data
    set fixes them)."""
    if split == "given":
        return "file"
    return "time" if split in ("loo", "time") and x.clock else "random"


def global_time_split(x: Interactions, test_ratio: float = 0.2, valid_ratio: float = 0.1) -> np.ndarray:
    """Label each row TRAIN/VALID/TEST along one timeline for every user (Ji et al., "A Critical
    Study on Data Leakage in Recommender System Offline Evaluation", TOIS 2023): the latest
    ``test_ratio`` of all rows are TEST, the latest ``valid_ratio`` of the rows before them VALID.

    Each cut is a time, not a row count: every row at the cut's timestamp goes to the later
    side, so no training row is as late as a validation or test row and no validation row as
    late as a test row (a per-user split lets a user's test item precede other users' training
    rows, which then tell the model what became popular later). The shares are therefore at
    least the ratios asked, more where many rows share the cut's timestamp. Needs the source's
    clock (``x.clock``): a file's row order is no timeline.
    """
    if not (0 < test_ratio < 1 and 0 <= valid_ratio < 1):
        raise FedrecError(f"split ratios must lie in (0, 1): test {test_ratio}, valid {valid_ratio}")
    if not x.clock:
        raise FedrecError(f"a global temporal split needs timestamps, and '{x.name}' has none "
                          "(its file has no time column)")
    label = np.full(len(x), TRAIN, dtype=np.int8)
    if not len(x):
        return label
    ts = np.sort(x.timestamps)
    test_at = ts[min(len(ts) - 1, int(np.floor((1 - test_ratio) * len(ts))))]
    before = int(np.searchsorted(ts, test_at, side="left"))  # rows earlier than the test cut
    if not before:
        raise FedrecError(f"'{x.name}': every row shares the test cut's timestamp; nothing is left "
                          "to train on")
    valid_at = ts[min(before, int(np.floor((1 - valid_ratio) * before)))] if before else test_at
    if valid_at == ts[0]:
        tied = int(np.searchsorted(ts, valid_at, side="right"))
        raise FedrecError(f"'{x.name}': the validation cut falls on the earliest timestamp, which {tied} of the "
                          f"{before} rows before the test cut share, and a timestamp's rows stay on one side "
                          "of a cut: nothing is left to train on")
    label[x.timestamps >= valid_at] = VALID
    label[x.timestamps >= test_at] = TEST
    return label


def timeline_leak(x: Interactions, label: np.ndarray) -> dict[str, float]:
    """How much of the future a split's training rows hold, measured against its test rows
    (Ji et al., TOIS 2023): ``later_train_share``, the mean over test rows of the share of
    training rows later than that row; ``targets_with_later_train``, the share of test rows
    with at least one later training row. Both are 0 under a global temporal split; a per-user
    split leaves later rows of other users in training."""
    train_ts = np.sort(x.timestamps[label == TRAIN])
    test_ts = x.timestamps[label == TEST]
    if not len(test_ts) or not len(train_ts) or not x.clock:
        return {"later_train_share": float("nan") if not x.clock else 0.0,
                "targets_with_later_train": float("nan") if not x.clock else 0.0}
    later = len(train_ts) - np.searchsorted(train_ts, test_ts, side="right")
    return {"later_train_share": float(later.mean() / len(train_ts)),
            "targets_with_later_train": float((later > 0).mean())}


def ratio_split(
    x: Interactions, test_ratio: float = 0.2, valid_ratio: float = 0.1, seed: int = 0
) -> np.ndarray:
    """Label each row TRAIN/VALID/TEST by a per-user random split.

    Each user's rows are shuffled (seeded); ``round(test_ratio * n_u)`` go to TEST and then
    ``round(valid_ratio * n_train)`` of the rest to VALID, always leaving at least one row in
    training so every evaluated user has a history.
    """
    if not (0 < test_ratio < 1 and 0 <= valid_ratio < 1):
        raise FedrecError(f"split ratios must lie in (0, 1): test {test_ratio}, valid {valid_ratio}")
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(x)), x.users))
    rank, count = _rank_within_user(x.users, order)
    n_test = np.minimum(np.round(test_ratio * count).astype(np.int64), count - 1)
    n_rest = count - n_test
    n_valid = np.minimum(np.round(valid_ratio * n_rest).astype(np.int64), n_rest - 1)
    label = np.full(len(x), TRAIN, dtype=np.int8)
    label[rank < n_test] = TEST
    label[(rank >= n_test) & (rank < n_test + n_valid)] = VALID
    return label
