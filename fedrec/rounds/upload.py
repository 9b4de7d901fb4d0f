"""The single client-upload path: clip -> noise -> encode -> count bytes.

A client's item-table upload is one of:

* ``rows`` (default): the row deltas of the rows it touched, index + values (4 + 4·D bytes a
  row);
* ``sparse``: the new values of the rows it touched, each row in the shorter of two forms: its
  non-zero entries (a 1-byte column and a 4-byte value each) or all of it (4·D bytes), after a
  4-byte item id and a 1-byte entry count (255 marks a whole row). The server subtracts the
  global rows it sent. It pays off when training keeps rows sparse (FedRAP's soft-thresholded
  C) and costs one byte a row when it does not; the encoding is really applied — the server
  trains on the decoded rows — so the count is of what travels;
* ``dense``: the whole table, forced under any noise: noise on the touched rows alone would
  tell the server which items the client touched.

Privacy, in order: ``clip`` bounds the L2 norm of every row delta; ``dp_clip`` bounds the L2
norm of a client's whole update (the Gaussian mechanism's sensitivity, FedRAP Eq. 4);
``ldp`` adds Laplace(0, λ) to every entry (PFedRec Eq. 12); ``dp_noise`` z adds Gaussian noise
so that the server's mean carries N(0, (2 z dp_clip / n)²) on every entry (FedRAP Section 3.3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

FLOAT_BYTES = 4
INDEX_BYTES = 4
ENCODINGS = ("rows", "sparse", "dense")


@dataclass(frozen=True)
class UploadPath:
    """How clients clip, noise and encode their item-table upload (see the module docstring)."""

    ldp: float = 0.0
    clip: float | None = None
    encoding: str = "rows"
    dp_clip: float | None = None
    dp_noise: float = 0.0

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown upload encoding '{self.encoding}'; known: {', '.join(ENCODINGS)}")

    @property
    def noisy(self) -> bool:
        return self.ldp > 0 or self.dp_noise > 0

    @property
    def sends_dense(self) -> bool:
        return self.encoding == "dense" or self.noisy

    def transmit(self, rows: torch.Tensor, start: torch.Tensor, counts: torch.Tensor,
                 n_items: int) -> tuple[torch.Tensor, int, int]:
        """Clip and encode a cohort's trained ``rows`` (client k owns ``counts[k]`` of them).

        Returns the row deltas the server receives (before noise, which the server's sum adds
        in one draw, see `noise_sum`) and the bytes up and down.
        """
        width = rows.shape[1]
        down = int(counts.sum()) * (INDEX_BYTES + width * FLOAT_BYTES)
        if self.encoding == "sparse" and not self.sends_dense:
            rows, up = decode_sparse(*encode_sparse(rows))
            delta = rows - start
        else:
            delta = rows - start
            up = (len(counts) * n_items * width * FLOAT_BYTES if self.sends_dense
                  else int(counts.sum()) * (INDEX_BYTES + width * FLOAT_BYTES))
        delta = clip_rows(delta, self.clip)
        if self.dp_clip is not None:
            delta = clip_clients(delta, counts, self.dp_clip)
        return delta, up, down

    def laplace(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``x`` as one client sends it under Laplace LDP: every float + Laplace(0, ``ldp``)
        (uploads that are not item rows: FedCIA's similarity matrices, factors and filters)."""
        return x + rng.laplace(0.0, self.ldp, x.shape) if self.ldp > 0 else x

    def noise_sum(self, n_clients: int, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
        """Sum over ``n_clients`` uploads of their independent noise tables, drawn in one pass
        (the simulator's path, when nothing looks at a single upload; see `local_noise`)."""
        return self.local_noise(n_clients, n_clients, shape, gen)

    def local_noise(self, k: int, n_clients: int, shape: tuple[int, int],
                    gen: torch.Generator) -> torch.Tensor:
        """Sum of the noise tables ``k`` clients add to their own uploads, out of a round of
        ``n_clients`` (a Flower node noises its clients' uploads this way before they leave).

        Laplace(0, b) = b (E1 - E2) with E ~ Exp(1), and a sum of k independent Exp(1) is
        Gamma(k, 1), so the Laplace sum is b (G1 - G2), G ~ Gamma(k, 1). (The inverse-CDF form
        -b sign(u) log(1 - 2|u|) is avoided: it is infinite when a uniform draw is exactly 0.)
        Each client's Gaussian share is N(0, (2 z S)² / n), so k shares sum to
        N(0, (2 z S)² k / n) and a round's n shares to N(0, (2 z S)²). Summing the nodes'
        local noise therefore has the distribution of `noise_sum` (tested).
        """
        total = torch.zeros(shape)
        if not self.noisy or k <= 0:
            return total
        rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=gen, device="cpu")))
        if self.ldp > 0:
            g = rng.standard_gamma(float(k), size=(2, *shape))
            total += torch.as_tensor(self.ldp * (g[0] - g[1])).float()
        if self.dp_noise > 0 and self.dp_clip is not None:
            std = 2.0 * self.dp_noise * self.dp_clip * (k / max(n_clients, 1)) ** 0.5
            total += torch.as_tensor(rng.normal(0.0, std, size=shape)).float()
        return total

    @property
    def noiseless(self) -> UploadPath:
        """This path without noise: the server's, when the clients noised their own uploads."""
        return replace(self, ldp=0.0, dp_noise=0.0)


