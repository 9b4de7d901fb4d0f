"""FedCA's server step: each aggregated client's weights over the others (composite aggregation).

For the clients A of a round's aggregation, client i's weights w_i over A solve the quadratic
programme of the official code,

    min_x  xᵀx - 2 (p + a c_i + b s_i)ᵀ x   subject to  x >= 0,  Σ x = 1,

with ``p`` the FedAvg weights (each client's share of A's training samples), ``c_i`` its
complementarity with each client, ``s_i`` its similarity and ``a``, ``b`` their weights. Its
solution is the Euclidean projection of ``p + a c_i + b s_i`` onto the probability simplex
(`project_simplex`, closed form: Duchi et al., ICML 2008), so no QP solver is needed (the
official code calls cvxpy once a client). With ``a = b = 0`` every row is ``p``: FedAvg over A.

* **Similarity** (`similarity`): each client's item table projected on its first principal
  component, less the common start's projection; ``s_ij = 1 / (1 + ||π_i - π_j||)``, set to 1
  above 0.9. (The official code keeps its negative, -s, and subtracts it.)
* **Complementarity** (`complementarity`): each client's principal subspace (``k`` directions of
  the item rows it trained this round, `principal_basis`), and ``c_ij`` the cosine of the mean
  principal angle between the two subspaces. The angles are the arc-cosines of the singular
  values of ``B_i B_jᵀ`` (the definition); the official code pairs basis vectors greedily by
  their cosine instead, which is not the principal angles when the bases are not aligned.
"""

from __future__ import annotations

import torch


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Each row of ``v`` ``(n, m)`` projected onto the probability simplex (sort, cumulative
    sums, one threshold a row)."""
    m = v.shape[-1]
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = torch.cumsum(u, dim=-1) - 1
    ks = torch.arange(1, m + 1, dtype=v.dtype, device=v.device)
    support = (u - css / ks) > 0  # true on a prefix
    rho = support.sum(-1, keepdim=True).clamp_min(1)
    theta = torch.gather(css, -1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp_min(0)


def first_component(tables: torch.Tensor) -> torch.Tensor:
    """Each table of ``tables`` ``(n, M, d)`` projected on its own first principal component
    ``(n, M)`` (centred rows; the component's sign set so its largest entry is positive, as
    scikit-learn's PCA does, which the official code calls)."""
    x = tables - tables.mean(1, keepdim=True)
    _, vecs = torch.linalg.eigh(x.transpose(1, 2) @ x)  # ascending eigenvalues
    top = vecs[..., -1]  # (n, d)
    sign = torch.sign(torch.gather(top, 1, top.abs().argmax(1, keepdim=True)))
    return torch.einsum("nmd,nd->nm", x, top * sign)


def similarity(tables: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``s`` ``(n, n)`` of the module docstring from the clients' item tables ``(n, M, d)`` and
    the common start ``(M, d)``."""
    moved = first_component(tables) - first_component(start[None])
    s = 1.0 / (1.0 + torch.cdist(moved, moved))
    return torch.where(s > 0.9, torch.ones_like(s), s)


def principal_basis(rows: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` principal directions ``(k, d)`` of ``rows`` ``(n, d)`` (centred; orthonormal;
    fewer when there are fewer rows or columns, padded with zero rows)."""
    d = rows.shape[1]
    out = torch.zeros(k, d, dtype=rows.dtype, device=rows.device)
    if len(rows) < 2:
        return out
    _, _, vt = torch.linalg.svd(rows - rows.mean(0), full_matrices=False)
    take = min(k, vt.shape[0])
    out[:take] = vt[:take]
    return out


def complementarity(bases: torch.Tensor) -> torch.Tensor:
    """``c`` ``(n, n)`` of the module docstring from the clients' bases ``(n, k, d)``: the
    cosine of the mean principal angle between each two subspaces.

    Every pair's ``B_i B_jᵀ`` comes from one product of the stacked bases, and its singular
    values as the square roots of the eigenvalues of ``(B_i B_jᵀ)(B_i B_jᵀ)ᵀ`` (in float64), for
    each pair once: 2.5 million 4 x 4 problems on Lastfm-2K's 1,600 clients."""
    n, k, d = bases.shape
    flat = bases.double().reshape(n * k, d)
    gram = (flat @ flat.T).reshape(n, k, n, k)
    i, j = torch.triu_indices(n, n, device=bases.device)
    g = gram[i, :, j, :]  # (pairs, k, k)
    cos = torch.linalg.eigvalsh(g @ g.transpose(-1, -2)).clamp(0.0, 1.0).sqrt()
    c = torch.cos(torch.arccos(cos).mean(-1)).to(bases.dtype)
    out = torch.empty(n, n, dtype=bases.dtype, device=bases.device)
    out[i, j] = c
    out[j, i] = c
    return out


def composite_weights(samples: torch.Tensor, c: torch.Tensor, s: torch.Tensor,
                      complement: float, similar: float) -> torch.Tensor:
    """Each aggregated client's weights over the others ``(n, n)`` (rows sum to 1) from their
    training samples ``(n,)``, complementarity ``c`` and similarity ``s``."""
    p = samples / samples.sum()
    return project_simplex(p[None, :] + complement * c + similar * s)
