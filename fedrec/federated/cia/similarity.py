"""The similarity arithmetic of FedCIA: eigendecomposition, fine-tune, factored uploads.

**The fine-tune in S̄'s eigenbasis, exactly.** A gradient step on ‖E Eᵀ − S̄‖ costs O(M²d) per
client (S̄ E). The server sends S̄ as its eigendecomposition U Λ Uᵀ (the same M² + M floats);
with Ẽ = Uᵀ E, ‖E Eᵀ − S̄‖_F = ‖Ẽ Ẽᵀ − Λ‖_F because U is orthogonal, its gradient is
U · 4(Ẽ(ẼᵀẼ) − ΛẼ), and the norm itself is ‖ẼᵀẼ‖² − 2 Σ_i λ_i ‖Ẽ_i‖² + ‖Λ‖² — O(Md²) a
step. Rotating in and out costs two GEMMs, so 100 steps cost about what 1 direct step would.
The loss is the Frobenius norm (not squared) as the official code (``finetune_loss="norm"``),
or the paper's MSE (``"mse"``, the squared norm / M²).
"""

from __future__ import annotations

import numpy as np
import torch

from fedrec.rounds.upload import UploadPath


def eigen(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The eigendecomposition U, λ of ``target``'s symmetric part, and ‖skew part‖² (noise: it
    only adds a constant to the fine-tune's loss)."""
    skew = 0.5 * (target - target.T)
    lam, u = torch.linalg.eigh(target - skew)
    return u, lam, float((skew * skew).sum())


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
    lam_rows = lam[None, :, None]
    for _ in range(steps):
        gram = e.transpose(1, 2) @ e
        resid = torch.bmm(e, gram).addcmul_(lam_rows, e, value=-1.0)  # X̃Ẽ = ẼG − ΛẼ
        if loss == "mse":
            c = torch.full((len(e),), lr * 4.0 / (m * m))
        else:
            # ‖X‖² = ‖G‖² − 2 Σ_i λ_i ‖Ẽ_i‖² + ‖Λ‖², combined in float64 (it cancels near the end)
            rows = torch.linalg.vector_norm(e, dim=2).double() ** 2
            g_sq = (gram.double() ** 2).sum((1, 2))
            sq = g_sq - 2.0 * (rows @ lam64) + lam_sq + offset
            sq = torch.maximum(sq, _norm_floor(resid, g_sq))
            c = (lr * 2.0 / sq.clamp_min(1e-30).sqrt()).float()  # d‖X‖ = d‖X‖² / (2‖X‖)
        e.addcmul_(resid, c[:, None, None], value=-1.0)  # Ẽ − lr·grad = Ẽ − c X̃Ẽ, in place
    item.copy_(torch.matmul(u, e))


def _norm_floor(resid: torch.Tensor, g_sq: torch.Tensor) -> torch.Tensor:
    """A lower bound on each client's ‖X‖² = ‖Ẽ Ẽᵀ − Λ‖² that does not cancel: the float32 Gram
    matrix G holds ‖G‖² to about 1e-7 of itself, so once a client's E Eᵀ is that close to S̄ (a
    long FedCIA run on ML-100K gets there by round 70, with λ in the thousands) the identity above
    can come out at or below zero, and the normalised step c = 2 lr / ‖X‖ explodes to NaN. Since
    ``resid`` = X̃Ẽ and ‖X̃Ẽ‖ ≤ ‖X‖ σ_max(Ẽ) ≤ ‖X‖ ‖G‖^½, ‖X̃Ẽ‖² / ‖G‖ ≤ ‖X‖²: taken as a floor
    it bounds the step's length by 2 lr ‖G‖^½, the exact gradient's own bound, and is never above
    the true value, so it changes no step where the identity holds."""
    return torch.linalg.vector_norm(resid, dim=(1, 2)).double() ** 2 / g_sq.clamp_min(1e-30).sqrt()


def factors(e: torch.Tensor, rank: int, path: UploadPath, rng: np.random.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's rank-``rank`` eigen-upload of E_k E_kᵀ: P_k ``(K, M, L)`` and λ_k
    ``(K, L)`` from the thin SVD of E_k (a client never forms M x M), noised as sent."""
    p, s, _ = torch.linalg.svd(e.double(), full_matrices=False)
    L = min(rank, e.shape[2])
    p, lam = p[:, :, :L], s[:, :L] ** 2
    return tuple(torch.as_tensor(path.laplace(x.detach().cpu().numpy(), rng)) for x in (p, lam))  # type: ignore[return-value]


def similarity_sum(e: torch.Tensor) -> torch.Tensor:
    """Σ_k E_k E_kᵀ of the clients' item tables ``e`` ``(K, M, d)``, in float64, as one GEMM."""
    flat = e.permute(1, 0, 2).reshape(e.shape[1], -1).double()
    return flat @ flat.T


def reconstruct_sum(p: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Σ_k P_k diag(λ_k) P_kᵀ, as the server rebuilds the clients' factored uploads."""
    m = p.shape[1]
    left = (p * lam[:, None, :]).permute(1, 0, 2).reshape(m, -1)
    right = p.permute(1, 0, 2).reshape(m, -1)
    return left @ right.T
