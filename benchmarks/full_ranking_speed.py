"""Time one full-ranking evaluation (every item scored for every validation user) of a
trained federated method, the part of a full-ranking round that is not training.

    OMP_NUM_THREADS=1 python benchmarks/full_ranking_speed.py pfedrec -d lastfm-2k \
        --data-dir ../shared/data/lastfm-2k-hetrec --rounds 1 --repeats 5

Trains ``--rounds`` rounds (so dual methods hold their own rows), then prints the median of
``--repeats`` timed `fedrec.eval.evaluate.evaluate` calls on the validation stage and of the
scoring alone, with the figures, so two revisions can be compared on the same state.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrec.eval.evaluate import evaluate
from fedrec.experiment import RunConfig, federated_config, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algorithm")
    ap.add_argument("-d", "--dataset", default="ml-100k")
    ap.add_argument("--data-dir")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = RunConfig(args.algorithm, dataset=args.dataset, protocol="loo-full", data_dir=args.data_dir,
                    federated=federated_config(args.algorithm, args.dataset, "loo-full", rounds=args.rounds))
    trained = train(cfg)
    model, stage, protocol = trained.model, trained.split.valid, trained.split.protocol
    score_s, eval_s = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        model.scores(stage.users, None)
        score_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        figures = evaluate(model.scores, stage, protocol)
        eval_s.append(time.perf_counter() - t)
    print(f"{args.algorithm} {args.dataset}: {len(stage.users)} users x {trained.split.n_items} items; "
          f"scores {statistics.median(score_s):.3f} s, evaluate {statistics.median(eval_s):.3f} s "
          f"(medians of {args.repeats}); {figures}")


if __name__ == "__main__":
    main()
