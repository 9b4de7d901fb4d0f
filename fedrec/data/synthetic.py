"""Synthetic interaction data with real latent structure, at the scale of millions of users.

Scale tests of the simulator need data sets far larger than the public ones, and tests need
data whose ground truth is known. Users and items get Gaussian latent factors; items get a
power-law popularity; each user's activity is heavy-tailed. A user picks items roughly with
probability proportional to ``popularity * exp(affinity / temperature)``, without repeats.

Doing that exactly needs every user x item affinity, which is out of reach at 10^6 x 10^5. So
each user draws a pool of candidates from the popularity law (inverse CDF, O(1) per draw),
and keeps the best distinct ones by ``affinity / temperature + Gumbel noise`` (the Gumbel
top-k trick, restricted to the pool). Selection and de-duplication are one integer sort per
chunk of users: ``user | score | item`` packed into an int64 key, with the noise a hash of
the (user, item) pair so that repeated candidates get identical keys and sit side by side.
Users whose pool holds too few distinct items retry with a larger pool, and the few that
still fall short are drawn exactly over all items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedrec.data.interactions import Interactions
from fedrec.errors import FedrecError

OVERSAMPLE = 2.0  # candidates drawn per wanted item in the first round
POOL_ROUNDS = 3  # rounds (pool doubling each time) before the exact fallback
ACTIVITY_SIGMA = 1.0  # log-scale spread of user activity (lognormal-Poisson)
CHUNK_INTERACTIONS = 1 << 18  # interactions generated per chunk of users
EXACT_CELLS = 1 << 22  # user x item cells per block of the exact fallback
RATING_CUTS = np.array([-1.0, -0.25, 0.5, 1.25], dtype=np.float32)  # affinity -> 1..5 stars
RATING_NOISE = 0.5
TIME_ORIGIN = 1_000_000_000  # timestamps are seconds after this
TIME_SPAN = 300_000_000  # users start uniformly within this window
MAX_GAP = 86_400  # seconds between consecutive events of a user, at most


@dataclass(frozen=True)
class SyntheticData:
    """A synthetic data set with its ground truth, so tests can check the latent structure.

    ``popularity`` is the probability that one candidate draw yields each item (sums to 1).
    """

    interactions: Interactions
    user_factors: np.ndarray
    item_factors: np.ndarray
    popularity: np.ndarray
    temperature: float

    def affinity(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """True affinity ``u . v / sqrt(dim)`` of each (user, item) pair (about N(0, 1))."""
        return _affinity(self.user_factors, self.item_factors, users, items)


def synthetic(
    n_users: int,
    n_items: int,
    mean_interactions: float = 20,
    dim: int = 8,
    popularity_exponent: float = 1.0,
    min_interactions: int = 3,
    seed: int = 0,
    name: str = "synthetic",
    *,
    temperature: float = 0.5,
    max_interactions: int | None = None,
) -> Interactions:
    """A synthetic `Interactions` (see `synthetic_data` for the model and the ground truth)."""
    return synthetic_data(
        n_users,
        n_items,
        mean_interactions,
        dim,
        popularity_exponent,
        min_interactions,
        seed,
        name,
        temperature=temperature,
        max_interactions=max_interactions,
    ).interactions


def synthetic_data(
    n_users: int,
    n_items: int,
    mean_interactions: float = 20,
    dim: int = 8,
    popularity_exponent: float = 1.0,
    min_interactions: int = 3,
    seed: int = 0,
    name: str = "synthetic",
    *,
    temperature: float = 0.5,
    max_interactions: int | None = None,
) -> SyntheticData:
    """Generate users x items interactions and return them with the factors behind them.

    Every user gets ``min_interactions + Poisson(LogNormal)`` distinct items (mean
    ``mean_interactions``, capped at ``max_interactions``, default ``n_items``: a protocol
    that samples evaluation negatives needs users who leave some items out); item popularity
    follows a power law with ``popularity_exponent`` (0: uniform) over a random ranking of the
    items. Rows are grouped by user in id order, each user's events in strictly increasing
    time; ratings are 1..5 stars from the affinity plus noise. ``user_ids``/``item_ids`` are
    ``0..n-1``. Time and memory grow with the number of interactions, never with
    ``n_users * n_items``.
    """
    _check_args(
        n_users, n_items, mean_interactions, dim, popularity_exponent, min_interactions, temperature,
        max_interactions,
    )
    user_bits = max(1, (n_users - 1).bit_length())
    item_bits = max(1, (n_items - 1).bit_length())
    rng = np.random.default_rng(seed)
    rank_to_item = rng.permutation(n_items)
    popularity = np.empty(n_items)
    popularity[rank_to_item] = _powerlaw_mass(n_items, popularity_exponent)
    word = np.iinfo(np.uint64).max
    gen = _Generator(
        rng=rng,
        exponent=float(popularity_exponent),
        temperature=float(temperature),
        item_bits=item_bits,
        score_bits=63 - user_bits - item_bits,
        rank_to_item=rank_to_item,
        popularity=popularity,
        user_factors=rng.standard_normal((n_users, dim), dtype=np.float32),
        item_factors=rng.standard_normal((n_items, dim), dtype=np.float32),
        item_hash=rng.integers(0, word, n_items, dtype=np.uint64, endpoint=True),
        user_hash=rng.integers(0, word, n_users, dtype=np.uint64, endpoint=True) | np.uint64(1),
    )
    cap = n_items if max_interactions is None else max_interactions
    need = _activity(rng, n_users, mean_interactions, min_interactions, cap)

    total = int(need.sum())
    users = np.empty(total, dtype=np.int64)
    items = np.empty(total, dtype=np.int64)
    ratings = np.empty(total, dtype=np.float32)
    timestamps = np.empty(total, dtype=np.int64)
    ends = np.cumsum(need)
    cuts = np.searchsorted(ends, np.arange(CHUNK_INTERACTIONS, total, CHUNK_INTERACTIONS))
    bounds = np.unique(np.r_[0, cuts, n_users])
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        rows = slice(ends[lo] - need[lo], ends[hi - 1])
        users[rows], items[rows], timestamps[rows] = gen.chunk(np.arange(lo, hi), need[lo:hi])
        ratings[rows] = gen.ratings(users[rows], items[rows])
    interactions = Interactions(
        users=users,
        items=items,
        ratings=ratings,
        timestamps=timestamps,
        user_ids=np.arange(n_users, dtype=np.int64),
        item_ids=np.arange(n_items, dtype=np.int64),
        name=name,
    )
    return SyntheticData(
        interactions, gen.user_factors, gen.item_factors, gen.popularity, float(temperature)
    )


def _check_args(
    n_users: int,
    n_items: int,
    mean_interactions: float,
    dim: int,
    exponent: float,
    min_interactions: int,
    temperature: float,
    max_interactions: int | None = None,
) -> None:
    """Reject impossible sizes with a message naming the offending option."""
    if n_users < 1 or n_items < 1:
        raise FedrecError(
            f"synthetic data needs n_users >= 1 and n_items >= 1, got {n_users} x {n_items}"
        )
    if not 1 <= min_interactions <= n_items:
        raise FedrecError(
            f"min_interactions must be in [1, n_items={n_items}], got {min_interactions}"
        )
    if not min_interactions <= mean_interactions <= n_items:
        raise FedrecError(
            f"mean_interactions must be in [min_interactions={min_interactions}, n_items={n_items}], "
            f"got {mean_interactions}"
        )
    low = max(min_interactions, mean_interactions)
    if max_interactions is not None and not low <= max_interactions <= n_items:
        raise FedrecError(
            f"max_interactions must be in [max(min_interactions, mean_interactions)={low:g}, "
            f"n_items={n_items}], got {max_interactions}"
        )
    if dim < 1:
        raise FedrecError(f"dim must be >= 1, got {dim}")
    if exponent < 0:
        raise FedrecError(f"popularity_exponent must be >= 0, got {exponent}")
    if temperature <= 0:
        raise FedrecError(f"temperature must be > 0, got {temperature}")
    if (n_users - 1).bit_length() + (n_items - 1).bit_length() > 51:
        raise FedrecError(
            f"{n_users} users x {n_items} items is too large to pack into 64-bit keys"
        )


def _affinity(
    user_factors: np.ndarray, item_factors: np.ndarray, users: np.ndarray, items: np.ndarray
) -> np.ndarray:
    """Row-wise ``u . v / sqrt(dim)``, gathering only the rows asked for.

    Summed column by column with element-wise ops, so a pair's value is bit-identical wherever
    it sits in the batch (a SIMD reduction may round rows differently); the pool de-duplication
    relies on repeated pairs getting identical keys.
    """
    prod = np.take(user_factors, users, axis=0)
    prod *= np.take(item_factors, items, axis=0)
    total = prod[:, 0].copy()
    for d in range(1, prod.shape[1]):
        total += prod[:, d]
    total *= np.float32(1 / math.sqrt(user_factors.shape[1]))
    return total


def _powerlaw_mass(n: int, exponent: float) -> np.ndarray:
    """Probability of each popularity rank under the sampler of `_powerlaw_ranks`.

    Ranks come from a continuous power law ``x^-exponent`` on ``[1, n + 1)``, floored, so rank
    r has mass ``F(r + 2) - F(r + 1)``: Zipf-like, and exact for the sampler.
    """
    edges = np.arange(1, n + 2, dtype=np.float64)
    if abs(exponent - 1.0) < 1e-9:
        cdf = np.log(edges) / math.log(n + 1)
    else:
        p = 1.0 - exponent
        cdf = (edges**p - 1.0) / ((n + 1.0) ** p - 1.0)
    return np.diff(cdf)


def _powerlaw_ranks(rng: np.random.Generator, size: int, n: int, exponent: float) -> np.ndarray:
    """Draw popularity ranks by inverting the continuous power law's CDF (no table search)."""
    dtype = np.float32 if n <= 1 << 17 else np.float64  # float32 is exact enough below 2^17
    u = rng.random(size, dtype=dtype)
    if abs(exponent - 1.0) < 1e-9:
        x = np.exp(u * dtype(math.log(n + 1)))
    else:
        p = 1.0 - exponent
        x = np.power(1 + u * dtype((n + 1.0) ** p - 1.0), dtype(1.0 / p))
    return np.clip(x.astype(np.int64) - 1, 0, n - 1)


