"""The single client-upload path: clip -> noise -> encode -> count bytes.

Item tables travel as *row deltas* of the rows a client touched (index + values: 4 + 4·D
bytes a row), or, for local differential privacy, as the whole table: noise on the touched
rows alone would tell the server which items the client touched, so an LDP upload is dense
and every entry carries Laplace(0, λ) noise (PFedRec Eq. 12).
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def noise_sum(self, n_clients: int, shape: tuple[int, int], gen: torch.Generator,
                  chunk: int = 64) -> torch.Tensor:
        """Sum over ``n_clients`` uploads of their independent Laplace noise tables."""
        total = torch.zeros(shape)
        if self.ldp <= 0:
            return total
        for start in range(0, n_clients, chunk):
            m = min(chunk, n_clients - start)
            # Laplace(0, b) = b (E1 - E2) with E ~ Exp(1). The inverse-CDF form
            # -b sign(u) log(1 - 2|u|) is infinite when a uniform draw is exactly 0, which
            # happens every few dozen million draws (every round of an ML-100K LDP run).
            e = torch.empty((2, m, *shape)).exponential_(generator=gen)
            total += self.ldp * (e[0] - e[1]).sum(0)
        return total

    def item_bytes(self, rows_per_client: torch.Tensor, n_items: int, width: int) -> int:
        """Bytes the cohort uploads for its item tables."""
        if self.sends_dense:
            return int(len(rows_per_client)) * n_items * width * FLOAT_BYTES
        return int(rows_per_client.sum()) * (INDEX_BYTES + width * FLOAT_BYTES)
