"""PIECK's rows of `fedrec reproduce attacks`' poisoning table, run alone (the other rows' runs
are cached where that command ran): the same runs (ML-100K, the methods' paper settings, 20
rounds, 5% malicious clients, one target, seed 0), each written as that command caches it.

    python benchmarks/attacks_pieck.py --data-dir ../shared/data/ml-100k -o results/attacks-pieck
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fedrec.experiment import RunConfig, federated_config, train
from fedrec.reproduce.attacks import MAIN_SHARE, POISON_METHODS, _label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--defences", default="none", help="comma-separated defences (none: undefended)")
    ap.add_argument("--boosts", default="1,10")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for method in POISON_METHODS:
        for attack in ("pieck-ipe", "pieck-uea"):
            for boost in (float(b) for b in args.boosts.split(",")):
                for defence in args.defences.split(","):
                    b = None if boost == 1.0 else boost
                    tag = "" if b is None else f"-b{b:g}"
                    path = out / f"poison-{method}-{attack}{tag}-{defence}-r{args.rounds}-s{args.seed}.json"
                    if path.exists():
                        continue
                    opts = {"attack": attack, "boost": b, "malicious": MAIN_SHARE}
                    if defence != "none":
                        opts["defence"] = defence
                    cfg = RunConfig(algorithm=method, dataset="ml-100k", seed=args.seed, data_dir=args.data_dir,
                                    federated=federated_config(method, "ml-100k", paper=True, rounds=args.rounds,
                                                               **opts))
                    start = time.perf_counter()
                    res = train(cfg).result
                    last = res.history[-1].extra
                    keep = ("er@5", "er@10", "er@20", "target_ndcg@10", "flag_precision", "flag_recall")
                    blob = {"method": method, "attack": _label(attack, b), "defence": defence, "seed": args.seed,
                            "malicious": MAIN_SHARE, **{k: last[k] for k in keep if k in last},
                            "er@10_by_round": [h.extra.get("er@10") for h in res.history],
                            "hr@10": res.test.get("hr@10"), "ndcg@10": res.test.get("ndcg@10"),
                            "aggregate_seconds": float(np.mean([h.extra["aggregate_seconds"] for h in res.history])),
                            "wall_seconds": time.perf_counter() - start}
                    path.write_text(json.dumps(blob, indent=1))
                    print(path.name, {k: blob.get(k) for k in ("er@10", "hr@10", "ndcg@10")}, flush=True)


if __name__ == "__main__":
    main()
