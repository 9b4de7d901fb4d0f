"""Which client holds which users: the federated split of a data set.

Most federated recommenders treat each user as a client, but some published methods group
users into clients (FedCIA: contiguous blocks of user ids) or mark some users public
(GFed-PP). A `Partition` records that mapping once, with the CSR-style inverse (users of each
client) so that a round can gather the users of its sampled clients without a Python loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from fedrec.errors import FedrecError


@dataclass(frozen=True, eq=False)
class Partition:
    """A map from users to clients, with the users of client ``c`` at
    ``client_users[client_ptr[c]:client_ptr[c + 1]]`` (sorted by user id).

    ``public`` (optional) flags users whose data may be shared with the server (GFed-PP).
    """

    client_of_user: np.ndarray
    n_clients: int
    public: np.ndarray | None = None
    client_ptr: np.ndarray = field(init=False, repr=False)
    client_users: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        client_of_user = np.asarray(self.client_of_user, dtype=np.int64)
        n_users = len(client_of_user)
        if self.n_clients < 1:
            raise FedrecError(
                f"a partition needs at least one client, got n_clients={self.n_clients}"
            )
        if n_users and (client_of_user.min() < 0 or client_of_user.max() >= self.n_clients):
            raise FedrecError(
                f"client ids must be in [0, {self.n_clients}), got {client_of_user.min()}..{client_of_user.max()}"
            )
        if self.public is not None:
            public = np.asarray(self.public, dtype=bool)
            if public.shape != (n_users,):
                raise FedrecError(f"public flags have shape {public.shape}, expected ({n_users},)")
            object.__setattr__(self, "public", public)
        sizes = np.bincount(client_of_user, minlength=self.n_clients)
        object.__setattr__(self, "client_of_user", client_of_user)
        object.__setattr__(self, "client_ptr", np.r_[0, np.cumsum(sizes)].astype(np.int64))
        object.__setattr__(
            self, "client_users", np.argsort(client_of_user, kind="stable").astype(np.int64)
        )

    @property
    def n_users(self) -> int:
        return len(self.client_of_user)

    def sizes(self) -> np.ndarray:
        """Number of users of each client."""
        return np.diff(self.client_ptr)

    def users_of(self, client_ids: np.ndarray) -> np.ndarray:
        """The users of the given clients, concatenated in the order of ``client_ids``."""
        clients = np.asarray(client_ids, dtype=np.int64).ravel()
        if len(clients) and (clients.min() < 0 or clients.max() >= self.n_clients):
            raise FedrecError(
                f"client ids must be in [0, {self.n_clients}), got {clients.min()}..{clients.max()}"
            )
        starts = self.client_ptr[clients]
        lengths = self.client_ptr[clients + 1] - starts
        # Position k of the output reads client_users[start of its client + offset within it].
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return self.client_users[np.repeat(starts, lengths) + offsets]


def one_user_per_client(n_users: int) -> Partition:
    """Client ``i`` holds user ``i`` only: the default cross-device setting."""
    _check_sizes(n_users, n_users)
    return Partition(np.arange(n_users, dtype=np.int64), n_users)


def random_groups(n_users: int, n_clients: int, seed: int | np.random.Generator = 0) -> Partition:
    """Shuffle users with ``seed``, then cut them into ``n_clients`` near-equal groups.

    Sizes differ by at most one: the first ``n_users % n_clients`` clients get one user more.
    """
    _check_sizes(n_users, n_clients)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_users)
    base, extra = divmod(n_users, n_clients)
    sizes = np.full(n_clients, base, dtype=np.int64)
    sizes[:extra] += 1
    client_of_user = np.empty(n_users, dtype=np.int64)
    client_of_user[order] = np.repeat(np.arange(n_clients, dtype=np.int64), sizes)
    return Partition(client_of_user, n_clients)


def contiguous_groups(n_users: int, n_clients: int) -> Partition:
    """Blocks of consecutive user ids, as in FedCIA's official split.

    Every block has ``n_users // n_clients`` users and the last one also takes the remainder:
    ML-1M's 6040 users in 100 clients give 99 clients of 60 users and one of 100.
    """
    _check_sizes(n_users, n_clients)
    block = n_users // n_clients
    client_of_user = np.minimum(np.arange(n_users, dtype=np.int64) // block, n_clients - 1)
    return Partition(client_of_user, n_clients)


GROUPINGS = ("contiguous", "random")


def clients_of(n_users: int, clients: int, grouping: str, seed: int) -> Partition:
    """``clients`` groups of users cut ``grouping``-wise (``contiguous`` or ``random``), or
    one user per client when ``clients`` is 0 (the option methods with grouped users take)."""
    if clients == 0:
        return one_user_per_client(n_users)
    if clients > n_users:
        raise FedrecError(f"clients={clients} but the data set has {n_users} users: give --set clients=N with "
                          f"N at most {n_users}, or --set clients=0 for one user a client")
    if grouping == "random":
        return random_groups(n_users, clients, seed)
    if grouping == "contiguous":
        return contiguous_groups(n_users, clients)
    raise FedrecError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")


def with_public(
    partition: Partition, public_ratio: float, seed: int | np.random.Generator = 0
) -> Partition:
    """The same partition with ``round(public_ratio * n_users)`` users, drawn with ``seed``, public.

    ``round`` is Python's (halves to even).
    """
    if not 0.0 <= public_ratio <= 1.0:
        raise FedrecError(f"public_ratio must be in [0, 1], got {public_ratio}")
    n_public = round(public_ratio * partition.n_users)
    rng = np.random.default_rng(seed)
    public = np.zeros(partition.n_users, dtype=bool)
    public[rng.choice(partition.n_users, size=n_public, replace=False)] = True
    return dataclasses.replace(partition, public=public)


def _check_sizes(n_users: int, n_clients: int) -> None:
    """Every client must get at least one user."""
    if n_users < 1:
        raise FedrecError(f"cannot partition {n_users} users; need at least one")
    if not 1 <= n_clients <= n_users:
        raise FedrecError(f"n_clients must be in [1, n_users={n_users}], got {n_clients}")
