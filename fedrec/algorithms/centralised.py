"""Centralised baselines: all training data on one server (the papers' "Rec" rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.models.mf import MF
from fedrec.models.ncf import NCF
from fedrec.protocols.protocol import Split


def _build_mf(split: Split, opts: dict[str, Any]) -> nn.Module:
    rating = split.protocol.ranking == "rating"
    offset = float(np.mean(split.train.data)) if rating and split.train.nnz else 0.0
    return MF(split.n_users, split.n_items, dim=opts["dim"], biased=rating, offset=offset)


def _build_ncf(split: Split, opts: dict[str, Any]) -> nn.Module:
    return NCF(split.n_users, split.n_items, dim=opts["dim"], layers=tuple(opts["layers"]))


register(AlgorithmSpec(
    "mf", "centralised",
    "matrix factorisation, BCE with sampled negatives (biased MSE under ratio-rating)",
    _build_mf, {"dim": 32, "lr": 1e-3},
))
register(AlgorithmSpec(
    "ncf", "centralised",
    "NeuMF: GMF + 3-layer MLP tower (64-32-16-8), BCE with sampled negatives",
    _build_ncf, {"dim": 32, "layers": [32, 16, 8], "lr": 1e-3},
))
