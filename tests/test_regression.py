"""Regression fixture: every registered algorithm's per-round figures at seed 0 must not move.

`tests/fixtures/regression.json` is recorded by running this module as a script
(``python tests/test_regression.py --write``; first at f35bf49, 2026-11-24). Each case runs
an algorithm for a few rounds on a small synthetic data set under a protocol it supports and
compares the loss and validation figures of every round, and the test figures at the best
validation round, with the recording. A change that moves them is a change of results, which
has to be measured and explained, not absorbed.

Cases re-recorded by a change of code, with the reason (``--write NAME ...`` rewrites only
those cases):

* FedCIA's family (fedcia, fedcia-mf, fedcia-lightgcn, fedlightgcn, stacked, lightgcn,
  fedcia+ldp) at 0a47666 (2026-11-24): its clients' initial vectors, negatives and shuffles are
  draws keyed by client id (as every other method's are), so that a Flower node trains its
  clients as the simulator does; and uploads are summed in float64. Another random stream, same
  distributions: GF-CF's cases, which draw nothing, did not move (0.00e+00).
* fedrap, fedrap-l2, fedrap-no at 88fa17f (2026-11-25): FedRAP's step sums the slots of each
  distinct row before updating it (one update a row, not one a slot), so float32 sums run in
  another order: after one local update of 10 epochs the rows differ by at most 4.8e-7 (of 1.3).
  At this case's item rate (scale 100) training is chaotic: the first round's loss moved by
  2.0e-5 relative, where a change of the item rate by 1e-7 moves it by 9e-6 (measured at
  88fa17f^); every other figure stayed within 1e-5 (fedrap-c, fedrap-d and centrap within it,
  not re-recorded; every other case 0.00e+00).
* feddae, fedvae at 2026-11-29: run at 64-wide layers (a 16-wide code and gate) instead of the
  defaults' 768/512, which took 21 s and 13 s of the suite; no code changed, and the cases at
  the default widths compared at 0.00e+00 just before.
* perfedrec, perfedrec+papers-rule at 802cd62 (2026-12-01): a cluster's row that none of its
  returning clients sent keeps its value (the official server's rule), not the new global row;
  every other case compared as before (at most 1.5e-06 relative, fedca-ncf's and metamf's
  round-off, and fedcia+ldp within its own tolerance).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "regression.json"
DATASET = "synthetic:120x240"
ROUNDS = 3
# round-off allowed between the recording and a run (float32 sums in another order)
TOLERANCE = 1e-5
#: FedCIA's trained cases: its similarity fine-tune amplifies float32 round-off by three or four
#: orders of magnitude in three rounds, so a CPU whose kernels round differently moves them more
#: than `TOLERANCE` (measured on an AVX-512 machine, with the code that last matched the
#: recording: losses up to 4.4e-4 and validation figures up to 0.010 apart, measured under ATen's
#: default, AVX2 and AVX-512 kernels alike; GF-CF's cases draw nothing and stay exact). They are
#: held to (loss, figures) tolerances ten and three times that spread; the best round exactly.
#: Still caught at these (checked): the server's target scaled by 1.2, the fine-tune skipped or
#: at half its steps.
CHAOTIC = {"fedcia", "fedcia-mf", "fedcia-lightgcn", "fedcia+ldp"}
CHAOTIC_TOLERANCE = (5e-3, 0.03)


def protocol_of(name: str) -> str:
    """A protocol the algorithm can be evaluated under: sampled ranking first, then full
    ranking, then ratings."""
    from fedrec.algorithms import get_algorithm

    rankings = get_algorithm(name).rankings
    if "sampled" in rankings and not name.startswith(("fedcia", "stacked", "fedlightgcn",
                                                       "lightgcn", "gfcf")):
        return "loo-sampled"
    if "full" in rankings:
        return "ratio-full"
    return "ratio-rating"


#: cases beyond each algorithm at its defaults: the engine's options that change its path
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "fedmf+dual": ("fedmf", {"dual": True}, {}),
    "fedmf+half-clients": ("fedmf", {}, {"clients_per_round": 0.5}),
    "pfedrec+ldp": ("pfedrec", {}, {"ldp": 0.01}),
    "pfedrec+dp": ("pfedrec", {}, {"dp_clip": 0.5, "dp_noise": 1.0}),
    "pfedrec+clip-sparse": ("pfedrec", {}, {"clip": 1.0, "encoding": "sparse"}),
    "fedncf+2-epochs": ("fedncf", {}, {"local_epochs": 2}),
    "fedcia+ldp": ("fedcia", {}, {"ldp": 0.01}),
    # fedrec's item-row rule (FedMF's and PFedRec's defaults); every other case runs its paper's
    "fedmf+samples": ("fedmf", {}, {"aggregation": "samples", "item_lr_scale": 300.0}),
    "pfedrec+samples": ("pfedrec", {}, {"aggregation": "samples", "item_lr_scale": 300.0}),
    "fedrap+samples": ("fedrap", {"curriculum": "fixed"}, {"aggregation": "samples", "lr": 1.0, "item_lr_scale": 10.0}),
    # FedPerGNN under the papers' item-row rule at the rates chosen for it (its paper setting)
    "fedpergnn+papers-rule": ("fedpergnn", {}, {}),
    # CoLR under the papers' item-row rule (the setting its attacks and LDP take, as FedMF's)
    "colr+papers-rule": ("colr", {}, {}),
    "perfedrec+papers-rule": ("perfedrec", {}, {}),
}


def case(name: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(algorithm, model options, engine options) of a recorded case."""
    if name in VARIANTS:
        return VARIANTS[name]
    engine: dict[str, Any] = {}
    if name.startswith(("fedrap", "centrap")):
        engine["item_lr_scale"] = 100.0  # the ML-100K rate diverges on 240 items
    if name == "fedpergnn":  # its defaults, recorded before it had a paper setting
        engine.update({"aggregation": "contributors", "lr": 1.0, "lr_item": 300.0})
    if name in ("colr", "perfedrec"):  # likewise (fedrec's item-row rule, at FedMF's rates)
        engine.update({"aggregation": "samples", "lr": 0.1, "item_lr_scale": 300.0})
    if name in ("feddae", "fedvae"):  # the default widths (768/512) made these 21 s and 13 s
        return name, {"hidden": "64", "latent": 16, "gate_hidden": 16}, engine
    return name, {}, engine


