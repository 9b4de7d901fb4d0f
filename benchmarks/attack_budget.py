"""The attacker's row budget against the honest clients' rows: the median L2 norm of the item rows
the honest clients upload in round ``--round``, beside the median of the rows the malicious
clients send at ``--boost`` 1 (ClusterAttack draws each row's length in [μ, μ + 3σ] of the
budget's rows, PIECK-IPE sends every target row at the budget, FedRecAttack clips to it).

    python benchmarks/attack_budget.py --data-dir ../shared/data/ml-100k --methods fedmf,pfedrec,fedncf

Each method in its paper setting (``--paper``) on ML-100K (or ``--dataset``), 5% malicious
clients, seed 0. docs/security.md ("The attacker's budget") quotes its output.
"""

from __future__ import annotations

import argparse

import torch

from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split
from fedrec.federated.family.model import ITEMS


def row_norms(method: str, attack: str, dataset: str, data_dir: str | None, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``rounds``' honest and malicious item-row norms (rows of zero length left out)."""
    cfg = RunConfig(algorithm=method, dataset=dataset, data_dir=data_dir, seed=0,
                    federated=federated_config(method, dataset, paper=True, rounds=rounds, attack=attack,
                                               boost=1.0, malicious=0.05))
    split = prepare_split(cfg)
    alg = build_trainable(cfg, split)[1]
    alg.keep_uploads = True
    for r in range(1, rounds + 1):
        plan = alg.plan(r)
        alg.begin_round(plan)
        uploads = alg.local_update(plan)
        if r < rounds:
            alg.aggregate(uploads, plan)
    n = split.n_users
    honest = torch.cat([u.tensors[ITEMS].norm(dim=1) for u in uploads.per_client if u.client < n])
    sent = [u.tensors[ITEMS].norm(dim=1) for u in uploads.per_client if u.client >= n]
    malicious = torch.cat(sent) if sent else torch.zeros(0)
    return honest, malicious[malicious > 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--methods", default="fedmf,pfedrec,fedncf",
                    help="methods whose uploads carry item rows (the item family, FedPerGNN)")
    ap.add_argument("--attacks", default="clusterattack,pieck-ipe,fedrecattack")
    ap.add_argument("--round", type=int, default=3, help="the round whose uploads are measured")
    args = ap.parse_args()
    print("| method | attack | honest rows: median (p90) | x1 rows: median | ratio |")
    print("|---|---|---|---|---|")
    for method in args.methods.split(","):
        for attack in args.attacks.split(","):
            honest, sent = row_norms(method, attack, args.dataset, args.data_dir, args.round)
            mid = float(sent.median()) if len(sent) else float("nan")
            print(f"| {method} | {attack} | {float(honest.median()):.3g} ({float(honest.quantile(0.9)):.3g}) "
                  f"| {mid:.3g} | {mid / float(honest.median()):.2f} |", flush=True)


if __name__ == "__main__":
    main()
