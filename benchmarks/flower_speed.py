"""Seconds per round of a loopback Flower deployment (3 and 10 SuperNodes) against fedrec's
simulator on the same run, and where the deployment's time goes.

    python benchmarks/flower_speed.py [--algorithm pfedrec] [--dataset ml-100k] [--rounds 3]
                                      [--nodes 3 10]

Prints, for each node count: the simulator's seconds a round, the same message flow in one
process (`fedrec.flower.dispatch.run_in_process`: the algorithm's work plus the nodes' overhead
of rebuilding their state from a message), and the deployment's seconds a round (train and
evaluate exchanges through the SuperLink). What a ClientApp pays for every message is measured
apart: a fresh process imports fedrec and Flower and loads the node's data split.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedrec.algorithms import get_algorithm
from fedrec.experiment import RunConfig, federated_config, prepare_split
from fedrec.federated.engine import run_federated
from fedrec.flower.dispatch import run_in_process
from fedrec.flower.launch import Loopback


def _per_round(history: list) -> float:  # type: ignore[type-arg]
    return sum(h.seconds for h in history) / len(history)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="pfedrec")
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=[3, 10])
    args = ap.parse_args()
    run = RunConfig(args.algorithm, dataset=args.dataset, protocol="loo-sampled", seed=0,
                    federated=federated_config(args.algorithm, rounds=args.rounds))
    split = prepare_split(run)
    alg = get_algorithm(args.algorithm)
    sim = run_federated(alg.build(split, alg.defaults), split, run.federated, seed=0)
    print(f"{args.algorithm} on {args.dataset}, {args.rounds} rounds, all clients a round")
    print(f"simulator: {_per_round(sim.history):.3f} s/round")

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import fedrec.flower.app"], check=True)
    imports = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c",
                    "from fedrec.flower.records import run_from_json; from fedrec.experiment import prepare_split;"
                    f"prepare_split(run_from_json({json.dumps(json.dumps(_dump(run)))}))"], check=True)
    data = time.perf_counter() - t - imports
    print(f"a ClientApp process: {imports:.2f} s to start and import, {data:.2f} s to load its split")

    for n in args.nodes:
        flow = run_in_process(run, n, split).out
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            with Loopback(n, workdir=tmp) as deployment:
                t = time.perf_counter()
                deployment.submit(run, out=out)
                wall = time.perf_counter() - t
            blob = json.loads(out.read_text())
        rounds = [h["seconds"] for h in blob["history"]]
        print(f"{n:>3} SuperNodes: in one process {_per_round(flow.history):.3f} s/round; "
              f"deployed {sum(rounds) / len(rounds):.2f} s/round (rounds {', '.join(f'{s:.1f}' for s in rounds)}), "
              f"{wall:.1f} s from `flwr run` to results")


def _dump(run: RunConfig) -> dict:  # type: ignore[type-arg]
    from dataclasses import asdict

    return asdict(run)


if __name__ == "__main__":
    main()
