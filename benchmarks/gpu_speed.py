"""Seconds per round and peak memory of the GPU issue's workloads, on CUDA and on the CPU.

    python benchmarks/gpu_speed.py                       # every workload, CUDA (if present) and CPU
    python benchmarks/gpu_speed.py --workload pfedrec-ml100k --devices cpu --rounds 5
    python benchmarks/gpu_speed.py --list

Each (workload, device) runs in its own process, so peak host memory (RSS) and peak device
memory (`torch.cuda.max_memory_allocated`) are its own. A row gives the median seconds a round
spends on the clients' side (broadcast, local training, uploads), in aggregation and in
evaluation, the total for the workload's rounds (measured, or the median round times the
rounds when ``--rounds`` asks for fewer: marked ``~``), and the peak memories. The CPU column
of the big workloads is skipped unless ``--cpu-all`` (a PFedRec round over 10^6 users takes
minutes on two cores). Targets are issue 18's (one H100-class GPU).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    algorithm: str
    data: str  # ml-100k, or synthetic USERSxITEMSxINTERACTIONS
    rounds: int
    target: str
    engine: tuple[tuple[str, Any], ...] = ()
    model: tuple[tuple[str, Any], ...] = ()
    cpu: bool = True  # measured on the CPU by default


WORKLOADS = [
    Workload("pfedrec-ml100k", "pfedrec", "ml-100k", 100, "<= 3 s (100 rounds)"),
    Workload("pfedrec-ml1m", "pfedrec", "6040x3706x1000000", 100, "<= 10 s"),
    Workload("fedrap-ml1m", "fedrap", "6040x3706x1000000", 100, "<= 60 s (CPU: < 20 min)",
             engine=(("local_epochs", 10),), cpu=False),
    Workload("gpfedrec-ml100k", "gpfedrec", "ml-100k", 100, "<= 5 s"),
    Workload("gfedpp-ml100k", "gfedpp", "ml-100k", 100, "<= 5 s"),
    Workload("gpfedrec-ml1m", "gpfedrec", "6040x3706x1000000", 100, "<= 60 s", cpu=False),
    Workload("fedcia-mf-per-user", "fedcia-mf", "ml-100k", 1, "<= 2 s a round",
             model=(("clients", 0),)),
    Workload("personalfr-ml100k", "personalfr", "ml-100k", 800, "<= 30 s"),
    Workload("pfedrec-1m-users", "pfedrec", "1000000x100000x20000000", 1, "<= 10 s, <= 40 GB",
             cpu=False),
]


def protocol_of(algorithm: str) -> str:
    from fedrec.algorithms import get_algorithm

    spec = get_algorithm(algorithm)
    if "aggregation" in spec.defaults:
        return "ratio-full"
    return "ratio-rating" if "sampled" not in spec.rankings else "loo-sampled"


def split_of(w: Workload, seed: int) -> Any:
    from fedrec.data.preprocess import PreprocessConfig, preprocess
    from fedrec.data.synthetic import synthetic
    from fedrec.experiment import RunConfig, prepare_split
    from fedrec.protocols import make_split

    protocol = protocol_of(w.algorithm)
    if w.data == "ml-100k":
        return prepare_split(RunConfig(algorithm=w.algorithm, dataset="ml-100k", seed=seed, protocol=protocol))
    users, items, events = (int(x) for x in w.data.split("x"))
    x = synthetic(users, items, mean_interactions=events / users, seed=seed)
    return make_split(preprocess(x, PreprocessConfig(implicit=True)), protocol, seed=seed)


def measure(w: Workload, device: str, rounds: int, seed: int) -> dict[str, Any]:
    """Run ``w`` on ``device`` in this process; its figures."""
    import torch

    from fedrec.algorithms import get_algorithm
    from fedrec.core.device import on
    from fedrec.experiment import federated_config
    from fedrec.federated.engine import run_federated

    torch.set_num_threads(1)
    split = split_of(w, seed)
    alg = get_algorithm(w.algorithm)
    spec = alg.build(split, {**alg.defaults, **dict(w.model)})
    cfg = federated_config(w.algorithm, rounds=min(rounds, w.rounds), patience=0, device=device,
                           **dict(w.engine))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with on(device):
        out = run_federated(spec, split, cfg, seed=seed)
    wall = time.perf_counter() - start
    median = lambda key: statistics.median(h.extra.get(key, 0.0) for h in out.history)  # noqa: E731
    per_round = statistics.median(h.seconds for h in out.history)
    done = len(out.history)
    return {
        "workload": w.name, "device": device, "rounds": done, "of": w.rounds,
        "train_s": median("train_seconds"), "aggregate_s": median("aggregate_seconds"),
        "eval_s": median("eval_seconds"), "round_s": per_round,
        "total_s": wall if done == w.rounds else per_round * w.rounds, "extrapolated": done != w.rounds,
        "host_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "device_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
        "users": split.n_users, "items": split.n_items, "train": int(split.train.nnz),
        "test": out.test, "target": w.target,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", help="name (repeatable; default: all)")
    ap.add_argument("--devices", default=None, help="comma-separated (default: cuda,cpu or cpu)")
    ap.add_argument("--rounds", type=int, default=100, help="at most this many rounds a workload")
    ap.add_argument("--cpu-all", action="store_true", help="also the big workloads on the CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("WORKLOAD", "DEVICE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    by_name = {w.name: w for w in WORKLOADS}
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:22s} {w.algorithm:12s} {w.data:26s} {w.rounds:4d} rounds  target {w.target}")
        return
    if args.one:
        print(json.dumps(measure(by_name[args.one[0]], args.one[1], args.rounds, args.seed)))
        return
    import torch

    devices = args.devices.split(",") if args.devices else (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    names = args.workload or [w.name for w in WORKLOADS]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        sys.exit(f"unknown workload(s) {', '.join(unknown)}; see --list")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"GPU: {gpu}; CPU threads: 1; rounds: at most {args.rounds} (~: median round x the workload's rounds)")
    print(f"{'workload':22s} {'device':6s} {'train':>8s} {'aggr':>8s} {'eval':>8s} {'total':>10s} "
          f"{'host GB':>8s} {'dev GB':>7s}  target")
    for name in names:
        w = by_name[name]
        for device in devices:
            if device == "cpu" and not (w.cpu or args.cpu_all):
                print(f"{name:22s} {device:6s} {'(skipped on the CPU; --cpu-all)':>46s}")
                continue
            done = subprocess.run([sys.executable, __file__, "--one", name, device, "--rounds", str(args.rounds),
                                   "--seed", str(args.seed)], capture_output=True, text=True)
            if done.returncode:
                print(f"{name:22s} {device:6s} failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            total = ("~" if r["extrapolated"] else "") + f"{r['total_s']:.1f}"
            dev = f"{r['device_peak_gb']:.2f}" if r["device_peak_gb"] is not None else "-"
            print(f"{name:22s} {device:6s} {r['train_s']:8.3f} {r['aggregate_s']:8.3f} {r['eval_s']:8.3f} "
                  f"{total:>10s} {r['host_peak_gb']:8.2f} {dev:>7s}  {r['target']}")


if __name__ == "__main__":
    main()
