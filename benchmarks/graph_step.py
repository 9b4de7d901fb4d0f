"""Time GFed-PP's server step on a data set: the product Ã X of the public users' graph with one
column block of every user's item table (`fedrec.federated.graph.state`), with Ã formed (dense, as
the server keeps it above 10 % non-zero), Ã as a sparse CSR tensor, and Ã factored through the
public users' interactions R (`FactoredGraph`: D^-1/2 (R (Rᵀ D^-1/2 X) - diag), never formed)
at several column widths. The factored form does fewer multiplications (2 nnz(R) against n² a
column) through sparse kernels bound by memory, so whether it wins is measured: one thread,
median of five, after checking that it gives the same product. It also prints which form the
server step chooses for the data set.

    python benchmarks/graph_step.py -d lastfm-2k --data-dir ../shared/data/lastfm-2k-hetrec
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from fedrec.experiment import RunConfig, prepare_split
from fedrec.federated.graph.state import BLOCK_BYTES
from fedrec.federated.graph.user_graph import FactoredGraph, graph_nnz, public_graph


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
    public = np.ones(n, bool)  # every user public: the largest graph
    adj = public_graph(train, public, factor_above=math.inf)  # Ã formed (dense, or sparse if < 10 %)
    factored = public_graph(train, public, factor_above=0.0)
    assert isinstance(factored, FactoredGraph)
    full = adj.layout == torch.strided
    width = max(1, BLOCK_BYTES // (n * args.dim * 4))  # items per block, as the server step
    x = torch.randn(n, width * args.dim, generator=torch.Generator().manual_seed(0))
    reference = adj @ x
    gap = float((factored @ x - reference).abs().max())
    chosen = "factored" if isinstance(public_graph(train, public), FactoredGraph) else "formed"
    print(f"{args.dataset}: {n} users, {m} items, nnz(R) {train.nnz}; Ã {'dense' if full else 'sparse'} "
          f"({graph_nnz(adj) / n / n:.1%} non-zero; the server step uses it {chosen}); blocks of {width} "
          f"items, {-(-m // width)} a round; max |difference| {gap:.2g} (largest entry "
          f"{float(reference.abs().max()):.3g})")
    base = median_ms(lambda: adj @ x)
    print(f"  Ã X, Ã formed:            {base:8.1f} ms a block")
    if full:  # the same Ã kept sparse (the server step keeps it dense above 10 % non-zero)
        sparse_adj = adj.to_sparse_csr()
        t = median_ms(lambda: sparse_adj @ x)
        print(f"  Ã X, Ã sparse (CSR):      {t:8.1f} ms a block ({base / t:.2f}x)")
    for columns in (16, 32, 64, 128, 512):
        factored.columns = columns
        t = median_ms(lambda: factored @ x)
        print(f"  factored, {columns:3d} columns at a time: {t:8.1f} ms a block ({base / t:.2f}x)")


if __name__ == "__main__":
    main()
