"""UNION's client-side term where the server filter alone may fail: FedMF on ML-100K under the
papers' item-row rule (`--paper`), ClusterAttack x10 by growing shares of malicious clients, 20
rounds, seed 0; undefended, the filter alone (`--defence union`) and UNION in full (the filter
and `--client-objective union`, its default weight). One JSON a cell in OUT (a rerun does only
what is missing).

    python benchmarks/union_term_shares.py --data-dir ../shared/data/ml-100k -o results/union-term-shares
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedrec.experiment import RunConfig, federated_config, train
from fedrec.security.attacks import BUDGET_RULE

SETTINGS = {"none": {}, "filter": {"defence": "union"},
            "full": {"defence": "union", "client_objective": "union"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--shares", default="0.1,0.2,0.3")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [("clean", 0.0, s) for s in ("none", "full")]
    cells += [("clusterattack", float(p), s) for p in args.shares.split(",") for s in SETTINGS]
    for attack, share, setting in cells:
        path = out / f"union-{attack}-p{share:g}-{setting}-r{args.rounds}.json"
        if path.exists():
            continue
        opts = dict(SETTINGS[setting])
        if attack != "clean":
            opts.update(attack=attack, boost=10.0, malicious=share)
        cfg = RunConfig(algorithm="fedmf", dataset="ml-100k", seed=0, data_dir=args.data_dir,
                        federated=federated_config("fedmf", "ml-100k", paper=True, rounds=args.rounds, **opts))
        res = train(cfg).result
        last = res.history[-1].extra
        blob = {"attack": attack, "malicious": share, "setting": setting, "rounds": args.rounds,
                **({} if attack == "clean" else {"budget_rule": BUDGET_RULE}),
                "hr@10": res.test.get("hr@10"), "ndcg@10": res.test.get("ndcg@10"),
                **{k: last[k] for k in ("flagged", "flag_precision", "flag_recall") if k in last},
                "flag_recall_by_round": [h.extra.get("flag_recall") for h in res.history]}
        path.write_text(json.dumps(blob, indent=1))
        print(path.name, {k: blob.get(k) for k in ("hr@10", "ndcg@10", "flag_precision", "flag_recall")}, flush=True)


if __name__ == "__main__":
    main()
