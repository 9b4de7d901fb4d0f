"""FedDAE (gated dual-encoder VAE) and its one-encoder ablations; see `fedrec.federated.dae.state`.

Model options (``--set KEY=VALUE``): ``encoders`` (dual; global; local), ``latent`` (256),
``hidden`` (768/512), ``gate_hidden`` (256), ``dropout`` (0.5), ``beta`` (1.0, times
tanh(round / 10); 0: the official code's effective weight), ``weight_decay`` (1e-5).

Engine defaults (the official code's): Adam 1e-3 on the clients and the server, 5 local steps
(a client's bag is one batch), every client every round, 100 rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.dae.spec import DAESpec
from fedrec.options import Options


@dataclass(frozen=True)
class DAEOptions(DAESpec, Options):
    """`DAESpec`'s fields, typed and checked by its own validation: the options are the spec."""


ENGINE: dict[str, Any] = {"lr": 1e-3, "rounds": 100, "local_epochs": 5, "clients_per_round": 1.0}
#: engine options of the item family that a bag-of-items VAE does not read
IGNORES = ("negatives", "batch_size", "lr_item", "item_lr_scale", "item_std", "encoding",
           "memory_budget_mb", "dp_clip", "pad_items", "aggregation")


def _register(name: str, text: str, fixed: dict[str, Any]) -> None:
    register(AlgorithmSpec(name, "federated", text, None, DAEOptions, ENGINE, fixed, ignores=IGNORES,
                           reads=("attacker_norm",), flower=True))


_register("feddae", "FedDAE: a multinomial VAE per client with a global and a private encoder mixed "
          "by a private gate, and a shared decoder; clients send accumulated gradients",
          {"encoders": "dual"})
_register("fedvae", "FedDAE's ablation with the global encoder alone: a federated multinomial VAE",
          {"encoders": "global"})
