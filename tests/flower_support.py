"""What the Flower tests share: their runs on a small synthetic data set, the simulator's outcome
of a run, and the comparison of two outcomes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedrec.algorithms import get_algorithm
from fedrec.experiment import RunConfig, federated_config, prepare_split, train
from fedrec.federated.engine import run_federated

DATA = "synthetic:60x300"

AE = {"clients": 10, "hidden": "16/8"}  # PersonalFR's clients: 10 groups of 6 users
CIA = {"clients": 6, "finetune_steps": 20}  # FedCIA's clients: 6 groups of 10 users
DAE = {"hidden": "16/8", "latent": 4, "gate_hidden": 8}  # FedDAE at small widths


def make_run(alg: str, rounds: int = 3, seed: int = 3, model: dict[str, Any] | None = None,
             protocol: str = "loo-sampled", **engine: Any) -> RunConfig:
    """A short run of ``alg`` on `DATA` (the engine's options in ``engine``)."""
    dim = {"dim": 8} if "dim" in get_algorithm(alg).defaults else {}
    # small chunks (several per node) where the algorithm trains the item family's cohorts
    chunks = {} if "memory_budget_mb" in get_algorithm(alg).ignores else {"memory_budget_mb": 0.05}
    return RunConfig(alg, dataset=DATA, protocol=protocol, seed=seed, model={**dim, **(model or {})},
                     federated=federated_config(alg, rounds=rounds, **chunks, **engine))


def engine_outcome(run: RunConfig) -> Any:
    """The run's outcome on the simulator (the reference every deployment is held to)."""
    if run.federated.attack is not None:  # the security layer plugs in where a run is built
        return train(run).result
    split = prepare_split(run)
    alg = get_algorithm(run.algorithm)
    spec = alg.build(split, {**alg.defaults, **run.model})
    return run_federated(spec, split, run.federated, seed=run.seed)


def assert_same_outcome(a: Any, b: Any, rounds: int | None = None) -> None:
    """The two outcomes agree round by round: figures, loss, bytes, the best round, test.
    ``rounds``: only their first ``rounds`` rounds are compared (runs that part after them)."""
    ha, hb = a.history[:rounds], b.history[:rounds]
    assert [h.round for h in ha] == [h.round for h in hb]
    for x, y in zip(ha, hb, strict=True):
        assert x.valid.keys() == y.valid.keys()
        for k in x.valid:
            assert x.valid[k] == pytest.approx(y.valid[k], rel=1e-7, abs=1e-12), (x.round, k)
        assert x.loss == pytest.approx(y.loss, rel=1e-5)
        assert (x.bytes_up, x.bytes_down, x.rejected_uploads) == (y.bytes_up, y.bytes_down, y.rejected_uploads)
    if rounds is not None:
        return
    assert a.best_round == b.best_round
    assert a.test == pytest.approx(b.test, rel=1e-7)


def read_flower_outcome(path: Path) -> Any:
    """The outcome a Flower run wrote to ``path`` (its ``--out`` file)."""
    from fedrec.core.selection import TrainOutcome
    from fedrec.results import RoundRecord

    blob = json.loads(path.read_text())
    out = TrainOutcome()
    out.history = [RoundRecord(**h) for h in blob["history"]]
    out.best_round, out.valid_at_best, out.test = blob["best_round"], blob["valid_at_best"], blob["test"]
    return out
