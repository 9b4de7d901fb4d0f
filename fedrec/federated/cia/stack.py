"""A stack of clients that each hold a whole model of the same shape, trained all at once.

FedCIA's clients (and its baselines') are groups of users with their *own* item table, user
embeddings and, for MLP, score network: nothing is shared unless the aggregation shares it. A
`ClientStack` keeps the parameters of K such clients along a leading client axis (item table
``(K, M, d)``, user embeddings ``(users, d)`` with each user in its client's block, MLP
weights ``(K, ...)``) and trains them with one autograd pass a step: the loss is the sum over
clients of each client's mean BPR loss over its own batch, so each client gets exactly its own
gradient.

Clients are ordered by their number of training pairs (most first), so at step t the clients
that still have a batch are a prefix; only that prefix takes an Adam step
(`fedrec.rounds.optim`: `torch.optim.Adam` cannot step a slice of a parameter, and stepping
a finished client with a zero gradient would still move it by momentum, which a client
training alone never does). With that, a stack equals K separate `torch.optim.Adam` trainings (tested).

Backbones: ``mf`` (⟨u, q⟩), ``mlp`` (an NCF-style tower on [u, q]), ``lightgcn`` (LightGCN on the
client's own user-item graph, layer mean; He et al., SIGIR 2020). FedCIA's item similarity is
always taken from the layer-0 item table ``item`` (the paper's choice for LightGCN).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedrec.core.device import here
from fedrec.protocols.negatives import ComplementSampler
from fedrec.rounds import draws
from fedrec.rounds.optim import adam_

BACKBONES = ("mf", "mlp", "lightgcn")


class ClientStack:
    """K clients of one backbone and dimension; ``clients`` are global client ids."""

    def __init__(self, backbone: str, dim: int, clients: np.ndarray, users: list[np.ndarray],
                 n_items: int, train: sp.csr_matrix, *, tower: tuple[int, ...], layers: int,
                 init_std: float, key: tuple[int, ...], model: int = 0) -> None:
        if backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {backbone!r}")
        per_user = np.diff(train.indptr)
        pairs = np.array([per_user[u].sum() for u in users], dtype=np.int64)
        order = np.argsort(-pairs, kind="stable")
        self.backbone, self.dim, self.n_items, self.layers = backbone, dim, n_items, layers
        self.model = model  # which of the run's (backbone, dim) pairs: what parameter averaging groups by
        self.clients = np.asarray(clients, dtype=np.int64)[order]
        self.users = np.concatenate([users[k] for k in order]).astype(np.int64)
        sizes = np.array([len(users[k]) for k in order], dtype=np.int64)
        self.user_ptr = np.r_[0, np.cumsum(sizes)]
        self.user_client = np.repeat(np.arange(len(order)), sizes)
        self.train = train[self.users].tocsr()
        self.train.data[:] = 1.0
        self.client_items = [np.unique(self.train[a:b].indices)
                             for a, b in zip(self.user_ptr[:-1], self.user_ptr[1:], strict=True)]
        self.client_pairs = pairs[order]
        K = len(order)
        # users' vectors: keyed by client id; the item table and MLP weights: one draw shared by
        # every client of the backbone (the common start of a federated model), the same on
        # every Flower node (`fedrec.rounds.draws`)
        user = draws.ragged_normals((*key, 1), self.clients, sizes * dim)
        gen = torch.Generator().manual_seed(draws.seed_of((*key, 2)))
        self.params: dict[str, torch.Tensor] = {
            "user": torch.as_tensor(user.astype(np.float32)).reshape(-1, dim) * init_std,
            "item": (here(torch.randn(n_items, dim, generator=gen, device="cpu")) * init_std).expand(K, -1, -1).clone(),
        }
        if backbone == "mlp":
            widths = (2 * dim, *tower, 1)
            for j, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
                bound = 1.0 / math.sqrt(a)  # nn.Linear's default init, drawn once
                w = (here(torch.rand(a, b, generator=gen, device="cpu")) * 2 - 1) * bound
                self.params[f"w{j}"] = w.expand(K, -1, -1).clone()
                self.params[f"b{j}"] = ((here(torch.rand(b, generator=gen, device="cpu")) * 2 - 1) * bound).expand(K, -1).clone()
        self.n_layers = sum(1 for name in self.params if name.startswith("w"))  # MLP tower
        self.moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in self.params.items()}
        self.steps = torch.zeros(K)
        self.adjacency = _lightgcn_adjacency(self.train, self.user_client, K, n_items) \
            if backbone == "lightgcn" else None
        #: (the parameters and their versions, the vectors `_embeddings` gave for them)
        self._scoring: tuple[list[tuple[torch.Tensor, int]], tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    # ---- training ---------------------------------------------------------------------------

    def train_round(self, sampler: ComplementSampler, k_neg: int, epochs: int, batch_size: int,
                    lr: float, seed: int, r: int) -> tuple[float, int]:
        """Round ``r`` of local BPR training: each training pair with ``k_neg`` negatives drawn
        from ``sampler`` (the split's policy; its rows are the rows of ``users``). Negatives and
        shuffles are keyed by (seed, round, client id), so a client trains the same alone, in
        this stack or on a Flower node. Returns (sum of the clients' batch losses, client
        batches)."""
        self._scoring = None  # training moves every parameter: free the cached scoring vectors
        coo = self.train.tocoo()  # grouped by client, in stack order
        u = draws.uniforms((seed, draws.NEGATIVES, r), self.clients, self.client_pairs * k_neg)
        negatives = sampler.sample_at(self.users[coo.row], u.reshape(-1, k_neg)).ravel()
        user = np.repeat(coo.row, k_neg)
        pos = np.repeat(coo.col, k_neg)
        client = self.user_client[user]
        counts = self.client_pairs * k_neg
        ptr = np.r_[0, np.cumsum(counts)]
        loss_sum, batches = 0.0, 0
        for e in range(epochs):
            keys = draws.uniforms((seed, draws.SHUFFLE, r, e), self.clients, counts)
            order = np.lexsort((keys, client))  # grouped by client, shuffled within
            u, p, n = (torch.as_tensor(x[order]) for x in (user, pos, negatives))
            n_steps = -(-counts // batch_size)
            for s in range(int(n_steps.max(initial=0))):
                active = int((n_steps > s).sum())
                lens = np.minimum(counts[:active] - s * batch_size, batch_size)
                width = int(lens.max())
                idx = ptr[:active, None] + s * batch_size + np.arange(width)[None]
                mask = np.arange(width)[None] < lens[:, None]
                idx = torch.as_tensor(np.where(mask, idx, ptr[:active, None]))
                losses = self._step(active, u[idx], p[idx], n[idx], torch.as_tensor(mask), lr)
                loss_sum += float(losses.sum())
                batches += active
        return loss_sum, batches

    def _step(self, active: int, u: torch.Tensor, p: torch.Tensor, n: torch.Tensor,
              mask: torch.Tensor, lr: float) -> torch.Tensor:
        """One Adam step of the first ``active`` clients on their (active, width) batches."""
        for v in self.params.values():
            v.requires_grad_(True)
        user_emb, item_emb = self._embeddings()
        k = torch.arange(active)[:, None]
        diff = self._pair_scores(user_emb, item_emb, k, u, p) - self._pair_scores(user_emb, item_emb, k, u, n)
        per = -(F.logsigmoid(diff) * mask).sum(1) / mask.sum(1)
        grads = torch.autograd.grad(per.sum(), list(self.params.values()), allow_unused=True)
        with torch.no_grad():
            self.steps[:active] += 1
            t = self.steps[:active]
            n_users = int(self.user_ptr[active])
            for (name, param), g in zip(self.params.items(), grads, strict=True):
                param.requires_grad_(False)
                if g is None:
                    continue
                rows = n_users if name == "user" else active
                steps = t[self.user_client[:n_users]] if name == "user" else t
                m, v = self.moments[name]
                adam_(param[:rows], g[:rows], m[:rows], v[:rows], steps, lr)
        return per.detach()

    def _embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """User and item vectors the score uses: the tables, or LightGCN's layer mean."""
        user, item = self.params["user"], self.params["item"]
        if self.adjacency is None:
            return user, item
        x = torch.cat([user, item.reshape(-1, self.dim)])
        total = x
        for _ in range(self.layers):
            x = propagate(self.adjacency, x)
            total = total + x
        total = total / (self.layers + 1)
        # split, not two slices: its backward is one concatenation, where each slice's is a
        # zero-filled copy of the whole graph's table and the two are then added
        user_part, item_part = total.split([len(user), len(total) - len(user)])
        return user_part, item_part.reshape(item.shape)

    def _scoring_embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`_embeddings` for scoring, computed once while no parameter changes: an evaluation
        scores users in several calls, and LightGCN's propagation over every client's graph is
        most of a call's work. A parameter written in place (training, aggregation) bumps its
        version counter, and one replaced (a loaded checkpoint) is another object, so either
        invalidates the cache."""
        params = list(self.params.values())
        if self._scoring is None or len(self._scoring[0]) != len(params) or any(
                t is not held or t._version != version for t, (held, version) in zip(params, self._scoring[0], strict=True)):
            self._scoring = ([(t, t._version) for t in params], self._embeddings())
        return self._scoring[1]

    def _pair_scores(self, user_emb: torch.Tensor, item_emb: torch.Tensor, k: torch.Tensor,
                     u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        """Scores of (user u, item i) pairs of client k: (active, width)."""
        uv, iv = user_emb[u], item_emb[k, i]
        if self.backbone != "mlp":
            return (uv * iv).sum(-1)
        h = torch.cat([uv, iv], dim=-1)
        for j in range(self.n_layers):
            w, b = self.params[f"w{j}"][: len(k)], self.params[f"b{j}"][: len(k)]
            h = torch.baddbmm(b[:, None, :], h, w)
            if j < self.n_layers - 1:
                h = torch.relu(h)
        return h[..., 0]

    # ---- evaluation ---------------------------------------------------------------------------

    @torch.no_grad()
    def scores(self, local_users: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Scores of every item for the given local users (rows of this stack).

        Client by client: a client's item table (and its tower's item half, ``E_k W0_i``) is
        read once for all of its users in the call, in blocks of ``chunk`` users, rather than
        copied once per user."""
        user_emb, item_emb = self._scoring_embeddings()
        local_users = np.asarray(local_users, dtype=np.int64)
        out = np.empty((len(local_users), self.n_items), dtype=np.float32)
        client = self.user_client[local_users]
        order = np.argsort(client, kind="stable")
        starts = np.r_[0, np.flatnonzero(np.diff(client[order])) + 1]
        for a, b in zip(starts, np.r_[starts[1:], len(order)], strict=True):
            k = int(client[order[a]])
            items = item_emb[k]
            item_half = None
            if self.backbone == "mlp":  # first layer split into its user and item halves
                w0 = self.params["w0"][k]
                item_half = items @ w0[self.dim :]
            for s in range(a, b, chunk):
                rows = order[s : min(s + chunk, b)]
                uv = user_emb[torch.as_tensor(local_users[rows])]
                if item_half is None:
                    out[rows] = (uv @ items.T).cpu().numpy()
                    continue
                h = (uv @ self.params["w0"][k][: self.dim] + self.params["b0"][k])[:, None, :] + item_half
                for j in range(1, self.n_layers):
                    h = torch.relu(h) @ self.params[f"w{j}"][k] + self.params[f"b{j}"][k]
                out[rows] = h[..., 0].cpu().numpy()
        return out

    # ---- what aggregation touches ----------------------------------------------------------

    def shared_names(self) -> list[str]:
        """Parameters a parameter-averaging server averages (everything but user embeddings)."""
        return [k for k in self.params if k != "user"]

    def payload_floats(self) -> int:
        """Floats one client uploads under parameter averaging."""
        return sum(int(self.params[k][0].numel()) for k in self.shared_names())


class _SymmetricPropagation(torch.autograd.Function):
    """``A @ x`` for a symmetric sparse ``A``, whose gradient with respect to ``x`` is ``A @ g``.

    torch's own backward of `torch.sparse.mm` multiplies by ``A.t()``, transposing and sorting
    A's indices at every step; for a symmetric A (LightGCN's D^-1/2 A D^-1/2, whose mirrored
    entries are the same float) that product is the same sum in the same order, so reusing A
    gives the same bits (tested) without the transpose. Both products write into an empty
    tensor with ``beta=0`` (the same kernel and sums as `torch.sparse.mm`, which zero-fills its
    output twice first)."""

    @staticmethod
    def forward(ctx: object, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.adjacency = adjacency
        return _product(adjacency, x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, _product(ctx.adjacency, grad)


def _product(adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.sparse.addmm(x.new_empty(adjacency.shape[0], x.shape[1]), adjacency, x, beta=0)


def propagate(adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One LightGCN layer, ``adjacency @ x``, for a symmetric ``adjacency`` (`_SymmetricPropagation`)."""
    return _SymmetricPropagation.apply(adjacency, x)


def _lightgcn_adjacency(train: sp.csr_matrix, user_client: np.ndarray, n_clients: int,
                        n_items: int) -> torch.Tensor:
    """D^-1/2 A D^-1/2 of every client's own user-item graph, block-diagonal over clients:
    nodes are the stack's users, then client k's copy of item i at ``users + k * M + i``."""
    coo = train.tocoo()
    n_users = train.shape[0]
    item_node = n_users + user_client[coo.row] * n_items + coo.col
    rows = np.r_[coo.row, item_node]
    cols = np.r_[item_node, coo.row]
    n = n_users + n_clients * n_items
    deg = np.bincount(rows, minlength=n).astype(np.float64)
    inv = np.divide(1.0, np.sqrt(deg), out=np.zeros_like(deg), where=deg > 0)
    vals = inv[rows] * inv[cols]
    index = torch.as_tensor(np.vstack([rows, cols]))
    return torch.sparse_coo_tensor(index, torch.as_tensor(vals.astype(np.float32)), (n, n),
                                   check_invariants=False).coalesce()
