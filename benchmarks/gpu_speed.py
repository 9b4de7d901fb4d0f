"""Seconds per round and peak memory of the GPU workloads (docs/scale.md), on CUDA and on the CPU.

    python benchmarks/gpu_speed.py                       # every workload, CUDA (if present) and CPU
    python benchmarks/gpu_speed.py --workload pfedrec-ml100k --devices cpu --rounds 5
    python benchmarks/gpu_speed.py --list
    python benchmarks/gpu_speed.py --budget-s 30 --json rows.jsonl --split-cache /tmp/splits
    python benchmarks/gpu_speed.py --prepare --workload pfedrec-1m-users --split-cache /tmp/splits

Each (workload, device) runs in its own process, so peak host memory (RSS) and peak device
memory (`torch.cuda.max_memory_allocated`) are its own. A row gives the median seconds a round
spends on the clients' side (broadcast, local training, uploads), in aggregation and in
evaluation, the total for the workload's rounds (measured, or the median round times the
rounds when ``--rounds`` asks for fewer: marked ``~``), and the peak memories. The CPU column
of the big workloads is skipped unless ``--cpu-all`` (a PFedRec round over 10^6 users takes
minutes on two cores). ``--budget-s`` stops a row after that many seconds and extrapolates
from the rounds it finished, so one call fits a GPU lease. Each workload names its target (one
H100-class GPU).
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
from pathlib import Path
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
    protocol: str | None = None  # the algorithm's usual one (`protocol_of`) when not given


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
    # the same with validation every 10 rounds (--eval-every 10): its training's share
    Workload("personalfr-ml100k-eval10", "personalfr", "ml-100k", 800, "<= 30 s",
             engine=(("eval_every", 10),)),
    Workload("pfedrec-1m-users", "pfedrec", "1000000x100000x20000000", 1, "<= 10 s, <= 40 GB",
             cpu=False),
    # leads from long GPU runs (docs/scale.md, "Long runs on a lent GPU"): MetaMF ran ten times slower
    # on an H200 than on the CPU, and a full-ranking GFed-PP round seven times its sampled one
    Workload("metamf-ml100k", "metamf", "ml-100k", 100, "as fast as the CPU"),
    Workload("gfedpp-ml100k-full", "gfedpp", "ml-100k", 100, "as its sampled row", protocol="loo-full"),
]


MOST_ACTIVE_SHARE = 2314 / 3706


def protocol_of(algorithm: str) -> str:
    from fedrec.algorithms import get_algorithm

    spec = get_algorithm(algorithm)
    if "aggregation" in spec.defaults:
        return "ratio-full"
    return "ratio-rating" if "sampled" not in spec.rankings else "loo-sampled"


def split_of(w: Workload, seed: int, cache: str | None = None) -> Any:
    """The workload's split. Synthetic splits are kept in ``cache`` when given (as
    `fedrec.tensorfile` files: arrays and JSON, nothing that runs when read): a 10^6-user split
    takes minutes to draw (its evaluation negatives most), so a GPU lease prepares it beside
    the tests (``--prepare``) and the timed rows load it in seconds."""
    from fedrec import tensorfile
    from fedrec.data.preprocess import PreprocessConfig, preprocess
    from fedrec.data.synthetic import synthetic
    from fedrec.experiment import RunConfig, prepare_split
    from fedrec.protocols import make_split

    protocol = w.protocol or protocol_of(w.algorithm)
    if w.data == "ml-100k":
        return prepare_split(RunConfig(algorithm=w.algorithm, dataset="ml-100k", seed=seed, protocol=protocol))
    kept = Path(cache) / f"{w.data}-cap{MOST_ACTIVE_SHARE:.4f}-{protocol}-s{seed}.split" if cache else None
    if kept is not None and kept.is_file():
        return _split_from_tree(tensorfile.load(kept, "bench-split", 1))
    users, items, events = (int(x) for x in w.data.split("x"))
    # ML-1M's most active user rated 62% of its items; the cap leaves every user the items
    # the sampled protocol draws evaluation negatives from (an uncapped heavy tail fills some)
    x = synthetic(users, items, mean_interactions=events / users, seed=seed,
                  max_interactions=int(MOST_ACTIVE_SHARE * items))
    split = make_split(preprocess(x, PreprocessConfig(implicit=True)), protocol, seed=seed)
    if kept is not None:  # written atomically: a reader sees the whole split or none
        tensorfile.save(kept, _split_tree(split), "bench-split", 1)
    return split


def _csr_tree(m: Any) -> Any:
    return None if m is None else {"indptr": m.indptr, "indices": m.indices, "data": m.data, "shape": m.shape}


def _csr_of(t: Any) -> Any:
    import scipy.sparse as sp

    return None if t is None else sp.csr_matrix((t["data"], t["indices"], t["indptr"]), shape=tuple(t["shape"]))


def _split_tree(split: Any) -> dict[str, Any]:
    """A synthetic split as a tree `fedrec.tensorfile` stores (its ids are integers)."""
    def stage(e: Any) -> dict[str, Any]:
        return {"users": e.users, "targets": _csr_tree(e.targets), "candidates": e.candidates,
                "exclude": _csr_tree(e.exclude)}

    return {"protocol": split.protocol.name, "negatives": split.negatives, "label": split.label,
            "data": dict(vars(split.data)), "train": _csr_tree(split.train), "valid": stage(split.valid),
            "test": stage(split.test), "sampler": dict(vars(split.sampler))}


def _split_from_tree(t: dict[str, Any]) -> Any:
    from fedrec.data.interactions import Interactions
    from fedrec.protocols.negatives import ComplementSampler
    from fedrec.protocols.protocol import EvalSet, Split, get_protocol

    def stage(e: dict[str, Any]) -> Any:
        return EvalSet(e["users"], _csr_of(e["targets"]), e["candidates"], _csr_of(e["exclude"]))

    sampler = object.__new__(ComplementSampler)  # its arrays as drawn: rebuilding them costs minutes
    sampler.__dict__.update(t["sampler"])
    return Split(get_protocol(t["protocol"]), Interactions(**t["data"]), t["label"], _csr_of(t["train"]),
                 stage(t["valid"]), stage(t["test"]), t["negatives"], sampler)


def _peaks(device: str) -> tuple[float, float | None]:
    import torch

    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return host, (torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None)


def setup(w: Workload, device: str, rounds: int, seed: int, cache: str | None = None) -> tuple[Any, Any, Any]:
    """The workload's split, algorithm description and engine options for ``rounds`` rounds
    on ``device`` (checked), with one torch thread."""
    import torch

    from fedrec.algorithms import get_algorithm
    from fedrec.core.device import check
    from fedrec.experiment import federated_config

    check(device)
    torch.set_num_threads(1)
    split = split_of(w, seed, cache)
    alg = get_algorithm(w.algorithm)
    spec = alg.build(split, {**alg.defaults, **dict(w.model)})
    return split, spec, federated_config(w.algorithm, rounds=rounds, patience=0, device=device, **dict(w.engine))


def measure(w: Workload, device: str, rounds: int, seed: int, cache: str | None = None) -> dict[str, Any]:
    """Run ``w`` on ``device`` in this process; its figures. Each round is also printed as a
    ``ROUND`` line as it ends, so a parent that stops the run at its budget keeps the rounds
    done."""
    import torch

    from fedrec.core.device import on
    from fedrec.federated.engine import run_federated

    loaded = time.perf_counter()
    split, spec, cfg = setup(w, device, min(rounds, w.rounds), seed, cache)
    print("LOADED " + json.dumps({"load_s": time.perf_counter() - loaded, "users": split.n_users,
                                  "items": split.n_items, "train": int(split.train.nnz)}), flush=True)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    def on_round(record: Any, *_: Any) -> None:
        host, dev = _peaks(device)
        print("ROUND " + json.dumps({"round": record.round, "round_s": record.seconds,
                                     "train_s": record.extra.get("train_seconds", 0.0),
                                     "aggregate_s": record.extra.get("aggregate_seconds", 0.0),
                                     "eval_s": record.extra.get("eval_seconds", 0.0),
                                     "host_peak_gb": host, "device_peak_gb": dev}), flush=True)

    start = time.perf_counter()
    with on(device):
        out = run_federated(spec, split, cfg, seed=seed, on_round=on_round)
    wall = time.perf_counter() - start
    host, dev = _peaks(device)
    return {"wall_s": wall, "rounds": len(out.history), "host_peak_gb": host, "device_peak_gb": dev,
            "test": out.test}


def summarise(w: Workload, device: str, lines: list[str], finished: bool) -> dict[str, Any] | None:
    """A row from a child's output: medians of its rounds; the measured total when all of the
    workload's rounds ran, else extrapolated: the median round's training and its median validation
    (one in `eval_every` rounds) times the workload's rounds."""
    tagged = lambda tag: [json.loads(x[len(tag):]) for x in lines if x.startswith(tag)]  # noqa: E731
    rounds, loaded = tagged("ROUND "), tagged("LOADED ")
    if not rounds:
        return None
    median = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    end = json.loads(lines[-1]) if finished else None
    complete = end is not None and end["rounds"] == w.rounds
    every = dict(w.engine).get("eval_every", 1)  # validated rounds: one in `every`, as extrapolated
    evals = [r["eval_s"] for r in rounds if r["eval_s"] > 0] or [0.0]
    per_round = (statistics.median(r["round_s"] - r["eval_s"] for r in rounds)
                 + statistics.median(evals) / every)
    return {
        "workload": w.name, "device": device, "rounds": len(rounds), "of": w.rounds,
        "train_s": median("train_s"), "aggregate_s": median("aggregate_s"), "eval_s": median("eval_s"),
        "round_s": median("round_s"), "load_s": loaded[0]["load_s"] if loaded else None,
        "total_s": end["wall_s"] if complete else per_round * w.rounds, "extrapolated": not complete,
        "host_peak_gb": (end or rounds[-1])["host_peak_gb"],
        "device_peak_gb": (end or rounds[-1])["device_peak_gb"],
        "test": end["test"] if end else None, "target": w.target, **(loaded[0] if loaded else {}),
    }


