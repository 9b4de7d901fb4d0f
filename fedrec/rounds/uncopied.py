"""Clients trained on shared weights without a copy of them each (`FamilyState.train_uncopied`).

Every client of a round starts from the same shared weights W. A score function whose shared
weights are each multiplied by one per-client input (MetaMF's: the user vector, its memory read,
a hidden layer; `FamilySpec.shares_unbatched`) makes, per client and step, one product
``out_c = x_c W (+ b)``, and the client's gradient of W is the outer product ``x_cᵀ d_c`` of its
input and its gradient ``d_c`` of ``out_c``. So after steps t with (clipped) ``d_{c,t}``, plain
SGD has moved the client's weight to

    W_c = W - lr_w sum_t x_{c,t}ᵀ d_{c,t},      b_c = b - lr_b sum_t d_{c,t},

and its next product is ``x W + b - sum_t (lr_w x.x_{c,t} + lr_b) d_{c,t}``: the shared product
plus a correction from each client's few earlier steps (`SharedHistory`), with no copy of the
473k floats. The server only sums the uploads: ``sum_c W_c = n W - lr_w Xᵀ D`` over every
client's steps, one matrix product (`SharedHistory.summed`). A step's cost grows with the steps
before it, so the engine sends a client here only up to `MAX_STEPS` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

#: most local steps a client trains here: each step's products read every earlier step's
#: history, so a client's steps cost O(steps²) (against O(steps) a copy, 100x larger a step)
MAX_STEPS = 32


class SharedProduct(NamedTuple):
    """One product of a shared weight with per-client inputs, ``out = x @ p[weight] (+ p[bias])``
    (``x``, ``out``: ``(C, in)``, ``(C, out)``), as a score function records it: a client's
    gradient of the weight is the outer product of its ``x`` row and its gradient of ``out``, so
    its norm and the clipped sum over clients need no copy."""

    weight: str
    bias: str | None
    x: torch.Tensor
    out: torch.Tensor


class SharedHistory:
    """What a chunk's clients' steps so far did to the shared weights: for each product, each
    client's input ``x`` and scaled output gradient ``d`` a step, ``(C, steps, in)`` and
    ``(C, steps, out)`` (zero for a client not active in a step)."""

    def __init__(self, n_clients: int, n_steps: int, lr_of: Callable[[str], float]) -> None:
        self.n_clients, self.n_steps, self.lr_of = n_clients, n_steps, lr_of
        self.taken = 0
        self.x: dict[str, torch.Tensor] = {}
        self.d: dict[str, torch.Tensor] = {}
        self.bias: dict[str, str | None] = {}

    def correct(self, weight: str, bias: str | None, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the product with the shared weight, first ``len(x)`` clients) as each client's
        own weight makes it: less ``sum_t (lr_w x.x_t + lr_b) d_t`` over its earlier steps."""
        if not self.taken:
            return out
        n, t = x.shape[0], self.taken
        coef = torch.bmm(self.x[weight][:n, :t], x[:, :, None]).squeeze(2).mul(self.lr_of(weight))
        if bias is not None:
            coef = coef + self.lr_of(bias)
        return out - torch.bmm(coef[:, None, :], self.d[weight][:n, :t]).squeeze(1)

    def add(self, products: list[SharedProduct], grads: tuple[torch.Tensor, ...]) -> None:
        """Record a step: each product's inputs and its (clipped) output gradients ``grads``,
        for the step's first ``len(x)`` clients."""
        t = self.taken
        for p, d in zip(products, grads, strict=True):
            if p.weight not in self.x:
                shape = (self.n_clients, self.n_steps)
                self.x[p.weight] = torch.zeros((*shape, p.x.shape[1]), dtype=p.x.dtype, device=p.x.device)
                self.d[p.weight] = torch.zeros((*shape, d.shape[1]), dtype=d.dtype, device=d.device)
                self.bias[p.weight] = p.bias
            n = p.x.shape[0]
            self.x[p.weight][:n, t] = p.x.detach()  # a copy: the input may be a private leaf stepped next
            self.d[p.weight][:n, t] = d
        self.taken += 1

    def summed(self, shared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every client's shared weights after its steps, summed: ``n W - lr Xᵀ D`` each."""
        total = {k: w * self.n_clients for k, w in shared.items()}
        for weight, x in self.x.items():
            d = self.d[weight][:, : self.taken].reshape(-1, self.d[weight].shape[2])
            x = x[:, : self.taken].reshape(-1, x.shape[2])
            total[weight].addmm_(x.T, d, alpha=-self.lr_of(weight))
            bias = self.bias[weight]
            if bias is not None:
                total[bias].sub_(d.sum(0), alpha=self.lr_of(bias))
        return total


class SharedTape:
    """The products of shared weights one step makes (`SharedProduct`), each corrected by the
    client's earlier steps (`SharedHistory`) so that it reads the client's own weights."""

    def __init__(self, history: SharedHistory | None = None) -> None:
        self.history = history
        self.products: list[SharedProduct] = []

    def product(self, weight: str, bias: str | None, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Record ``out = x p[weight] (+ p[bias])``, computed with the shared weight; returns it
        as the client's own weight gives it."""
        if self.history is not None:
            out = self.history.correct(weight, bias, x, out)
        if any(p.weight == weight for p in self.products):
            raise ValueError(f"shared weight '{weight}' is read twice in a step; its gradient is no outer product")
        self.products.append(SharedProduct(weight, bias, x, out))
        return out


def squared_norms(tape: SharedTape, outs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Each client's squared norm of its gradients of the shared weights in ``tape``, given its
    gradients ``outs`` of their outputs: |x_c|^2 |d_c|^2 for a weight (the norm of the outer
    product x_c^T d_c) and |d_c|^2 for its bias, in float64 as `clip_scale` sums them."""
    sq = torch.zeros(outs[0].shape[0], dtype=torch.float64)
    for t, d in zip(tape.products, outs, strict=True):
        d2 = d.square().sum(1).double()
        sq += t.x.detach().square().sum(1).double() * d2 + (d2 if t.bias is not None else 0.0)
    return sq
