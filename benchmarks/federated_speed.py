"""Speed and memory of the cohort-vectorised engine, against the one-client-at-a-time reference.

    python benchmarks/federated_speed.py                          # PFedRec, ML-100K, 100 rounds
    python benchmarks/federated_speed.py --scale ml-1m --rounds 100
    python benchmarks/federated_speed.py --algorithm fedncf --rounds 10
    python benchmarks/federated_speed.py --algorithm fedrap --reference-rounds 0
    python benchmarks/federated_speed.py --algorithm fedcia-mf --reference-rounds 0   # ratio-full

All clients train every round with the algorithm's engine defaults (PFedRec: 1 local epoch,
batch 256; FedRAP: 10 local epochs, batch 2048) and validation runs every round, as the speed
targets assume. The reference engine (`tests/reference_engine.py`) trains the same rounds one
client at a time with plain per-client modules; its seconds per round give the speed ratio.
``--scale ml-1m`` builds a 6,040-user / 3,706-item / ~1M-interaction synthetic data set (or
reads FedCIA's ML-1M split with ``--ml1m-split PATH``). Peak memory is the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedrec.algorithms import get_algorithm
from fedrec.data.preprocess import PreprocessConfig, preprocess
from fedrec.data.synthetic import synthetic
from fedrec.experiment import RunConfig, federated_config, prepare_split
from fedrec.federated.engine import run_federated
from fedrec.federated.family.spec import FamilySpec
from fedrec.protocols import make_split
from fedrec.protocols.protocol import get_protocol


def ml1m_scale(split_path: str | None, seed: int, protocol: str):  # type: ignore[no-untyped-def]
    if split_path:
        from fedrec.data.parsers import parse_fedcia_split

        x = preprocess(parse_fedcia_split(split_path), PreprocessConfig())
    else:
        implicit = get_protocol(protocol).implicit  # rating protocols keep the 1-5 stars
        x = preprocess(synthetic(6040, 3706, mean_interactions=165, seed=seed), PreprocessConfig(implicit=implicit))
        counts = np.bincount(x.users, minlength=x.n_users)
        x = preprocess(x.subset(counts[x.users] <= x.n_items - 2 * 99), PreprocessConfig(implicit=implicit))
    return make_split(x, protocol, seed=seed)


def dense_floor(n_users: int, n_items: int, dim: int, products: int) -> tuple[float, float]:
    """Seconds per round that ``products`` exact (n_users x n_users) @ (n_users x n_items*dim)
    products take at this machine's measured float32 matrix rate, and that rate (GFLOP/s).

    The graph servers cannot do less: GPFedRec needs the Gram matrix of all uploaded tables and
    the graph times all tables (two such products; fedrec's Gram is one triangle: half of one on the CPU, 3/4 on a GPU),
    GFed-PP needs Ã times all tables (one). The rate is timed on 32 MB column blocks, as the
    server step runs."""
    width = max(1, (32 << 20) // (n_users * 4))
    a, b = torch.randn(n_users, n_users), torch.randn(n_users, width)
    a @ b
    reps, start = 5, time.perf_counter()
    for _ in range(reps):
        a @ b
    rate = 2 * n_users * n_users * width * reps / (time.perf_counter() - start)
    flops = products * 2 * n_users * n_users * n_items * dim
    return flops / rate, rate / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithm", default="pfedrec")
    ap.add_argument("--scale", choices=["ml-100k", "ml-1m"], default="ml-100k")
    ap.add_argument("--ml1m-split", default=None, help="FedCIA's ML-1M split TSV instead of synthetic")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--reference-rounds", type=int, default=1, help="0 to skip the reference")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr-item", type=float, default=None, help="item-row learning rate (default: the algorithm's)")
    ap.add_argument("--protocol", default=None,
                    help="default: ratio-full for FedCIA-style algorithms, else loo-sampled")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model option")
    ap.add_argument("--paper", action="store_true", help="the algorithm's paper setting (its item-row rule, no stop)")
    ap.add_argument("--backoffs", type=int, default=None, help="back-offs (default: the setting's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    spec_a = get_algorithm(args.algorithm)
    protocol = args.protocol or ("ratio-full" if "aggregation" in spec_a.defaults
                                 else "ratio-rating" if "sampled" not in spec_a.rankings else "loo-sampled")
    if args.scale == "ml-100k":
        split = prepare_split(RunConfig(algorithm=args.algorithm, dataset="ml-100k", seed=args.seed,
                                        protocol=protocol))
    else:
        split = ml1m_scale(args.ml1m_split, args.seed, protocol)
    options = dict(item.split("=", 1) for item in args.set)
    spec = spec_a.build(split, {**spec_a.defaults, **options})
    cfg = federated_config(args.algorithm, rounds=args.rounds, lr_item=args.lr_item, paper=args.paper,
                           backoffs=args.backoffs)
    print(f"{args.algorithm} on {args.scale}: {split.n_users:,} users, {split.n_items:,} items, "
          f"{split.train.nnz:,} training interactions; torch threads {torch.get_num_threads()}")

    start = time.perf_counter()
    out = run_federated(spec, split, cfg, seed=args.seed)
    wall = time.perf_counter() - start
    per_round = wall / len(out.history)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"engine: {len(out.history)} rounds in {wall:.1f} s ({per_round:.3f} s/round incl. "
          f"validation every round); peak RSS {peak:,.0f} MB")
    print(f"        best validation round {out.best_round}: valid {out.valid_at_best}, test {out.test}")
    train = [h.extra["train_seconds"] for h in out.history if "train_seconds" in h.extra]
    if train:  # states that run whole rounds: local training, then the aggregation
        aggregate = [h.extra["aggregate_seconds"] for h in out.history]
        what = " (FedCIA: upload, server mean, eigendecomposition, fine-tune)" if "cia" in args.algorithm else ""
        print(f"        of which local training {np.mean(train):.3f} s/round, aggregation{what} "
              f"{np.mean(aggregate):.3f} s/round; "
              f"upload {np.mean([h.bytes_up for h in out.history]) / 2**20:,.2f} MiB/round")
    macs = [h.extra["macs"] for h in out.history if "macs" in h.extra]
    if macs:  # the autoencoders: what a dense implementation computes and what fedrec does
        sparse = np.mean([h.extra["macs_fedrec"] for h in out.history])
        print(f"        forward multiply-adds a round: {np.mean(macs) / 1e6:,.0f}M as a dense model computes "
              f"them, {sparse / 1e6:,.0f}M as fedrec does (rated entries only)")
    server = [h.extra["server_seconds"] for h in out.history if "server_seconds" in h.extra]
    if server:  # GPFedRec / GFed-PP: the graph step over every user's table
        print(f"        of which the server's graph step: {sum(server):.1f} s "
              f"({sum(server) / len(server):.3f} s/round over {len(server)} rounds)")
        products = 1.75 if args.algorithm == "gpfedrec" else 1.0
        floor, gflops = dense_floor(split.n_users, split.n_items, spec.dim, products)
        print(f"        floor of an exact graph step: {products:g} dense user x user products of "
              f"all tables = {floor:.3f} s/round at {gflops:.0f} GFLOP/s measured here "
              f"({floor * len(server):.0f} s over {len(server)} rounds)")
    if args.reference_rounds and not isinstance(spec, FamilySpec):
        print("reference: none for this algorithm (its equivalence test has its own reference)")
    elif args.reference_rounds:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from reference_engine import time_reference_rounds  # the tests' one-client-at-a-time engine

        ref = time_reference_rounds(spec, split, cfg, rounds=args.reference_rounds, seed=args.seed)
        train_only = np.mean([h.seconds for h in out.history])
        print(f"reference (one client at a time): {ref:.2f} s/round of training; "
              f"engine {train_only:.3f} s/round incl. validation -> {ref / train_only:.0f}x faster")


if __name__ == "__main__":
    main()
