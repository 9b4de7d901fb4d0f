"""FedRAP, its ablations and CentRAP (Li, Long and Zhou, ICLR 2024); see `fedrec.federated.rap`.

Every variant takes the model options of `RAPSpec` (``--set lam=0.1 --set curriculum=sin``).
Engine defaults follow the paper in 10 local epochs, batch 2048, 4 negatives, plain SGD, and C
travels in the sparse encoding; fedrec's item-row rule and rates carry over to data no one tuned
on, the papers' rule stays as ``--paper``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.rap import RAPSpec
from fedrec.options import Options, check


@dataclass(frozen=True)
class RAPOptions(RAPSpec, Options):
    """`RAPSpec`'s fields (checked by its own validation); ``lam`` and ``mu`` are the paper's
    v1 and v2; ``use_c``, ``use_d``, ``centralised`` are set by the ablations and CentRAP.

    ``mu`` 1e-3 rather than the paper's 0.1: at these learning rates 0.1 soft-thresholds a row
    by about lr_item x mu / k / n_slots = 0.1 per step for a 100-slot client, which wipes C out.
    """

    #: weight (v2) of the sparsity term on the global table C
    mu: float = 1e-3

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))


# fedrec's defaults: the family's item-row rule (`fedrec.algorithms.federated.samples`: C's rows
# averaged over the clients that sent them, rows stepped on the batch's summed loss), the head at
# 1.0 on the batch mean, item rows at 10 (lr x item_lr_scale), chosen on validation NDCG@10 of
# ML-100K, Lastfm-2K and synthetic 2,000 x 8,000 among heads 0.3 / 1 / 3 and rows 10 / 30 / 100
# (docs/fedrap.md): no back-off on any of them, where rows at 30 or more overshoot Lastfm-2K.
ENGINE: dict[str, object] = {"lr": 1.0, "local_epochs": 10, "batch_size": 2048, "encoding": "sparse",
                             "aggregation": "samples", "item_lr_scale": 10.0}
# The papers' setting (`--paper`, `fedrec reproduce`): FedAvg over the round's clients, with the
# rates chosen for it on validation HR@10 of ML-100K: the head at 3.0, item rows at 3,000. The
# official rates (head 1e-4, rows 1e3) leave the head at its random initialisation.
PAPER: dict[str, object] = {"lr": 3.0, "aggregation": "clients", "item_lr_scale": 1000.0}

# `fedrec tune` also searches the regularisers' weights (v1 = lam, v2 = mu), D_i's rate apart
# from C's (`d_rate`), and declares its rates' range: a decade around the defaults' head and
# rows; mu stops at 1e-2, above which the L1 step wipes C out (RAPOptions)
_SEARCH = {"lr": (0.1, 10.0), "item_lr_scale": (1.0, 100.0), "d_rate": (1e-2, 1.0),
           "lam": (1e-3, 1.0), "mu": (1e-5, 1e-2)}

VARIANTS = {
    "fedrap": ("FedRAP: private head and D_i, global sparse C (L1 prox), tanh curriculum", {}),
    "fedrap-c": ("FedRAP-C ablation: the global C alone (no D_i)", {"use_d": False}),
    "fedrap-d": ("FedRAP-D ablation: the private D_i alone (no C, nothing shared)", {"use_c": False}),
    "fedrap-no": ("FedRAP-No ablation: no sparsity term on C", {"reg": "none"}),
    "fedrap-l2": ("FedRAP-L2 ablation: mu ||C||^2 instead of the L1 term", {"reg": "l2"}),
}


def _search(fixed: dict[str, object]) -> dict[str, tuple[float, float]]:
    """The searched options a variant reads: no mu without a term on C (or without C), no
    lam (the D-C term) without both views, no d_rate without D_i."""
    unread: set[str] = set()
    if fixed.get("reg") == "none" or fixed.get("use_c") is False:
        unread |= {"mu", "lam"}
    if fixed.get("use_d") is False:
        unread |= {"lam", "d_rate"}
    return {k: v for k, v in _SEARCH.items() if k not in unread}


# measured at the defaults on five data sets (docs/defaults.md, transfer table): no back-off
MEASURED = ("fedrap", "fedrap-c")

#: what shapes an upload: read by no run that uploads nothing (FedRAP-D shares nothing, CentRAP
#: trains on the server), where noise would be reported as a privacy it does not give
UPLOADS = ("ldp", "clip", "dp_clip", "dp_noise", "dp_delta", "encoding", "pad_items")

for name, (text, fixed) in VARIANTS.items():
    register(AlgorithmSpec(name, "federated", text, None, RAPOptions, dict(ENGINE), fixed, flower=True,
                           search=_search(fixed), paper=dict(PAPER), transfers=name in MEASURED,
                           ignores=UPLOADS if not fixed.get("use_c", True) else ()))
register(AlgorithmSpec(
    "centrap", "federated",
    "CentRAP: FedRAP's model and objective trained on one server (C updated every step)",
    None, RAPOptions, {**ENGINE, "encoding": "rows"}, {"centralised": True}, paper=dict(PAPER), ignores=UPLOADS,
))
