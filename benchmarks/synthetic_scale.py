"""Time `synthetic_data` at scale and report peak memory.

Usage: python benchmarks/synthetic_scale.py --users 1000000 --items 100000
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from fedrec.data.synthetic import synthetic_data


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--mean", type=float, default=20.0, help="mean interactions per user")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs in one process (later ones are warm)"
    )
    args = parser.parse_args()
    baseline = peak_rss_mib()
    for run in range(args.repeat):
        start = time.perf_counter()
        data = synthetic_data(args.users, args.items, args.mean, dim=args.dim, seed=args.seed)
        seconds = time.perf_counter() - start
        n = len(data.interactions)
        print(
            f"run {run + 1}: {args.users} users x {args.items} items, {n} interactions "
            f"({n / args.users:.2f}/user) in {seconds:.2f} s ({n / seconds / 1e6:.1f} M/s)"
        )
        del data
    peak = peak_rss_mib()
    print(f"peak RSS {peak:.0f} MiB (interpreter and imports: {baseline:.0f} MiB)")


if __name__ == "__main__":
    main()
