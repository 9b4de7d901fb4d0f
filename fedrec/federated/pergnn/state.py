"""FedPerGNN (Wu, Wu, Cao, Huang and Xie, "A federated graph neural network framework for
privacy-preserving personalization", Nature Communications 2022; the FedGNN preprint, arXiv
2102.04925): each client holds one user's interactions as a local graph, which it expands with
neighbouring users found through a third party, and trains a graph attention layer over it.

**The model.** The server holds the item table E and the graph layer's weights (a projection W
and an attention vector a = [a₁; a₂]); a client holds its user vector e_u. A user's local graph
is its node, its training items and up to ``neighbours`` neighbouring users (below). The user's
representation is one graph-attention hop over that graph, its own node included:
z_j = W x_j for every node j, α_j = softmax_j(LeakyReLU(a₁·z_u + a₂·z_j)), h_u = Σ_j α_j z_j;
an item's is h_v = W e_v, and the score is ⟨h_u, h_v⟩ (the paper's dot-product predictor).
Under ranking protocols it is trained on the client's positives and ``negatives`` fresh
leak-free negatives a positive, by the mean binary cross-entropy. Under rating protocols (the
paper's task) it fits the client's observed ratings by their mean squared error, no negatives;
with the engine's rating baseline (``--rating-baseline user-item``, fedrec's default for
ratings) the predicted rating is the client's training mean plus a learned item bias plus
⟨h_u, h_v⟩, the bias sent and averaged as one more column of the item's row; with ``none`` it
is ⟨h_u, h_v⟩ alone, the paper's.

**A round** (the paper's Algorithm 1):

1. The server samples the round's clients; each downloads W, a and the rows of its items and
   negatives, and the third party sends it its neighbours' latest user vectors.
2. Each computes one gradient of its loss (the paper's clients compute gradients once a round,
   with no local epochs), moves its own e_u by it, and uploads the gradient's item rows and
   the graph layer's gradient as steps (−lr x gradient); it publishes its new e_u to the third
   party, anonymously, for its co-raters' next expansion.
3. Privacy (the engine's options): ``--clip`` bounds each uploaded row's L2 norm (the paper
   clips entries to [−δ, δ]), ``--pad-items M`` adds M pseudo items' rows with Gaussian values
   of the real rows' spread (the paper's pseudo-interacted items, M = 1000 there), ``--ldp λ``
   adds Laplace(0, λ) to every uploaded number (rows, pseudo rows and the layer's step), and
   the model options ``layer_clip`` bound each client's graph-layer step (L2, W and a together)
   and ``entry_clip`` every entry of every step sent (the paper's δ).
4. The server averages: the graph layer over the round's clients, and each item row over the
   round's clients (the paper's rule, ``--aggregation clients``) or over the clients that sent
   it (``contributors``).

**Neighbours.** The paper's third party matches clients' encrypted item ids and returns the
embeddings of users who share an item. Here each of a client's ``neighbours`` draws picks one of
its training items and then one of that item's raters at random (keyed by seed, round and
client), so a user sharing more items is drawn more often, and takes the vector that user last
published. A draw that lands on the client itself or on a user who has not published yet is
left out, not redrawn, and a user drawn twice counts twice in the attention. A client keeps the vectors it was last
sent, and scores with them. What the third party sees (every item id, hashed, and every user's
vector) is the paper's trust assumption, not audited here.

**Departures from the official code** (wuch15/FedPerGNN, read at 9e77e2e), which differs from
its paper: its neighbours hang off items and include the user itself, its item-level attention
has no softmax and its user-level mask is inverted, its predictor is an MLP, its labels are cast
to integers (all zero) and its test predictions are compared with labels in another order, and
its noise is added centrally to every weight. fedrec follows the paper's design instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.core.device import here
from fedrec.federated.engine import client_negatives
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.spec import FamilySpec
from fedrec.protocols.protocol import Split, user_means
from fedrec.rounds import draws
from fedrec.rounds.cohort import chunk_clients
from fedrec.rounds.padding import pseudo_rows
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES, clip_rows

#: samples (positives and negatives) a chunk of clients computes its gradients over at once
CHUNK_SAMPLES = 1 << 20
#: users x items scored at once
SCORE_CELLS = 1 << 23
#: LeakyReLU's slope in the attention (GAT's)
SLOPE = 0.2
#: numbers of the outer products summed at once into each client's graph-layer gradient
OUTER_CELLS = 1 << 22


@dataclass
class ClientSteps:
    """The sums over a round's clients of what they send (`GNNAlgorithm.client_steps`): item-row
    steps ``(M, width)``, how many sent each row, the graph layer's steps; their loss and bytes."""

    item_sum: torch.Tensor
    item_count: torch.Tensor
    layer_sum: dict[str, torch.Tensor]
    loss_sum: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass
