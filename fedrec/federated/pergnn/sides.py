"""FedPerGNN's round by side (see `fedrec.rounds.sides`).

A client is one user; node i holds the i-th block of users and runs a `GNNAlgorithm` for them
alone (``client_ids=``: negatives and user vectors are drawn by user id, so it trains them as
the simulator does).

**The server plays the paper's third party.** FedPerGNN's expansion needs someone who matches
clients' items and relays their published user vectors. A Flower deployment has one server, so
it does both jobs:

* each node's first answer names its clients' training items;
* each reply carries its trained clients' new user vectors;
* each train message carries the neighbours' vectors of the sampled clients it expands that
  round (`fedrec.federated.pergnn.state.expanding` and `neighbours`, the simulator's draws);
  the others keep those they were last sent.

So the server learns what the paper keeps from it: every client's items and user vector. Run
it only where the server may know them; `docs/fedpergnn.md` says so.

A train message carries the whole item table and the graph layer. A reply carries:

* the sums of the node's clients' item-row steps on the rows they sent, with each row's
  senders;
* the graph layer's steps;
* the new user vectors.

The server averages them as the simulator does. Under a robust rule (``--defence``) the server
asks for each client's upload instead (``per_client``: its item rows and graph-layer steps) and
aggregates them by the rule, as the simulator's `GNNAlgorithm.aggregate` does.

Under ``--ldp`` and ``--pad-items``, a node draws its clients' noise and pseudo rows from its
own entropy. The server knows the run's seed and could redraw anything keyed by it.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.federated.family.sides import check_per_client, client_uploads, per_client_payload
from fedrec.federated.pergnn.state import GNNAlgorithm, GNNState, expanding, neighbours
from fedrec.protocols.protocol import Split
from fedrec.rounds.ragged import ranges
from fedrec.rounds.sides import (
    COUNTS,
    ClientSide,
    NodeData,
    Payload,
    RoundTotals,
    ServerSide,
    bad_floats,
    bad_item_ids,
    local_rows,
    missing,
    node_users,
    stage_metrics,
    wire_ids,
)

#: the global parts a message carries
GLOBAL = ("items", "w", "a")


class GNNClient(ClientSide):
    """A node holding a block of FedPerGNN's clients (one user each)."""

    def __init__(self, spec: Any, cfg: Any, seed: int, split: Split, partition: int, partitions: int) -> None:
        self.n_clients = split.n_users
        self.data = NodeData.of(split, node_users(split.n_users, partition, partitions))
        state = GNNState(spec, self.data.view(), cfg, seed, client_ids=self.data.users)  # type: ignore[arg-type]
        self.algorithm = GNNAlgorithm(state, cfg)
        if cfg.ldp > 0 or cfg.pad_items:  # the node's own entropy, never the run's seed
            self.algorithm.noise_seed = secrets.randbits(62)

    @property
    def state(self) -> GNNState:
        return self.algorithm.state

    def private_state(self) -> dict[str, Any]:
        st = self.state
        return {"users": st.users, "neighbour_vectors": st.neighbour_vectors,
                "neighbour_valid": torch.as_tensor(st.neighbour_valid)}

    def load_private_state(self, blob: dict[str, Any]) -> None:
        st = self.state
        st.users, st.neighbour_vectors = blob["users"], blob["neighbour_vectors"]
        st.neighbour_valid = np.asarray(blob["neighbour_valid"], bool)

    def hello(self, resume_round: int = 0) -> Payload:
        train = self.data.train
        return {"clients": self.data.users, "n_clients": self.n_clients, "n_items": train.shape[1],
                "row_width": self.state.items.shape[1],
                "client_items": wire_ids(train.indices), "client_ptr": train.indptr.astype(np.int64)}

    def _set_global(self, msg: Payload) -> None:
        st = self.state
        st.items, st.w, st.a = (torch.as_tensor(msg[k]) for k in GLOBAL)

    def train(self, msg: Payload) -> Payload:
        """Take the neighbours sent, step the sampled clients; reply with the sums of what they
        send and their new user vectors."""
        st = self.state
        self._set_global(msg)
        rows = local_rows(self.data.users, np.asarray(msg["clients"], np.int64))
        rows = rows[np.diff(self.data.train.indptr)[rows] > 0]
        if "neighbours.vectors" in msg:  # those of its clients the third party expands this round
            fresh = rows[np.asarray(msg["neighbours.fresh"], bool)]
            st.neighbour_vectors[torch.as_tensor(fresh)] = torch.as_tensor(msg["neighbours.vectors"])
            st.neighbour_valid[fresh] = np.asarray(msg["neighbours.valid"], bool)
            st.received[fresh] = int(msg["round"])
        kept: list[Any] | None = [] if msg.get("per_client") else None  # a robust rule: each client's upload
        step = self.algorithm.client_steps(rows, int(msg["round"]), kept, each_layer=kept is not None)
        counts = {"published": st.users[torch.as_tensor(rows)].cpu().numpy(), "n": len(rows),
                  "loss_sum": step.loss_sum, "client_batches": len(rows), "bytes_up": step.bytes_up,
                  "bytes_down": step.bytes_down}
        if kept is not None:  # the uploads name the clients by their run ids
            return {**per_client_payload(kept, np.arange(self.n_clients), {"w": st.w, "a": st.a},
                                         width=st.items.shape[1]), **counts}
        touched = torch.nonzero(step.item_count > 0).reshape(-1)
        return {"items": wire_ids(touched.cpu().numpy()), "rows": step.item_sum[touched].cpu().numpy(),
                "senders": step.item_count[touched].cpu().numpy().astype(np.int32),
                "w": step.layer_sum["w"].cpu().numpy(), "a": step.layer_sum["a"].cpu().numpy(), **counts}

    def evaluate(self, msg: Payload) -> Payload:
        self._set_global(msg)
        return stage_metrics(self.algorithm.scores, self.data.valid, self.data.test, self.data.protocol)


