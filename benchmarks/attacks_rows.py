"""Rows of `fedrec reproduce attacks`' poisoning table run alone, for attacks or defences added
after that command's cached runs: the same runs (ML-100K, the methods' paper settings, 20 rounds,
5% malicious clients, one target for a targeted attack, seed 0), each written as that command
caches it (`fedrec.reproduce.attacks.poison_run`).

    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-pieck \\
        --attacks pieck-ipe,pieck-uea --defences none,norm-bound,median,trimmed-mean,krum,multi-krum
    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-poisonfrs-cluster \\
        --attacks poisonfrs,clusterattack --defences none,norm-bound,median,trimmed-mean,krum,multi-krum,union
    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-personalfr \\
        --methods personalfr --protocol ratio-rating-implicit --attacks none,fedrecattack,clusterattack \\
        --defences none,norm-bound,median,trimmed-mean,krum,multi-krum,union
    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-graph \
        --methods gfedpp --set public_attackers=true --attacks fedrecattack,pieck-uea --defences none,median
    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-feddae \
        --methods feddae --engine clients_per_round=0.1 --attacks none,fedrecattack,pieck-uea \
        --defences none,norm-bound,median,trimmed-mean,krum,union
    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-regula \
        --methods fedmf,fedncf --engine client_objective=regula --boosts 10 \
        --attacks none,pieck-ipe,pieck-uea,fedrecattack

A folder's cells made under an earlier rule for the attacker's budget
(`fedrec.reproduce.attacks.budget_change`) are run again in place, each from what its file
records (method, attack, factor, defence, seed, rounds, options), with ``--rerun-stale``:

    python benchmarks/attacks_rows.py --data-dir ../shared/data/ml-100k -o results/attacks-regula --rerun-stale

It runs each cell with the code at hand: a folder kept as the record of earlier code (such as
``results/attacks-fedpergnn-plain-layer/``, the graph layer averaged plainly under the rules at
57936f8) is not one to run again.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from fedrec.data import user_sets
from fedrec.data.registry import REGISTRY
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.experiment import content_at_hand, federated_config
from fedrec.files import atomic_write
from fedrec.reproduce.attacks import (
    MAIN_SHARE,
    POISON_METHODS,
    AttackTables,
    budget_change,
    cached_figures,
    poison_config,
    poison_run,
)

#: engine options that describe an attacker, left out of a clean ("none") cell
ATTACKER_ONLY = ("attacker_norm",)


def _value(text: str) -> int | float | str:
    """An engine option's value: a whole number, a number, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def stale_cell(path: Path, blob: dict) -> dict:
    """The `poison_run` arguments of a cell file, read from what it records: the attack's name
    from its label and its factor from the file's name (``-bB``, absent at x1: explicit
    boosting's label carries no factor), the rounds from the name's ``-rN``."""
    attack = blob["attack"].split(" x")[0]
    found = re.search(rf"-{re.escape(attack)}(?:-b([^-]+))?-{re.escape(blob['defence'])}-r(\d+)-s\d+\.json$",
                      path.name)
    if found is None:
        raise ValueError(f"the name does not hold attack {attack!r} and defence {blob['defence']!r}")
    return {"method": blob["method"], "attack": attack, "boost": None if found[1] is None else float(found[1]),
            "defence": blob["defence"], "seed": blob["seed"], "share": blob["malicious"], "rounds": int(found[2]),
            "protocol": blob.get("protocol"), "model": blob.get("model") or {}, "engine": blob.get("engine") or {},
            "dataset": blob.get("dataset", "ml-100k")}


