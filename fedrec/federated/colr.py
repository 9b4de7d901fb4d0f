"""CoLR (Nguyen et al., "Towards Efficient Communication and Secure Federated Recommendation
System via Low-rank Training", WWW 2024): FedMF whose item updates lie in a random subspace of
rank r that the whole round shares, so a client sends r numbers an item row instead of d.

The official code (NNHieu/CoLR-FedRec) freezes the item table E and trains E + A B, with A
(n_items x r) starting at zero and B (r x d) redrawn each round with orthonormal rows scaled
by sqrt(d / r); A's gradient is scaled by sqrt(r / d), and the client uploads A. Under SGD the
two are one thing: A's step is -lr sqrt(r/d) G Bᵀ for the item rows' gradient G, so the rows'
step is that times B, -lr sqrt(d/r) G Qᵀ Q with Q = B / sqrt(d/r): the gradient projected onto
the round's subspace and scaled by sqrt(d/r), which keeps its expected length. `CoLRState`
takes the step in that form (one d x d product a step), and its upload is really the r
coordinates of each row's change in the basis Q (the server rebuilds the change from them), so
the bytes counted are the bytes sent. The server averages each row over the clients that sent
it, as the official code divides A's sum by each item's senders (fedrec's ``contributors``
and ``samples`` rules).

Every party draws the round's basis from the run's seed and the round (`round_basis`), as the
official server broadcasts B: a Flower node and the server need no message to agree on it. On
Flower the rows travel as their r coordinates too (`wire_rows`), and under secure aggregation
the masked table is n_items x r, the method's point: a dense upload of r/d the size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedrec.federated.family.state import CohortUpload, FamilyState
from fedrec.rounds import draws
from fedrec.rounds.cohort import CohortBatches
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES, UploadPath


def round_basis(seed: int, r: int, dim: int, rank: int) -> torch.Tensor:
    """The ``(rank, dim)`` orthonormal rows of round ``r``'s subspace: the Q of a Gaussian
    matrix's QR, keyed by (``seed``, round), so every party draws the same."""
    gen = torch.Generator().manual_seed(draws.seed_of((seed, draws.BASIS, r)))
    q, _ = torch.linalg.qr(torch.randn((dim, rank), generator=gen, dtype=torch.float64, device="cpu"))
    return q.T.contiguous().float()


@dataclass
class CoLRState(FamilyState):
    """FedMF's state whose item steps and uploads lie in the round's subspace (module docstring)."""

    #: its item step reads the round's basis, a new tensor each round, which a captured step
    #: would not see (`FamilyState.graphed_steps`)
    graphed_steps = False

    #: the round's ``(rank, width)`` orthonormal basis (None before the first round)
    basis: torch.Tensor | None = None
    #: ``sqrt(d / r) Qᵀ Q``: what an item-row gradient step is multiplied by
    step_map: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return int(self.spec.rank)

    def begin_round(self, r: int) -> Any:
        width = self.items.shape[1]
        self.basis = round_basis(self.seed, r, width, self.rank).to(self.items.device)
        self.step_map = (self.basis.T @ self.basis) * math.sqrt(width / self.rank)
        return super().begin_round(r)

    def _apply_item_step(self, rows: torch.Tensor, idx: torch.Tensor, step_rows: torch.Tensor) -> None:
        """The step projected onto the round's subspace, at sqrt(d/r) its length there."""
        assert self.step_map is not None, "begin_round draws the round's basis"
        super()._apply_item_step(rows, idx, step_rows @ self.step_map)

    def _finish(self, cohort: CohortBatches, params: dict[str, torch.Tensor], start: torch.Tensor,
                rows: torch.Tensor, path: UploadPath, loss_sum: float,
                shared_sum: dict[str, torch.Tensor] | None = None) -> CohortUpload:
        """FedMF's upload, sent as each row's r coordinates and rebuilt from them; its bytes
        are those coordinates' (4 + 4 r a row, or the whole n_items x r table where the upload
        is dense)."""
        up = super()._finish(cohort, params, start, rows, path, loss_sum, shared_sum)
        up.delta = self.unwire_rows(self.wire_rows(up.delta))
        c, n_items = len(cohort.clients), self.items.shape[0]
        shared = c * sum(v.numel() for v in self.shared.values()) * FLOAT_BYTES
        items = (c * n_items * self.rank * FLOAT_BYTES if path.sends_dense
                 else len(cohort.row_items) * (INDEX_BYTES + self.rank * FLOAT_BYTES))
        up.bytes_up = items + shared
        return up

    def noise_rows(self, k: int, n_clients: int, path: UploadPath, gen: torch.Generator) -> torch.Tensor:
        """The clients' LDP/DP noise drawn on what they send, each row's r coordinates (an
        n_items x r table a client under noise), as the rows' change it makes: noise in the
        round's subspace, of the same per-number scale as FedMF's on its d numbers a row."""
        coords = path.local_noise(k, n_clients, (self.items.shape[0], self.rank), gen)
        return self.unwire_rows(coords.to(self.items.device))

    # -- what travels ----------------------------------------------------------------------

    @property
    def wire_width(self) -> int:
        """Numbers an item row takes on the wire: the rank."""
        return self.rank

    def wire_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Row changes (in the round's subspace) as their coordinates in its basis."""
        assert self.basis is not None, "begin_round draws the round's basis"
        return rows @ self.basis.T

    def unwire_rows(self, coords: torch.Tensor) -> torch.Tensor:
        """Row changes back from their coordinates."""
        assert self.basis is not None, "begin_round draws the round's basis"
        return coords.to(self.basis.dtype) @ self.basis
