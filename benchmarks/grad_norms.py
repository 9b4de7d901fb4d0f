"""Per-round quantiles of each client's gradient norm per step, for the members of the item
family trained by autograd (MetaMF, FedNCF, GPFedRec, GFed-PP): what to look at before
choosing ``--set clip`` (`fedrec.federated.family.state.FamilyState._clip`).

    OMP_NUM_THREADS=1 python benchmarks/grad_norms.py metamf -d lastfm-2k \
        --data-dir ../shared/data/lastfm-2k-hetrec -p loo-full --rounds 80

Each line: the round, its training loss, and the median, 99th and 99.9th percentile and the
largest of the L2 norms of every client's gradient in every step of the round (its parameters
and its batch's item slots, before any clip). A run that diverges stops with fedrec's error
after the last line it finished.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import fedrec
from fedrec.federated.family.state import FamilyState


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algorithm")
    ap.add_argument("-d", "--dataset", default="ml-100k")
    ap.add_argument("--data-dir")
    ap.add_argument("-p", "--protocol", default="loo-sampled")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model option")
    args = ap.parse_args()
    torch.set_num_threads(1)
    norms: list[np.ndarray] = []
    autograd = FamilyState._autograd

    def recording(self, params, v, y, m, names, train_items):  # type: ignore[no-untyped-def]
        loss, grads = autograd(self, params, v, y, m, names, train_items)
        n = v.shape[0]
        sq = sum(g[:n].double().pow(2).reshape(n, -1).sum(1) for g in grads.values())
        norms.append(sq.sqrt().cpu().numpy())
        return loss, grads

    FamilyState._autograd = recording  # a diagnostic: wraps the engine's step, changes nothing

    def on_round(record, *_):  # type: ignore[no-untyped-def]
        x = np.concatenate(norms)
        norms.clear()
        q = np.quantile(x, [0.5, 0.99, 0.999, 1.0])
        print(f"{record.round:4d}  loss {record.loss:.4f}  norm median {q[0]:.3g}  p99 {q[1]:.3g}  "
              f"p99.9 {q[2]:.3g}  max {q[3]:.3g}", flush=True)

    options = {}
    for item in args.set:
        key, _, value = item.partition("=")
        options[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    fedrec.run(args.algorithm, args.dataset, protocol=args.protocol, seed=args.seed, rounds=args.rounds,
               options=options, data_dir=args.data_dir, on_round=on_round)


if __name__ == "__main__":
    main()
