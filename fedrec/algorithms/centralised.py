"""Centralised baselines: all training data on one server (the papers' "Rec" rows)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.models.mf import MF
from fedrec.models.ncf import NCF
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class MFOptions(Options):
    #: embedding size of users and items
    dim: int = 32

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))


@dataclass(frozen=True)
class NCFOptions(MFOptions):
    """``layers``: the MLP tower's widths after its 2 x dim input (32/16/8)."""

    #: widths of the MLP tower's layers after its 2 x dim input
    layers: tuple[int, ...] = (32, 16, 8)


def _build_mf(split: Split, o: MFOptions) -> nn.Module:
    rating = split.protocol.ranking == "rating"
    offset = float(np.mean(split.train.data)) if rating and split.train.nnz else 0.0
    return MF(split.n_users, split.n_items, dim=o.dim, biased=rating, offset=offset)


def _build_ncf(split: Split, o: NCFOptions) -> nn.Module:
    return NCF(split.n_users, split.n_items, dim=o.dim, layers=o.layers)


register(AlgorithmSpec(
    "mf", "centralised",
    "matrix factorisation, BCE with sampled negatives (biased MSE under ratio-rating)",
    _build_mf, MFOptions, {"lr": 1e-3}, rankings=("sampled", "full", "rating"),
))
register(AlgorithmSpec(
    "ncf", "centralised",
    "NeuMF: GMF + 3-layer MLP tower (64-32-16-8), BCE with sampled negatives (MSE under ratio-rating)",
    _build_ncf, NCFOptions, {"lr": 1e-3}, rankings=("sampled", "full", "rating"),
))
