"""PersonalFR and its baselines on the rating autoencoder; see `fedrec.federated.autoencoder`.

Model options (``--set KEY=VALUE``): ``clients`` (100; 0 = one user per client), ``grouping``
(random, as the paper; or contiguous), ``hidden`` (``256/128``: encoder [n, 256, 128], decoder
[128, 256, n]), ``dropout`` (0.5), ``norm`` (GroupNorm + tanh, true), ``compression`` (send only
the rows of a client's items), ``optimizer`` (adam, sgd), ``momentum`` (0.9), ``nesterov``,
``weight_decay`` (default 5e-4 with SGD, 0 with Adam), ``clip`` (per-client gradient norm, 0).

Engine defaults (Table II and the official code): 800 rounds, a tenth of the clients a round,
5 local epochs, batches of 10 users, Adam 1e-3, no early stopping (the best validation round is
kept). The Joint model: one client, every user, batches of 500, one epoch a round. For one user
per client the paper uses SGD 0.1 with momentum 0.9 and weight decay 5e-4: ``--set
optimizer=sgd --lr 0.1`` (what `fedrec reproduce personalfr` runs).
"""

from __future__ import annotations

from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.errors import FedrecError
from fedrec.federated.autoencoder import AESpec
from fedrec.protocols.protocol import Split

ENGINE: dict[str, Any] = {"lr": 1e-3, "rounds": 800, "clients_per_round": 0.1, "local_epochs": 5,
                          "batch_size": 10, "patience": 0}
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() not in _BOOL:
        raise FedrecError(f"expected true or false, got {value!r}")
    return _BOOL[str(value).lower()]


def _build(fixed: dict[str, Any]):  # type: ignore[no-untyped-def]
    def build(split: Split, opts: dict[str, Any]) -> AESpec:
        if opts.get("dual"):
            raise FedrecError("the autoencoders have no --dual variant")
        clash = sorted(k for k in fixed if k in opts and str(opts[k]) != str(fixed[k]))
        if clash:
            raise FedrecError(f"this algorithm fixes {', '.join(f'{k}={fixed[k]}' for k in clash)}")
        o = {**opts, **fixed}
        kwargs: dict[str, Any] = {}
        for k in ("share", "grouping", "optimizer"):
            if k in o:
                kwargs[k] = str(o[k])
        for k in ("clients",):
            if k in o:
                kwargs[k] = int(o[k])
        for k in ("dropout", "momentum", "clip"):
            if k in o:
                kwargs[k] = float(o[k])
        for k in ("norm", "compression", "nesterov"):
            if k in o:
                kwargs[k] = _flag(o[k])
        if o.get("weight_decay") not in (None, ""):
            kwargs["weight_decay"] = float(o["weight_decay"])
        if "hidden" in o:
            kwargs["hidden"] = tuple(int(x) for x in str(o["hidden"]).replace(",", "/").split("/"))
        return AESpec(**kwargs)

    return build


def _register(name: str, text: str, fixed: dict[str, Any], engine: dict[str, Any] | None = None) -> None:
    register(AlgorithmSpec(name, "federated", text, _build(fixed), {"clients": 100, **fixed},
                           {**ENGINE, **(engine or {})}, rankings=("rating", "rated"),
                           flower=fixed.get("clients") != 1))


_register("personalfr", "PersonalFR: rating autoencoder, private encoder per client, decoder "
          "averaged; only the rows of a client's items travel (partial compression)",
          {"share": "decoder"})
_register("fedavg-ae", "FedAvg of the whole rating autoencoder (PersonalFR's baseline; the whole "
          "model travels)", {"share": "all", "compression": False})
_register("ae", "the rating autoencoder trained on all users at once (PersonalFR's 'Joint')",
          {"share": "all", "clients": 1},
          engine={"clients_per_round": 1.0, "local_epochs": 1, "batch_size": 500})