class Layout:
    """A chunk's samples and local rows: sample s of client ``sample_client[s]`` is local row
    ``sample_row[s]`` with label ``label[s]``; client k's local rows are
    ``row_ptr[k]:row_ptr[k+1]``, holding items ``row_items`` (sorted within a client); the
    clients' positives are local rows ``history`` (owner ``history_owner``). The samples are
    every positive, then every negative: a client's gradient is a sum over its samples, so
    their order is free (`fedrec.rounds.cohort.build_cohort` orders them client by client for
    its lockstep batches)."""

    clients: np.ndarray
    sample_client: np.ndarray
    sample_row: np.ndarray
    label: np.ndarray
    row_items: np.ndarray
    row_ptr: np.ndarray
    history: np.ndarray
    history_owner: np.ndarray

    @staticmethod
    def build(train: sp.csr_matrix, clients: np.ndarray, negatives: np.ndarray | None,
              ratings: bool = False) -> Layout:
        """The layout of ``clients``' samples: their positives labelled 1 and ``negatives``
        labelled 0, or with ``ratings`` their observed ratings as labels (no negatives)."""
        n_items = train.shape[1]
        pos_client, pos_items, at = positives(train, clients)
        k = 0 if negatives is None else negatives.shape[1]
        client = np.concatenate([pos_client, np.repeat(pos_client, k)])
        items = np.concatenate([pos_items, negatives.reshape(-1) if k else np.zeros(0, np.int64)]).astype(np.int64)
        first = train.data[at].astype(np.float32) if ratings else np.ones(len(pos_items), np.float32)
        label = np.concatenate([first, np.zeros(len(pos_items) * k, np.float32)])
        uniq, sample_row = np.unique(client * n_items + items, return_inverse=True)
        row_ptr = np.concatenate([[0], np.cumsum(np.bincount(uniq // n_items, minlength=len(clients)))])
        return Layout(clients, client, sample_row.reshape(-1), label, (uniq % n_items).astype(np.int64), row_ptr,
                      sample_row.reshape(-1)[: len(pos_items)], pos_client)


def positives(train: sp.csr_matrix, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each training item of ``clients`` in CSR order: its client (0..C-1), the item, and its
    index into ``train.data`` (its rating); one gather, no loop over clients."""
    counts = np.diff(train.indptr)[clients].astype(np.int64)
    owner = np.repeat(np.arange(len(clients)), counts)
    offset = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    at = np.repeat(train.indptr[clients].astype(np.int64), counts) + offset
    return owner, train.indices[at].astype(np.int64), at


def user_representation(users: torch.Tensor, history_rows: torch.Tensor, history_owner: torch.Tensor,
                        neighbour_vectors: torch.Tensor, neighbour_owner: torch.Tensor, w: torch.Tensor,
                        a: torch.Tensor, taps: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """h_u = Σ_j α_j W x_j over each user's node, its items' rows and its neighbours' vectors,
    α = softmax over the user's nodes of LeakyReLU(a₁·W x_u + a₂·W x_j) (module docstring).
    ``users`` ``(C, d)``; the other nodes are flat, ``*_owner`` naming their user (0..C-1).
    ``taps``: filled with the graph's intermediate tensors (``z_self``, the users' W x_u; ``z``,
    every node's W x_j; ``s``, the attention's inputs a₁·z_u + a₂·z_j; ``owner``, each node's
    user), whose gradients give each user's gradient of W and a (`layer_gradients`)."""
    c, d = users.shape
    z_self = users @ w
    z = torch.cat([z_self, history_rows @ w, neighbour_vectors @ w])
    owner = torch.cat([torch.arange(c, device=users.device), history_owner, neighbour_owner])
    s = z_self[owner] @ a[:d] + z @ a[d:]
    if taps is not None:
        taps.update(z_self=z_self, z=z, s=s, owner=owner)
    e = F.leaky_relu(s, SLOPE)
    top = torch.full((c,), -torch.inf, dtype=e.dtype, device=e.device).scatter_reduce(
        0, owner, e.detach(), "amax", include_self=True)
    ex = (e - top[owner]).exp()
    den = torch.zeros(c, dtype=e.dtype, device=e.device).index_add(0, owner, ex)
    alpha = ex / den[owner]
    return torch.zeros(c, d, dtype=z.dtype, device=z.device).index_add(0, owner, alpha[:, None] * z)


def owner_outer(x: torch.Tensor, g: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    """Σ_j x_jᵀ g_j over each owner's rows ``(n, dx, dg)``: each owner's gradient of a weight
    that maps ``x`` to outputs whose gradient is ``g`` (the sum over every row is the weight's
    gradient); the outer products are formed `OUTER_CELLS` numbers at a time."""
    dx, dg = x.shape[1], g.shape[1]
    out = x.new_zeros((n, dx * dg))
    step = max(1, OUTER_CELLS // (dx * dg))
    for a in range(0, len(x), step):
        outer = x[a : a + step, :, None] * g[a : a + step, None, :]
        out.index_add_(0, owner[a : a + step], outer.reshape(len(outer), -1))
    return out.reshape(n, dx, dg)


def neighbours(train: sp.csr_matrix, raters: sp.csc_matrix, published: torch.Tensor, has_published: np.ndarray,
               clients: np.ndarray, k: int, seed: int, r: int) -> tuple[torch.Tensor, np.ndarray]:
    """The third party's round-``r`` expansion of ``clients`` (module docstring): each one's
    ``k`` neighbours' latest published vectors ``(C, k, d)`` (zero where not real) and which
    are real ``(C, k)``. ``train``: every user's items (CSR order); ``raters``: every item's
    users (CSC, sorted); ``published``/``has_published``: every user's latest vector."""
    u = draws.uniforms((seed, draws.NEIGHBOURS, r), clients, 2 * k).reshape(len(clients), 2, k)
    counts = np.diff(train.indptr)[clients]
    pick = train.indptr[clients][:, None] + (u[:, 0] * counts[:, None]).astype(np.int64)
    item = train.indices[np.minimum(pick, train.indptr[clients + 1][:, None] - 1)]
    n_raters = np.diff(raters.indptr)[item]
    other = raters.indices[raters.indptr[item] + np.minimum((u[:, 1] * n_raters).astype(np.int64), n_raters - 1)]
    valid = (counts[:, None] > 0) & (other != clients[:, None]) & has_published[other]
    vectors = published[torch.as_tensor(other)] * torch.as_tensor(
        valid, dtype=published.dtype, device=published.device)[:, :, None]
    return vectors, valid


def expanding(spec: Any, expanded: np.ndarray, clients: np.ndarray, r: int) -> np.ndarray:
    """The clients among ``clients`` the third party expands in round ``r``: none during the
    warm-up (``spec.warmup`` rounds), then every one (``every-round``) or those not expanded
    before (``once``, per ``expanded``, every user's flag)."""
    if not spec.neighbours or r <= spec.warmup:
        return clients[:0]
    return clients[~expanded[clients]] if spec.expansion == "once" else clients


def item_rate(cfg: Any) -> float:
    """The item rows' rate: ``--lr-item``, or ``--lr`` where it is not given."""
    return float(cfg.lr_item if cfg.lr_item is not None else cfg.lr)


def rating_baseline(split: Split, cfg: Any) -> bool:
    """Whether the score sits on the rating baseline (module docstring): under a rating
    protocol, unless ``--rating-baseline none``."""
    return split.protocol.ranking == "rating" and cfg.rating_baseline != "none"


def row_width(spec: Any, split: Split, cfg: Any) -> int:
    """An item row's width: the vector, and the item bias under the rating baseline."""
    return spec.dim + int(rating_baseline(split, cfg))


class GNNState:
    """The server's item table and graph layer, the clients' user vectors, the third party's
    published vectors and each client's last received neighbours."""

    #: its server plainly averages item rows (the security layer's attacks and rules apply)
    plain_average = True

    def __init__(self, spec: Any, split: Split, cfg: Any, seed: int, client_ids: np.ndarray | None = None) -> None:
        """``spec``: the run's `fedrec.federated.pergnn.spec.GNNSpec` (not imported: the spec builds
        this state). ``client_ids``: the run's id of each row of ``split.train`` (a deployment's node
        holds some of the users; draws are keyed by these ids), by default the rows' numbers."""
        self.spec, self.split, self.seed = spec, split, seed
        n, m, d = split.n_users, split.n_items, spec.dim
        self.ids = np.arange(n) if client_ids is None else np.asarray(client_ids, np.int64)
        #: under a rating protocol it fits ratings by squared error (module docstring), with the
        #: rating baseline beneath the score where the engine asks for one
        self.rating = split.protocol.ranking == "rating"
        self.baseline = rating_baseline(split, cfg)
        gen = torch.Generator().manual_seed(seed)
        self.items = here(torch.randn((m, d), generator=gen, device="cpu") * cfg.item_std)
        if self.baseline:  # the item bias: one more column of each row, starting at 0
            self.items = torch.cat([self.items, torch.zeros_like(self.items[:, :1])], 1)
        #: each client's training mean (the baseline's offset, computed on the client), or None
        self.offsets = here(torch.as_tensor(user_means(split.train))) if self.baseline else None
        self.w = here(torch.eye(d))
        self.a = here(torch.zeros(2 * d))
        self.users = here(torch.as_tensor(draws.normals((seed, draws.INIT), self.ids, d), dtype=torch.float32)
                          * spec.user_std)
        #: the third party's latest published vector of each user, and who has published
        self.published = torch.zeros_like(self.users)
        self.has_published = np.zeros(n, bool)
        #: each client's neighbours as last sent: their vectors ``(n, K, d)`` and which are real
        self.neighbour_vectors = torch.zeros((n, spec.neighbours, d), device=self.users.device)
        self.neighbour_valid = np.zeros((n, spec.neighbours), bool)
        #: which users the third party has expanded (``expansion=once`` expands each one once),
        #: and the round each client last received its neighbours (their vectors' download)
        self.expanded = np.zeros(n, bool)
        self.received = np.zeros(n, np.int64)
        self.raters = sp.csc_matrix(split.train)
        self.lr = cfg.lr
        self.lr_item = item_rate(cfg)

    # ---- the third party ----------------------------------------------------------------

    def expand(self, clients: np.ndarray, r: int) -> None:
        """Round ``r``'s neighbours of those of ``clients`` the third party expands then
        (`expanding`: after the warm-up, each round or once), stored as each is sent; the rest
        keep what they were last sent."""
        clients = expanding(self.spec, self.expanded, clients, r)
        if not len(clients):
            return
        self.expanded[clients] = True
        self.received[clients] = r
        vectors, valid = neighbours(self.split.train, self.raters, self.published, self.has_published,
                                    clients, self.spec.neighbours, self.seed, r)
        self.neighbour_vectors[torch.as_tensor(clients)] = vectors
        self.neighbour_valid[clients] = valid

    def _neighbours(self, clients: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The flat vectors of ``clients``' real neighbours and their owners (0..C-1)."""
        valid = self.neighbour_valid[clients]
        owner, slot = np.nonzero(valid)
        vectors = self.neighbour_vectors[torch.as_tensor(clients[owner]), torch.as_tensor(slot)]
        return vectors, torch.as_tensor(owner, device=vectors.device)

    # ---- a round -------------------------------------------------------------------------

    def predict(self, clients: np.ndarray, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Scores ``(C, V)`` of ``clients``' representations ``h`` ``(C, d)`` for item rows
        ``rows`` ``(V, width)`` or ``(C, V, width)``: ⟨h_u, W e_v⟩, plus the client's mean and the
        item's bias under the rating baseline."""
        d = self.spec.dim
        hv = rows[..., :d] @ self.w
        s = h @ hv.T if hv.dim() == 2 else (h[:, None, :] * hv).sum(-1)
        if self.offsets is not None:
            s = s + rows[..., d] + self.offsets[torch.as_tensor(clients, device=s.device)][:, None]
        return s

    def gradients(self, lay: Layout, each_layer: bool = False) -> dict[str, torch.Tensor]:
        """Each client's gradient of its mean loss (BCE, or squared error on ratings): of its
        item rows ``(R, width)``, its user vector ``(C, d)``, and the graph layer's summed over
        the chunk's clients (``w``, ``a``); with ``each_layer`` also each client's graph-layer
        gradient (``w_each`` ``(C, d, d)``, ``a_each`` ``(C, 2d)``), which a robust rule judges
        client by client. The sums are computed the same way either way."""
        dev, d = self.items.device, self.spec.dim
        rows = self.items[torch.as_tensor(lay.row_items, device=dev)].clone().requires_grad_(True)
        users = self.users[torch.as_tensor(lay.clients, device=dev)].clone().requires_grad_(True)
        w, a = self.w.clone().requires_grad_(True), self.a.clone().requires_grad_(True)
        nb, nb_owner = self._neighbours(lay.clients)
        sc = torch.as_tensor(lay.sample_client, device=dev)
        sr = torch.as_tensor(lay.sample_row, device=dev)
        label = torch.as_tensor(lay.label, device=dev)
        taps: dict[str, torch.Tensor] | None = {} if each_layer else None
        with torch.enable_grad():
            history = rows[torch.as_tensor(lay.history, device=dev), :d]
            history_owner = torch.as_tensor(lay.history_owner, device=dev)
            h = user_representation(users, history, history_owner, nb, nb_owner, w, a, taps)
            hv = rows[:, :d] @ w
            logit = (h[sc] * hv[sr]).sum(1)
            if self.offsets is not None:
                logit = logit + rows[sr, d] + self.offsets[torch.as_tensor(lay.clients, device=dev)][sc]
            if self.rating:
                per = (logit - label) ** 2
            else:
                per = F.binary_cross_entropy_with_logits(logit, label, reduction="none")
            n_c = torch.bincount(sc, minlength=len(lay.clients)).clamp_min(1).to(per.dtype)
            loss = (per / n_c[sc]).sum()  # each client's mean, summed: its own gradients stay apart
            if taps is None:
                g_rows, g_users, g_w, g_a = torch.autograd.grad(loss, [rows, users, w, a])
            else:
                g_rows, g_users, g_w, g_a, g_zself, g_z, g_s, g_hv = torch.autograd.grad(
                    loss, [rows, users, w, a, taps["z_self"], taps["z"], taps["s"], hv])
        out = {"rows": g_rows, "users": g_users, "w": g_w, "a": g_a, "loss": loss.detach()}
        if taps is not None:  # W maps every node and item row, a the attention's inputs (`owner_outer`)
            c = len(lay.clients)
            row_owner = torch.as_tensor(np.repeat(np.arange(c), np.diff(lay.row_ptr)), device=dev)
            nodes = torch.cat([history, nb]).detach()
            node_owner = torch.cat([history_owner, nb_owner])
            out["w_each"] = (owner_outer(users.detach(), g_zself, torch.arange(c, device=dev), c)
                             + owner_outer(nodes, g_z[c:], node_owner, c)
                             + owner_outer(rows[:, :d].detach(), g_hv, row_owner, c))
            per_user = torch.zeros(c, dtype=g_s.dtype, device=dev).index_add_(0, taps["owner"], g_s)
            a_self = taps["z_self"].detach() * per_user[:, None]
            a_node = torch.zeros_like(a_self).index_add_(0, taps["owner"], g_s[:, None] * taps["z"].detach())
            out["a_each"] = torch.cat([a_self, a_node], 1)
        return out

    @torch.no_grad()
    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        users = np.asarray(users, np.int64)
        train, d = self.split.train, self.spec.dim
        m = self.items.shape[0] if items is None else items.shape[1]
        out = np.empty((len(users), m), np.float32)
        step = max(1, SCORE_CELLS // max(m * d, 1))
        for s0 in range(0, len(users), step):
            block = users[s0 : s0 + step]
            owner, hist, _ = positives(train, block)
            nb, nb_owner = self._neighbours(block)
            dev = self.items.device
            h = user_representation(self.users[torch.as_tensor(block, device=dev)],
                                    self.items[torch.as_tensor(hist, device=dev), :d],
                                    torch.as_tensor(owner, device=dev), nb, nb_owner, self.w, self.a)
            rows = self.items if items is None else self.items[torch.as_tensor(items[s0 : s0 + step], device=dev)]
            out[s0 : s0 + step] = self.predict(block, h, rows).float().cpu().numpy()
        return out


class GNNAlgorithm(FederatedAlgorithm):
    """A `GNNState` as the round driver's federated algorithm (module docstring).

    **Attacks and defences** (`fedrec.security.adversary`): its server averages item rows, so
    the security layer plugs in as for the item family. Malicious clients craft item-row steps
    against matrix factorisation's dot product on the global rows (FedRecAttack's own model; the
    attacker does not run the graph layer) and send no layer step (a zero one where a rule
    reads it); a defence's robust rule aggregates the item rows and the graph layer's steps
    client by client (each client's layer gradient from `GNNState.gradients`'s ``each_layer``),
    as the item family's shared weights: the median and trimmed mean coordinate by coordinate,
    Krum by distance, ``norm-bound`` bounds rows and sums the layer's steps plainly, and UNION's
    dropped clients send neither."""

    #: its clients draw their own pseudo items (``--pad-items``, `_sent_rows`)
    pads_uploads = True
    #: each client takes one step on the mean over all its samples, not on ``--batch-size`` of
    #: them: an attacker's cover step is sized to that (`fedrec.security.adversary.honest_batch`)
    whole_batch = True
    #: the key of the clients' own noise and pseudo rows (``--ldp``, ``--pad-items``): the
    #: run's seed in the simulator; a deployment's node draws its own, which the server cannot
    #: redraw (`fedrec.federated.pergnn.sides`)
    noise_seed: int | None = None
    #: the run's attack and defence (`fedrec.security.adversary.attach`); None: plain rounds
    security: Any = None
    takes_security = True

    def __init__(self, state: GNNState, cfg: Any) -> None:
        self.state, self.cfg = state, cfg
        self.n_clients, self.seed = state.split.n_users, state.seed
        self.clients_per_round = cfg.clients_per_round
        self.divergence_hint = "lower --lr or --lr-item"
        self.lr_item = state.lr_item

    def scale_rates(self, factor: float) -> bool:
        self.state.lr *= factor
        self.state.lr_item *= factor
        self.lr_item = self.state.lr_item
        self.divergence_hint = f"lower --lr (now {self.state.lr:g}) or --lr-item (now {self.state.lr_item:g})"
        return True

    def local_update(self, plan: RoundPlan) -> Uploads:
        st = self.state
        train, width = st.split.train, st.items.shape[1]
        clients = np.sort(plan.clients[np.diff(train.indptr)[plan.clients] > 0]).astype(np.int64)
        st.expand(clients, plan.round)
        sec = self.security
        kept: list[ClientUpload] | None = [] if self.keep_uploads or (sec is not None and sec.keeps_uploads) else None
        step = self.client_steps(clients, plan.round, kept, each_layer=sec is not None and sec.rule is not None)
        item_sum, item_count, up, down = step.item_sum, step.item_count, step.bytes_up, step.bytes_down
        st.published[torch.as_tensor(clients)] = st.users[torch.as_tensor(clients)]
        st.has_published[clients] = True
        n = len(clients)
        if sec is not None and sec.attack is not None:
            attacker_model = FamilySpec(score="dot", private_score=False, dual=False, dim=width)
            bad, n_bytes = sec.malicious_uploads(attacker_model, st.items, {}, plan.round)
            if sec.rule is not None:  # it sends no graph-layer step: a zero one, as the rule reads it
                for u in bad:
                    u.tensors.update(w=torch.zeros_like(st.w), a=torch.zeros_like(st.a))
            if kept is not None:
                kept.extend(bad)
            up, down, n = up + n_bytes, down + n_bytes, n + len(bad)
            if sec.rule is None:  # the plain average: the crafted rows join the sums
                for u in bad:
                    at = torch.as_tensor(u.items, device=item_sum.device)
                    item_sum.index_add_(0, at, u.tensors[ITEMS].to(item_sum))
                    item_count.index_add_(0, at, torch.ones(len(at), dtype=item_count.dtype, device=item_count.device))
        payload = (n, item_sum, item_count, step.layer_sum)
        return Uploads(payload=payload, per_client=kept, loss_sum=step.loss_sum, client_batches=len(clients),
                       bytes_up=up, bytes_down=down)

    def client_steps(self, clients: np.ndarray, r: int, kept: list[ClientUpload] | None = None,
                     each_layer: bool = False) -> ClientSteps:
        """Round ``r``'s step of ``clients`` (rows of the training matrix, each with a training
        item, its neighbours already received): each moves its user vector and sends its
        item-row and graph-layer steps; their sums (``kept``: each client's rows appended, and
        with ``each_layer`` its graph-layer steps, which a robust rule judges client by client;
        each client's layer step bounded by ``layer_clip`` and ``entry_clip``, where set;
        under one the steps carry no LDP noise: `fedrec.security.adversary.attach` refuses the
        two together)."""
        st, cfg = self.state, self.cfg
        train, m, d, width = st.split.train, st.split.n_items, st.spec.dim, st.items.shape[1]
        out = ClientSteps(torch.zeros_like(st.items), torch.zeros(m, dtype=st.items.dtype, device=st.items.device),
                          {"w": torch.zeros_like(st.w), "a": torch.zeros_like(st.a)})
        sizes = np.diff(train.indptr)[clients] * (1 + cfg.negatives)
        each_layer = each_layer and kept is not None
        each_client = st.spec.layer_clip is not None or st.spec.entry_clip is not None
        for part in chunk_clients(clients, sizes, CHUNK_SAMPLES):
            ids = st.ids[part]
            negs = client_negatives(cfg.negatives, train, st.split.sampler, part, ids, self.seed, r)
            lay = Layout.build(train, part, negs, ratings=st.rating)
            g = st.gradients(lay, each_layer=each_layer or each_client)
            out.loss_sum += float(g["loss"])
            st.users[torch.as_tensor(part)] -= st.lr * g["users"]  # the client's own step
            items, rows, counts = self._sent_rows(-st.lr_item * g["rows"], lay, ids, r)
            layer_each = (layer_steps(g, st.lr, st.spec.layer_clip, st.spec.entry_clip)
                          if each_layer or each_client else {})
            for k in ("w", "a"):
                step = layer_each[k].sum(0) if each_client else -st.lr * g[k]
                out.layer_sum[k] += step + self._noise_sum(ids, tuple(g[k].shape), r, 1 + (k == "a"))
            out.item_sum.index_add_(0, torch.as_tensor(items, device=rows.device), rows)
            out.item_count.index_add_(0, torch.as_tensor(items, device=rows.device), torch.ones_like(rows[:, 0]))
            if kept is not None:
                ptr = np.concatenate([[0], np.cumsum(counts)])
                sent_layer = layer_each if each_layer else {}
                kept += [ClientUpload(int(c), items[ptr[j]:ptr[j + 1]],
                                      {ITEMS: rows[ptr[j]:ptr[j + 1]], **{k: v[j] for k, v in sent_layer.items()}})
                         for j, c in enumerate(ids)]
            n_rows, layer_size = int(counts.sum()), d * d + 2 * d
            neighbours_sent = int(st.neighbour_valid[part][st.received[part] == r].sum())
            out.bytes_up += n_rows * (INDEX_BYTES + width * FLOAT_BYTES) + len(part) * (layer_size + d) * FLOAT_BYTES
            out.bytes_down += (len(lay.row_items) * (INDEX_BYTES + width * FLOAT_BYTES)
                               + (len(part) * layer_size + neighbours_sent * d) * FLOAT_BYTES)
        return out

    def _sent_rows(self, steps: torch.Tensor, lay: Layout, ids: np.ndarray, r: int
                   ) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
        """What the chunk's clients (run ids ``ids``) send of their item-row steps: each row
        held to the bounds (`_bounded`), with ``--pad-items`` pseudo rows (drawn with the bounded
        rows' spread, and held to the same bounds: a row beyond them would be a pseudo one) and
        ``--ldp`` noise; (items, rows, rows a client), client by client, items sorted within a
        client."""
        cfg = self.cfg
        steps = self._bounded(steps)
        items, counts = lay.row_items, np.diff(lay.row_ptr)
        if cfg.pad_items:
            ptr, p_items, p_rows, _ = pseudo_rows(ids, lay.row_items, lay.row_ptr, steps.cpu(),
                                                  self.state.split.n_items, cfg.pad_items, self._noise_key, r)
            p_rows = self._bounded(p_rows)
            owner = np.concatenate([np.repeat(np.arange(len(counts)), counts),
                                    np.repeat(np.arange(len(counts)), np.diff(ptr))])
            items_all = np.concatenate([items, p_items])
            order = np.lexsort((items_all, owner))
            steps = torch.cat([steps, p_rows.to(steps.device)])[torch.as_tensor(order, device=steps.device)]
            items, counts = items_all[order], counts + np.diff(ptr)
        if cfg.ldp > 0:
            noise = laplace((self._noise_key, draws.LOCAL_NOISE, r, 0), ids, counts * steps.shape[1], cfg.ldp)
            steps = steps + torch.as_tensor(noise, dtype=steps.dtype, device=steps.device).reshape(steps.shape)
        return items, steps, counts

    def _bounded(self, rows: torch.Tensor) -> torch.Tensor:
        """Item-row steps held to ``entry_clip`` entry by entry, then to ``--clip`` in L2."""
        if self.state.spec.entry_clip is not None:
            rows = rows.clamp(-self.state.spec.entry_clip, self.state.spec.entry_clip)
        return clip_rows(rows, self.cfg.clip)

    @property
    def _noise_key(self) -> int:
        return self.seed if self.noise_seed is None else self.noise_seed

    def _noise_sum(self, clients: np.ndarray, shape: tuple[int, ...], r: int, which: int) -> torch.Tensor:
        """The sum of ``clients``' own Laplace(``--ldp``) noise on their graph-layer steps."""
        if self.cfg.ldp <= 0:
            return torch.zeros(shape, device=self.state.w.device)
        size = int(np.prod(shape))
        noise = laplace((self._noise_key, draws.LOCAL_NOISE, r, which), clients, size, self.cfg.ldp)
        return torch.as_tensor(noise.reshape(len(clients), size).sum(0).reshape(shape), dtype=self.state.w.dtype,
                               device=self.state.w.device)

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        n, item_sum, item_count, layer_sum = uploads.payload
        if not n:
            return
        st = self.state
        sec = self.security
        rows_n = n
        if sec is not None and sec.rule is not None and uploads.per_client is not None:
            # the rule's row and graph-layer sums over the uploads it kept (UNION's dropped ones
            # do not count), and under ``contributors`` each row's senders among them
            per_row = item_count if self.cfg.aggregation == "contributors" else None
            item_sum, layer_sum, rows_n = sec.sums(uploads.per_client, *st.items.shape, {"w": st.w, "a": st.a},
                                                   st.items, plan.round, senders=per_row)
            item_sum = item_sum.to(st.items)
            if not rows_n:
                return
            n = rows_n
        divisor = item_count.clamp_min(1)[:, None] if self.cfg.aggregation == "contributors" else rows_n
        st.items = st.items + item_sum / divisor
        st.w = st.w + layer_sum["w"].to(st.w) / n
        st.a = st.a + layer_sum["a"].to(st.a) / n

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        return {"neighbours": self.state.spec.neighbours}

    def round_extra(self) -> dict[str, float]:
        return self.security.figures(self.scores) if self.security is not None else {}

    def server_state_dict(self) -> dict[str, Any]:
        """The item table, the graph layer, and the third party's published vectors and whom it
        has expanded."""
        st = self.state
        return {"items": st.items, "w": st.w, "a": st.a, "published": st.published,
                "has_published": st.has_published, "expanded": st.expanded}

    def client_state_dict(self) -> dict[str, Any]:
        """The user vectors and each client's last received neighbours."""
        st = self.state
        return {"users": st.users, "neighbour_vectors": st.neighbour_vectors, "neighbour_valid": st.neighbour_valid}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        st = self.state
        st.items, st.w, st.a, st.published = blob["items"], blob["w"], blob["a"], blob["published"]
        st.has_published = np.asarray(blob["has_published"], bool)
        # a save made before the flag was kept: those who published are those expanded
        st.expanded = np.asarray(blob.get("expanded", st.has_published), bool)

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        st = self.state
        st.users, st.neighbour_vectors = blob["users"], blob["neighbour_vectors"]
        st.neighbour_valid = np.asarray(blob["neighbour_valid"], bool)


def layer_steps(g: dict[str, torch.Tensor], lr: float, bound: float | None,
                entry: float | None = None) -> dict[str, torch.Tensor]:
    """Each client's graph-layer step, ``w`` ``(C, d, d)`` and ``a`` ``(C, 2d)``, from its
    gradients (`GNNState.gradients`'s ``each_layer``): −lr x gradient, each entry held to
    [−``entry``, ``entry``] (``entry_clip``), then scaled where the two together are longer than
    ``bound`` (L2) down to it (``layer_clip``)."""
    steps = {k: -lr * g[f"{k}_each"] for k in ("w", "a")}
    if entry is not None:
        steps = {k: v.clamp(-entry, entry) for k, v in steps.items()}
    if bound is None:
        return steps
    norm = (steps["w"].flatten(1).square().sum(1) + steps["a"].square().sum(1)).sqrt()
    scale = (bound / norm.clamp_min(1e-12)).clamp(max=1.0)
    return {"w": steps["w"] * scale[:, None, None], "a": steps["a"] * scale[:, None]}


def laplace(key: tuple[int, ...], clients: np.ndarray, counts: np.ndarray | int, scale: float) -> np.ndarray:
    """Laplace(0, ``scale``) draws, ``counts[k]`` of client ``clients[k]``'s, keyed by client
    (`fedrec.rounds.draws`): scale (E1 − E2) with E = −log(1 − U) ~ Exp(1), never infinite."""
    e1 = -np.log1p(-draws.uniforms((*key, 1), clients, counts))
    e2 = -np.log1p(-draws.uniforms((*key, 2), clients, counts))
    return scale * (e1 - e2)
