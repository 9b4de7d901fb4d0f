"""Client objectives: a term added to every client's local loss beside its data term, the
public client hook of the item-embedding family and MetaMF (``--client-objective``).

A term sees what a client downloaded from the server (its item rows and the shared weights) at
each local step, as they are now and as the round sent them, and returns its gradient; the
client steps by it at the tensor's own rate after the data term's step (its item rows at the
item rate, on the rows of the clients still training that step), or by the term's own `step`. FedProx's proximal term
(`Proximal`; the method ``fedprox``, `fedrec.algorithms.fedprox`) is one: (mu / 2) ||w - w_round||²,
gradient mu (w - w_round). A term is a frozen dataclass whose fields are its settings;
registering it by name (`register_objective`, in a module imported before a run names it, as
an algorithm's module is) makes it ``--client-objective NAME[:KEY=VALUE,...]`` for every
member, and a method that is defined by one takes it in its spec
(`fedrec.federated.family.spec.FamilySpec.objective`).
The gradient is not clipped by ``--set clip=``, which bounds the data term's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedrec.errors import FedrecError, UnknownNameError
from fedrec.options import parse_named, typed

#: the registered terms, by name (`register_objective`)
OBJECTIVES: dict[str, type[ClientObjective]] = {}


@dataclass(frozen=True)
class ClientObjective:
    """A term of each client's local objective (see the module docstring)."""

    #: its ``--client-objective`` name
    name: ClassVar[str] = ""

    def gradient(self, tensor: str, current: torch.Tensor, sent: torch.Tensor) -> torch.Tensor | None:
        """The term's gradient w.r.t. downloaded ``tensor`` (``items`` for the item rows, else a
        shared weight's name), given its ``current`` value and the value the round ``sent``
        (broadcastable to ``current``); None: the term does not involve it."""
        return None

    def step(self, tensor: str, current: torch.Tensor, sent: torch.Tensor, lr: float) -> torch.Tensor | None:
        """What a client subtracts from ``current`` for this term at rate ``lr``: ``lr`` times
        its `gradient` (a term may take its exact proximal step instead)."""
        g = self.gradient(tensor, current, sent)
        return None if g is None else g.mul_(lr)

    def check(self) -> None:
        """Reject impossible settings with one `FedrecError` (override)."""

    def text(self) -> str:
        """The ``--client-objective`` string that parses back to this term."""
        settings = ",".join(f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self))
        return self.name + (":" + settings if settings else "")


def register_objective(cls: type[ClientObjective]) -> type[ClientObjective]:
    """Make ``cls`` a ``--client-objective`` (a class decorator)."""
    if not cls.name or cls.name in OBJECTIVES:
        raise ValueError(f"client objective {cls.__name__} needs a name of its own (got {cls.name!r})")
    OBJECTIVES[cls.name] = cls
    return cls


def parse_objective(text: str) -> ClientObjective:
    """``NAME`` or ``NAME:KEY=VALUE,...`` (e.g. ``prox:mu=0.01``) as a term; one `FedrecError`
    line for a bad name, key or value."""
    name, values = parse_named(text, "--client-objective")
    if name not in OBJECTIVES:
        raise UnknownNameError("client objective", name, list(OBJECTIVES))
    settings = {f.name for f in dataclasses.fields(OBJECTIVES[name])}
    term = OBJECTIVES[name](**typed(OBJECTIVES[name], values, f"--client-objective {name}", only=settings))
    term.check()
    return term


@register_objective
@dataclass(frozen=True)
class Proximal(ClientObjective):
    """FedProx's proximal term (Li et al., MLSys 2020): (mu / 2) ||w - w_round||² over what the
    client downloaded, which holds its local steps near the round's model."""

    name: ClassVar[str] = "prox"
    #: the term's weight (0: FedAvg)
    mu: float = 0.01

    def check(self) -> None:
        if not self.mu >= 0:
            raise FedrecError(f"--client-objective prox: mu must be >= 0 (got {self.mu})")

    def gradient(self, tensor: str, current: torch.Tensor, sent: torch.Tensor) -> torch.Tensor | None:
        return (current - sent).mul_(self.mu)

    def step(self, tensor: str, current: torch.Tensor, sent: torch.Tensor, lr: float) -> torch.Tensor | None:
        """The term's exact proximal step, w <- (w + lr mu w_round) / (1 + lr mu): it moves w
        towards the round's value by lr mu / (1 + lr mu) of the gap, never past it, where a
        gradient step (lr mu of the gap) overshoots once lr mu > 1; and item rates here run to
        30 and more (fedrec's rule) or thousands (the papers')."""
        shrink = lr * self.mu / (1.0 + lr * self.mu)
        return (current - sent).mul_(shrink)
