"""FedCIA (collaborative-information aggregation) and its parameter-averaging counterparts.

Clients hold groups of users (the paper: 100 clients of consecutive user ids; or one user per
client) and each keeps a whole model of its own. Per round (the paper's Algorithm 1):

1. every client trains its model on its own data (BPR, Adam; `fedrec.federated.cia.stack`);
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

**The fine-tune** runs in S̄'s eigenbasis (`fedrec.federated.cia.similarity`): O(M d²) a step.

**Uploads** go through one path: the dense matrix (M² floats), or with ``upload_rank`` L its
truncated eigendecomposition (M·L + L floats; from the client's thin SVD of E_k, so a client
never forms M x M); GF-CF filters are not symmetric and travel as a rank-L SVD (2 M·L + L).
Laplace LDP (``--ldp δ``) noises what travels: every entry of the dense matrix, or every float of
the factors. The server keeps one running sum, never a matrix per client.

**Draws** of a client (its initial user vectors, negatives, shuffles) are keyed by its id
(`fedrec.rounds.draws`), and the shared start of the item table by the backbone's index, so a
Flower node holding a few clients (`fedrec.federated.cia.sides`) trains them exactly as the simulator
does. Uploads are summed in float64, so any grouping of the clients gives the same mean.

**GF-CF** (`fedrec.models.gfcf`) has no parameters: one round computes each client's filter
F_k, and a client scores its users with r_u F_k + β r_u F̄ (``none``: r_u F_k).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.core.contract import ClientUpload
from fedrec.errors import FedrecError
from fedrec.federated.cia.similarity import (
    eigen,
    factors,
    finetune,
    reconstruct_sum,
    similarity_sum,
)
from fedrec.federated.cia.stack import ClientStack
from fedrec.models.gfcf import LocalFilter
from fedrec.partition import Partition
from fedrec.protocols.negatives import ComplementSampler
from fedrec.rounds import draws
from fedrec.rounds.upload import UploadPath


class CIAState:
    """Clients of a run: parameter stacks (one per backbone and dim) or GF-CF filters.

    The simulator holds every client; a Flower node (`fedrec.federated.cia.sides`) the clients
    ``client_ids`` (global ids of the ``partition``'s clients) over its own users' rows of
    ``train`` and ``sampler``. A round is `train`, then `client_sums` (what the clients upload,
    summed), `combine` (the server) and `apply` (what the server sends back, on every client).
    ``spec`` is the method's `fedrec.federated.cia.spec.CIASpec` (not imported: the spec builds
    this state).
    """

    def __init__(self, spec: Any, train: sp.csr_matrix, sampler: ComplementSampler,
                 partition: Partition, seed: int, client_ids: np.ndarray | None = None) -> None:
        self.spec, self.train_matrix, self.sampler, self.seed = spec, train, sampler, seed
        self.n_users, self.n_items = train.shape
        self.n_clients = partition.n_clients
        #: which users each client holds (the privacy audit reads its clients' items through it)
        self.partition = partition
        ids = np.arange(self.n_clients) if client_ids is None else np.asarray(client_ids, np.int64)
        users = np.split(partition.client_users, partition.client_ptr[1:-1])  # users of each client
        self.stacks: list[ClientStack] = []
        self.gfcf = spec.models[0][0] == "gfcf"
        self._global_filter: np.ndarray | None = None  # GF-CF: F̄ under cia
        self._local_scores: np.ndarray | None = None  # GF-CF: r_u F_k of every user
        self.user_stack = np.zeros(self.n_users, dtype=np.int64)
        self.user_local = np.zeros(self.n_users, dtype=np.int64)
        self.users_of_client = users
        self.client_ids = ids  # global ids of the clients, in partition order
        if self.gfcf:
            return
        for j, (backbone, dim) in enumerate(spec.models):  # client c runs models[c % len(models)]
            local = np.flatnonzero(ids % len(spec.models) == j)
            if len(local) == 0:
                continue
            stack = ClientStack(backbone, dim, ids[local], [users[c] for c in local], self.n_items,
                                train, tower=spec.tower, layers=spec.layers, init_std=spec.init_std,
                                key=(seed, draws.INIT, j), model=j)
            self.user_stack[stack.users] = len(self.stacks)
            self.user_local[stack.users] = np.arange(len(stack.users))
            self.stacks.append(stack)

    @property
    def plain_average(self) -> bool:
        """Whether the server averages whole similarity matrices (``cia`` over every item, with
        parameter models and more than one client): their rows are what the security layer
        reads and aggregates row by row (`CIAAlgorithm`)."""
        return (not self.gfcf and self.spec.aggregation == "cia" and self.spec.scope == "all"
                and self.n_clients > 1)

    def start_similarity(self) -> torch.Tensor:
        """The clients' mean E_k E_kᵀ before any training (float32): what a round-1 upload
        moves from. Every client starts from its backbone's shared table, so any client can
        compute it."""
        return (self.similarity_total() / self.n_clients).float()

    def similarity_total(self) -> torch.Tensor:
        """The sum over this state's clients of E_k E_kᵀ as their models are now (float64)."""
        m = self.n_items
        total = torch.zeros(m, m, dtype=torch.float64)
        for stack in self.stacks:
            total += similarity_sum(stack.params["item"])
        return total

    # ---- a round ---------------------------------------------------------------------------

    def train(self, cfg: Any, r: int) -> tuple[float, int]:
        """Round ``r``'s local training of every client (draws keyed by client id)."""
        loss, batches = 0.0, 0
        for stack in self.stacks:
            s, b = stack.train_round(self.sampler, max(cfg.negatives, 1), cfg.local_epochs,
                                     cfg.batch_size, cfg.lr, self.seed, r)
            loss, batches = loss + s, batches + b
        return loss, batches

    def aggregate(self, path: UploadPath, rng: np.random.Generator,
                  keep: list[ClientUpload] | None = None) -> tuple[int, int, dict[str, float]]:
        """A round's uploads, server step and clients' update in one call (`CIAAlgorithm` runs
        the three in its local update and aggregation); (bytes up, down, figures)."""
        sums = self.client_sums(path, rng, keep)
        sync, extra = combine(self.spec, sums)
        self.apply(sync)
        return int(sums["bytes_up"]), int(sums["bytes_down"]), extra

    def client_sums(self, path: UploadPath, rng: np.random.Generator,
                    keep: list[ClientUpload] | None = None) -> dict[str, Any]:
        """What this state's clients upload, summed over them (noised as sent: Laplace LDP from
        ``rng``), with their number and the bytes each way (``bytes_up``, ``bytes_down``).
        With ``keep``, each client's own upload (as sent, noise included) is appended to it and
        the sums are of those (slower: one product per client instead of one GEMM)."""
        if self.gfcf:
            return self._gfcf_sums(path, rng, keep)
        if self.spec.aggregation == "waa":
            return self._waa_sums(keep)
        if self.spec.aggregation == "none":
            return {"n": self.n_clients, "bytes_up": 0, "bytes_down": 0}
        if self.spec.scope == "local":
            return self._local_sums(path, rng, keep)
        m, rank = self.n_items, self.spec.upload_rank
        # summed in float64 (about 1.5x the float32 GEMM): a sum over any grouping of the clients
        # (the simulator's stacks, Flower nodes) then rounds to the same float32 mean, and the
        # fine-tune, which amplifies round-off, starts from the same target
        total = torch.zeros(m, m, dtype=torch.float64)
        up, everything = 0, np.arange(m)
        for stack in self.stacks:
            e = stack.params["item"]  # (K, M, d)
            if rank:
                p, lam = factors(e, rank, path, rng)
                total += reconstruct_sum(p, lam)
                up += stack.n_clients * (m * min(rank, stack.dim) + min(rank, stack.dim)) * 4
                for c, client in enumerate(stack.clients if keep is not None else ()):
                    keep.append(ClientUpload(int(client), everything, {"p": p[c].float(), "lam": lam[c].float()}))
            elif keep is not None:
                for c, client in enumerate(stack.clients):
                    s_k = torch.as_tensor(path.laplace((e[c].double() @ e[c].double().T).cpu().numpy(), rng))
                    keep.append(ClientUpload(int(client), everything, {"similarity": s_k.float()}))
                    total += s_k
                up += stack.n_clients * m * m * 4
            else:
                total += similarity_sum(e)
                up += stack.n_clients * m * m * 4
        if path.ldp > 0 and not rank and keep is None:  # the clients' noise, summed in one pass
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            total += path.noise_sum(self.n_clients, (m, m), gen).double()
        return {"n": self.n_clients, "similarity": total, "bytes_up": up,
                "bytes_down": self.n_clients * (m * m + m) * 4}

    def _waa_sums(self, keep: list[ClientUpload] | None) -> dict[str, Any]:
        """Per backbone and size: Σ_k pairs_k · θ_k of every shared parameter, and Σ_k pairs_k."""
        out: dict[str, Any] = {"n": self.n_clients}
        up = 0
        for stack in self.stacks:
            for c, client in enumerate(stack.clients if keep is not None else ()):
                keep.append(ClientUpload(int(client), np.arange(self.n_items),
                                         {k: stack.params[k][c].clone() for k in stack.shared_names()}))
            w = torch.as_tensor(stack.client_pairs.astype(np.float64))  # float64: see `client_sums`
            for name in stack.shared_names():
                out[f"waa.{stack.model}.{name}"] = torch.tensordot(w, stack.params[name].double(), dims=1)
            out[f"waa.{stack.model}.weight"] = np.float64(stack.client_pairs.sum())
            up += stack.n_clients * stack.payload_floats() * 4
        return {**out, "bytes_up": up, "bytes_down": up}

    def _local_sums(self, path: UploadPath, rng: np.random.Generator,
                    keep: list[ClientUpload] | None) -> dict[str, Any]:
        """CIA restricted to each client's items I_k: it uploads S_k[I_k, I_k] (with I_k); the
        sums of the blocks and of how many clients hold each pair."""
        m, rank = self.n_items, self.spec.upload_rank
        total = torch.zeros(m, m, dtype=torch.float64)  # float64: see `client_sums`
        count = torch.zeros(m, m, dtype=torch.float64)
        up = down = 0
        for stack in self.stacks:
            for c, items in enumerate(stack.client_items):
                idx = torch.as_tensor(items)
                e = stack.params["item"][c, idx]
                n = len(items)
                if rank:
                    p, lam = factors(e[None], rank, path, rng)
                    s_k = reconstruct_sum(p, lam)
                    sent = {"p": p[0].float(), "lam": lam[0].float()}
                    up += (n * min(rank, stack.dim) + min(rank, stack.dim) + n) * 4
                else:
                    e = e.double()
                    s_k = torch.as_tensor(path.laplace((e @ e.T).cpu().numpy(), rng))
                    sent = {"similarity": s_k.float()}
                    up += (n * n + n) * 4
                if keep is not None:
                    keep.append(ClientUpload(int(stack.clients[c]), items, sent))
                total[idx[:, None], idx[None, :]] += s_k
                count[idx[:, None], idx[None, :]] += 1.0
                down += (n * n + n) * 4
        return {"n": self.n_clients, "similarity": total, "count": count, "bytes_up": up,
                "bytes_down": down}

    def _gfcf_sums(self, path: UploadPath, rng: np.random.Generator,
                   keep: list[ClientUpload] | None) -> dict[str, Any]:
        """GF-CF's one shot: every client's filter F_k (kept for its own scores), and under
        ``cia`` the sum of the (noisy) uploads."""
        spec, m, train = self.spec, self.n_items, self.train_matrix
        if self._local_scores is not None:
            return {"n": self.n_clients, "bytes_up": 0, "bytes_down": 0}
        local = np.zeros((self.n_users, m), dtype=np.float32)
        total = np.zeros((m, m), dtype=np.float64) if spec.aggregation == "cia" else None
        up = 0
        for client, users in zip(self.client_ids, self.users_of_client, strict=True):
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
                sent = {"u": a, "s": s, "vt": bt}
                up += (2 * m * L + L) * 4
            else:
                noisy = path.laplace(dense, rng)
                total += noisy
                sent = {"filter": noisy}
                up += m * m * 4
            if keep is not None:
                keep.append(ClientUpload(int(client), np.arange(m),
                                         {k: torch.as_tensor(v, dtype=torch.float32) for k, v in sent.items()}))
        self._local_scores = local
        out: dict[str, Any] = {"n": self.n_clients, "bytes_up": up,
                               "bytes_down": self.n_clients * m * m * 4 if total is not None else 0}
        return out if total is None else {**out, "filter": total}

    def apply(self, sync: dict[str, Any]) -> None:
        """What the server sent after aggregating (`combine`), on every client of this state."""
        if "filter" in sync:
            self._global_filter = np.asarray(sync["filter"], np.float32)
        for stack in self.stacks:
            for name in stack.shared_names():
                mean = sync.get(f"waa.{stack.model}.{name}")
                if mean is not None:
                    stack.params[name].copy_(torch.as_tensor(mean).expand_as(stack.params[name]))
            if "u" in sync:
                finetune(stack.params["item"], torch.as_tensor(sync["u"]), torch.as_tensor(sync["lam"]),
                         self.spec.finetune_steps, self.spec.finetune_lr, self.spec.finetune_loss,
                         float(sync["offset"]))
            elif "mean" in sync:  # local scope: each client towards its own block
                mean = torch.as_tensor(sync["mean"])
                for c, items in enumerate(stack.client_items):
                    idx = torch.as_tensor(items)
                    rows = stack.params["item"][c, idx][None].clone()
                    u, lam, offset = eigen(mean[idx[:, None], idx[None, :]])
                    finetune(rows, u, lam, self.spec.finetune_steps, self.spec.finetune_lr,
                             self.spec.finetune_loss, offset)
                    stack.params["item"][c, idx] = rows[0]

    # ---- what the clients keep -----------------------------------------------------------------

    def client_state(self) -> dict[str, Any]:
        """Each client's own model (parameters, Adam moments, steps) and GF-CF's local scores."""
        return {"stacks": [{"params": s.params, "moments": s.moments, "steps": s.steps}
                           for s in self.stacks],
                "local_scores": self._local_scores}

    def load_client_state(self, blob: dict[str, Any]) -> None:
        for stack, saved in zip(self.stacks, blob["stacks"], strict=True):
            stack.params, stack.moments, stack.steps = saved["params"], saved["moments"], saved["steps"]
        self._local_scores = blob["local_scores"]

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
                rows = (self.train_matrix[users] > 0).astype(np.float32)
                out += self.spec.beta * np.asarray(rows @ self._global_filter)
        else:
            out = np.empty((len(users), self.n_items), dtype=np.float32)
            for j, stack in enumerate(self.stacks):
                rows = np.flatnonzero(self.user_stack[users] == j)
                if len(rows):
                    out[rows] = stack.scores(self.user_local[users[rows]])
        return out if items is None else np.take_along_axis(out, items, axis=1)


