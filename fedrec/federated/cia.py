"""FedCIA (collaborative-information aggregation) and its parameter-averaging counterparts.

Clients hold groups of users (the paper: 100 clients of consecutive user ids; or one user per
client) and each keeps a whole model of its own. Per round (the paper's Algorithm 1):

1. every client trains its model on its own data (BPR, Adam; `fedrec.federated.stack`);
2. aggregation, one of
   * ``cia``: each client uploads its item similarity S_k = E_k E_kᵀ (E_k its layer-0 item
     table; for GF-CF its filter F_k), the server averages them into S̄ and every client
     fine-tunes its own E_k for ``finetune_steps`` gradient steps so that E_k E_kᵀ approaches S̄
     (Eq. 6). Each client keeps its embedding space; clients of different sizes and models
     federate;
   * ``waa``: weighted-average aggregation (FedAvg by training size) of every parameter but the
     user embeddings, among clients of the same backbone and size only (FedMF, FedNCF,
     FedLightGCN with grouped clients);
   * ``none``: independent models (the paper's "no aggregation" columns); with one client,
     the centralised model.

**The fine-tune in S̄'s eigenbasis, exactly.** A gradient step on ‖E Eᵀ − S̄‖ costs O(M²d) per
client (S̄ E). The server sends S̄ as its eigendecomposition U Λ Uᵀ (the same M² + M floats);
with Ẽ = Uᵀ E, ‖E Eᵀ − S̄‖_F = ‖Ẽ Ẽᵀ − Λ‖_F because U is orthogonal, its gradient is
U · 4(Ẽ(ẼᵀẼ) − ΛẼ), and the norm itself is ‖ẼᵀẼ‖² − 2 Σ_i λ_i ‖Ẽ_i‖² + ‖Λ‖² — O(Md²) a
step. Rotating in and out costs two GEMMs, so 100 steps cost about what 1 direct step would.
The loss is the Frobenius norm (not squared) as the official code (``finetune_loss="norm"``),
or the paper's MSE (``"mse"``, the squared norm / M²).

**Uploads** go through one path: the dense matrix (M² floats), or with ``upload_rank`` L its
truncated eigendecomposition (M·L + L floats; from the client's thin SVD of E_k, so a client
never forms M x M); GF-CF filters are not symmetric and travel as a rank-L SVD (2 M·L + L).
Laplace LDP (``--ldp δ``) noises what travels: every entry of the dense matrix, or every float of
the factors. The server keeps one running sum, never a matrix per client.

**GF-CF** (`fedrec.models.gfcf`) has no parameters: one round computes each client's filter
F_k, and a client scores its users with r_u F_k + β r_u F̄ (``none``: r_u F_k).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedrec.core.contract import FederatedAlgorithm, RoundPlan, Uploads
from fedrec.errors import FedrecError
from fedrec.federated.stack import BACKBONES, ClientStack
from fedrec.federated.upload import UploadPath
from fedrec.models.gfcf import LocalFilter
from fedrec.options import check
from fedrec.partition import GROUPINGS, Partition, clients_of
from fedrec.protocols.protocol import Split

AGGREGATIONS = ("cia", "waa", "none")
FINETUNE_LOSSES = ("norm", "mse")
SCOPES = ("all", "local")


@dataclass(frozen=True)
class CIASpec:
    """A FedCIA-style run. ``models`` lists (backbone, dim) pairs; client c uses
    ``models[c % len(models)]`` (several pairs: the heterogeneous runs of Section 6.6).
    ``clients`` = 0 means one user per client."""

    models: tuple[tuple[str, int], ...] = (("mf", 64),)
    aggregation: str = "cia"
    clients: int = 100
    grouping: str = "contiguous"
    layers: int = 3
    tower: tuple[int, ...] = (64, 32, 16, 8)
    init_std: float = 0.1
    finetune_steps: int = 100
    finetune_lr: float = 0.1
    finetune_loss: str = "norm"
    upload_rank: int = 0
    scope: str = "all"
    beta: float = 60.0
    ideal_weight: float = 0.3
    filter_rank: int = 32

    def __post_init__(self) -> None:
        check(
            (self.aggregation not in AGGREGATIONS, f"aggregation must be one of {AGGREGATIONS}"),
            (self.grouping not in GROUPINGS, f"grouping must be one of {GROUPINGS}"),
            (self.finetune_loss not in FINETUNE_LOSSES, f"finetune_loss must be one of {FINETUNE_LOSSES}"),
            (self.scope not in SCOPES, f"scope must be one of {SCOPES}"),
            (not self.models, "at least one (backbone, dim) is needed"),
            (any(b not in (*BACKBONES, "gfcf") for b, _ in self.models),
             f"backbones are {', '.join((*BACKBONES, 'gfcf'))}"),
            (any(d < 1 for _, d in self.models), "dims must be >= 1"),
            (self.clients < 0, "clients must be >= 0 (0: one user per client)"),
            (self.upload_rank < 0 or self.finetune_steps < 0 or self.layers < 0,
             "upload_rank, finetune_steps and layers must be >= 0"),
            (any(b == "gfcf" for b, _ in self.models) and len(self.models) > 1,
             "GF-CF cannot be mixed with parameter models in one run"),
        )

    def partition(self, n_users: int, seed: int) -> Partition:
        return clients_of(n_users, self.clients, self.grouping, seed)

    def algorithm(self, split: Split, cfg: Any, seed: int) -> CIAAlgorithm:
        """The federated algorithm the round driver trains."""
        if cfg.clients_per_round != 1.0:
            raise FedrecError("FedCIA runs train every client every round (--clients-per-round 1)")
        if cfg.dp_noise > 0 or cfg.clip is not None:
            raise FedrecError("FedCIA's uploads take Laplace LDP (--ldp) only")
        return CIAAlgorithm(CIAState(self, split, self.partition(split.n_users, seed), seed), cfg, seed)


class CIAState:
    """All clients of a run: parameter stacks (one per backbone and dim) or GF-CF filters."""

    def __init__(self, spec: CIASpec, split: Split, partition: Partition, seed: int) -> None:
        self.spec, self.split = spec, split
        self.n_users, self.n_items = split.n_users, split.n_items
        gen = torch.Generator().manual_seed(seed)
        users = np.split(partition.client_users, partition.client_ptr[1:-1])  # users of each client
        self.n_clients = partition.n_clients
        self.stacks: list[ClientStack] = []
        self.gfcf = spec.models[0][0] == "gfcf"
        self._global_filter: np.ndarray | None = None  # GF-CF: F̄ under cia
        self._local_scores: np.ndarray | None = None  # GF-CF: r_u F_k of every user
        self.user_stack = np.zeros(self.n_users, dtype=np.int64)
        self.user_local = np.zeros(self.n_users, dtype=np.int64)
        self.users_of_client = users
        if self.gfcf:
            return
        for j, (backbone, dim) in enumerate(spec.models):
            ids = np.arange(j, self.n_clients, len(spec.models))
            if len(ids) == 0:
                continue
            stack = ClientStack(backbone, dim, ids, [users[c] for c in ids], self.n_items, split.train,
                                tower=spec.tower, layers=spec.layers, init_std=spec.init_std, gen=gen)
            self.user_stack[stack.users] = len(self.stacks)
            self.user_local[stack.users] = np.arange(len(stack.users))
            self.stacks.append(stack)

    # ---- a round ---------------------------------------------------------------------------

    def train(self, cfg: Any, rng: np.random.Generator) -> tuple[float, int]:
        loss, batches = 0.0, 0
        for stack in self.stacks:
            s, b = stack.train_round(self.split.sample_negatives, max(cfg.negatives, 1),
                                     cfg.local_epochs, cfg.batch_size, cfg.lr, rng)
            loss, batches = loss + s, batches + b
        return loss, batches

    def aggregate(self, path: UploadPath, rng: np.random.Generator) -> tuple[int, int, dict[str, float]]:
        """Run the round's aggregation; returns (bytes up, bytes down, extra figures)."""
        if self.gfcf:
            return self._gfcf_round(path, rng)
        if self.spec.aggregation == "waa":
            return self._average()
        if self.spec.aggregation == "none":
            return 0, 0, {}
        if self.spec.scope == "local":
            return self._cia_local(path, rng)
        return self._cia(path, rng)

    def _average(self) -> tuple[int, int, dict[str, float]]:
        """FedAvg of every shared parameter within each stack, weighted by training pairs."""
        up = 0
        for stack in self.stacks:
            w = torch.from_numpy(stack.client_pairs / stack.client_pairs.sum()).float()
            for name in stack.shared_names():
                p = stack.params[name]
                mean = torch.tensordot(w, p, dims=1)
                p.copy_(mean.expand_as(p))
            up += stack.n_clients * stack.payload_floats() * 4
        return up, up, {}

    def _cia(self, path: UploadPath, rng: np.random.Generator) -> tuple[int, int, dict[str, float]]:
        """Similarity upload, server mean, eigendecomposition, fine-tune of every client."""
        m, rank = self.n_items, self.spec.upload_rank
        total = torch.zeros(m, m)  # float32: a mean of 100 products loses ~1e-6 relative
        up = 0
        for stack in self.stacks:
            e = stack.params["item"]  # (K, M, d)
            if rank:
                total += _factored_sum(e, rank, path, rng).float()
                up += stack.n_clients * (m * min(rank, stack.dim) + min(rank, stack.dim)) * 4
            else:
                flat = e.permute(1, 0, 2).reshape(m, -1)
                total += flat @ flat.T  # Σ_k E_k E_kᵀ in one GEMM
                up += stack.n_clients * m * m * 4
        if path.ldp > 0 and not rank:
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            total += path.noise_sum(self.n_clients, (m, m), gen)
        mean = total / self.n_clients
        for stack in self.stacks:
            self._align(stack.params["item"], mean)
        down = self.n_clients * (m * m + m) * 4
        return up, down, {"similarity_norm": float(0.5 * (mean + mean.T).norm())}

    def _align(self, item: torch.Tensor, target: torch.Tensor) -> None:
        """Fine-tune ``item`` ((K, L, d), in place) towards ``target`` (L x L): in the eigenbasis
        of its symmetric part; the skew part (noise) only adds a constant to the loss."""
        skew = 0.5 * (target - target.T)
        lam, u = torch.linalg.eigh(target - skew)
        finetune(item, u, lam, self.spec.finetune_steps, self.spec.finetune_lr,
                 self.spec.finetune_loss, float((skew * skew).sum()))

    def _cia_local(self, path: UploadPath, rng: np.random.Generator) -> tuple[int, int, dict[str, float]]:
        """CIA restricted to each client's items I_k: it uploads S_k[I_k, I_k] (with I_k), the
        server averages every entry over the clients that hold both items, and the client
        fine-tunes only E_k[I_k] towards S̄[I_k, I_k] (in that block's own eigenbasis)."""
        m, rank = self.n_items, self.spec.upload_rank
        total, count = torch.zeros(m, m), torch.zeros(m, m)
        up = down = 0
        for stack in self.stacks:
            for c, items in enumerate(stack.client_items):
                idx = torch.from_numpy(items)
                e = stack.params["item"][c, idx]
                n = len(items)
                if rank:
                    s_k = _factored_sum(e[None], rank, path, rng).float()
                    up += (n * min(rank, stack.dim) + min(rank, stack.dim) + n) * 4
                else:
                    s_k = torch.from_numpy(path.laplace((e @ e.T).detach().numpy(), rng)).float()
                    up += (n * n + n) * 4
                total[idx[:, None], idx[None, :]] += s_k
                count[idx[:, None], idx[None, :]] += 1.0
        mean = total / count.clamp_min(1.0)
        for stack in self.stacks:
            for c, items in enumerate(stack.client_items):
                idx = torch.from_numpy(items)
                rows = stack.params["item"][c, idx][None].clone()
                self._align(rows, mean[idx[:, None], idx[None, :]])
                stack.params["item"][c, idx] = rows[0]
                down += (len(items) ** 2 + len(items)) * 4
        return up, down, {"similarity_norm": float(0.5 * (mean + mean.T).norm())}

    def _gfcf_round(self, path: UploadPath, rng: np.random.Generator) -> tuple[int, int, dict[str, float]]:
        """GF-CF's one shot: local filters, and under ``cia`` their (noisy) mean."""
        if self._local_scores is not None:
            return 0, 0, {}
        spec, m, train = self.spec, self.n_items, self.split.train
        local = np.zeros((self.n_users, m), dtype=np.float32)
        total = np.zeros((m, m), dtype=np.float64) if spec.aggregation == "cia" else None
        up = 0
        for users in self.users_of_client:
            f = LocalFilter.fit(train[users], spec.filter_rank, spec.ideal_weight)
            local[users] = f.apply(train[users])
            if total is None:
                continue
            dense = f.dense()
            if spec.upload_rank:
                a, s, bt = np.linalg.svd(dense, full_matrices=False)
                L = spec.upload_rank
                a, s, bt = a[:, :L], s[:L], bt[:L]
                a, s, bt = (path.laplace(x, rng) for x in (a, s, bt))
                total += (a * s) @ bt
                up += (2 * m * L + L) * 4
            else:
                total += path.laplace(dense, rng)
                up += m * m * 4
        self._local_scores = local
        if total is not None:
            self._global_filter = (total / self.n_clients).astype(np.float32)
        return up, (self.n_clients * m * m * 4 if total is not None else 0), {}

    # ---- scores ------------------------------------------------------------------------------

    def run_extra(self) -> dict[str, Any]:
        return {"clients": self.n_clients,
                "models": [f"{b}-{d}" for b, d in self.spec.models],
                "aggregation": self.spec.aggregation}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        users = np.asarray(users, dtype=np.int64)
        if self.gfcf:
            if self._local_scores is None:
                raise FedrecError("GF-CF has no scores before its one round")
            out = self._local_scores[users].copy()
            if self._global_filter is not None:
                rows = (self.split.train[users] > 0).astype(np.float32)
                out += self.spec.beta * np.asarray(rows @ self._global_filter)
        else:
            out = np.empty((len(users), self.n_items), dtype=np.float32)
            for j, stack in enumerate(self.stacks):
                rows = np.flatnonzero(self.user_stack[users] == j)
                if len(rows):
                    out[rows] = stack.scores(self.user_local[users[rows]])
        return out if items is None else np.take_along_axis(out, items, axis=1)


