"""Where a CUDA run leaves the CPU's: the users whose scores differ, and for them each private
parameter, their starting table and their post-tuned rows (for a device test that fails).

    python benchmarks/gpu_device_diff.py gfedpp-no-ugc --rounds 1 2

Trains the small run of `tests/test_device.py::test_cuda_ends_with_the_cpu_figures` (the
contract tests' config) on the CPU and on CUDA and prints, per round count, the largest score
difference, the users over ``--tol`` of the scores' scale, and for each such user the largest
difference of each thing the engine keeps for it (what exists for the algorithm's state).
For an MLP tower (FedNCF, GPFedRec, GFed-PP) it also prints, from a third, instrumented CPU
run, how close each of those users' first-layer pre-activations came to ReLU's kink in each
round (the smallest |pre-activation| over the largest, per client): a margin near float32's
rounding (about 1e-7) means the devices' different sums can fall on either side of zero and
the gradient step jumps. gfedpp-no-ugc's user 20 ended 0.4% off after two rounds on an H100
(results/gpu/h100-lastfm-2k-tuned/README.md); its margin in round 2 is 1.1e-8 (the median
client's: 1.5e-4).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _per_user(state: Any, user: int) -> dict[str, torch.Tensor]:
    """What the engine keeps for ``user``: its private parameters, its dense table, its rows."""
    out: dict[str, torch.Tensor] = {}
    for name, value in getattr(state, "private", {}).items():
        out[f"private.{name}"] = value[user].detach().cpu()
    table, dense_of = getattr(state, "table", None), getattr(state, "dense_of", None)
    if table is not None and dense_of is not None and dense_of[user] >= 0:
        out["table"] = table[int(dense_of[user])].detach().cpu()
    personal = getattr(state, "personal", None)
    if personal is not None:
        n = int(state.items.shape[0])
        v = torch.zeros((1, n, personal.width), device=state.items.device)
        personal.override(v, np.array([user]), None)
        out["own rows"] = v[0].cpu()
    return out


def _kink_margins(cfg: Any) -> dict[tuple[int, int], float]:
    """(round, client) -> the smallest |first-layer pre-activation| of the client's training
    over its largest, from a CPU run of ``cfg`` with `Tower.first_layer` and the engine's
    per-chunk draws wrapped (the tower does not know its clients; the draws do)."""
    import fedrec.federated.engine as engine
    from fedrec.experiment import train
    from fedrec.federated.family.scores import Tower

    now: dict[str, Any] = {}
    closest: dict[tuple[int, int], float] = {}
    draws, first_layer = engine.client_draws, Tower.first_layer

    def recording_draws(*args: Any) -> Any:
        now["clients"], now["round"] = np.asarray(args[5]), args[7]
        return draws(*args)

    def recording_first_layer(p: dict[str, torch.Tensor], u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pre = first_layer(p, u, v)
        if pre.requires_grad and len(now.get("clients", ())) == pre.shape[0]:  # training, not scoring
            size = pre.detach().abs().flatten(1)
            for c, m in zip(now["clients"], (size.min(1).values / size.max(1).values).tolist(), strict=True):
                key = (int(now["round"]), int(c))
                closest[key] = min(closest.get(key, 1.0), m)
        return pre

    engine.client_draws, Tower.first_layer = recording_draws, staticmethod(recording_first_layer)
    try:
        train(cfg)
    finally:
        engine.client_draws, Tower.first_layer = draws, staticmethod(first_layer)
    return closest


def main() -> None:
    from test_contract import config

    from fedrec.core.device import on
    from fedrec.experiment import train
    from fedrec.federated.family.scores import Tower

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algorithm")
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tol", type=float, default=1e-5, help="share of the scores' scale a user may move")
    args = ap.parse_args()
    for rounds in args.rounds:
        cpu = config(args.algorithm, rounds=rounds)
        cuda = replace(cpu, federated=replace(cpu.federated, device="cuda"), train=replace(cpu.train, device="cuda"))
        a, b = train(cpu), train(cuda)
        users = np.arange(a.split.n_users)
        with on("cuda"):
            on_cuda = b.model.scores(users, None)
        on_cpu = a.model.scores(users, None)
        diff, scale = np.abs(on_cuda - on_cpu), float(np.abs(on_cpu).max())
        off = np.flatnonzero((diff > args.tol * scale).any(axis=1))
        print(f"== {args.algorithm}, {rounds} rounds: largest score difference {diff.max():.3g} "
              f"(scale {scale:.3g}); users over {args.tol:g} of it: {off.tolist()}")
        print(f"   losses: cpu {[r.loss for r in a.result.history]}, cuda {[r.loss for r in b.result.history]}")
        state_a, state_b = getattr(a.model, "state", None), getattr(b.model, "state", None)
        for user in off[:5]:
            items = np.flatnonzero(diff[user] > args.tol * scale)
            print(f"   user {user}: {len(items)} items off, largest {diff[user].max():.3g}")
            if state_a is None or state_b is None:
                continue
            kept_a = _per_user(state_a, int(user))
            with on("cuda"):
                kept_b = _per_user(state_b, int(user))
            for name, x in kept_a.items():
                d = (kept_b[name] - x).abs()
                rows = "" if d.dim() < 2 else f", rows off {int((d.amax(-1) > 1e-6).sum())} of {d.shape[0]}"
                print(f"     {name}: largest {float(d.max()):.3g} of {float(x.abs().max()):.3g}{rows}")
        if len(off) and isinstance(getattr(getattr(state_a, "spec", None), "scorer", None), Tower):
            margins = _kink_margins(cpu)
            every = sorted(margins.values())
            print(f"   closest to ReLU's kink (CPU; median client {np.median(every):.2g}, "
                  f"smallest {every[0]:.2g}):")
            for user in off[:5]:
                per_round = {r: f"{m:.2g}" for (r, c), m in sorted(margins.items()) if c == user}
                print(f"     user {user}: {per_round}")


if __name__ == "__main__":
    main()
