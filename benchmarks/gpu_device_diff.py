"""Where a CUDA run leaves the CPU's: the users whose scores differ, and for them each private
parameter, their starting table and their post-tuned rows (for a device test that fails).

    python benchmarks/gpu_device_diff.py gfedpp-no-ugc --rounds 1 2

Trains the small run of `tests/test_device.py::test_cuda_ends_with_the_cpu_figures` (the
contract tests' config) on the CPU and on CUDA and prints, per round count, the largest score
difference, the users over ``--tol`` of the scores' scale, and for each such user the largest
difference of each thing the engine keeps for it (what exists for the algorithm's state).
Session 47 found gfedpp-no-ugc's user 20 off by 0.4% after two rounds on an H100
(results/gpu/h100-lastfm-2k-tuned/README.md); this is the next step of that search.
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


def main() -> None:
    from test_contract import config

    from fedrec.core.device import on
    from fedrec.experiment import train

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


if __name__ == "__main__":
    main()
