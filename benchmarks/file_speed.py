"""Time writing and reading a checkpoint-sized state in fedrec's safe format (`fedrec.tensorfile`:
safetensors + JSON + SHA-256) against the pickle ``torch.save`` / ``torch.load`` it replaced:
a GPFedRec-like state on ML-100K (one 1,682 x 32 item table per user, ~194 MB), medians of
``--repeats`` tries, each format in a fresh process so peak memory is its own.

    OMP_NUM_THREADS=1 python benchmarks/file_speed.py --users 943 --repeats 5

The pickle side is read as PyTorch reads by default (``weights_only=True``; the state holds
tensors, dicts, lists and numbers only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def one(fmt: str, users: int, folder: str) -> dict[str, float]:
    import torch

    from fedrec import tensorfile

    state = {"server": {"tables": torch.randn(users, 1682, 32), "items": torch.randn(1682, 32)},
             "clients": {"users": torch.randn(users, 32), "ids": torch.arange(users)},
             "history": [{"round": r, "loss": 0.1} for r in range(100)]}
    path = os.path.join(folder, f"state.{fmt}")
    start = time.perf_counter()
    if fmt == "pickle":
        torch.save(state, path)
    else:
        tensorfile.save(path, state, "checkpoint", 0)
    saved = time.perf_counter()
    if fmt == "pickle":
        back = torch.load(path, weights_only=True)
    else:
        back = tensorfile.load(path, "checkpoint", 0)
    loaded = time.perf_counter()
    assert torch.equal(back["server"]["tables"], state["server"]["tables"])
    return {"save_s": saved - start, "load_s": loaded - saved, "file_mb": os.path.getsize(path) / 2**20,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=943)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--one", nargs=2, metavar=("FORMAT", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.users, args.one[1])))
        return
    rows: dict[str, list[dict[str, float]]] = {"pickle": [], "tensorfile": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for fmt in rows:  # alternated, so both see the same machine
                out = subprocess.run([sys.executable, __file__, "--users", str(args.users), "--one", fmt, folder],
                                     capture_output=True, text=True, check=True).stdout
                rows[fmt].append(json.loads(out.strip().splitlines()[-1]))
    for fmt, got in rows.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        print(f"{fmt:>10}: save {med['save_s']:.2f} s, load {med['load_s']:.2f} s, file {med['file_mb']:.0f} MB, "
              f"peak RSS {med['peak_mb']:.0f} MB (medians of {len(got)})")


if __name__ == "__main__":
    main()
