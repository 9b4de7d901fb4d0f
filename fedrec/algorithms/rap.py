"""FedRAP, its ablations and CentRAP (Li, Long and Zhou, ICLR 2024); see `fedrec.federated.rap`.

Every variant takes the model options of `RAPSpec` (``--set lam=0.1 --set curriculum=sin``).
Engine defaults follow the paper: 10 local epochs, batch 2048, 4 negatives, plain SGD, and C
travels in the sparse encoding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.rap import RAPSpec
from fedrec.options import Options, check
from fedrec.protocols.protocol import Split


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


def _build(split: Split, o: RAPOptions) -> RAPSpec:
    return RAPSpec(**asdict(o))


# Learning rates chosen on validation HR@10 of ML-100K (docs/fedrap.md): the head at 3.0, item
# rows at 3,000 (lr x item_lr_scale). The official rates (head 1e-4, rows 1e3) leave the head
# at its random initialisation.
ENGINE: dict[str, object] = {"lr": 3.0, "local_epochs": 10, "batch_size": 2048,
                             "encoding": "sparse", "item_lr_scale": 1000.0}

# `fedrec tune` also searches the regularisers' weights (v1 = lam, v2 = mu), and declares its
# rates' range. A decade around the ML-100K rates (head 0.3-30, rows scale 100-10,000) misses
# Lastfm-2K both ways: every trial with a head rate above 1 diverged, and the one below it had
# rows at 49, where the server's mean over clients leaves C (all an unseen item is scored by)
# untrained (docs/leaderboard.md; FedMF's tuned rows rate there is 43,000). So the head runs two
# decades below its default, the rows' scale up to 1e6, as the engine's item-rate rule reaches on
# large catalogues, and D_i's rate may fall three decades below C's (`d_rate`: C's step is
# divided by the round's clients, D_i's is not; see fedrec.federated.rap); mu stops at 1e-2,
# above which the L1 step wipes C out (RAPOptions)
_SEARCH = {"lr": (0.03, 3.0), "item_lr_scale": (100.0, 1e6), "d_rate": (1e-3, 1.0),
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


for name, (text, fixed) in VARIANTS.items():
    register(AlgorithmSpec(name, "federated", text, _build, RAPOptions, dict(ENGINE), fixed, flower=True,
                           search=_search(fixed)))
register(AlgorithmSpec(
    "centrap", "federated",
    "CentRAP: FedRAP's model and objective trained on one server (C updated every step)",
    _build, RAPOptions, {**ENGINE, "encoding": "rows"}, {"centralised": True},
))
