"""The server's user graphs of GPFedRec and GFed-PP (see `fedrec.federated.graph.state`): which
users are public, the graph of public users' interactions, the neighbour graph of uploaded
tables, and the blocked Gram matrix both build on.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import blas
from threadpoolctl import threadpool_limits


def public_users(n_users: int, ratio: float, seed: int) -> np.ndarray:
    """A boolean mask of ``round(ratio x n_users)`` public users drawn at random (seeded)."""
    mask = np.zeros(n_users, bool)
    mask[np.random.default_rng([seed, 0x9F]).permutation(n_users)[: round(ratio * n_users)]] = True
    return mask


class FactoredGraph:
    """Ã applied as ``D^-1/2 (R (Rᵀ D^-1/2 X) - diag(n_i - lonely_i) D^-1/2 X)``, never formed.

    A = R Rᵀ less its diagonal (user i's own n_i items), plus the lonely users' self-loops. Two
    sparse products over R's non-zeros replace the dense n x n one: fewer multiplications when
    2 nnz(R) is well under n², but memory-bound ones, so it pays only on large, sparse data
    (benchmarks/graph_step.py, one thread: Lastfm-2K, 1,600 users, 1.5-1.9x faster than the
    dense Ã; ML-100K, 943 users, 0.6-0.8x). scipy's CSR product, in blocks of ``columns``
    columns that stay in cache: PyTorch's sparse CSR product measured 2x slower here. On
    another device than the CPU (a GPU) the dense Ã is formed there once and used instead.
    """

    def __init__(self, r: sp.csr_matrix, lonely: np.ndarray, deg: np.ndarray, nnz: int, columns: int = 64) -> None:
        self.r, self.rt = r, r.T.tocsr()
        self.inv = (1.0 / np.sqrt(deg)).astype(np.float32)[:, None]
        self.diag = (np.asarray(r.sum(1)).ravel() - lonely).astype(np.float32)[:, None]
        self.nnz, self.columns = nnz, columns
        self._dense: torch.Tensor | None = None

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            if self._dense is None or self._dense.device != x.device:
                self._dense = self.to_dense().to(x.device)
            return self._dense @ x
        y = x.cpu().numpy() * self.inv
        out = np.empty_like(y)
        for s in range(0, y.shape[1], self.columns):
            part = y[:, s : s + self.columns]
            out[:, s : s + self.columns] = self.r @ (self.rt @ part) - self.diag * part
        return torch.as_tensor(out * self.inv)

    def to_dense(self) -> torch.Tensor:
        a = (self.r @ self.rt).toarray() - np.diagflat(self.diag)
        return torch.as_tensor(self.inv * a * self.inv.T, device="cpu")


Graph = torch.Tensor | FactoredGraph


def public_graph(train: sp.csr_matrix, public: np.ndarray, sparse_below: float = 0.1,
                 factor_above: float = 10.0) -> Graph:
    """Ã = D^-1/2 A D^-1/2 over the public users, A = R Rᵀ without self-loops (Eq. 3-4).

    A public user who shares no item with any other keeps a self-loop, so that its row is its
    own table rather than zero. Returned as a `FactoredGraph` when n² exceeds ``factor_above`` x
    2 nnz(R) (the dense product's multiplications against the factored one's), else dense, or as
    a sparse CSR tensor when fewer than ``sparse_below`` of its entries are non-zero.
    """
    r = (train[np.flatnonzero(public)] > 0).astype(np.float32).tocsr()
    a = (r @ r.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    deg = np.asarray(a.sum(1)).ravel()
    alone = deg == 0
    lonely = np.flatnonzero(alone)
    a = (a + sp.csr_matrix((np.ones(len(lonely), np.float32), (lonely, lonely)), shape=a.shape)).tocsr()
    deg[lonely] = 1.0
    n = a.shape[0]
    if n * n > factor_above * 2 * r.nnz:
        return FactoredGraph(r, alone, deg, int(a.nnz))
    scale = sp.diags((1.0 / np.sqrt(deg)).astype(np.float32))
    norm = (scale @ a @ scale).tocsr().astype(np.float32)
    norm.sort_indices()
    if norm.nnz >= sparse_below * max(n * n, 1):
        return torch.as_tensor(norm.toarray())
    with warnings.catch_warnings():  # "sparse CSR support is in beta": products with dense work
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.as_tensor(norm.indptr.astype(np.int64)),
                                       torch.as_tensor(norm.indices.astype(np.int64)),
                                       torch.as_tensor(norm.data), size=norm.shape,
                                       check_invariants=True)


def graph_nnz(graph: Graph) -> int:
    """Non-zero entries of Ã, however it is held."""
    if isinstance(graph, FactoredGraph):
        return graph.nnz
    return int(graph._nnz()) if graph.layout == torch.sparse_csr else int((graph != 0).sum())


def neighbour_graph(gram: torch.Tensor, similarity: str, threshold: float) -> tuple[torch.Tensor, dict[str, float]]:
    """GPFedRec's user graph from the Gram matrix of the uploaded tables.

    Each user's neighbours are the users whose value exceeds ``threshold`` x the mean of the
    whole matrix, weighted uniformly (a user without neighbours keeps itself). The value is the
    cosine similarity, or under ``legacy-distance`` 1 - similarity, as the official code.
    Returns the row-stochastic graph and diagnostics: the mean similarity of the chosen
    neighbours and of the others.
    """
    norms = gram.diagonal().clamp_min(1e-24).sqrt()
    cos = gram / norms[:, None] / norms[None, :]
    value = cos if similarity == "cosine" else 1.0 - cos
    chosen = value > threshold * value.mean()
    empty = ~chosen.any(1)
    chosen[empty, empty] = True
    g = chosen.float()
    g /= g.sum(1, keepdim=True)
    others = ~chosen
    stats = {
        "neighbours": float(chosen.sum(1).float().mean()),
        "neighbour_similarity": float(cos[chosen].mean()),
        "other_similarity": float(cos[others].mean()) if bool(others.any()) else float("nan"),
    }
    return g, stats


class Gram:
    """``Σ x xᵀ`` over the column blocks ``x`` (``(n, w)``, float64) of every user's table.

    On the CPU each block is one symmetric rank-k update (BLAS ``dsyrk``, through SciPy, with as
    many threads as PyTorch uses): it computes one triangle, half the multiplications of the
    full product, and measured 2x faster than the three products torch needs for the same
    triangle (1,600 users, 2,048 columns, one thread: 0.12 s against 0.24 s a block). torch has no
    such kernel, so on another device (a GPU) the lower triangle is computed from the rows split
    in two halves (3/4 of the full product's work). The two differ from ``x xᵀ`` by round-off in
    the last bits of float64 only (the sums run in another order). Only ``value``'s lower
    triangle is kept; `result` mirrors it.
    """

    def __init__(self, n: int, device: torch.device | str | None = None) -> None:
        self.value = torch.zeros((n, n), dtype=torch.float64, device=device)
        self._cpu = self.value.device.type == "cpu"

    def add(self, x: torch.Tensor) -> None:
        if self._cpu:
            # gram.T is Fortran-ordered, so BLAS updates it in place; its upper triangle is the
            # gram's lower one. x.T is Fortran-ordered (w, n): trans=1 gives (x.T)ᵀ x.T = x xᵀ.
            c = self.value.cpu().numpy().T
            with threadpool_limits(torch.get_num_threads(), user_api="blas"):
                out = blas.dsyrk(1.0, x.cpu().numpy().T, beta=1.0, c=c, trans=1, lower=0, overwrite_c=1)
            if out is not c:  # a copy would drop the update silently
                raise RuntimeError("dsyrk did not update the Gram matrix in place")
            return
        h = x.shape[0] // 2
        top, bottom = x[:h], x[h:]
        self.value[:h, :h].addmm_(top, top.T)
        self.value[h:, h:].addmm_(bottom, bottom.T)
        self.value[h:, :h].addmm_(bottom, top.T)

    def result(self) -> torch.Tensor:
        """The whole symmetric matrix (its lower triangle mirrored)."""
        low = torch.tril(self.value)
        return low + torch.tril(self.value, -1).T
