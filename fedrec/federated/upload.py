"""The single client-upload path: clip -> noise -> encode -> count bytes.

Item tables travel as *row deltas* of the rows a client touched (index + values: 4 + 4·D
bytes a row), or, for local differential privacy, as the whole table: noise on the touched
rows alone would tell the server which items the client touched, so an LDP upload is dense
and every entry carries Laplace(0, λ) noise (PFedRec Eq. 12).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FLOAT_BYTES = 4
INDEX_BYTES = 4


@dataclass(frozen=True)
class UploadPath:
    """How clients encode their item-table upload.

    ``ldp``: Laplace scale λ (0 = none). ``clip``: maximum L2 norm of each uploaded row delta
    (None = no clipping). ``dense``: send the full table (forced when ``ldp > 0``).
    """

    ldp: float = 0.0
    clip: float | None = None
    dense: bool = False

    @property
    def sends_dense(self) -> bool:
        return self.dense or self.ldp > 0

    def clip_rows(self, delta: torch.Tensor) -> torch.Tensor:
        if self.clip is None:
            return delta
        norms = delta.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return delta * (self.clip / norms).clamp(max=1.0)

    def noise_sum(self, n_clients: int, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
        """Sum over ``n_clients`` uploads of their independent Laplace(0, λ) noise tables.

        Drawn exactly in one pass: Laplace(0, b) = b (E1 - E2) with E ~ Exp(1), and a sum of n
        independent Exp(1) is Gamma(n, 1), so the sum is b (G1 - G2), G ~ Gamma(n, 1). (The
        inverse-CDF form -b sign(u) log(1 - 2|u|) is also avoided: it is infinite when a uniform
        draw is exactly 0, which happens every few dozen million draws.)
        """
        if self.ldp <= 0 or n_clients <= 0:
            return torch.zeros(shape)
        rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=gen)))
        g = rng.standard_gamma(float(n_clients), size=(2, *shape))
        return torch.from_numpy(self.ldp * (g[0] - g[1])).float()

    def item_bytes(self, rows_per_client: torch.Tensor, n_items: int, width: int) -> int:
        """Bytes the cohort uploads for its item tables."""
        if self.sends_dense:
            return int(len(rows_per_client)) * n_items * width * FLOAT_BYTES
        return int(rows_per_client.sum()) * (INDEX_BYTES + width * FLOAT_BYTES)