class GNNServer(ServerSide):
    """FedPerGNN's server: the item table, the graph layer, and the third party's matching of
    items and relaying of published user vectors."""

    #: it has a slot for a robust rule (``--defence``): the nodes then send each client's upload,
    #: its item rows and graph-layer steps, and the server aggregates them by the rule as the
    #: simulator's `GNNAlgorithm.aggregate` does
    takes_rule: ClassVar[bool] = True
    #: the round's robust aggregation (`fedrec.security.adversary.Security`), plugged in by the
    #: deployment; None: plain averages
    rule: Any = None
    plain_average: ClassVar[bool] = True

    def __init__(self, spec: Any, cfg: Any, seed: int, hellos: dict[int, Payload], n_clients: int,
                 n_items: int, secure: bool) -> None:
        self.spec, self.cfg, self.seed, self.n_items, self.n_users = spec, cfg, seed, n_items, n_clients
        # a malicious node's clients come after the users (``extra_clients``): they hold no
        # items, train nothing, publish nothing (`fedrec.flower.malicious.GNNMaliciousNode`)
        hellos = {k: h for k, h in hellos.items() if not int(h.get("extra_clients", 0))}
        widths = {int(h["row_width"]) for h in hellos.values()}
        width = widths.pop() if len(widths) == 1 else spec.dim
        d = spec.dim
        gen = torch.Generator().manual_seed(seed)  # the simulator's start (`GNNState`)
        items = torch.randn((n_items, d), generator=gen, device="cpu") * cfg.item_std
        self.items = torch.cat([items, torch.zeros((n_items, width - d))], 1)
        self.w, self.a = torch.eye(d), torch.zeros(2 * d)
        self.published = torch.zeros((n_clients, d))
        self.has_published = np.zeros(n_clients, bool)
        self.expanded = np.zeros(n_clients, bool)
        # every client's items in its own order, and every item's raters: the third party's
        counts = np.zeros(n_clients, np.int64)
        for h in hellos.values():
            counts[np.asarray(h["clients"], np.int64)] = np.diff(np.asarray(h["client_ptr"], np.int64))
        indptr = np.concatenate([[0], np.cumsum(counts)])
        indices = np.zeros(indptr[-1], np.int64)
        for h in hellos.values():
            held = np.asarray(h["clients"], np.int64)
            indices[ranges(indptr[held], counts[held])] = np.asarray(h["client_items"], np.int64)
        self.train = sp.csr_matrix((np.ones(len(indices), np.float32), indices, indptr), shape=(n_clients, n_items))
        self.raters = sp.csc_matrix(self.train)
        self.counts = counts

    def begin(self, r: int) -> None:
        self.item_sum = torch.zeros_like(self.items)
        self.item_count = torch.zeros(self.n_items)
        self.layer = {"w": torch.zeros_like(self.w), "a": torch.zeros_like(self.a)}
        self.sent: dict[int, np.ndarray] = {}
        self.fresh: dict[int, np.ndarray] = {}  # each node's clients expanded this round
        self.new_vectors: list[tuple[np.ndarray, torch.Tensor]] = []
        self.kept: list[Any] = []  # each client's upload, under a rule
        self.totals = RoundTotals()
        self.n = 0

    def _trainable(self, clients: np.ndarray) -> np.ndarray:
        """The users among ``clients`` with a training item (those that train and publish)."""
        users = clients[clients < self.n_users]
        return users[self.counts[users] > 0]

    def _uploading(self, clients: np.ndarray) -> int:
        """How many of ``clients`` upload: the users with a training item, and any malicious
        client beyond the users."""
        return len(self._trainable(clients)) + int((clients >= self.n_users).sum())

    def message(self, r: int, node: int, clients: np.ndarray) -> Payload:
        out: Payload = {"round": r, "clients": wire_ids(clients),
                        **{k: getattr(self, k).cpu().numpy() for k in GLOBAL},
                        **({"per_client": 1} if self.rule is not None else {})}
        trainable = self._trainable(clients)
        self.sent[node] = trainable
        fresh = expanding(self.spec, self.expanded, trainable, r)
        self.fresh[node] = fresh  # marked expanded when the node answers (`fold`)
        if len(fresh):
            vectors, valid = neighbours(self.train, self.raters, self.published, self.has_published, fresh,
                                        self.spec.neighbours, self.seed, r)
            out["neighbours.fresh"] = np.isin(trainable, fresh).astype(np.uint8)
            out["neighbours.vectors"] = vectors.cpu().numpy()
            out["neighbours.valid"] = valid.astype(np.uint8)
        return out

    def check(self, reply: Payload, clients: np.ndarray) -> str | None:
        publishing = len(self._trainable(clients))
        if self.rule is not None:
            layer = {"w": self.w, "a": self.a}
            uploading = np.concatenate([self._trainable(clients), clients[clients >= self.n_users]])
            return (check_per_client(reply, uploading, self.n_items, self.items.shape[1], layer,
                                     side_keys=("published",))
                    or bad_floats("published", np.asarray(reply["published"]), (publishing, self.spec.dim)))
        problem = missing(reply, ["items", "rows", "senders", "w", "a", "published", *COUNTS])
        if problem:
            return problem
        n = self._uploading(clients)
        items = np.asarray(reply["items"])
        problem = bad_item_ids(items, self.n_items)
        if problem:
            return problem
        shapes = {"rows": (len(items), self.items.shape[1]), "w": tuple(self.w.shape), "a": tuple(self.a.shape),
                  "published": (publishing, self.spec.dim)}
        for k, want in shapes.items():
            problem = bad_floats(k, np.asarray(reply[k]), want)
            if problem:
                return problem
        senders = np.asarray(reply["senders"])
        if senders.shape != items.shape or senders.dtype.kind not in "iu" or (senders < 1).any() or (senders > n).any():
            return f"row sender counts outside 1..{n}"
        if int(reply["n"]) != n or not math.isfinite(float(reply["loss_sum"])):
            return f"{reply['n']} clients trained of the {n} with training items, or a non-finite loss"
        return None

    def fold(self, node: int, reply: Payload) -> None:
        self.new_vectors.append((self.sent[node], torch.as_tensor(reply["published"])))
        self.expanded[self.fresh[node]] = True
        self.totals.add(reply)
        self.n += int(reply["n"])
        if self.rule is not None:  # each client's upload, for the rule (which counts the senders)
            self.kept.extend(client_uploads(reply, ["w", "a"]))
            return
        at = torch.as_tensor(reply["items"], dtype=torch.int64)
        self.item_sum.index_add_(0, at, torch.as_tensor(reply["rows"]))
        self.item_count.index_add_(0, at, torch.as_tensor(reply["senders"], dtype=self.item_count.dtype))
        for k in self.layer:
            self.layer[k] += torch.as_tensor(reply[k])

    def finish(self, r: int, rejected: int, gen: Any) -> RoundTotals:
        for clients, vectors in self.new_vectors:  # the third party's: published for the next rounds
            self.published[torch.as_tensor(clients)] = vectors
            self.has_published[clients] = True
        n = self.n
        if self.rule is not None and n:  # as the simulator's `GNNAlgorithm.aggregate`
            per_row = self.item_count if self.cfg.aggregation == "contributors" else None
            self.item_sum, self.layer, n = self.rule.sums(self.kept, *self.items.shape, {"w": self.w, "a": self.a},
                                                          self.items, r, senders=per_row)
        if n:
            divisor = self.item_count.clamp_min(1)[:, None] if self.cfg.aggregation == "contributors" else n
            self.items = self.items + self.item_sum.to(self.items) / divisor
            self.w = self.w + self.layer["w"].to(self.w) / n
            self.a = self.a + self.layer["a"].to(self.a) / n
        self.totals.rejected = rejected
        self.totals.extra = {"clients": float(self.n), **(self.rule.last if self.rule is not None else {})}
        return self.totals

    def evaluate_message(self) -> Payload:
        return {k: getattr(self, k).cpu().numpy() for k in GLOBAL}

    def state_dict(self) -> dict[str, Any]:
        return {"items": self.items, "w": self.w, "a": self.a, "published": self.published,
                "has_published": torch.as_tensor(self.has_published), "expanded": torch.as_tensor(self.expanded)}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.items, self.w, self.a, self.published = blob["items"], blob["w"], blob["a"], blob["published"]
        self.has_published = np.asarray(blob["has_published"], bool)
        # a save made before the flag was kept: those who published are those expanded
        self.expanded = np.asarray(blob.get("expanded", self.has_published), bool)
