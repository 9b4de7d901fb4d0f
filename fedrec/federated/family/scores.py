"""Score functions of the item-embedding family as small classes, found by name.

A score function says which per-user parameters it needs (``user_shapes``: always private),
which weights of its own (``score_shapes``: private or averaged, as the spec says), how each
starts (`init`), how it turns item rows into logits (`logits`), and, when it can, its
gradients in closed form (`closed_form`, `grad`, `item_grad`), which the engine then uses
instead of autograd. Adding one is a class and `register_score` (see
`fedrec.algorithms.fedmf_bias`): nothing in the engine switches on its name.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

SCORES: dict[str, ScoreFunction] = {}


def register_score(score: ScoreFunction) -> ScoreFunction:
    if score.name in SCORES:
        raise ValueError(f"score function '{score.name}' registered twice")
    SCORES[score.name] = score
    return score


def get_score(name: str) -> ScoreFunction:
    if name not in SCORES:
        raise ValueError(f"unknown score function '{name}'; known: {', '.join(SCORES)}")
    return SCORES[name]


class ScoreFunction:
    """Logits ``(C, B)`` of item rows ``(C, B, width)`` under per-client parameters ``(C, ...)``."""

    name = ""
    #: closed-form gradients (`grad`, `item_grad`) instead of autograd
    closed_form = False
    #: working-set multiplier per sample and item column (sizes cohort chunks)
    cost = 6

    def item_width(self, spec: Any) -> int:
        return int(spec.dim)

    def user_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {}

    def score_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {}

    def init(self, spec: Any, name: str) -> float | None:
        """The bound b of a U(-b, b) start (as ``nn.Linear``: 1/sqrt(fan-in)); None = N(0, 1)."""
        return 1.0 / math.sqrt(spec.dim)

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def grad(self, spec: Any, name: str, p: dict[str, torch.Tensor], v: torch.Tensor,
             g: torch.Tensor) -> torch.Tensor:
        """d loss / d ``name`` given g = d loss / d logits ``(C, B)`` (closed-form scores)."""
        raise ValueError(f"no closed-form gradient for '{name}' under score '{self.name}'")

    def item_grad(self, spec: Any, p: dict[str, torch.Tensor], g: torch.Tensor) -> torch.Tensor:
        """d loss / d item rows ``(C, B, width)`` given g (closed-form scores)."""
        raise NotImplementedError


class ItemBias(ScoreFunction):
    """``inner``'s score plus a learned bias per item, held as the item row's last column and
    aggregated like the rest of the row: the item half of a rating baseline
    (`fedrec.federated.family.spec.FamilySpec.baseline`)."""

    def __init__(self, inner: ScoreFunction) -> None:
        self.inner = inner
        self.name = f"{inner.name}+item-bias"
        self.closed_form, self.cost = inner.closed_form, inner.cost

    def item_width(self, spec: Any) -> int:
        return self.inner.item_width(spec) + 1

    def user_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return self.inner.user_shapes(spec)

    def score_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return self.inner.score_shapes(spec)

    def init(self, spec: Any, name: str) -> float | None:
        return self.inner.init(spec, name)

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return self.inner.logits(spec, p, v[..., :-1]) + v[..., -1]

    def grad(self, spec: Any, name: str, p: dict[str, torch.Tensor], v: torch.Tensor,
             g: torch.Tensor) -> torch.Tensor:
        return self.inner.grad(spec, name, p, v[..., :-1], g)

    def item_grad(self, spec: Any, p: dict[str, torch.Tensor], g: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.inner.item_grad(spec, p, g), g[..., None]], -1)


class Dot(ScoreFunction):
    """FedMF, FedRecon: <u, q> with a private user vector."""

    name, closed_form = "dot", True

    def user_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {"user": (self.item_width(spec),)}

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return torch.einsum("cd,cbd->cb", p["user"], v)

    def grad(self, spec: Any, name: str, p: dict[str, torch.Tensor], v: torch.Tensor,
             g: torch.Tensor) -> torch.Tensor:
        if name == "user":
            return torch.einsum("cb,cbd->cd", g, v)
        return super().grad(spec, name, p, v, g)

    def item_grad(self, spec: Any, p: dict[str, torch.Tensor], g: torch.Tensor) -> torch.Tensor:
        return g[..., None] * p["user"][:, None, :]


class Linear(ScoreFunction):
    """PFedRec: a Linear(d, 1) score function."""

    name, closed_form = "linear", True

    def score_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {"w": (spec.dim,), "b": ()}

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return torch.einsum("cd,cbd->cb", p["w"], v) + p["b"][:, None]

    def grad(self, spec: Any, name: str, p: dict[str, torch.Tensor], v: torch.Tensor,
             g: torch.Tensor) -> torch.Tensor:
        if name == "w":
            return torch.einsum("cb,cbd->cd", g, v)
        if name == "b":
            return g.sum(1)
        return super().grad(spec, name, p, v, g)

    def item_grad(self, spec: Any, p: dict[str, torch.Tensor], g: torch.Tensor) -> torch.Tensor:
        return g[..., None] * p["w"][:, None, :]


class Tower(ScoreFunction):
    """An MLP tower (``spec.layers``) and a head: NCF's (beside GMF) and GPFedRec's ``mlp``."""

    cost = 12

    def user_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        return {"user": (self.item_width(spec),)}

    def head_width(self, spec: Any, width: int) -> int:
        return width

    def score_shapes(self, spec: Any) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        width = 2 * spec.dim
        for n, out in enumerate(spec.layers):
            shapes[f"W{n}"] = (width, out)
            shapes[f"b{n}"] = (out,)
            width = out
        shapes["head_w"] = (self.head_width(spec, width),)
        shapes["head_b"] = ()
        return shapes

    def init(self, spec: Any, name: str) -> float | None:
        shapes = self.score_shapes(spec)
        if name == "user":
            return 1.0 / math.sqrt(spec.dim)
        if name.startswith("W"):
            fan_in = shapes[name][0]
        elif name.startswith("b"):
            fan_in = shapes["W" + name[1:]][0]
        else:
            fan_in = shapes["head_w"][0]
        return 1.0 / math.sqrt(fan_in)

    def tower(self, spec: Any, p: dict[str, torch.Tensor], u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The tower over [u, v] for each item row of ``v`` ``(C, B, w)`` and user ``u`` ``(C, w)``.

        The first layer takes the two halves apart, u W_u + v W_v = [u, v] W, so the
        ``(C, B, 2w)`` input is never formed: half that layer's products, no copy, and the
        user's half once per client rather than per row (`benchmarks/tower_speed.py`: the
        same output to 3.5e-7 relative, and faster; figures in docs/scale.md).
        """
        x = F.relu(self.first_layer(p, u, v))
        for n in range(1, len(spec.layers)):
            x = F.relu(torch.baddbmm(p[f"b{n}"][:, None, :], x, p[f"W{n}"]))
        return x

    @staticmethod
    def first_layer(p: dict[str, torch.Tensor], u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The first layer's pre-activations ``(C, B, out)``, u W_u + v W_v + b (`tower`; its own
        method so that a diagnosis can read them: `benchmarks/gpu_device_diff.py`)."""
        w0, width = p["W0"], u.shape[-1]
        user_part = torch.baddbmm(p["b0"][:, None, :], u[:, None, :], w0[:, :width])  # (C, 1, out)
        return torch.baddbmm(user_part, v, w0[:, width:])


class NCF(Tower):
    """FedNCF: NeuMF, GMF and MLP halves side by side in each item row and user vector."""

    name = "ncf"

    def item_width(self, spec: Any) -> int:
        return 2 * spec.dim

    def head_width(self, spec: Any, width: int) -> int:
        return spec.dim + width

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        d, u = spec.dim, p["user"]
        x = self.tower(spec, p, u[:, d:], v[..., d:])
        gmf = u[:, None, :d] * v[..., :d]
        head = p["head_w"]  # over [gmf, x], taken in its two parts (no concatenated copy)
        return (torch.einsum("cd,cbd->cb", head[:, :d], gmf) + torch.einsum("cd,cbd->cb", head[:, d:], x)
                + p["head_b"][:, None])


class MLP(Tower):
    """GPFedRec, GFed-PP: the user vector beside the item row through the tower (no GMF)."""

    name = "mlp"

    def init(self, spec: Any, name: str) -> float | None:
        # an MLP input like the item rows: N(0, 1), as nn.Embedding in GPFedRec's code
        return None if name == "user" else super().init(spec, name)

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        x = self.tower(spec, p, p["user"], v)
        return torch.einsum("cd,cbd->cb", p["head_w"], x) + p["head_b"][:, None]


class Generated(ScoreFunction):
    """MetaMF: a score function generated from the user vector (`MetaMFSpec.logits`); the spec
    declares its own shapes."""

    name = "metamf"

    def logits(self, spec: Any, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return spec.logits(p, v)


for _score in (Dot(), Linear(), NCF(), MLP(), Generated()):
    register_score(_score)
