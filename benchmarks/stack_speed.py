"""Time a `ClientStack` round (FedCIA's family: LightGCN alone, FedLightGCN, FedCIA-LightGCN)
and one evaluation's scoring, and print a digest of what they computed.

    OMP_NUM_THREADS=1 python benchmarks/stack_speed.py [--backbone lightgcn] [--rounds 2]
    OMP_NUM_THREADS=1 PYTHONPATH=OTHER_TREE python benchmarks/stack_speed.py   # the same, other code

On FedCIA's ML-1M split (100 clients of consecutive users, d = 64, batch 4,096, four negatives,
the reproduction's settings) when ``../shared/data/ml-1m-fedcia`` or ``--data-dir`` holds it,
else on a synthetic data set of the same shape. Scoring is timed as the evaluator asks for it,
every user in eight calls. The digest (SHA-256 of the losses, the trained tables and the scores)
tells whether two code trees compute the same bits; the times, whether one is faster. Run both
trees alternately on one machine and compare medians.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic
from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated.cia.stack import ClientStack
from fedrec.protocols import make_split

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-1m-fedcia"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="lightgcn", choices=("mf", "mlp", "lightgcn"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", default=str(SHARED))
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    torch.set_num_threads(1)
    if Path(args.data_dir).exists():
        split = prepare_split(RunConfig(algorithm="stacked", dataset="ml-1m-fedcia", protocol="given-full",
                                        data_dir=args.data_dir))
        source = "ml-1m-fedcia"
    else:
        split = make_split(to_implicit(synthetic(6040, 3706, mean_interactions=120, seed=0)), "ratio-full", seed=0)
        source = "synthetic 6040 x 3706"
    train = split.train
    n_users, n_items = train.shape
    stack = ClientStack(args.backbone, 64, np.arange(100), np.array_split(np.arange(n_users), 100), n_items,
                        train, tower=(64, 32, 16, 8), layers=3, init_std=0.1, key=(0, 1, 0))
    digest = hashlib.sha256()
    trained, scored = [], []
    for r in range(args.rounds):
        start = time.perf_counter()
        loss, batches = stack.train_round(split.sampler, 4, 1, 4096, 0.03, 0, r)
        trained.append(time.perf_counter() - start)
        start = time.perf_counter()
        for chunk in np.array_split(np.arange(n_users), 8):
            scores = stack.scores(chunk)
        scored.append(time.perf_counter() - start)
        digest.update(np.array([loss, batches]).tobytes())
        digest.update(scores.tobytes())
    for v in stack.params.values():
        digest.update(v.detach().cpu().numpy().tobytes())
    print(f"{source}, {args.backbone}, {stack.n_clients} clients, {train.nnz:,} training pairs: "
          f"train a round {statistics.median(trained):.2f} s (each: {', '.join(f'{t:.2f}' for t in trained)}), "
          f"score every user {statistics.median(scored):.2f} s; digest {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
