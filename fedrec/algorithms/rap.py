"""FedRAP, its ablations and CentRAP (Li, Long and Zhou, ICLR 2024); see `fedrec.federated.rap`.

Every variant takes the model options of `RAPSpec` (``--set lam=0.1 --set curriculum=sin``).
Engine defaults follow the paper: 10 local epochs, batch 2048, 4 negatives, plain SGD, and C
travels in the sparse encoding.
"""

from __future__ import annotations

from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.errors import FedrecError
from fedrec.federated.rap import RAPSpec
from fedrec.protocols.protocol import Split

OPTIONS = ("score", "lam", "mu", "curriculum", "dc_sign", "push_cap", "reg")
# Learning rates chosen on validation HR@10 of ML-100K (docs/fedrap.md): the head at 3.0, item
# rows at 3,000 (lr x item_lr_scale). The official rates (head 1e-4, rows 1e3) leave the head
# at its random initialisation. mu 1e-3: at these rates the paper's 0.1 soft-thresholds a row by
# about lr_item x mu / k / n_slots = 0.1 per step for a 100-slot client, which wipes C out.
DEFAULTS: dict[str, Any] = {
    "dim": 32, "lr": 3.0, "score": "linear", "lam": 0.1, "mu": 1e-3, "curriculum": "tanh",
    "dc_sign": "pull", "push_cap": 1.0, "reg": "l1",
}
ENGINE: dict[str, Any] = {"local_epochs": 10, "batch_size": 2048, "encoding": "sparse",
                          "item_lr_scale": 1000.0}


def _rap(**fixed: Any):  # type: ignore[no-untyped-def]
    def build(split: Split, opts: dict[str, Any]) -> RAPSpec:
        clash = sorted(k for k in fixed if k in opts and opts[k] != fixed[k])
        if clash:  # e.g. --set reg=l1 on fedrap-no: that would be another variant
            raise FedrecError(f"this variant fixes {', '.join(f'{k}={fixed[k]}' for k in clash)}")
        chosen = {k: opts[k] for k in OPTIONS if k in opts}
        chosen.update(fixed)
        return RAPSpec(dim=int(opts["dim"]), **chosen)

    return build


VARIANTS = {
    "fedrap": ("FedRAP: private head and D_i, global sparse C (L1 prox), tanh curriculum", {}),
    "fedrap-c": ("FedRAP-C ablation: the global C alone (no D_i)", {"use_d": False}),
    "fedrap-d": ("FedRAP-D ablation: the private D_i alone (no C, nothing shared)", {"use_c": False}),
    "fedrap-no": ("FedRAP-No ablation: no sparsity term on C", {"reg": "none"}),
    "fedrap-l2": ("FedRAP-L2 ablation: mu ||C||^2 instead of the L1 term", {"reg": "l2"}),
}
for name, (text, fixed) in VARIANTS.items():
    defaults = {**DEFAULTS, **{k: v for k, v in fixed.items() if k in OPTIONS}}
    register(AlgorithmSpec(name, "federated", text, _rap(**fixed), defaults, dict(ENGINE), flower=True))
register(AlgorithmSpec(
    "centrap", "federated",
    "CentRAP: FedRAP's model and objective trained on one server (C updated every step)",
    _rap(centralised=True), dict(DEFAULTS), {**ENGINE, "encoding": "rows"},
))
