"""Matrix factorisation: score(u, i) = <p_u, q_i> (+ biases and a global mean for ratings)."""

from __future__ import annotations

import torch
from torch import nn


class MF(nn.Module):
    """Dot-product MF. ``biased=True`` adds user/item biases and a global offset (rating tasks)."""

    def __init__(self, n_users: int, n_items: int, dim: int = 32, biased: bool = False,
                 init_std: float = 0.01, offset: float = 0.0) -> None:
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        nn.init.normal_(self.user.weight, std=init_std)
        nn.init.normal_(self.item.weight, std=init_std)
        self.biased = biased
        if biased:
            self.user_bias = nn.Embedding(n_users, 1)
            self.item_bias = nn.Embedding(n_items, 1)
            nn.init.zeros_(self.user_bias.weight)
            nn.init.zeros_(self.item_bias.weight)
            self.register_buffer("offset", torch.tensor(float(offset)))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Scores for ``users`` of shape (n,) against ``items`` of shape (n,) or (n, C)."""
        p = self.user(users)
        q = self.item(items)
        if items.dim() == 2:
            p = p.unsqueeze(1)
        out = (p * q).sum(-1)
        if self.biased:
            ub = self.user_bias(users).squeeze(-1)
            out = out + (ub.unsqueeze(1) if items.dim() == 2 else ub)
            out = out + self.item_bias(items).squeeze(-1) + self.offset
        return out

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        """Scores of ``users`` against every item, as one matrix product."""
        out = self.user(users) @ self.item.weight.T
        if self.biased:
            out = out + self.user_bias(users) + self.item_bias.weight.T + self.offset
        return out
