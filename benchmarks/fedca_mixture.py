"""FedCA's server mixture on the CPU: one sparse product against column blocks.

    python benchmarks/fedca_mixture.py                       # Lastfm-2K's shape, one thread
    python benchmarks/fedca_mixture.py --clients 943 --items 1682 --repeats 5   # ML-100K's

Each aggregated client's new table is a weighted sum of the aggregated clients' tables
(`fedrec.federated.ca.state.mixtures`), the weights a sparse matrix from the simplex projection
(about ``--per-row`` weights a row; 60 of 1,600 on Lastfm-2K). The script times that product as
one `torch.sparse.mm` call and as `sparse_product`'s blocks of `PRODUCT_COLUMNS` columns,
alternating, on random tables of the given shape, checks that the two are bitwise equal, and
prints each one's times, their medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrec.federated.ca import state as ca_state
from fedrec.federated.ca.composite import project_simplex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1600)
    ap.add_argument("--items", type=int, default=12454)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--per-row", type=int, default=60, help="weights a row (the rest are 0)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    n = args.clients
    raw = torch.rand(n, n, generator=gen, dtype=torch.float64)
    raw[raw < 1 - args.per_row / n] = 0.0
    w = project_simplex(raw + 0.5 * (raw > 0)).float().to_sparse()
    tables = torch.randn(n, args.items * args.dim, generator=gen)
    print(f"{n} clients x {args.items} items x dim {args.dim}: {tables.numel() * 4 / 2**30:.2f} GiB of tables, "
          f"{w._nnz() / n:.0f} weights a row, {args.threads} thread(s), blocks of {ca_state.PRODUCT_COLUMNS} columns")
    whole = torch.sparse.mm(w, tables)
    times: dict[str, list[float]] = {"one call": [], "blocks": []}
    for _ in range(args.repeats):
        for name in times:
            t = time.perf_counter()
            got = torch.sparse.mm(w, tables) if name == "one call" else ca_state.sparse_product(w, tables)
            times[name].append(time.perf_counter() - t)
            if not torch.equal(got, whole):
                raise SystemExit(f"{name}: not bitwise the one call's product")
            del got
    for name, ts in times.items():
        print(f"{name:>9}: {', '.join(f'{x:.2f}' for x in ts)} s (median {statistics.median(ts):.2f})")
    print(f"one call / blocks: {statistics.median(times['one call']) / statistics.median(times['blocks']):.2f}x; "
          "bitwise equal")


if __name__ == "__main__":
    main()
