"""The item-embedding family's model, apart from its spec (`fedrec.federated.family.spec.FamilySpec`):
every parameter's draw, the scores, the per-client losses and the closed-form gradients. The
engine's kernels (`fedrec.federated.family.state`) read these; they take the spec as an argument and do
not import it, so the spec can build the state without an import circle.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.device import here
from fedrec.rounds import draws

#: the item table's name among a client's uploads
ITEMS = "items"


def init_params(spec: Any, names: list[str], n: int,
                gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` independent draws of the named parameters (leading axis n), from ``gen``.

    Everything, user vectors included, starts like PyTorch's ``nn.Linear`` weights:
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)). A user vector plays the part of a score function's
    weight (FedMF is PFedRec's Linear(d, 1) without a bias), and drawing it N(0, 1) against
    N(0, 1) item rows would start every logit at a std of sqrt(d), deep in the flat part of the
    sigmoid. Under the ``mlp`` score the user vector is an input of the MLP beside the item
    row, and starts N(0, 1) like it (as ``nn.Embedding`` in GPFedRec's code).
    """
    return _draw_params(spec, names, n, lambda shape: here(torch.rand(shape, generator=gen, device="cpu")),
                        lambda shape: here(torch.randn(shape, generator=gen, device="cpu")))


def client_params(spec: Any, names: list[str], clients: np.ndarray,
                  key: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """`init_params` for ``clients`` from per-client keyed draws (`fedrec.rounds.draws`):
    client c gets the same values whichever clients are drawn with it (simulator, Flower node)."""
    out: dict[str, torch.Tensor] = {}
    for name in names:
        sub = (*key, zlib.crc32(name.encode()))

        def keyed(shape: tuple[int, ...], fn: Callable[..., np.ndarray], sub=sub) -> torch.Tensor:
            x = fn(sub, clients, math.prod(shape[1:]))
            return torch.as_tensor(np.asarray(x, np.float32)).reshape(shape)

        out.update(_draw_params(spec, [name], len(clients),
                                lambda shape, k=keyed: k(shape, draws.uniforms),
                                lambda shape, k=keyed: k(shape, draws.normals)))
    return out


def _draw_params(spec: Any, names: list[str], n: int,
                 uniform: Callable[[tuple[int, ...]], torch.Tensor],
                 normal: Callable[[tuple[int, ...]], torch.Tensor]) -> dict[str, torch.Tensor]:
    shapes = {**spec.user_shapes(), **spec.score_shapes()}
    out = {}
    for name in names:
        shape = (n, *shapes[name])
        bound = spec.scorer.init(spec, name)
        out[name] = normal(shape) if bound is None else (uniform(shape) * 2 - 1) * bound
    return out


def score(spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """Logits ``(C, B)`` of item rows ``v`` ``(C, B, item_width)`` under per-client params."""
    return spec.scorer.logits(spec, p, v)


def batch_loss(spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor,
               labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over the step's clients of each client's mean loss (``spec.loss``) over its own batch.

    ``v`` holds the batch's item vectors ``(n_active, B, width)``; parameters are sliced to the
    ``n_active`` clients still training (clients are ordered by batch count) unless they hold
    just those (autograd's leaves: no slice to differentiate through).
    """
    n = v.shape[0]
    return mean_loss(spec, score(spec, {k: t if t.shape[0] == n else t[:n] for k, t in p.items()}, v),
                     labels, mask)


def mean_loss(spec: Any, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over clients of each client's mean loss (``spec.loss``) over the real slots of its
    row of ``logits`` ``(C, B)``."""
    if spec.loss == "mse":
        per_slot = (logits - labels) ** 2 * mask
    else:
        per_slot = F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * mask
    # a client with no real slot (a padded one: `fedrec.rounds.step_graphs`) adds 0, not 0/0
    return (per_slot.sum(1) / mask.sum(1).clamp(min=1)).sum()


def linear_grads(spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor,
                 labels: torch.Tensor, mask: torch.Tensor, names: list[str], items: bool
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Closed-form gradients of `batch_loss` for score functions that have them (dot, linear).

    With logits x, d(mean BCE)/dx = (sigmoid(x) - y) / n_c on real slots (d(mean squared
    error)/dx = 2 (x - y) / n_c), so each gradient is one contraction (`ScoreFunction.grad`): no
    autograd graph, about half the memory traffic. The gradients are the ``n_active`` clients'
    (``(n_active, ...)``), as `FamilyState._autograd`'s; the loss is a 0-d tensor on the run's
    device (read once a chunk, not once a step: reading it waits for the device).
    """
    n = v.shape[0]
    scorer = spec.scorer
    pn = {k: t[:n] for k, t in p.items()}
    logits = scorer.logits(spec, pn, v)
    count = mask.sum(1, keepdim=True).clamp(min=1)  # a padded client's gradient: 0, not 0/0
    if spec.loss == "mse":
        err = logits - labels
        g = 2 * err * mask / count
        loss = (err**2 * mask / count).sum()
    else:
        g = (torch.sigmoid(logits) - labels) * mask / count
        loss = ((F.softplus(logits) - labels * logits) * mask / count).sum()
    grads = {name: scorer.grad(spec, name, pn, v, g) for name in names}  # (n_active, ...)
    if items:
        grads["items"] = scorer.item_grad(spec, pn, g)
    return loss, grads
