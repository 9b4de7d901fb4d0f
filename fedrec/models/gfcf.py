"""GF-CF (Shen et al., CIKM 2021): a parameter-free graph filter over items.

With R the binary user x item training matrix and R̃ = D_u^-1/2 R D_i^-1/2, the filter is

    F = R̃ᵀR̃ + w · D_i^-1/2 Vᵀ V D_i^1/2

(the linear filter plus the ideal low-pass filter from the top ``rank`` right singular vectors V
of R̃), and a user's scores are r_u F. Items without interactions get D_i^-1/2 = 0, as in the
official code. `LocalFilter` keeps R̃ and V rather than the M x M filter: applying it to a few
users costs O(nnz + rank x M) per user, and a client holding a handful of users never needs
the dense filter except to upload it (FedCIA).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

# dense SVD below this many cells of R̃ (fast and exact); truncated ARPACK SVD above
_DENSE_SVD_CELLS = 2**24


@dataclass
class LocalFilter:
    """GF-CF's filter for one set of users, in factored form.

    ``norm`` is R̃ (users x items, CSR), ``v`` the top right singular vectors (rank x items),
    ``d_inv`` and ``d`` the item degrees' D^-1/2 and D^1/2 (zero for unseen items).
    """

    norm: sp.csr_matrix
    v: np.ndarray
    d_inv: np.ndarray
    d: np.ndarray
    ideal_weight: float

    @classmethod
    def fit(cls, train: sp.csr_matrix, rank: int, ideal_weight: float) -> LocalFilter:
        """The filter of the users in ``train`` (rows; any ratings are binarised).

        ``rank`` is clamped to the rank R̃ can have (min(users, items) - 1 for the ARPACK path),
        so a client of nine users gets at most nine singular vectors.
        """
        r = (train > 0).astype(np.float64).tocsr()
        du = np.asarray(r.sum(axis=1)).ravel()
        di = np.asarray(r.sum(axis=0)).ravel()
        du_inv = np.divide(1.0, np.sqrt(du), out=np.zeros_like(du), where=du > 0)
        d_inv = np.divide(1.0, np.sqrt(di), out=np.zeros_like(di), where=di > 0)
        norm = sp.diags(du_inv) @ r @ sp.diags(d_inv)
        v = _top_right_singular(norm.tocsr(), rank)
        return cls(norm.tocsr().astype(np.float32), v.astype(np.float32),
                   d_inv.astype(np.float32), np.sqrt(di).astype(np.float32), ideal_weight)

    def apply(self, rows: sp.csr_matrix | np.ndarray) -> np.ndarray:
        """r F for each row r of ``rows`` (users x items, binarised), without forming F."""
        rows = (sp.csr_matrix(rows) > 0).astype(np.float32)
        linear = ((rows @ self.norm.T) @ self.norm).toarray()
        ideal = ((rows @ sp.diags(self.d_inv)) @ self.v.T) @ (self.v * self.d)
        return linear + self.ideal_weight * np.asarray(ideal)

    def dense(self) -> np.ndarray:
        """The M x M filter F (float32): only for uploading it."""
        f = np.asarray((self.norm.T @ self.norm).todense(), dtype=np.float32)
        f += self.ideal_weight * ((self.v * self.d_inv).T @ (self.v * self.d))
        return f


def _top_right_singular(m: sp.csr_matrix, rank: int) -> np.ndarray:
    """The ``rank`` leading right singular vectors of ``m`` as rows (fewer if m has less rank)."""
    n_rows, n_cols = m.shape
    if rank <= 0 or m.nnz == 0:
        return np.zeros((0, n_cols))
    if n_rows * n_cols <= _DENSE_SVD_CELLS:
        _, s, vt = np.linalg.svd(m.toarray(), full_matrices=False)
        keep = min(rank, int((s > s[0] * 1e-10).sum()))
        return vt[:keep]
    k = min(rank, min(n_rows, n_cols) - 1)
    _, s, vt = spla.svds(m, k=k, random_state=0)
    return vt[np.argsort(-s)]