def finetune(item: torch.Tensor, u: torch.Tensor, lam: torch.Tensor, steps: int, lr: float,
             loss: str, offset: float = 0.0) -> None:
    """``steps`` gradient steps of every client's E (``item``, (K, M, d), in place) on
    ‖E Eᵀ − S̄‖ (``loss="norm"``) or ‖E Eᵀ − S̄‖² / M² (``"mse"``), with S̄ = U diag(lam) Uᵀ;
    ``offset`` is ‖S − S̄‖² for a target S whose symmetric part is S̄ (it only enters the norm)."""
    if steps == 0:
        return
    m = item.shape[1]
    e = torch.matmul(u.T, item)  # Ẽ = Uᵀ E for every client
    lam64 = lam.double()
    lam_sq = float((lam64**2).sum())
    for _ in range(steps):
        gram = e.transpose(1, 2) @ e
        if loss == "mse":
            c = torch.full((len(e),), lr * 4.0 / (m * m))
        else:
            # ‖X‖² = ‖G‖² − 2 Σ_i λ_i ‖Ẽ_i‖² + ‖Λ‖², combined in float64 (it cancels near the end)
            rows = torch.linalg.vector_norm(e, dim=2).double() ** 2
            sq = (gram.double() ** 2).sum((1, 2)) - 2.0 * (rows @ lam64) + lam_sq + offset
            c = (lr * 2.0 / sq.clamp_min(1e-30).sqrt()).float()  # d‖X‖ = d‖X‖² / (2‖X‖)
        # Ẽ − lr·grad = Ẽ + c (ΛẼ − ẼG) = (1 + cΛ) ⊙ Ẽ − c ẼG, in place
        step = torch.bmm(e, gram).mul_(c[:, None, None])
        e.mul_(1.0 + c[:, None, None] * lam[None, :, None]).sub_(step)
    item.copy_(torch.matmul(u, e))