def _activity(
    rng: np.random.Generator, n_users: int, mean: float, minimum: int, cap: int
) -> np.ndarray:
    """Interactions per user: ``minimum + Poisson(LogNormal)`` with the given mean, heavy-tailed."""
    extra_mean = mean - minimum
    if extra_mean <= 0:
        return np.full(n_users, minimum, dtype=np.int64)
    mu = math.log(extra_mean) - ACTIVITY_SIGMA**2 / 2
    extra = rng.poisson(rng.lognormal(mu, ACTIVITY_SIGMA, n_users))
    return np.minimum(minimum + extra, cap).astype(np.int64)


@dataclass
class _Generator:
    """State shared by the chunks of one `synthetic_data` call."""

    rng: np.random.Generator
    exponent: float
    temperature: float
    item_bits: int
    score_bits: int
    rank_to_item: np.ndarray
    popularity: np.ndarray
    user_factors: np.ndarray
    item_factors: np.ndarray
    item_hash: np.ndarray
    user_hash: np.ndarray

    @property
    def n_items(self) -> int:
        return len(self.item_factors)

    def chunk(
        self, users: np.ndarray, need: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows (user, item, timestamp) for consecutive ``users``, grouped by user, in time order."""
        pending, pending_need, factor = users, need, OVERSAMPLE
        got_u, got_i = [], []
        for _ in range(POOL_ROUNDS):
            if len(pending) == 0:
                break
            u, i, short = self._pool_round(pending, pending_need, factor)
            got_u.append(u)
            got_i.append(i)
            pending, pending_need, factor = pending[short], pending_need[short], factor * 2
        if len(pending):
            u, i = self._exact(pending, pending_need)
            got_u.append(u)
            got_i.append(i)
        return self._time_order(np.concatenate(got_u), np.concatenate(got_i), need)

    def ratings(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """1..5 stars: the affinity plus Gaussian noise, cut at fixed levels."""
        aff = _affinity(self.user_factors, self.item_factors, users, items)
        aff += self.rng.standard_normal(len(aff), dtype=np.float32) * np.float32(RATING_NOISE)
        stars = np.ones(len(aff), dtype=np.float32)
        for cut in RATING_CUTS:
            stars += aff > cut
        return stars

    def _pool_round(
        self, users: np.ndarray, need: np.ndarray, factor: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pick each user's items from a popularity-drawn pool; flag users with too few distinct."""
        pool = np.ceil(need * factor).astype(np.int64) + 1
        row_user = np.repeat(users, pool)
        items = self.rank_to_item[
            _powerlaw_ranks(self.rng, len(row_user), self.n_items, self.exponent)
        ]
        score = _affinity(self.user_factors, self.item_factors, row_user, items) / np.float32(
            self.temperature
        )
        score += self._pair_gumbel(row_user, items)
        key = self._pack(row_user, self._descending(score), items)
        key.sort()
        starts = np.cumsum(pool) - pool
        fresh = np.empty(len(key), dtype=bool)
        fresh[0] = True
        np.not_equal(key[1:], key[:-1], out=fresh[1:])
        distinct_before = np.cumsum(fresh) - 1  # distinct keys before this row, overall
        base = distinct_before[starts]
        short = np.r_[base[1:], distinct_before[-1] + 1] - base < need
        # A row is kept if it is a user's first, second, ... need-th distinct key (best scores).
        limit = np.where(short, base, base + need)
        keep = fresh & (distinct_before < np.repeat(limit, pool))
        kept = key[keep]
        return kept >> (self.score_bits + self.item_bits), kept & ((1 << self.item_bits) - 1), short

    def _pair_gumbel(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Gumbel noise that is a function of the (user, item) pair (multiplicative hashing).

        For one user the products ``item_hash * odd`` are a bijection of iid uniform words, so
        the noise is iid across that user's items; repeats of a pair get the same value.
        """
        h = np.take(self.item_hash, items) * np.take(self.user_hash, users)
        u = ((h >> np.uint64(41)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-23)
        return -np.log(-np.log(u))

    def _descending(self, score: np.ndarray) -> np.ndarray:
        """Score quantised to ``score_bits`` bits, higher scores giving smaller integers."""
        top = (1 << self.score_bits) - 1
        lo = -6.0 / self.temperature - 4.0
        hi = 6.0 / self.temperature + 17.0
        q = (score - np.float32(lo)) * np.float32(top / (hi - lo))
        q = np.clip(q, 0, top).astype(np.int64)
        np.clip(q, 0, top, out=q)  # float32 may round ``top`` itself up; clip again exactly
        return top - q

    def _pack(self, users: np.ndarray, middle: np.ndarray, items: np.ndarray) -> np.ndarray:
        """``user | middle | item`` as one int64, so one sort groups by user then orders by middle."""
        key = users.astype(np.int64) << (self.score_bits + self.item_bits)
        key |= middle << self.item_bits
        key |= items
        return key

    def _exact(self, users: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gumbel top-k over all items (exact sampling without replacement), in blocks of users."""
        log_pop = np.log(np.maximum(self.popularity, 1e-300)).astype(np.float32)
        scale = np.float32(1 / (self.temperature * math.sqrt(self.user_factors.shape[1])))
        block = max(1, EXACT_CELLS // self.n_items)
        out_u, out_i = [], []
        for lo in range(0, len(users), block):
            bu, bneed = users[lo : lo + block], need[lo : lo + block]
            logits = (self.user_factors[bu] @ self.item_factors.T) * scale + log_pop
            logits += self.rng.gumbel(size=logits.shape).astype(np.float32)
            order = np.argsort(-logits, axis=1, kind="stable")
            mask = np.arange(self.n_items) < bneed[:, None]
            out_u.append(np.repeat(bu, bneed))
            out_i.append(order[mask])
        return np.concatenate(out_u), np.concatenate(out_i)

    def _time_order(
        self, users: np.ndarray, items: np.ndarray, need: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sort rows by user then a random key, and give each user increasing timestamps."""
        shuffle = self.rng.integers(0, 1 << self.score_bits, len(users), dtype=np.int64)
        key = self._pack(users, shuffle, items)
        key.sort()
        users = key >> (self.score_bits + self.item_bits)
        items = key & ((1 << self.item_bits) - 1)
        start = TIME_ORIGIN + self.rng.integers(0, TIME_SPAN, len(need), dtype=np.int64)
        elapsed = np.cumsum(self.rng.integers(1, MAX_GAP + 1, len(users), dtype=np.int64))
        first = np.cumsum(need) - need
        before = np.r_[0, elapsed[first[1:] - 1]]
        timestamps = elapsed + np.repeat(start - before, need)
        return users, items, timestamps
