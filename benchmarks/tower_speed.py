"""Time the family's MLP tower (GPFedRec, GFed-PP, FedNCF), whose first layer takes the user's
and the item's halves apart (u W_u + v W_v), against the same tower on the concatenated input
[u, v].

    OMP_NUM_THREADS=1 python benchmarks/tower_speed.py

Shapes (clients x rows): a full-ranking chunk of Lastfm-2K (10 x 12,454), a training step
(64 x 1,280) and a sampled evaluation (1,400 x 100). Prints the medians of seven forward passes
of each, their ratio and the largest difference of their outputs relative to the largest
output.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from fedrec.federated.family.scores import get_score

DIM, LAYERS = 32, (32, 16, 8)


def concatenated(p: dict[str, torch.Tensor], u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x = torch.cat([u[:, None, :].expand(-1, v.shape[1], -1), v], dim=-1)
    for n in range(len(LAYERS)):
        x = F.relu(torch.baddbmm(p[f"b{n}"][:, None, :], x, p[f"W{n}"]))
    return x


def main() -> None:
    torch.set_num_threads(1)
    tower = get_score("mlp")
    spec = SimpleNamespace(dim=DIM, layers=LAYERS)
    gen = torch.Generator().manual_seed(0)
    for clients, rows in ((10, 12454), (64, 1280), (1400, 100)):
        p = {name: torch.randn((clients, *shape), generator=gen) for name, shape in tower.score_shapes(spec).items()}
        u, v = torch.randn((clients, DIM), generator=gen), torch.randn((clients, rows, DIM), generator=gen)
        want, got = concatenated(p, u, v), tower.tower(spec, p, u, v)
        err = float((want - got).abs().max() / want.abs().max())
        old_s, new_s = [], []
        for _ in range(7):  # alternated, so that a noisy spell hits both
            t = time.perf_counter()
            concatenated(p, u, v)
            old_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            tower.tower(spec, p, u, v)
            new_s.append(time.perf_counter() - t)
        old, new = statistics.median(old_s), statistics.median(new_s)
        print(f"{clients:5d} x {rows:6d}: concatenated {old * 1e3:7.1f} ms  two parts {new * 1e3:7.1f} ms  "
              f"{old / new:.2f}x  max rel. difference {err:.1e}")


if __name__ == "__main__":
    main()