def run_child(w: Workload, device: str, args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    """Measure ``w`` on ``device`` in a fresh process, stopped after ``args.budget_s``."""
    cmd = [sys.executable, __file__, "--one", w.name, device, "--rounds", str(args.rounds),
           "--seed", str(args.seed)] + (["--split-cache", args.split_cache] if args.split_cache else [])
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            out, err = child.communicate(timeout=args.budget_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            timed_out = True
    lines = [x for x in out.splitlines() if x.strip()]
    finished = not timed_out and child.returncode == 0
    row = summarise(w, device, lines, finished)
    if finished:
        return row, ""
    if timed_out:
        return row, f"stopped at the {args.budget_s:.0f} s budget"
    why = f"crashed: {(err.strip().splitlines() or ['?'])[-1]}"
    if row is not None:  # rounds before a crash are no measurement of the workload: no row
        why += f" (after {row['rounds']} rounds)"
    return None, why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", help="name (repeatable; default: all)")
    ap.add_argument("--devices", default=None, help="comma-separated (default: cuda,cpu or cpu)")
    ap.add_argument("--rounds", type=int, default=100, help="at most this many rounds a workload")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop a (workload, device) after this many seconds and extrapolate its rounds")
    ap.add_argument("--json", default=None, help="append each row as a JSON line to this file")
    ap.add_argument("--cpu-all", action="store_true", help="also the big workloads on the CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split-cache", default=None, help="keep synthetic splits in this folder")
    ap.add_argument("--prepare", action="store_true",
                    help="only draw the chosen workloads' synthetic splits into --split-cache")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("WORKLOAD", "DEVICE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    by_name = {w.name: w for w in WORKLOADS}
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:22s} {w.algorithm:12s} {w.data:26s} {w.rounds:4d} rounds  target {w.target}")
        return
    if args.one:
        print(json.dumps(measure(by_name[args.one[0]], args.one[1], args.rounds, args.seed, args.split_cache)))
        return
    unknown = [n for n in args.workload or [] if n not in by_name]
    if unknown:
        sys.exit(f"unknown workload(s) {', '.join(unknown)}; see --list")
    if args.prepare:
        if not args.split_cache:
            sys.exit("--prepare needs --split-cache")
        for name in args.workload or [w.name for w in WORKLOADS]:
            if by_name[name].data != "ml-100k":
                start = time.perf_counter()
                split_of(by_name[name], args.seed, args.split_cache)
                print(f"{name}: split ready in {time.perf_counter() - start:.1f} s", flush=True)
        return
    import torch

    devices = args.devices.split(",") if args.devices else (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    names = args.workload or [w.name for w in WORKLOADS]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"GPU: {gpu}; torch {torch.__version__}; CPU threads: 1; rounds: at most {args.rounds}; "
          f"budget: {args.budget_s or 'none'} s a row (~: median round x the workload's rounds)", flush=True)
    print(f"{'workload':22s} {'device':6s} {'load':>6s} {'train':>8s} {'aggr':>8s} {'eval':>8s} {'rounds':>8s} "
          f"{'total':>10s} {'host GB':>8s} {'dev GB':>7s}  target", flush=True)
    for name in names:
        w = by_name[name]
        for device in devices:
            if device == "cpu" and not (w.cpu or args.cpu_all):
                print(f"{name:22s} {device:6s} {'(skipped on the CPU; --cpu-all)':>46s}", flush=True)
                continue
            r, why = run_child(w, device, args)
            if r is None:
                print(f"{name:22s} {device:6s} failed: {why}", flush=True)
                continue
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({**r, "gpu": gpu, "torch": torch.__version__, "note": why}) + "\n")
            total = ("~" if r["extrapolated"] else "") + f"{r['total_s']:.1f}"
            dev = f"{r['device_peak_gb']:.2f}" if r["device_peak_gb"] is not None else "-"
            load = f"{r['load_s']:.1f}" if r["load_s"] is not None else "-"
            print(f"{name:22s} {device:6s} {load:>6s} {r['train_s']:8.3f} {r['aggregate_s']:8.3f} {r['eval_s']:8.3f} "
                  f"{r['rounds']:>4d}/{w.rounds:<4d}{total:>9s} {r['host_peak_gb']:8.2f} {dev:>7s}  {r['target']}"
                  + (f"  ({why})" if why else ""), flush=True)


if __name__ == "__main__":
    main()
