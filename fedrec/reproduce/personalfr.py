"""PersonalFR's tables (Joint, FedAvg and PersonalFR; explicit RMSE and binarised NDCG) and its
communication and computation comparison against FedAvg.

Table III runs 100 and 300 clients of randomly grouped users, Table IV one user per client with
the paper's SGD (lr 0.1, momentum 0.9, weight decay 5e-4, one user a batch). Each row is two
runs: `ratio-rating` gives its RMSE, `ratio-rating-implicit` its NDCG. The paper's data sets
(ML-1M, Anime) are not on this project's machine: runs on another data set are printed beside
the paper's ML-1M figures, labelled so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from fedrec.reproduce.planned import PlannedRun

PROTOCOLS = ("ratio-rating", "ratio-rating-implicit")
#: the paper's global epochs (Table II)
ROUNDS = 800
PER_USER = (("clients", 0), ("optimizer", "sgd"))
PER_USER_ENGINE = (("batch_size", 1), ("lr", 0.1))


def tables() -> dict[str, list[PlannedRun]]:
    joint = [PlannedRun("joint", "ae", protocol=p) for p in PROTOCOLS]
    grouped = [PlannedRun(m, a, protocol=p, setting=f"clients={k}", model=(("clients", k),))
               for k in (100, 300) for m, a in (("fedavg", "fedavg-ae"), ("personalfr", "personalfr"))
               for p in PROTOCOLS]
    per_user = [PlannedRun(m, a, protocol=p, setting="per-user", model=PER_USER, engine=PER_USER_ENGINE)
                for m, a in (("fedavg", "fedavg-ae"), ("personalfr", "personalfr")) for p in PROTOCOLS]
    return {"3": joint + grouped, "4": joint + per_user}


def compression_notes(results: Iterable[dict[str, Any]]) -> list[str]:
    """Per setting: bytes and multiply-adds a round of PersonalFR against FedAvg (explicit runs;
    the same clients and batches, so the ratios are like for like)."""
    per: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r["protocol"] != "ratio-rating" or r["algorithm"] not in ("fedavg", "personalfr"):
            continue
        setting = str(r["config"].get("setting") or "")
        for h in r["history"]:
            cell = per[(setting, r["algorithm"])]
            cell["bytes"].append(h["bytes_up"] + h["bytes_down"])
            cell["macs"].append(h["extra"].get("macs", 0.0))
            cell["macs_fedrec"].append(h["extra"].get("macs_fedrec", 0.0))
    lines = []
    for setting in sorted({s for s, _ in per}):
        fa, pf = per.get((setting, "fedavg")), per.get((setting, "personalfr"))
        if not fa or not pf:
            continue
        mean = {name: {k: statistics.fmean(v) for k, v in cell.items()} for name, cell in (("fa", fa), ("pf", pf))}
        lines.append(
            f"{setting}: a round moves {mean['pf']['bytes'] / 2**20:.1f} MiB with PersonalFR against "
            f"{mean['fa']['bytes'] / 2**20:.1f} MiB with FedAvg ({mean['fa']['bytes'] / mean['pf']['bytes']:.1f}x "
            f"less; paper 2.5-27x); forward multiply-adds of a dense implementation "
            f"{mean['fa']['macs'] / mean['pf']['macs']:.2f}x fewer (paper 1.25-1.9x); fedrec itself "
            f"computes {mean['pf']['macs_fedrec'] / 1e6:.0f}M a round (rated entries only), "
            f"{mean['fa']['macs'] / max(mean['pf']['macs_fedrec'], 1):.1f}x fewer than dense FedAvg")
    return lines
