"""Neural collaborative filtering (NeuMF, He et al. 2017): GMF and an MLP tower fused by a linear head."""

from __future__ import annotations

import torch
from torch import nn


class NCF(nn.Module):
    """NeuMF with embedding ``dim`` for both towers and an MLP of ``2*dim -> ... -> layers[-1]``.

    The default MLP 64-32-16-8 is the 3-layer tower of the NCF paper for dim 32.
    """

    def __init__(self, n_users: int, n_items: int, dim: int = 32,
                 layers: tuple[int, ...] = (32, 16, 8), init_std: float = 0.01) -> None:
        super().__init__()
        self.user_gmf = nn.Embedding(n_users, dim)
        self.item_gmf = nn.Embedding(n_items, dim)
        self.user_mlp = nn.Embedding(n_users, dim)
        self.item_mlp = nn.Embedding(n_items, dim)
        for emb in (self.user_gmf, self.item_gmf, self.user_mlp, self.item_mlp):
            nn.init.normal_(emb.weight, std=init_std)
        tower: list[nn.Module] = []
        width = 2 * dim
        for out in layers:
            tower += [nn.Linear(width, out), nn.ReLU()]
            width = out
        self.mlp = nn.Sequential(*tower)
        self.head = nn.Linear(dim + width, 1)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits for ``users`` (n,) against ``items`` (n,) or (n, C)."""
        if items.dim() == 2:
            users = users.unsqueeze(1).expand_as(items)
        gmf = self.user_gmf(users) * self.item_gmf(items)
        mlp = self.mlp(torch.cat([self.user_mlp(users), self.item_mlp(items)], dim=-1))
        return self.head(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        items = torch.arange(self.item_gmf.num_embeddings, device=users.device)
        return self.forward(users, items.unsqueeze(0).expand(len(users), -1))
