"""The rating autoencoder of PersonalFR, written for many models at once.

A user's training rating vector x ∈ R^n goes through an encoder [n, 256, 128] and a decoder
[128, 256, n] (Diao et al.'s architecture, as in the official code: every Linear but the last
is followed by GroupNorm with one group and tanh; dropout 0.5 on the 128-wide code; Xavier
initialisation, zero biases). The loss is taken on the observed entries only, so neither end
needs the dense vector:

* the first layer is a sum of the rows of the items the user rated, weighted by the ratings
  (``embedding_bag``), so the n × 256 weight is a *row table* and a model only needs the rows of
  items its users rated;
* the output layer is evaluated only on (user, rated item) pairs during training, from the rows
  of the output table of those items; evaluation scores every item.

Parameters come in two kinds: row tables (first-layer weights ``enc.in``, output weights
``dec.out`` and biases ``dec.out.b``; one row per item) and dense layers. The forward pass takes
dense layers with a leading *slot-group* axis ``(A, ...)`` and activations ``(A, B, width)``:
``A`` models (clients) of ``B`` users each, so one batched matmul runs every client's own layer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.device import here

ROW_TABLES = ("enc.in", "dec.out", "dec.out.b")


def layer_shapes(hidden: tuple[int, ...], norm: bool) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Dense shapes of the encoder and of the decoder (without the row tables).

    ``hidden`` = (256, 128): the encoder's first layer (a row table) ends in 256 units, then
    ``enc.1`` maps 256 → 128; the decoder's ``dec.1`` maps 128 → 256, then the output row table.
    """
    enc: dict[str, tuple[int, ...]] = {"enc.in.b": (hidden[0],)}
    if norm:
        enc.update({"enc.in.g": (hidden[0],), "enc.in.s": (hidden[0],)})
    for j, (a, b) in enumerate(zip(hidden[:-1], hidden[1:], strict=True), start=1):
        enc.update(_dense(f"enc.{j}", a, b, norm))
    dec: dict[str, tuple[int, ...]] = {}
    back = hidden[::-1]
    for j, (a, b) in enumerate(zip(back[:-1], back[1:], strict=True), start=1):
        dec.update(_dense(f"dec.{j}", a, b, norm))
    return enc, dec


def _dense(name: str, a: int, b: int, norm: bool) -> dict[str, tuple[int, ...]]:
    shapes = {f"{name}.W": (a, b), f"{name}.b": (b,)}
    if norm:
        shapes.update({f"{name}.g": (b,), f"{name}.s": (b,)})
    return shapes


def init_params(n_items: int, hidden: tuple[int, ...], norm: bool,
                gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One model's parameters: Xavier-uniform weights, zero biases, unit GroupNorm scales."""
    enc, dec = layer_shapes(hidden, norm)
    out: dict[str, torch.Tensor] = {
        "enc.in": _xavier((n_items, hidden[0]), n_items, hidden[0], gen),
        "dec.out": _xavier((n_items, hidden[0]), hidden[0], n_items, gen),
        "dec.out.b": torch.zeros(n_items),
    }
    for name, shape in {**enc, **dec}.items():
        if name.endswith(".W"):
            out[name] = _xavier(shape, shape[0], shape[1], gen)
        elif name.endswith(".g"):
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.zeros(shape)
    return out


def _xavier(shape: tuple[int, ...], fan_in: int, fan_out: int, gen: torch.Generator) -> torch.Tensor:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (here(torch.rand(shape, generator=gen, device="cpu")) * 2 - 1) * bound


def _activate(h: torch.Tensor, p: dict[str, torch.Tensor], name: str, A: int) -> torch.Tensor:
    """GroupNorm(1) (when the model has it) and tanh; ``h`` is (A, B, width)."""
    if f"{name}.g" in p:
        h = F.layer_norm(h, h.shape[-1:], eps=1e-5)  # one group over all features = layer norm
        h = h * p[f"{name}.g"][:A, None] + p[f"{name}.s"][:A, None]
    return torch.tanh(h)


def codes(p: dict[str, torch.Tensor], hidden: tuple[int, ...], rows: torch.Tensor,
          offsets: torch.Tensor, values: torch.Tensor, A: int, B: int, dropout: float = 0.0,
          draws: torch.Tensor | None = None) -> torch.Tensor:
    """The last hidden layer of the decoder for A groups of B users: (A * B, hidden[0]).

    ``rows``/``offsets``/``values`` are the users' rated items as an ``embedding_bag`` input over
    ``p["enc.in"]`` (bag k = user slot k, row ids already pointing into the given table).
    ``p``'s dense entries have a leading axis of at least A (one layer per group). Dropout on
    the code keeps the units whose uniform ``draws`` ``(A, B, hidden[-1])`` are >= ``dropout``.
    """
    h = encode(p, hidden, rows, offsets, values, A, B)
    if dropout > 0:
        keep = (draws if draws is not None else torch.rand(h.shape)) >= dropout
        h = h * keep / (1.0 - dropout)
    return decode_hidden(p, hidden, h, A)


def encode(p: dict[str, torch.Tensor], hidden: tuple[int, ...], rows: torch.Tensor,
           offsets: torch.Tensor, values: torch.Tensor, A: int, B: int) -> torch.Tensor:
    """The code (the encoder's output) of A groups of B users: (A, B, hidden[-1]); inputs as
    `codes`'."""
    h = F.embedding_bag(rows, p["enc.in"], offsets, mode="sum", per_sample_weights=values)
    h = h.view(A, B, -1) + p["enc.in.b"][:A, None]
    h = _activate(h, p, "enc.in", A)
    for j in range(1, len(hidden)):
        h = torch.baddbmm(p[f"enc.{j}.b"][:A, None], h, p[f"enc.{j}.W"][:A])
        h = _activate(h, p, f"enc.{j}", A)
    return h


def decode_hidden(p: dict[str, torch.Tensor], hidden: tuple[int, ...], h: torch.Tensor, A: int) -> torch.Tensor:
    """The decoder's last hidden layer from codes ``h`` (A, B, hidden[-1]): (A * B, hidden[0])."""
    for j in range(1, len(hidden)):
        h = torch.baddbmm(p[f"dec.{j}.b"][:A, None], h, p[f"dec.{j}.W"][:A])
        h = _activate(h, p, f"dec.{j}", A)
    return h.reshape(h.shape[0] * h.shape[1], -1)


def pair_outputs(h: torch.Tensor, slots: torch.Tensor, out_rows: torch.Tensor,
                 p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Outputs of (user slot, item) pairs: ⟨h[slot], dec.out[row]⟩ + dec.out.b[row]."""
    return (h[slots] * p["dec.out"][out_rows]).sum(-1) + p["dec.out.b"][out_rows]


def forward_macs(n_in: Any, n_out: Any, hidden: tuple[int, ...]) -> float:
    """Multiply-adds of forward passes with ``n_in`` input and ``n_out`` output units (numbers
    or arrays, one entry per user; summed)."""
    inner = sum(a * b for a, b in zip(hidden[:-1], hidden[1:], strict=True))
    n_in, n_out = np.broadcast_arrays(np.asarray(n_in, dtype=np.float64), np.asarray(n_out, dtype=np.float64))
    return float((n_in * hidden[0] + 2 * inner + n_out * hidden[0]).sum())
