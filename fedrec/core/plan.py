"""The server's draws of a round: which clients take part, and the generators of its noise.

All of them are functions of (seed, round), so a resumed run replays them and a Flower node
can compute when its clients take part without asking.
"""

from __future__ import annotations

import numpy as np
import torch

from fedrec.errors import FedrecError


def cohort_size(n_clients: int, per_round: float) -> int:
    """Clients per round: a fraction (<= 1) or a count (> 1) of ``n_clients``."""
    if per_round <= 1.0:
        return max(1, round(per_round * n_clients))
    return min(int(per_round), n_clients)


def sample_clients(n_clients: int, per_round: float, rng: np.random.Generator) -> np.ndarray:
    """All clients, a fraction (<= 1) or a count (> 1) of them, without replacement. A count
    above ``n_clients`` is an error rather than "all": the run would record a number of clients
    per round that it never had."""
    if per_round > 1.0 and per_round > n_clients:
        raise FedrecError(f"--clients-per-round {per_round:g} is more than the {n_clients} clients of this "
                          f"run (one per user unless the algorithm groups users into clients); give at most "
                          f"{n_clients}, or a fraction <= 1")
    k = cohort_size(n_clients, per_round)
    if k >= n_clients:
        return np.arange(n_clients)
    return np.sort(rng.choice(n_clients, size=k, replace=False))


def round_plan(n_clients: int, per_round: float, seed: int, r: int
               ) -> tuple[np.ndarray, torch.Generator]:
    """The server's draws of round ``r``: the clients it samples and the generator of its own
    noise (DP). Public given the seed: a Flower node computes when its clients take part."""
    rng = np.random.default_rng([seed, r])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return sample_clients(n_clients, per_round, rng), gen


def extra_sample(n_extra: int, clients_per_round: float, seed: int, r: int) -> np.ndarray:
    """Round ``r``'s sample of the clients beyond the data's users (0-based among them): the
    same share as of the users, drawn from a stream of its own so the users' sample does not
    change. The simulator samples its malicious clients so, and a Flower server the clients a
    malicious node declares (it sees clients, not intentions)."""
    if not n_extra:
        return np.zeros(0, np.int64)
    k = cohort_size(n_extra, clients_per_round)
    return np.sort(np.random.default_rng([seed, r, 0x3A11]).choice(n_extra, k, replace=False))
