"""fedrec's Python API: run an experiment, read its figures, get the trained model back,
recommend, and save or load a trained run as one file (see docs/api.md).

    import fedrec
    run = fedrec.run("pfedrec", dataset="ml-100k", rounds=20)
    run.test["hr@10"], run.best_round          # test figures at the best validation round
    run.recommend(user="196", k=10)             # raw item ids, the user's training items excluded
    run.save("pfedrec.fedrec"); again = fedrec.load("pfedrec.fedrec")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec import tensorfile
from fedrec.core.checkpoint import load_state
from fedrec.core.device import check as check_device
from fedrec.core.device import on
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, build_trainable, federated_config, prepare_split, train
from fedrec.files import check_writable
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord, RunResult
from fedrec.train.centralised import TrainConfig

#: the layout of a run file's tree (`fedrec.tensorfile`); "fedrec-run/1" was the pickled one
KIND, FORMAT = "run", 2
#: what to do with a run file an older fedrec pickled
LEGACY = ("Train it again with --save (or Run.save), or, if you trust where it came from, "
          "convert it once: fedrec convert FILE")


class Run:
    """A trained run: its configuration, results, model (at the best validation round) and
    the split it was trained on."""

    def __init__(self, config: RunConfig, result: RunResult, model: Any, split: Split) -> None:
        self.config, self.result, self.model, self.split = config, result, model, split

    def __repr__(self) -> str:
        return (f"Run({self.config.algorithm!r} on {self.config.dataset!r}, best round "
                f"{self.best_round}, test {self.test})")

    @property
    def history(self) -> list[RoundRecord]:
        """One record per round (epoch): loss, validation figures, bytes, seconds."""
        return self.result.history

    @property
    def test(self) -> dict[str, float]:
        """Test figures at the best validation round."""
        return self.result.test

    @property
    def best_round(self) -> int:
        return self.result.best_round

    @property
    def device(self) -> str:
        """Where the model's tensors live: the run's device."""
        return run_device(self.config)

    def scores(self, users: np.ndarray, items: np.ndarray | None = None) -> np.ndarray:
        """Scores of ``items`` (``(len(users), C)``; None = every item) for user indices
        ``users``, each under its own state (a federated user's private parameters)."""
        with torch.no_grad(), on(self.device):
            return self.model.scores(np.asarray(users, dtype=np.int64), items)

    def user_index(self, user: Any) -> int:
        """The index of raw user id ``user`` (compared as text, so ``196`` and ``"196"`` match)."""
        ids = self.split.data.user_ids
        hit = np.flatnonzero(ids.astype(str) == str(user))
        if not len(hit):
            raise FedrecError(f"user {user!r} is not in this run's data ({len(ids)} users)")
        return int(hit[0])

    def recommend(self, user: Any, k: int = 10) -> list[Any]:
        """The ``k`` best items (raw ids) for raw user id ``user``, excluding the items the user
        trained on; ties are broken by item index."""
        if k < 1:
            raise FedrecError(f"k must be >= 1 (got {k})")
        u = self.user_index(user)
        scores = self.scores(np.array([u]))[0].astype(np.float64)
        seen = self.split.train.indices[self.split.train.indptr[u]: self.split.train.indptr[u + 1]]
        scores[seen] = -np.inf
        k = min(k, int(np.isfinite(scores).sum()))
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return self.split.data.item_ids[order].tolist()

    def save(self, path: str | Path) -> Path:
        """Write the run (configuration, results, server and client state) to one file
        (`fedrec.tensorfile`: tensors and JSON, nothing that runs when read)."""
        blob = {"config": asdict(self.config), "result": self.result.to_dict(),
                "state": self.model.state_dict(), "data": data_signature(self.split)}
        return tensorfile.save(check_writable(path, "run file"), blob, KIND, FORMAT)


def data_signature(split: Split) -> dict[str, Any]:
    """What identifies a run's data: sizes, raw ids and a hash of the training matrix."""
    import hashlib

    h = hashlib.sha256()
    for a in (split.train.indptr, split.train.indices, split.data.user_ids.astype(str),
              split.data.item_ids.astype(str)):
        h.update(np.ascontiguousarray(a).tobytes())
    return {"users": split.n_users, "items": split.n_items, "train": int(split.train.nnz),
            "sha256": h.hexdigest()}


def run_device(config: RunConfig) -> str:
    """The device a run's algorithm runs on (the engine's or the centralised trainer's)."""
    from fedrec.algorithms import get_algorithm

    federated = get_algorithm(config.algorithm).kind == "federated"
    return (config.federated if federated else config.train).device


def load(path: str | Path, data_dir: str | None = None, device: str = "cpu") -> Run:
    """A run saved by `Run.save`, its model on ``device`` (whichever device trained it). Its
    data set is prepared again from the configuration (from the registry's cache, or
    ``data_dir``), so the split and id maps are the ones it trained on."""
    check_device(device)
    blob = tensorfile.load(path, KIND, FORMAT, what="run file", device=device, legacy=LEGACY)
    problem = tensorfile.entries_mismatch(_SHAPE, blob)
    if problem is not None:
        raise FedrecError(f"{path}: not a fedrec run file ({problem})")
    try:
        config = RunConfig.from_dict(blob["config"])
        config.validate()
        problem = tensorfile.mismatch(asdict(RunConfig(algorithm=config.algorithm)), blob["config"], "config")
    except FedrecError as e:
        problem = f"config: {e}"
    except (TypeError, ValueError, AttributeError) as e:
        problem = f"config: {type(e).__name__}: {str(e)[:120]}"
    if problem is not None:
        raise FedrecError(f"{path}: not a fedrec run file ({problem})")
    config.federated.device = config.train.device = device
    if data_dir is not None:
        config.data_dir = data_dir
    split = prepare_split(config)
    if blob.get("data") != data_signature(split):
        raise FedrecError(f"{path}: the data set prepared now ({config.dataset}"
                          f"{', from ' + data_dir if data_dir else ''}) is not the one the run was "
                          "trained on (users, items or training interactions differ)")
    with on(device):
        _, model = build_trainable(config, split)
        load_state(model, blob["state"], f"{path}: its state does not fit {config.algorithm} under its config")
    res = dict(blob["result"])
    known = {f.name for f in fields(RunResult)}
    try:
        res["history"] = [RoundRecord(**h) for h in res["history"]]
        result = RunResult(**{k: v for k, v in res.items() if k in known})
    except (KeyError, TypeError) as e:
        raise FedrecError(f"{path}: not a fedrec run file (result: {type(e).__name__}: {str(e)[:120]})") from None
    return Run(config, result, model, split)


#: the kind of each entry `Run.save` writes (`tensorfile.mismatch` compares a file with it)
_SHAPE: dict[str, Any] = {"config": {}, "result": {"history": [], "test": {}, "best_round": 0},
                          "state": {}, "data": {}}


def _check_arguments(**given: tuple[Any, Any]) -> None:
    for name, (value, kind) in given.items():
        if isinstance(value, bool) or not isinstance(value, kind):
            raise FedrecError(f"{name} must be {getattr(kind, '__name__', str(kind))} "
                              f"(got {value!r})")


def run(
    algorithm: str,
    dataset: str = "ml-100k",
    *,
    protocol: str = "loo-sampled",
    seed: int = 0,
    rounds: int | None = None,
    options: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    negatives: str = "leak-free",
    data_dir: str | None = None,
    out: str | Path | None = None,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    **data: Any,
) -> Run:
    """Train ``algorithm`` on ``dataset`` under ``protocol`` and return the trained `Run`.

    ``options``: the algorithm's typed options (``fedrec algorithms`` lists them);
    ``engine``: engine options (federated: `fedrec.federated.engine.FederatedConfig`'s fields,
    e.g. ``clients_per_round``, ``ldp``; centralised: `TrainConfig`'s); ``rounds``: rounds
    (epochs); ``data``: preprocessing options of `RunConfig` (``min_user``, ``max_users``, ...).
    """
    from fedrec.algorithms import get_algorithm
    from fedrec.federated.engine import FederatedConfig
    from fedrec.options import typed

    spec = get_algorithm(algorithm)
    _check_arguments(dataset=(dataset, str), protocol=(protocol, str), seed=(seed, int),
                     rounds=(rounds, int | None), negatives=(negatives, str))
    for name, value in (("options", options), ("engine", engine)):
        if value is not None and not isinstance(value, Mapping):
            raise FedrecError(f"{name} must be a dict of KEY: VALUE (got {type(value).__name__})")
    own = {"algorithm", "dataset", "protocol", "seed", "negatives", "data_dir", "model", "train",
           "federated"}
    clash = sorted(set(data) & own)
    if clash:
        instead = {"model": "options", "train": "engine", "federated": "engine"}
        raise FedrecError(f"{clash[0]} is not a data option: pass it as run()'s "
                          f"{instead.get(clash[0], clash[0])} argument")
    data = typed(RunConfig, data, "data option", only={f.name for f in fields(RunConfig)} - own)
    engine = dict(engine or {})
    for key in ("rounds", "epochs"):
        if key in engine:
            if rounds is not None:
                raise FedrecError(f"give the number of rounds once: rounds={rounds} and engine {key}")
            rounds = engine.pop(key)
    cfg = RunConfig(algorithm=algorithm, dataset=dataset, protocol=protocol, seed=seed,
                    negatives=negatives, data_dir=data_dir, model=dict(options or {}), **data)
    if spec.kind == "federated":
        cfg.federated = federated_config(algorithm, dataset, protocol, rounds=rounds,
                                         **typed(FederatedConfig, engine, "engine option"))
    else:
        train_opts = typed(TrainConfig, engine, "training option")
        train_opts.setdefault("lr", spec.lr or 1e-3)
        cfg.train = TrainConfig(**{"epochs": rounds if rounds is not None else 100, **train_opts})
    done = train(cfg, out=out, on_round=on_round, keep_best=True)
    cfg.model = dict(done.result.config["model"])  # the options as parsed and used
    return Run(cfg, done.result, done.model, done.split)