def clip_rows(delta: torch.Tensor, bound: float | None) -> torch.Tensor:
    """Each row of ``delta`` scaled down to L2 norm ``bound`` where longer (``--clip``); None:
    as it is."""
    if bound is None:
        return delta
    norms = delta.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return delta * (bound / norms).clamp(max=1.0)


def clip_clients(delta: torch.Tensor, counts: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale each client's rows (client k owns ``counts[k]`` consecutive rows) to L2 norm <= bound."""
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts)
    sq = torch.zeros(len(counts), dtype=delta.dtype).index_add_(0, owner, delta.square().sum(1))
    scale = (bound / sq.sqrt().clamp_min(1e-12)).clamp(max=1.0)
    return delta * scale[owner, None]


WHOLE_ROW = 255  # entry-count byte marking a row sent whole


def encode_sparse(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Each row as its non-zero entries or whole, whichever is shorter (see the module docs).

    Returns the per-row count bytes (``WHOLE_ROW`` for a whole row), the column byte of each
    sparse entry, the float32 values (sparse entries and whole rows, in row order) and the
    width, as tensors on the rows' device (on a GPU the rows are not copied to the host and
    back). Row ids travel too; both sides know them from the rows' order, so they are counted,
    not built.
    """
    width = rows.shape[1]
    if width >= WHOLE_ROW:
        raise ValueError("the sparse row encoding stores columns in one byte (width < 255)")
    rows = rows.float()
    nz = rows != 0
    per_row = nz.sum(1)
    whole = per_row * (1 + FLOAT_BYTES) >= width * FLOAT_BYTES
    counts = torch.where(whole, WHOLE_ROW, per_row).to(torch.uint8)
    if bool(whole.all()):  # a dense table (FedRAP's C at most settings): no mask to build
        return counts, torch.zeros(0, dtype=torch.uint8, device=rows.device), rows.reshape(-1), width
    cols = torch.nonzero(nz[~whole])[:, 1].to(torch.uint8)
    return counts, cols, rows[nz | whole[:, None]], width


def decode_sparse(counts: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
                  width: int) -> tuple[torch.Tensor, int]:
    """Rows back from `encode_sparse`, and the bytes the encoding took."""
    whole = counts == WHOLE_ROW
    n_bytes = len(counts) * INDEX_BYTES + counts.numel() + cols.numel() + values.numel() * FLOAT_BYTES
    if bool(whole.all()):
        return values.reshape(-1, width).clone(), n_bytes
    rows = torch.zeros((len(counts), width), dtype=torch.float32, device=values.device)
    # whole rows are blocks of ``width`` values; the others' values go to their columns
    per_row = torch.where(whole, width, counts.long())
    in_whole = torch.repeat_interleave(whole, per_row, output_size=len(values))
    rows[whole] = values[in_whole].reshape(-1, width)
    sparse = torch.nonzero(~whole).flatten()
    rows[torch.repeat_interleave(sparse, per_row[sparse]), cols.long()] = values[~in_whole]
    return rows, n_bytes
