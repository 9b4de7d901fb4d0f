"""How the server applies a round's aggregate: the server optimisers of Reddi et al., "Adaptive
Federated Optimization" (ICLR 2021), Algorithm 2, as one part of every item-family member.

The clients' uploads are averaged into a mean model; a server optimiser turns the pseudo-
gradient d = mean - current into the server's step:

* ``avg`` (FedAvg): x <- x + lr d; at lr 1 (its default) the new state is the mean itself.
* ``avgm`` (FedAvgM, Hsu et al. 2019): m <- momentum m + d, x <- x + lr m.
* ``adam`` (FedAdam): m <- b1 m + (1 - b1) d, v <- b2 v + (1 - b2) d², x <- x + lr m / (√v + tau),
  v starting at tau² and no bias correction, as in the paper; each coordinate then moves by at
  most about lr a round, whatever the item rows' rate.
* ``yogi`` (FedYogi): Adam whose second moment moves additively, v <- v - (1 - b2) d² sign(v - d²),
  so it grows no faster and shrinks more slowly than Adam's.

A run names one with ``--server-opt NAME[:KEY=VALUE,...]`` (`ServerOpt.parse`, e.g.
``yogi:lr=0.05``) for any member of the item-embedding family and MetaMF (the spec takes it in
`fedrec.federated.family.spec.FamilySpec.configured`); ``fedavgm``, ``fedadam`` and ``fedyogi`` are
FedMF with theirs. Each keeps its buffers per server tensor, in the server's state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from fedrec.errors import FedrecError
from fedrec.federated.threats import RowStep
from fedrec.options import check, parse_named, typed

#: the server optimisers a run can name (`ServerOpt.name`)
SERVER_OPTIMIZERS = ("avg", "avgm", "adam", "yogi")
#: the server step size each takes when none is given: FedAvg's mean itself; Reddi et al.'s
#: and Hsu et al.'s effective step for the others (momentum 0.9: 0.1 / (1 - 0.9) = 1)
DEFAULT_LR = {"avg": 1.0, "avgm": 0.1, "adam": 0.1, "yogi": 0.1}


@dataclass(frozen=True)
class ServerOpt:
    """A server optimiser and its settings (`fedrec.federated.family.server_opt`)."""

    #: one of `SERVER_OPTIMIZERS`
    name: str = "avg"
    #: the server's step size on the pseudo-gradient (None: `DEFAULT_LR` of ``name``, which it
    #: then holds)
    lr: float | None = None
    #: avgm: the momentum of the pseudo-gradient's buffer
    momentum: float = 0.9
    #: adam, yogi: decay of the first moment
    beta1: float = 0.9
    #: adam, yogi: decay of the second moment
    beta2: float = 0.99
    #: adam, yogi: adaptivity constant (Adam's epsilon; the second moment starts at its square)
    tau: float = 1e-3

    def __post_init__(self) -> None:
        check((self.name not in SERVER_OPTIMIZERS,
               f"--server-opt must be one of {', '.join(SERVER_OPTIMIZERS)} (got {self.name!r})"),
              (self.lr is not None and not self.lr > 0, f"--server-opt {self.name}: lr must be > 0"),
              (not 0 <= self.momentum < 1, f"--server-opt {self.name}: momentum must be in [0, 1)"),
              (not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1),
               f"--server-opt {self.name}: beta1 and beta2 must be in [0, 1)"),
              (not self.tau > 0, f"--server-opt {self.name}: tau must be > 0"))
        if self.lr is None:  # so that two settings that step alike are equal
            object.__setattr__(self, "lr", DEFAULT_LR[self.name])

    @staticmethod
    def parse(text: str) -> ServerOpt:
        """``NAME`` or ``NAME:KEY=VALUE,...`` (e.g. ``adam:lr=0.05,tau=0.01``); one
        `FedrecError` line for a bad name, key or value."""
        name, values = parse_named(text, "--server-opt")
        if "name" in values:
            raise FedrecError(f"--server-opt {text!r}: the optimiser is named before the colon")
        settings = {f.name for f in dataclasses.fields(ServerOpt)} - {"name"}
        return ServerOpt(name, **typed(ServerOpt, values, f"--server-opt {name}", only=settings))

    def text(self) -> str:
        """The ``--server-opt`` string that parses back to this (its settings that differ from
        the defaults only)."""
        changed = [f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self)
                   if f.name != "name" and getattr(self, f.name) not in (None, f.default)
                   and not (f.name == "lr" and self.lr == DEFAULT_LR[self.name])]
        return self.name + (":" + ",".join(changed) if changed else "")

    def make(self) -> ServerOptimizer:
        """A fresh optimiser (no buffers) with these settings."""
        lr = DEFAULT_LR[self.name] if self.lr is None else self.lr
        if self.name == "avgm":
            return Momentum(lr, self.momentum)
        if self.name in ("adam", "yogi"):
            return (Yogi if self.name == "yogi" else Adam)(lr, self.beta1, self.beta2, self.tau)
        return ServerOptimizer(lr)


class ServerOptimizer:
    """FedAvg: the server takes the mean of the accepted clients' models (at ``server_lr`` 1;
    otherwise it steps that far along the pseudo-gradient)."""

    def __init__(self, server_lr: float = 1.0) -> None:
        self.server_lr = server_lr

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The new value of server tensor ``name`` given its ``current`` value and the round's
        ``mean`` of the clients' values."""
        return mean if self.server_lr == 1.0 else current + self.server_lr * (mean - current)

    def row_step(self, name: str) -> RowStep | None:
        """How this server's next step moves rows of server tensor ``name``, as UNION judges a
        client (`fedrec.federated.threats.RowStep`): None for FedAvg and FedAvgM, which UNION
        judges at the client's share of a plain average (`fedrec.security.robust.share`), not at
        their own step (FedAvg at a ``server_lr`` other than 1 moves by ``server_lr`` x that
        share, FedAvgM every row by its momentum buffer as well)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        """Restore the optimiser's buffers (none for FedAvg)."""


