"""The runs behind a paper's tables, executed (or reused) and summarised beside its figures.

A plan lists runs by a canonical key (method, protocol, setting); tables share runs where the
paper does (Table 2's baselines are Table 1's rows). Each run is done once per seed and
negative policy and stored as a results JSON in the output folder, so an interrupted
reproduction resumes where it stopped and a finished one re-renders instantly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrec.errors import FedrecError, UnknownNameError
from fedrec.run import RunConfig, federated_config, run

LEGACY = "legacy-exclude-heldout"
POLICY_CHOICES = {"both": ("leak-free", LEGACY), "leak-free": ("leak-free",), "legacy": (LEGACY,)}


@dataclass(frozen=True)
class PlannedRun:
    """One configuration of a reproduction (repeated over seeds and negative policies)."""

    method: str
    algorithm: str
    dual: bool = False
    protocol: str = "loo-sampled"
    setting: str = ""
    ldp: float = 0.0

    def file_name(self, negatives: str, seed: int) -> str:
        setting = f"-{self.setting}" if self.setting else ""
        return f"{self.method}{setting}-{self.protocol}-{negatives}-s{seed}.json"


def _pfedrec_tables() -> dict[str, list[PlannedRun]]:
    table1 = [PlannedRun(m, m) for m in ("fedmf", "fedncf", "fedrecon", "pfedrec")]
    dual = [PlannedRun(f"{m}+dual", m, dual=True) for m in ("fedncf", "fedrecon", "fedmf")]
    ldp = [PlannedRun("pfedrec", "pfedrec", setting=f"ldp={lam:g}", ldp=lam)
           for lam in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    full = [PlannedRun(m, m, protocol="loo-full") for m in ("fedmf", "fedncf", "fedrecon", "pfedrec")]
    return {"1": table1, "2": table1[:3] + dual, "7": ldp, "8": full}


PLANS: dict[str, Callable[[], dict[str, list[PlannedRun]]]] = {"pfedrec": _pfedrec_tables}


def plan(paper: str, tables: Iterable[str] | None = None) -> dict[str, list[PlannedRun]]:
    """The runs of the requested tables of ``paper`` (all tables when None)."""
    if paper not in PLANS:
        raise UnknownNameError("paper", paper, list(PLANS))
    everything = PLANS[paper]()
    chosen = list(everything) if tables is None else [str(t) for t in tables]
    for t in chosen:
        if t not in everything:
            raise FedrecError(f"{paper} has no reproducible table '{t}'; known: {', '.join(everything)}")
    return {t: everything[t] for t in chosen}


def execute(
    runs: Iterable[PlannedRun], *, dataset: str, seeds: Iterable[int], policies: Iterable[str],
    rounds: int, out_dir: Path, data_dir: str | None = None,
    on_run: Callable[[PlannedRun, str, int, bool], None] | None = None,
    on_fail: Callable[[PlannedRun, str, int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run (or reuse) every planned run for every policy and seed; return their result dicts.

    Each dict is labelled for `fedrec.reproduce.table.summarise`: ``algorithm`` is the
    paper's method name and ``config["setting"]`` the setting (e.g. ``ldp=0.1``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    unique = list(dict.fromkeys(runs))
    for planned in unique:
        for negatives in policies:
            for seed in seeds:
                path = out_dir / dataset / planned.file_name(negatives, seed)
                reused = path.exists()
                if on_run is not None:
                    on_run(planned, negatives, seed, reused)
                if not reused:
                    cfg = RunConfig(
                        algorithm=planned.algorithm, dataset=dataset, protocol=planned.protocol,
                        seed=seed, negatives=negatives, data_dir=data_dir,
                        model={"dim": 32, "dual": planned.dual},
                        federated=federated_config(planned.algorithm, rounds=rounds, ldp=planned.ldp),
                    )
                    try:
                        run(cfg, out=path)
                    except FedrecError as e:  # one failed run must not end the reproduction
                        if on_fail is not None:
                            on_fail(planned, negatives, seed, str(e))
                        continue
                result = json.loads(path.read_text())
                result["algorithm"] = planned.method
                result["config"]["setting"] = planned.setting
                results.append(result)
    return results