def combine(spec: Any, sums: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """The server's step on the clients' summed uploads: what it sends back to every client
    (`CIAState.apply`) and the round's figures. ``sums["n"]``: how many clients uploaded."""
    n = max(int(sums["n"]), 1)
    f32 = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731  (sums may arrive as float64)
    if "filter" in sums:
        return {"filter": (np.asarray(sums["filter"]) / n).astype(np.float32)}, {}
    if "count" in sums:
        mean = f32(sums["similarity"]) / f32(sums["count"]).clamp_min(1.0)
        return {"mean": mean}, {"similarity_norm": float(0.5 * (mean + mean.T).norm())}
    if "similarity" in sums:
        mean = f32(sums["similarity"]) / n
        u, lam, offset = eigen(mean)
        return ({"u": u, "lam": lam, "offset": offset},
                {"similarity_norm": float(0.5 * (mean + mean.T).norm())})
    return {k: f32(torch.as_tensor(v, dtype=torch.float64) / float(sums[k.rsplit(".", 1)[0] + ".weight"]))
            for k, v in sums.items() if k.startswith("waa.") and not k.endswith(".weight")}, {}


def dense_upload(upload: ClientUpload) -> torch.Tensor:
    """A kept similarity upload as the dense matrix the server rebuilds (float32)."""
    t = upload.tensors
    if "similarity" in t:
        return t["similarity"].float()
    return reconstruct_sum(t["p"][None].double(), t["lam"][None].double()).float()