def _factored_sum(e: torch.Tensor, rank: int, path: UploadPath, rng: np.random.Generator) -> torch.Tensor:
    """Σ_k of each client's rank-``rank`` eigen-upload of E_k E_kᵀ (P_k, λ_k from the thin SVD
    of E_k; noised as sent), reconstructed by the server as P diag(λ) Pᵀ."""
    p, s, _ = torch.linalg.svd(e.double(), full_matrices=False)
    L = min(rank, e.shape[2])
    p, lam = p[:, :, :L], s[:, :L] ** 2
    p, lam = (torch.from_numpy(path.laplace(x.detach().numpy(), rng)) for x in (p, lam))
    m = e.shape[1]
    left = (p * lam[:, None, :]).permute(1, 0, 2).reshape(m, -1)
    right = p.permute(1, 0, 2).reshape(m, -1)
    return left @ right.T


class CIAAlgorithm(FederatedAlgorithm):
    """A `CIAState` as the round driver's federated algorithm: every client trains, then the
    round's aggregation (similarities, averaging, GF-CF filters) runs. Its draws are not keyed by
    client yet: the round's generator (`RoundPlan.rng`) serves training and aggregation."""

    def __init__(self, state: CIAState, cfg: Any, seed: int) -> None:
        self.state, self.cfg, self.seed = state, cfg, seed
        self.n_clients = state.n_clients
        self.max_rounds = 1 if state.gfcf else None

    def local_update(self, plan: RoundPlan) -> Uploads:
        start = time.perf_counter()
        loss, batches = self.state.train(self.cfg, plan.rng)
        return Uploads(loss_sum=loss, client_batches=batches,
                       extra={"train_seconds": time.perf_counter() - start})

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        start = time.perf_counter()
        up, down, extra = self.state.aggregate(UploadPath(ldp=self.cfg.ldp), plan.rng)
        uploads.bytes_up, uploads.bytes_down = up, down
        uploads.extra = {**extra, **uploads.extra, "aggregate_seconds": time.perf_counter() - start}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        return self.state.run_extra()

    def server_state_dict(self) -> dict[str, Any]:
        return {"global_filter": self.state._global_filter}

    def client_state_dict(self) -> dict[str, Any]:
        """Each client's own model (parameters, Adam moments, steps) and GF-CF's local scores."""
        return {"stacks": [{"params": s.params, "moments": s.moments, "steps": s.steps}
                           for s in self.state.stacks],
                "local_scores": self.state._local_scores}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.state._global_filter = blob["global_filter"]

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        for stack, saved in zip(self.state.stacks, blob["stacks"], strict=True):
            stack.params, stack.moments, stack.steps = saved["params"], saved["moments"], saved["steps"]
        self.state._local_scores = blob["local_scores"]
