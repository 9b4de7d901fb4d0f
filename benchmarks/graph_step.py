"""Time GFed-PP's server step on a data set: the product Ã X of the public users' graph with one
column block of every user's item table, as `fedrec.federated.graph` computes it (dense Ã, or
sparse when under 10 % full), against the factored form Ã X = D^-1/2 (R (Rᵀ D^-1/2 X) - diag)
that never forms Ã (R: the public users' interactions, binary), and Ã kept sparse.

The factored form does fewer multiplications (2 nnz(R) against n² per column) but through sparse
kernels that are bound by memory; this script measures whether that wins, one thread, median of
five, and checks both give the same product.

    python benchmarks/graph_step.py -d lastfm-2k --data-dir ../shared/data/lastfm-2k-hetrec
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated.graph import BLOCK_BYTES
from fedrec.federated.user_graph import public_graph


def median_ms(f: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-d", "--dataset", default="ml-100k")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--dim", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)

    split = prepare_split(RunConfig("gfedpp", dataset=args.dataset, protocol="loo-sampled", data_dir=args.data_dir))
    train = split.train.tocsr()
    n, m = train.shape
    adj = public_graph(train, np.ones(n, bool))  # every user public: the largest graph
    full = adj.layout == torch.strided
    nnz_adj = int((adj != 0).sum()) if full else int(adj.values().numel())
    width = max(1, BLOCK_BYTES // (n * args.dim * 4))  # items per block, as the server step
    x = torch.randn(n, width * args.dim, generator=torch.Generator().manual_seed(0))

    r = (train > 0).astype(np.float32).tocsr()
    rt = r.T.tocsr()
    items_of = np.asarray(r.sum(1)).ravel()
    deg = np.asarray((r @ rt).sum(1)).ravel() - items_of  # A = R Rᵀ without its diagonal
    lonely = deg == 0  # these keep a self-loop of weight 1
    inv = (1.0 / np.sqrt(np.where(lonely, 1.0, deg))).astype(np.float32)[:, None]
    diag = (items_of - lonely).astype(np.float32)[:, None]
    xn = x.numpy()

    def factored(columns: int) -> np.ndarray:
        y = xn * inv
        out = np.empty_like(y)
        for s in range(0, y.shape[1], columns):
            part = y[:, s : s + columns]
            out[:, s : s + columns] = r @ (rt @ part) - diag * part
        return out * inv

    reference = (adj @ x).numpy()
    gap = float(np.abs(factored(64) - reference).max())
    print(f"{args.dataset}: {n} users, {m} items, nnz(R) {train.nnz}; Ã {'dense' if full else 'sparse'} "
          f"({nnz_adj / n / n:.1%} non-zero); blocks of {width} items, {-(-m // width)} a round; "
          f"max |difference| {gap:.2g} (largest entry {np.abs(reference).max():.3g})")
    base = median_ms(lambda: adj @ x)
    print(f"  Ã X as the server step: {base:8.1f} ms a block")
    if full:  # the same Ã kept sparse (the server step keeps it dense above 10 % non-zero)
        sparse_adj = adj.to_sparse_csr()
        t = median_ms(lambda: sparse_adj @ x)
        print(f"  Ã X with Ã sparse (CSR): {t:8.1f} ms a block ({base / t:.2f}x)")
    for columns in (64, 256, 1024):
        t = median_ms(lambda c=columns: factored(c))
        print(f"  factored, {columns:4d} columns at a time: {t:8.1f} ms a block ({base / t:.2f}x)")


if __name__ == "__main__":
    main()
