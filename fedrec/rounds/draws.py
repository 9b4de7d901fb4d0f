"""Random draws that belong to one client, keyed by (seed, purpose, round, client, position).

A client's training negatives, its shuffles and its initial private parameters are a pure
function of the run's seed, the round, the client's id and the draw's position — never of
which other clients share its cohort, chunk or process. So the cohort-vectorised simulator,
the per-client reference loop and a Flower deployment (each SuperNode drawing for its own
clients) make exactly the same draws, and a test can compare them number for number.

The draws are a counter-based hash (SplitMix64's finaliser) evaluated on numpy uint64 arrays:
fully vectorised over clients and positions, with no generator state to carry between rounds.
Draws that belong to the server (the global table's start, the clients sampled in a round,
the server's DP noise) stay with ordinary seeded generators.
"""

from __future__ import annotations

import numpy as np

# what a draw is for (part of its key)
NEGATIVES, SHUFFLE, FRESH_USER, INIT, DROPOUT, LOCAL_NOISE, PAD_ITEMS, PAD_VALUES = 1, 2, 3, 4, 5, 6, 7, 8
#: a round's subspace that every party shares (CoLR's basis, `fedrec.federated.colr`)
BASIS = 9
#: a round's clustering of the users (PerFedRec's k-means starts, `fedrec.federated.perfedrec`)
CLUSTERS = 10
#: a client's neighbouring users in its expanded graph (FedPerGNN, `fedrec.federated.pergnn.state`)
NEIGHBOURS = 11
#: a client's contrastive candidates at a local step (UNION's term, `fedrec.federated.family.objective`)
CONTRAST = 12

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


def _key(parts: tuple[int, ...]) -> np.ndarray:
    z = np.zeros(1, np.uint64)
    for p in parts:
        z = _mix(z + _GOLDEN + np.uint64(p & 0xFFFFFFFFFFFFFFFF))
    return z


def uniforms(key: tuple[int, ...], clients: np.ndarray, counts: np.ndarray | int) -> np.ndarray:
    """Uniform [0, 1) draws: ``counts[k]`` for client ``clients[k]``, concatenated in order.

    Draw j of client c is a hash of (``key``, c, j): any subset of clients, in any order,
    gets the same values for the same client.
    """
    clients = np.asarray(clients, np.int64)
    counts = np.broadcast_to(np.asarray(counts, np.int64), clients.shape)
    base = _mix(_key(key) + clients.astype(np.uint64) * _GOLDEN)
    total = int(counts.sum())
    pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    z = _mix(np.repeat(base, counts) + (pos.astype(np.uint64) + np.uint64(1)) * _C1)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def normals(key: tuple[int, ...], clients: np.ndarray, count: int) -> np.ndarray:
    """``(len(clients), count)`` standard normal draws (Box-Muller on two uniform streams)."""
    return ragged_normals(key, clients, count).reshape(len(clients), count)


def ragged_normals(key: tuple[int, ...], clients: np.ndarray, counts: np.ndarray | int) -> np.ndarray:
    """Standard normal draws: ``counts[k]`` for client ``clients[k]``, concatenated in order."""
    u1 = uniforms((*key, 1), clients, counts)
    u2 = uniforms((*key, 2), clients, counts)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def seed_of(key: tuple[int, ...]) -> int:
    """A 63-bit seed for an ordinary generator whose draws every party must share (a start
    common to all clients, drawn the same on every node)."""
    return int(_key(key)[0] >> np.uint64(1))