def figures(name: str) -> dict[str, Any]:
    """Run case ``name`` for `ROUNDS` rounds at seed 0; its per-round loss and validation
    figures and the test figures at the best validation round."""
    from fedrec.algorithms import get_algorithm
    from fedrec.experiment import RunConfig, federated_config, run
    from fedrec.train.centralised import TrainConfig

    algorithm, model, engine = case(name)
    spec = get_algorithm(algorithm)
    model = dict(model)
    if "clients" in spec.defaults and spec.defaults["clients"] not in (0, 1):
        model["clients"] = 12  # grouped clients: a dozen groups of ten users
    cfg = RunConfig(
        algorithm=algorithm, dataset=DATASET, protocol=protocol_of(algorithm), seed=0,
        model=model,
        train=TrainConfig(epochs=ROUNDS, batch_size=256, lr=float(spec.defaults.get("lr", 1e-3)),
                          patience=0),
        federated=federated_config(algorithm, rounds=ROUNDS, paper=True, **engine),
    )
    res = run(cfg)
    return {
        "protocol": cfg.protocol,
        "rounds": [{"round": h.round, "loss": h.loss, "valid": h.valid} for h in res.history],
        "best_round": res.best_round,
        "test": res.test,
    }


def _close(a: Any, b: Any, path: str, out: list[str]) -> float:
    """Largest relative difference between two nested records; mismatches appended to out."""
    if isinstance(a, dict):
        if set(a) != set(b):
            out.append(f"{path}: keys {sorted(a)} != {sorted(b)}")
            return math.inf
        return max([_close(a[k], b[k], f"{path}.{k}", out) for k in a], default=0.0)
    if isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} entries != {len(b)}")
            return math.inf
        return max([_close(x, y, f"{path}[{i}]", out) for i, (x, y) in enumerate(zip(a, b, strict=True))],
                   default=0.0)
    if isinstance(a, float) or isinstance(b, float):
        diff = abs(float(a) - float(b)) / max(1.0, abs(float(a)))
        tolerance = TOLERANCE
        if path.split(".")[0] in CHAOTIC:
            tolerance = CHAOTIC_TOLERANCE[0] if path.endswith(".loss") else CHAOTIC_TOLERANCE[1]
        if diff > tolerance:
            out.append(f"{path}: recorded {a!r}, got {b!r}")
        return diff
    if a != b:
        out.append(f"{path}: recorded {a!r}, got {b!r}")
        return math.inf
    return 0.0


def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}


@pytest.mark.parametrize("name", sorted(_recorded()))
def test_figures_match_the_recording(name):
    problems: list[str] = []
    _close(_recorded()[name], figures(name), name, problems)
    assert not problems, "\n".join(problems[:10])


def test_every_registered_algorithm_is_recorded():
    from fedrec.algorithms import ALGORITHMS

    missing = sorted(set(ALGORITHMS) - set(_recorded()) - NEW_SINCE_RECORDING)
    assert not missing, (f"no regression case for {', '.join(missing)}: record it with "
                         f"python tests/test_regression.py --write {' '.join(missing)}")


#: algorithms added after the recording; each has its own test
NEW_SINCE_RECORDING = {"fedavgm", "fedadam", "fedmf-bias"}


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    from fedrec.algorithms import ALGORITHMS

    names = sys.argv[2:] or [*ALGORITHMS, *VARIANTS]
    if sys.argv[1:2] == ["--write"]:
        got = {**(_recorded() if sys.argv[2:] else {}), **{name: figures(name) for name in names}}
        FIXTURE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FIXTURE} ({len(names)} of {len(got)} cases)")
    elif sys.argv[1:2] == ["--compare"]:
        recorded = _recorded()
        for name in (n for n in names if n in recorded):
            problems: list[str] = []
            worst = _close(recorded[name], figures(name), name, problems)
            print(f"{name:18s} largest relative difference {worst:.2e}"
                  + (f"  ({len(problems)} over tolerance)" if problems else ""))
    else:
        sys.exit("usage: python tests/test_regression.py --write|--compare [NAME ...]")
