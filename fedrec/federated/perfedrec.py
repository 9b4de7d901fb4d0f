"""PerFedRec (Luo, Xiao and Song, "Personalized Federated Recommendation via Joint Representation
Learning, User Clustering, and Model Adaptation", CIKM 2022) on FedMF's model: the server
clusters the users by their uploaded user vectors, keeps one item table a cluster beside the
global one, sends each client its cluster's table, and each client scores with the average of
the global, its cluster's and its own model.

What the official code (sichunluo/PerFedRec, read at 4d0c8f0) does, and what fedrec keeps:

* **Clustering.** Each round the server runs k-means (5 clusters) over the users' vectors. The
  official server holds every user's row of a shared user table; here a client uploads its
  user vector each round (d floats, counted in its bytes) and the server clusters the latest
  vector of every user it has heard from (`scipy.cluster.vq.kmeans2`, k-means++ starts drawn
  from the run's seed and the round). New clusters are matched to the last round's by their
  centroids (an assignment on their distances), so a cluster's table stays its own; the
  official code indexes last round's cluster models by this round's arbitrary labels.
* **Cluster models.** Cluster k's table for the next round is its table this round moved by
  the mean change of each row over the clients of cluster k that sent it (fedrec's item-row
  rule, as the global table); a row none of them sent keeps its value, and a cluster none of
  whose clients came back this round takes the global table. This is the official server's
  rule (the plain mean of the members' models, each started from the cluster's; the global
  model for an empty cluster) with rows a client did not train left as it downloaded them. A
  client downloads its cluster's rows; one the server has not clustered yet (it
  never uploaded) downloads the global rows. The global table averages every client's rows as
  they came back (what it downloaded plus its change).
* **Model adaptation.** A client's score of an item is the mean of three scores: under the
  global table, its cluster's table, and its own model (its cluster's table with the rows it
  trained in its latest round, kept on the client); a client that has not trained yet averages
  the first two. The official code does this at evaluation only, with fixed equal weights, and
  for the round's participants only (it keeps no client model between rounds).

**Attacks and defences** (`fedrec.security.adversary`). A malicious client is a client: it
sends a user vector as everyone does, forged as one of the users it approximates from the public
interactions, so the server clusters it, and its crafted rows join its cluster's table as well
as the global one (`join_attackers`). A defence's rule aggregates the global table and each
cluster's table, over the cluster's members (`guard_clusters`).

On Flower (`PerFedRecClient`, `PerFedRecServer`) a node is told its sampled clients' clusters
and sent the rows they need of those clusters' tables beside the global rows; it replies with
the family's sums, each cluster's sums and the user vectors its clients sent; under a robust
rule, each client's upload, which the server judges as the simulator does (`FamilyServer.finish`
calls `guard_clusters`).

Not kept: the official GNN (each client propagates its positives over *every* user's
interactions in the global graph, which a client cannot see; its layers are not chained), its
attribute branch (off in the code, its files absent), its single Adam step a round shared
across clients, its size-weighted client selection (clients are sampled uniformly, as every
fedrec method), and its evaluation, which averages scores of three different draws of
negatives and reports each metric's best test round.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from scipy.cluster.vq import kmeans2
from scipy.optimize import linear_sum_assignment

from fedrec.core.contract import row_senders
from fedrec.federated.family.model import ITEMS, score
from fedrec.federated.family.sides import FamilyClient, FamilyServer
from fedrec.federated.family.state import Accumulator, CohortUpload, FamilyState
from fedrec.rounds import draws
from fedrec.rounds.cohort import CohortBatches
from fedrec.rounds.sides import Payload, missing, wire_ids
from fedrec.rounds.upload import FLOAT_BYTES, UploadPath


@dataclass
class PerFedRecState(FamilyState):
    """FedMF's state with cluster tables, the server's copies of the users' vectors and each
    client's own rows (module docstring)."""

    #: ``(clusters, n_items, width)``: each cluster's table (None before the first aggregation)
    cluster_items: torch.Tensor | None = None
    #: each client's cluster (-1: not clustered yet), as the server assigned it
    labels: np.ndarray | None = None
    #: the clusters' centroids ``(clusters, width)`` of the latest clustering
    centroids: np.ndarray | None = None
    #: the latest user vector each client uploaded (the server's), and whether it has one
    server_users: torch.Tensor | None = None
    heard: np.ndarray | None = None
    #: whether a client has trained (and keeps its own rows, ``personal``)
    trained: np.ndarray | None = None
    _cluster_sum: torch.Tensor | None = None
    _cluster_count: torch.Tensor | None = None
    _round: int = 0
    #: the clients whose vectors this round's uploads carried (a Flower node sends them on)
    _sent: list[np.ndarray] = field(default_factory=list)
    #: each cluster's members a defence kept this round (`guard_clusters`); None: every member back
    _kept_members: torch.Tensor | None = None

    @classmethod
    def create(cls, spec: Any, n_clients: int, n_items: int, *, lr: float, lr_item: float,
               item_std: float, seed: int, client_ids: np.ndarray | None = None) -> PerFedRecState:
        state = super().create(spec, n_clients, n_items, lr=lr, lr_item=lr_item, item_std=item_std,
                               seed=seed, client_ids=client_ids)
        assert isinstance(state, PerFedRecState)
        state.labels = np.full(n_clients, -1, np.int64)
        state.server_users = torch.zeros((n_clients, spec.dim), dtype=state.items.dtype, device=state.items.device)
        state.heard = np.zeros(n_clients, bool)
        state.trained = np.zeros(n_clients, bool)
        return state

    @property
    def clusters(self) -> int:
        return int(self.spec.clusters)

    # -- a round ---------------------------------------------------------------------------

    def begin_round(self, r: int) -> Accumulator:
        self._round = r
        n_items, width = self.items.shape
        like = {"dtype": self.items.dtype, "device": self.items.device}
        self._cluster_sum = torch.zeros((self.clusters * n_items, width), **like)
        self._cluster_count = torch.zeros(self.clusters * n_items, **like)
        self._sent = []
        self._kept_members = None
        return super().begin_round(r)

    def _row_clusters(self, cohort: CohortBatches) -> torch.Tensor:
        """The cluster each of the cohort's rows was downloaded from (-1: the global table)."""
        assert self.labels is not None
        counts = np.diff(cohort.row_ptr)
        return torch.as_tensor(np.repeat(self.labels[cohort.clients], counts), device=self.items.device)

    def _base_rows(self, cohort: CohortBatches) -> torch.Tensor:
        """The rows the cohort downloads: its clients' clusters' rows, or the global ones."""
        items = torch.as_tensor(cohort.row_items, device=self.items.device)
        start = self.items.index_select(0, items)
        if self.cluster_items is None:
            return start
        clusters = self._row_clusters(cohort)
        mine = clusters >= 0
        flat = self.cluster_items.reshape(-1, self.items.shape[1])
        start[mine] = flat.index_select(0, clusters[mine] * self.items.shape[0] + items[mine])
        return start

    def _download(self, cohort: CohortBatches) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        clients = torch.as_tensor(cohort.clients)
        return self._base_rows(cohort), {k: self.private[k][clients] for k in self.spec.private_names()}

    def _finish(self, cohort: CohortBatches, params: dict[str, torch.Tensor], start: torch.Tensor,
                rows: torch.Tensor, path: UploadPath, loss_sum: float,
                shared_sum: dict[str, torch.Tensor] | None = None) -> CohortUpload:
        """FedMF's upload and the client's user vector beside it (for the server's clustering);
        the client keeps the rows it trained (its own model)."""
        up = super()._finish(cohort, params, start, rows, path, loss_sum, shared_sum)
        assert self.server_users is not None and self.heard is not None and self.trained is not None
        ok = up.accepted.cpu().numpy()
        sent = cohort.clients[ok]
        device = self.server_users.device
        self.server_users[torch.as_tensor(sent, device=device)] = params["user"][torch.as_tensor(ok, device=device)].detach()
        self.heard[sent] = True
        self._sent.append(sent)
        self.personal.update(cohort.clients, cohort.row_items, cohort.row_ptr, rows)
        self.trained[cohort.clients] = ok  # a rejected client's rows are not a model to score with
        up.bytes_up += len(cohort.clients) * self.spec.dim * FLOAT_BYTES
        # a client of a cluster started from its cluster's row: the global table reads each row
        # as it came back less the global row
        up.offset = start - self.items.index_select(0, torch.as_tensor(cohort.row_items, device=start.device))
        return up

    def accumulate(self, acc: Accumulator, up: CohortUpload) -> None:
        """The global sums take each row as it came back less the global row (a client of a
        cluster started from its cluster's row); the cluster sums take each clustered client's
        change."""
        cohort = up.cohort
        items = torch.as_tensor(cohort.row_items)
        super().accumulate(acc, replace(up, delta=up.global_delta, offset=None))
        clusters = self._row_clusters(cohort)
        keep = (clusters >= 0) & torch.repeat_interleave(up.accepted, torch.as_tensor(np.diff(cohort.row_ptr)))
        if bool(keep.any()):
            assert self._cluster_sum is not None and self._cluster_count is not None
            key = clusters[keep] * self.items.shape[0] + items[keep]
            self._cluster_sum.index_add_(0, key, up.delta[keep])
            self._cluster_count.index_add_(0, key, torch.ones(len(key), dtype=self._cluster_count.dtype))

    def aggregate(self, acc: Accumulator, path: UploadPath, gen: torch.Generator) -> None:
        """The global table (`FamilyState.aggregate`), each cluster's table, then the users
        clustered anew."""
        if acc.n == 0:  # nothing came back: every table stays as it is
            return
        old = self.cluster_items
        super().aggregate(acc, path, gen)
        n_items, width = self.items.shape
        glob = self.items.expand(self.clusters, n_items, width).reshape(-1, width)
        if old is None:
            tables = glob.clone()
        else:
            assert self._cluster_sum is not None and self._cluster_count is not None
            sent = self._cluster_count > 0
            members = self._members_back()
            # a row its cluster's members came back without keeps the cluster's value (they all
            # started from it: the mean of their models, as the official server takes it); a
            # cluster none of whose members came back takes the global table
            kept = torch.repeat_interleave(members > 0, n_items) & ~sent
            tables = glob.clone()
            flat = old.reshape(-1, width)
            tables[kept] = flat[kept]
            tables[sent] = flat[sent] + self._cluster_sum[sent] / self._cluster_divisor(sent, members)[:, None]
        self.cluster_items = tables.reshape(self.clusters, n_items, width)
        self._recluster()

    def _members_back(self) -> torch.Tensor:
        """How many of each cluster's clients came back this round (attackers it clustered
        included), less those a defence dropped (UNION's)."""
        assert self._cluster_count is not None and self.labels is not None
        if self._kept_members is not None:
            return self._kept_members
        back = np.concatenate([np.zeros(0, np.int64), *self._sent])
        labels = self.labels[back]
        return torch.as_tensor(np.bincount(labels[labels >= 0], minlength=self.clusters),
                               dtype=self._cluster_count.dtype, device=self._cluster_count.device)

    def _cluster_divisor(self, sent: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
        """What each sent cluster row's summed change is divided by: the cluster's clients that
        sent it (fedrec's item-row rules, as the global table), or under the papers' rule
        (``--aggregation clients``) every client of the cluster that came back this round
        (``members``; one that did not send the row counts as unchanged)."""
        assert self._cluster_count is not None
        if self.per_row:
            return self._cluster_count[sent]
        cluster = torch.nonzero(sent).flatten() // self.items.shape[0]
        return members[cluster].clamp_min(1)

    def _recluster(self) -> None:
        """k-means over the latest vectors of the users the server has heard from; the new
        clusters matched to the old by their centroids."""
        assert self.heard is not None and self.server_users is not None and self.labels is not None
        heard = np.flatnonzero(self.heard)
        if len(heard) < self.clusters:
            return
        data = self.server_users[torch.as_tensor(heard)].double().cpu().numpy()
        rng = np.random.default_rng(draws.seed_of((self.seed, draws.CLUSTERS, self._round)))
        centroids, labels = kmeans2(data, self.clusters, iter=20, minit="++", seed=rng)
        if self.centroids is not None:  # cluster k stays cluster k: the cheapest matching
            cost = ((self.centroids[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)
            old_of, new_of = linear_sum_assignment(cost)
            relabel = np.empty(self.clusters, np.int64)
            relabel[new_of] = old_of
            labels, centroids = relabel[labels], centroids[np.argsort(relabel)]
        self.centroids = centroids
        self.labels[heard] = labels

    # -- attackers (`fedrec.security.adversary`) -------------------------------------------

    def admit_attackers(self, n: int, attack: Any = None) -> None:
        """Room for ``n`` malicious clients (run ids after the benign ones) among the clients
        the server clusters: a vector, a heard flag and a label each (``attack``: not read; the
        vectors come each round, `join_attackers`)."""
        assert self.labels is not None and self.server_users is not None and self.heard is not None
        self.labels = np.concatenate([self.labels, np.full(n, -1, np.int64)])
        self.server_users = torch.cat([self.server_users, self.server_users.new_zeros((n, self.spec.dim))])
        self.heard = np.concatenate([self.heard, np.zeros(n, bool)])

    def join_attackers(self, ids: np.ndarray, users: dict[str, torch.Tensor], uploads: list[Any]) -> int:
        """The round's malicious clients (run ``ids``) send the user vectors they forged
        (``users["user"]``) beside their crafted rows (``uploads``, in the same order): the
        server keeps and clusters their vectors as anyone's, and a clustered attacker's rows
        join its cluster's sums as a member's change. The bytes of the vectors."""
        assert self.server_users is not None and self.labels is not None and self._cluster_sum is not None
        assert self._cluster_count is not None and self.heard is not None
        assert [u.client for u in uploads] == ids.tolist()
        device = self.server_users.device
        self.server_users[torch.as_tensor(ids, device=device)] = users["user"].to(self.server_users)
        self.heard[ids] = True
        self._sent.append(ids)
        add_to_clusters(self.labels[ids], uploads, self.items.shape[0], self._cluster_sum, self._cluster_count)
        return len(ids) * self.spec.dim * FLOAT_BYTES

    def guard_clusters(self, uploads: list[Any], rule: Any, key: tuple[int, ...], benign: int | None = None) -> None:
        """A defence's rule on each cluster's table too (``rule``, a
        `fedrec.security.robust.RobustRule`): the round's cluster sums become, row by row, the
        rule's over the cluster's members' changes (a benign member's upload less the cluster's
        offset from the global row; an attacker's crafted change as it sent it), and a row's
        count its senders (less the members UNION drops). ``key``: the run's seed and the round
        (UNION's sample, drawn per cluster); ``benign``: the data's clients, whose ids come
        before the attackers' (default: this state's, the simulator's)."""
        if self.cluster_items is None:  # no cluster table yet: the round's tables are the global one
            return
        assert self.labels is not None and self.trained is not None
        assert self._cluster_sum is not None and self._cluster_count is not None
        n_items, width = self.items.shape
        benign = len(self.trained) if benign is None else benign
        self._cluster_sum.zero_()
        self._cluster_count.zero_()
        self._kept_members = torch.zeros(self.clusters, dtype=self._cluster_count.dtype,
                                         device=self._cluster_count.device)
        for k in range(self.clusters):
            members = [u for u in uploads if u.accepted and self.labels[u.client] == k]
            if not members:
                continue
            offset = self.cluster_items[k] - self.items
            ups = [u if u.client >= benign else
                   replace(u, tensors={**u.tensors, ITEMS: u.tensors[ITEMS] - offset[torch.as_tensor(u.items)]})
                   for u in members]
            item_sum, _, flagged = rule.aggregate(ups, n_items, width, {}, self.cluster_items[k], (*key, 1 + k),
                                                  per_row=self.per_row)
            kept = [u for u, f in zip(ups, flagged, strict=True) if not (rule.name == "union" and f)]
            self._kept_members[k] = len(kept)
            if not kept:
                continue
            rows = slice(k * n_items, (k + 1) * n_items)
            self._cluster_sum[rows] = item_sum.to(self._cluster_sum)
            self._cluster_count[rows] = row_senders(kept, n_items).to(self._cluster_count)

    # -- scores ----------------------------------------------------------------------------

    def _score_block(self, clients: np.ndarray, items: np.ndarray | None) -> torch.Tensor:
        """The mean of the client's scores under the global table, its cluster's and its own
        model (its cluster's table with its trained rows); the first two where it has not
        trained."""
        assert self.labels is not None and self.trained is not None
        c = torch.as_tensor(clients)
        p = {k: self.private[k][c] for k in self.spec.private_names()}
        idx = None if items is None else torch.as_tensor(items)
        glob = self.items.expand(len(clients), *self.items.shape) if idx is None else self.items[idx]
        total = score(self.spec, p, glob)
        labels = torch.as_tensor(self.labels[clients])
        if self.cluster_items is None:
            own = glob.clone(memory_format=torch.contiguous_format) if idx is None else glob.clone()
        else:
            tables = torch.cat([self.items[None], self.cluster_items])  # 0: the global table
            own = tables[labels + 1] if idx is None else tables[(labels + 1)[:, None], idx]
        total = total + score(self.spec, p, own)
        self.personal.override(own, clients, items)
        mine = torch.as_tensor(self.trained[clients])
        total = total + torch.where(mine[:, None], score(self.spec, p, own), torch.zeros(()))
        return total / (2 + mine.to(total.dtype))[:, None]

    # -- checkpoints -----------------------------------------------------------------------

    def server_state_dict(self) -> dict[str, Any]:
        assert self.labels is not None and self.heard is not None
        return {**super().server_state_dict(), "cluster_items": self.cluster_items,
                "labels": self.labels, "heard": self.heard, "server_users": self.server_users,
                "centroids": self.centroids}  # NumPy arrays stay on the CPU wherever the run is

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        self.cluster_items = blob.pop("cluster_items")
        self.labels, self.heard = _array(blob.pop("labels")), _array(blob.pop("heard"))
        self.server_users = blob.pop("server_users")
        centroids = blob.pop("centroids")
        self.centroids = None if centroids is None else _array(centroids)
        super().load_server_state_dict(blob)

    def client_state_dict(self) -> dict[str, Any]:
        assert self.trained is not None
        return {**super().client_state_dict(), "trained": self.trained}

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        self.trained = _array(blob.pop("trained"))
        super().load_client_state_dict(blob)


def add_to_clusters(labels: np.ndarray, uploads: list[Any], n_items: int, sums: torch.Tensor,
                    counts: torch.Tensor) -> None:
    """Each upload's rows into its cluster's row sums and sender ``counts`` (row k x ``n_items``
    + item; ``labels``: each upload's cluster, -1 where it is not clustered yet, whose rows join
    the global table only): an attacker's crafted rows as a member's change."""
    for k, u in zip(np.asarray(labels).tolist(), uploads, strict=True):
        if k < 0 or not len(u.items):
            continue
        key = torch.as_tensor(k * n_items + np.asarray(u.items, np.int64), device=sums.device)
        sums.index_add_(0, key, u.tensors[ITEMS].to(sums))
        counts.index_add_(0, key, torch.ones(len(key), dtype=counts.dtype, device=counts.device))


def _array(x: Any) -> np.ndarray:
    """A saved array back as NumPy (a tensor on any device, from older files, or an array)."""
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# -- on Flower ---------------------------------------------------------------------------------


class PerFedRecClient(FamilyClient):
    """A node of PerFedRec: the family's node, told each round which cluster its sampled clients
    are in and sent their clusters' rows beside the global ones; it replies with the family's
    sums, each cluster's sums of its clients' row changes, and the vectors its clients sent."""

    def _train(self, msg: Payload, keep: list[Any] | None = None) -> Any:
        st = self.state
        assert st.labels is not None
        st.labels[self.data.rows_of(np.asarray(msg["clients"]))] = np.asarray(msg["cluster_of"])
        if "cluster_rows" in msg:
            if st.cluster_items is None:
                st.cluster_items = torch.zeros((st.clusters, *st.items.shape), dtype=st.items.dtype)
            st.cluster_items[:, torch.as_tensor(msg["items"])] = torch.as_tensor(msg["cluster_rows"])
        return super()._train(msg, keep)

    def train(self, msg: Payload) -> Payload:
        reply = super().train(msg)
        st = self.state
        assert st._cluster_sum is not None and st._cluster_count is not None and st.server_users is not None
        keys = torch.nonzero(st._cluster_count > 0).flatten()
        sent = np.concatenate([np.zeros(0, np.int64), *st._sent])
        return {**reply, "cluster_keys": keys.cpu().numpy().astype(np.int64),
                "cluster_sums": st._cluster_sum[keys].cpu().numpy(),
                "cluster_senders": st._cluster_count[keys].cpu().numpy().astype(np.int32),
                "user_ids": wire_ids(self.data.users[sent]),
                "user_vectors": st.server_users[torch.as_tensor(sent)].cpu().numpy()}

    def evaluate(self, msg: Payload) -> Payload:
        st = self.state
        assert st.labels is not None
        st.labels[:] = np.asarray(msg["labels"])[self.data.users]
        if "cluster_table" in msg:
            st.cluster_items = torch.as_tensor(msg["cluster_table"])
        return super().evaluate(msg)


class PerFedRecServer(FamilyServer):
    """PerFedRec's server: the family's, with every user's cluster, the latest vector each
    sent, the cluster tables, and the clustering (`PerFedRecState.aggregate`)."""

    #: a robust rule judges the global table from each client's upload (the family's), and each
    #: cluster's table from its members' (`PerFedRecState.guard_clusters`, in `FamilyServer.finish`)
    takes_rule: ClassVar[bool] = True

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        super().__init__(spec, cfg, seed, hellos, n_clients, n_items, secure)
        st = self.state
        # clients beyond the data's users (a node that declares them) have a slot too: the server
        # samples and checks them as any client
        total = n_clients + sum(int(h.get("extra_clients", 0)) for h in hellos.values())
        st.labels = np.full(total, -1, np.int64)
        st.server_users = torch.zeros((total, spec.dim), dtype=st.items.dtype)
        st.heard = np.zeros(total, bool)

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        msg = super().message(r, node, clients)
        st = self.state
        assert st.labels is not None
        msg["cluster_of"] = st.labels[clients]
        if st.cluster_items is not None:
            msg["cluster_rows"] = st.cluster_items[:, torch.as_tensor(msg["items"])].cpu().numpy()
        return msg

    def fold(self, node: int, reply: Payload) -> None:
        super().fold(node, reply)
        st = self.state
        assert st._cluster_sum is not None and st._cluster_count is not None
        assert st.server_users is not None and st.heard is not None
        keys = torch.as_tensor(np.asarray(reply["cluster_keys"], np.int64))
        st._cluster_sum.index_add_(0, keys, torch.as_tensor(reply["cluster_sums"]))
        st._cluster_count.index_add_(0, keys, torch.as_tensor(reply["cluster_senders"], dtype=st._cluster_count.dtype))
        users = np.asarray(reply["user_ids"], np.int64)
        st.server_users[torch.as_tensor(users)] = torch.as_tensor(reply["user_vectors"])
        st.heard[users] = True
        st._sent.append(users)  # the clients that came back (the papers' rule divides by them)

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        problem = super().check(reply, clients) or missing(
            reply, ["cluster_keys", "cluster_sums", "cluster_senders", "user_ids", "user_vectors"])
        if problem:
            return problem
        st = self.state
        keys, sums = np.asarray(reply["cluster_keys"]), np.asarray(reply["cluster_sums"])
        senders = np.asarray(reply["cluster_senders"])
        width = st.items.shape[1]
        if keys.ndim != 1 or keys.dtype.kind not in "iu" or (
                len(keys) and (keys.min() < 0 or keys.max() >= st.clusters * self.n_items
                               or len(np.unique(keys)) != len(keys))):
            return "cluster row keys out of range, repeated or not integers"
        if sums.shape != (len(keys), width) or not np.isfinite(sums).all():
            return f"cluster sums have shape {sums.shape} or non-finite values, expected ({len(keys)}, {width})"
        if senders.shape != (len(keys),) or (len(senders) and (senders.min() < 1 or senders.max() > len(clients))):
            return f"cluster senders must be one count in 1..{len(clients)} for each cluster row sent"
        users, vectors = np.asarray(reply["user_ids"]), np.asarray(reply["user_vectors"])
        if users.ndim != 1 or not np.isin(users, clients).all() or len(np.unique(users)) != len(users):
            return "user vectors from clients that were not sent this round, or twice"
        if vectors.shape != (len(users), st.spec.dim) or not np.isfinite(vectors).all():
            return f"user vectors have shape {vectors.shape} or non-finite values"
        return None

    def evaluate_message(self) -> Payload:
        st = self.state
        msg = {**super().evaluate_message(), "labels": st.labels}
        if st.cluster_items is not None:
            msg["cluster_table"] = st.cluster_items.cpu().numpy()
        return msg