def rerun_stale(out: Path, dataset: str, data_dir: str | None) -> None:
    """Run again, in place, each cell of ``out`` on ``dataset`` made under another budget rule;
    where a file records its config, the rebuilt one must match it (less the budget), else the
    cell is left as it is and said, as is one whose name or run fails (one line each)."""
    from fedrec.reproduce.runner import config_changes

    content = content_at_hand(dataset, data_dir)
    blobs = {f: json.loads(f.read_text()) for f in sorted(out.glob("poison-*.json"))}
    stale = {f: b for f, b in blobs.items() if budget_change(b) and b.get("dataset", "ml-100k") == dataset}
    print(f"{len(stale)} cells of {out} on {dataset} made under another budget rule", flush=True)
    for path, blob in stale.items():
        try:
            a = stale_cell(path, blob)
            args = (a["method"], a["attack"], a["boost"], a["defence"], a["seed"], a["share"], a["rounds"],
                    data_dir, a["protocol"], a["model"], a["engine"], a["dataset"])
            if "config" in blob and (changes := config_changes(blob["config"], poison_config(*args))):
                raise ValueError(f"its run is not rebuilt from the file ({changes})")
            new = poison_run(*args)
        except (ValueError, FedrecError) as e:
            print(f"left {path.name}: {e}", flush=True)
            continue
        if content is not None and new["data"]["source"].get("content") not in (None, content):
            raise SystemExit(f"{path.name}: the run read other events than the copy at hand")
        atomic_write(path, lambda tmp, new=new: Path(tmp).write_text(json.dumps(new, indent=1)))
        print(path.name, {k: (blob.get(k), new.get(k)) for k in ("er@10", "hr@10")}, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--dataset", default="ml-100k", help="a registered data set (named in the file unless ML-100K)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--protocol", default=None, help="the split (default: each method's own)")
    ap.add_argument("--methods", default=",".join(POISON_METHODS))
    ap.add_argument("--attacks", help="comma-separated attacks (none: the clean run)")
    ap.add_argument("--defences", default="none", help="comma-separated defences (none: undefended)")
    ap.add_argument("--boosts", default="1,10", help="undefended runs take each; defended runs the largest")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a model option beside the method's defaults (named in the file)")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine option beside the paper setting, a number or a text such as "
                         "client_objective=regula (named in the file)")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--rerun-stale", action="store_true",
                    help="run again, in place, OUT's cells made under an earlier budget rule (nothing else)")
    args = ap.parse_args()
    if args.rerun_stale:
        if not Path(args.out).is_dir():
            ap.error(f"{args.out} is not a folder of cells")
        rerun_stale(Path(args.out), args.dataset, args.data_dir)
        return
    if not args.attacks:
        ap.error("--attacks is required (or --rerun-stale)")
    if any("=" not in kv for kv in args.set + args.engine):
        ap.error("--set and --engine take KEY=VALUE")
    model = dict(kv.split("=", 1) for kv in args.set)
    engine = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.engine)}
    attacks = [a for a in args.attacks.split(",") if a != "none"]
    try:  # an unknown data set, method or engine option (or its value) ends in one line before any cell runs
        if args.dataset not in REGISTRY and user_sets.get(args.dataset) is None:
            raise UnknownNameError("data set", args.dataset, [*REGISTRY, *user_sets.entries()])
        for method in args.methods.split(","):
            federated_config(method, args.dataset, paper=True, **engine,
                             **({"attack": attacks[0]} if attacks else {})).validate()
    except FedrecError as e:
        ap.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    boosts = [float(b) for b in args.boosts.split(",")]
    tables = AttackTables()  # what reused files say of the settings they were made with
    # the events at hand, so that a cell run on another copy is set aside and run again
    content = content_at_hand(args.dataset, args.data_dir)
    for method in args.methods.split(","):
        for attack in args.attacks.split(","):
            # the options that describe an attacker (--attacker-norm) leave the clean run as it is
            opts = {k: v for k, v in engine.items() if attack != "none" or k not in ATTACKER_ONLY}
            named = "".join(f"-{k}={v}" for k, v in sorted({**model, **opts}.items()))
            for defence in args.defences.split(","):
                for boost in (boosts if defence == "none" else [max(boosts)]):
                    b = None if boost == 1.0 or attack == "none" else boost
                    tag = "" if b is None else f"-b{b:g}"
                    where = "" if args.dataset == "ml-100k" else f"{args.dataset}-"
                    path = out / f"poison-{where}{method}{named}-{attack}{tag}-{defence}-r{args.rounds}-s{args.seed}.json"
                    ran = []

                    def run(b=b, method=method, attack=attack, defence=defence, opts=opts, ran=ran):  # type: ignore[no-untyped-def]
                        ran.append(True)
                        return poison_run(method, attack, b, defence, args.seed, MAIN_SHARE, args.rounds,
                                          args.data_dir, args.protocol, model, opts, args.dataset)

                    def planned(b=b, method=method, attack=attack, defence=defence, opts=opts):  # type: ignore[no-untyped-def]
                        return poison_config(method, attack, b, defence, args.seed, MAIN_SHARE, args.rounds,
                                             args.data_dir, args.protocol, model, opts, args.dataset)

                    blob = cached_figures(path, run, True, planned, tables, content)
                    if not ran:
                        continue
                    print(path.name, {k: blob.get(k) for k in ("er@10", "hr@10", "ndcg@10", "flag_recall")}, flush=True)
    for name, then, now, outcome in tables.set_aside:
        print(f"set aside {name}: its run read other events of {args.dataset} (content {then[:12]}) than the "
              f"copy at hand ({now[:12]}); kept as {name.removesuffix('.json')}.other-data-{then[:12]}.json, "
              + ("and the run of the copy at hand given back" if outcome == "given back" else "run again"))
    for name, changes in dict(tables.stale).items():  # a clean cell is visited once a boost
        print(f"reused {name} was made with {changes}; delete it to run it again")
    if tables.unchecked:
        print(f"{tables.unchecked} reused files record no settings: not checked against the runs they stand for")


if __name__ == "__main__":
    main()
