"""Where a round of a `gpu_speed.py` workload spends its time on a device: kernels or the host.

    python benchmarks/gpu_profile.py pfedrec-ml1m --device cuda --rounds 4
    py-spy record --idle -r 200 -f raw -o spy.txt -- python benchmarks/gpu_profile.py pfedrec-ml1m
    python benchmarks/gpu_profile.py --fold spy.txt          # py-spy's samples by source line
    python benchmarks/gpu_profile.py pfedrec-ml1m --cprofile  # the host's functions, without py-spy

The run's first round is a warm-up; the next ``--rounds`` run under PyTorch's profiler, which
prints the rounds' wall time beside the time the device's kernels were busy (their sum: a
device busy a small share of the wall waits for the host), the count of kernel launches and of
host<->device copies and synchronisations, and the operators that took the most device and
host time. py-spy's samples of the same script show which Python lines the host time is in;
where py-spy is not installed, ``--cprofile`` gives the host's time by function (Python's
profiler, which slows the host a little and says so in the wall time it prints).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def profile(name: str, device: str, rounds: int, split_cache: str | None, top: int, torch_profiler: bool,
            cprofile: bool = False) -> None:
    import gpu_speed
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from fedrec.core.device import on, settle
    from fedrec.core.driver import run_rounds

    w = {x.name: x for x in gpu_speed.WORKLOADS}[name]
    split, spec, cfg = gpu_speed.setup(w, device, 1 + rounds, 0, split_cache)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with on(device):
        algorithm = spec.algorithm(split, cfg, 0)
        run_rounds(algorithm, split, rounds=1, eval_every=1)  # warm-up: kernels load, caches fill
        settle()
        start = time.perf_counter()
        host = cProfile.Profile() if cprofile else None
        with torch_profile(activities=activities) if torch_profiler else contextlib.nullcontext() as prof:
            if host is not None:
                host.enable()
            _timed_rounds(algorithm, split, rounds)
            settle()
            if host is not None:
                host.disable()
        wall = (time.perf_counter() - start) / rounds
    if prof is None:
        print(f"== {name} on {device}: {wall:.3f} s a round (train + validation"
              f"{', under cProfile' if host is not None else ''})")
        if host is not None:
            stats = pstats.Stats(host, stream=sys.stdout)
            stats.sort_stats("cumulative").print_stats(r"fedrec|torch\.(sort|unique|searchsorted)", top)
            stats.sort_stats("tottime").print_stats(top)
        return
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events) / rounds
    calls = collections.Counter()
    for e in events:
        for api in ("cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize",
                    "cudaDeviceSynchronize", "cudaMemsetAsync"):
            if e.key == api:
                calls[api] += e.count // rounds
    print(f"== {name} on {device}: {wall:.3f} s a round (train + validation, under the profiler); "
          f"kernels busy {device_us / 1e6:.3f} s a round ({100 * device_us / 1e6 / wall:.0f}%)")
    print("   a round: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    if device.startswith("cuda"):
        print(events.table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=50))
    print(events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=50))


def _timed_rounds(algorithm: Any, split: Any, rounds: int) -> None:
    """The profiled rounds (`fold` keeps the samples under this frame)."""
    for r in range(2, 2 + rounds):
        algorithm.train_round(r)
        algorithm.evaluate("valid", split)


def fold(path: str, top: int) -> None:
    """py-spy's raw samples of the profiled rounds summed by frame (function and line),
    inclusive, as shares of those rounds' samples."""
    totals: collections.Counter[str] = collections.Counter()
    n = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "_timed_rounds" not in stack:
            continue
        n += int(count)
        for frame in set(stack.split(";")):
            totals[frame] += int(count)
    for frame, count in totals.most_common(top):
        print(f"{count / max(n, 1):6.1%}  {frame[:150]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", nargs="?")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=3, help="profiled rounds after one warm-up round")
    ap.add_argument("--split-cache", default=None)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-torch-profiler", action="store_true", help="time the rounds only (for py-spy)")
    ap.add_argument("--fold", metavar="SPY_RAW", help="summarise a py-spy raw file instead")
    ap.add_argument("--cprofile", action="store_true",
                    help="the host's time by function (Python's profiler; implies --no-torch-profiler)")
    args = ap.parse_args()
    if args.fold:
        fold(args.fold, args.top)
    elif args.workload:
        profile(args.workload, args.device, args.rounds, args.split_cache, args.top,
                not (args.no_torch_profiler or args.cprofile), args.cprofile)
    else:
        ap.error("name a workload (see gpu_speed.py --list) or --fold a py-spy file")


if __name__ == "__main__":
    main()