class Momentum(ServerOptimizer):
    """Server SGD with momentum on the pseudo-gradient, one buffer per server tensor."""

    def __init__(self, server_lr: float, momentum: float) -> None:
        self.server_lr, self.momentum = server_lr, momentum
        self.buffers: dict[str, torch.Tensor] = {}

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        step = mean - current
        m = self.buffers.get(name)
        m = step if m is None else m.mul_(self.momentum).add_(step)
        self.buffers[name] = m
        return current + self.server_lr * m

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.buffers}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.buffers = {k: v.clone() for k, v in blob["buffers"].items()}


class Adam(ServerOptimizer):
    """Server Adam on the pseudo-gradient, moments per server tensor."""

    def __init__(self, server_lr: float, beta1: float, beta2: float, tau: float) -> None:
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def second_moment(self, v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Adam's: v <- b2 v + (1 - b2) d², in place."""
        return v.mul_(self.beta2).addcmul_(d, d, value=1 - self.beta2)

    def update(self, name: str, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        d = mean - current
        # Algorithm 2 starts v at tau^2 or more, so the first step is bounded by server_lr
        m, v = self.moments.get(name, (torch.zeros_like(d), torch.full_like(d, self.tau**2)))
        m = m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
        v = self.second_moment(v, d)
        self.moments[name] = (m, v)
        return current + self.server_lr * m / (v.sqrt() + self.tau)

    def row_step(self, name: str) -> RowStep:
        """The next step on rows of ``name`` with one client's change as the round's
        pseudo-gradient (the official UNION's form of its Adam server's step): every row moves
        by its moments, a client's rows by its change as well. Reads the moments, changes none."""
        def step(rows: torch.Tensor, at: torch.Tensor, change: torch.Tensor | None) -> torch.Tensor:
            d = torch.zeros_like(rows) if change is None else change
            if name in self.moments:
                m, v = (x[at.to(x.device)].to(rows) for x in self.moments[name])
            else:
                m, v = torch.zeros_like(d), torch.full_like(d, self.tau**2)
            m = m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
            v = self.second_moment(v, d)
            return rows + self.server_lr * m / (v.sqrt() + self.tau)

        return step

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.moments = {k: (m.clone(), v.clone()) for k, (m, v) in blob["moments"].items()}


class Yogi(Adam):
    """FedYogi: Adam whose second moment moves by (1 - b2) d² towards d², never past it."""

    def second_moment(self, v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        d2 = d * d
        return v.sub_((1 - self.beta2) * d2 * torch.sign(v - d2))
