"""fedrec's Python API: run an experiment, read its figures, get the trained model back,
recommend, and save or load a trained run as one file (see docs/api.md).

    import fedrec
    run = fedrec.run("pfedrec", dataset="ml-100k", rounds=20)
    run.test["hr@10"], run.best_round          # test figures at the best validation round
    run.recommend(user="196", k=10)             # raw item ids, the user's training items excluded
    run.save("pfedrec.fedrec"); again = fedrec.load("pfedrec.fedrec")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from os import PathLike
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
from fedrec.options import is_whole
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord, RunResult
from fedrec.train.centralised import TrainConfig

#: the layout of a run file's tree (`fedrec.tensorfile`); "fedrec-run/1" was the pickled one,
#: 2 re-read the data set on loading, 3 holds what recommending needs (`portable_data`)
KIND, FORMAT = "run", 3
#: the layouts `load` reads
READABLE = (2, 3)
#: what to do with a run file an older fedrec pickled
LEGACY = ("Train it again with --save (or Run.save), or, if you trust where it came from, "
          "convert it once: fedrec convert FILE")


class Run:
    """A trained run: its configuration, results, model (at the best validation round) and
    the split it was trained on."""

    def __init__(self, config: RunConfig, result: RunResult, model: Any, split: Split,
                 carries_data: bool = False) -> None:
        self.config, self.result, self.model, self.split = config, result, model, split
        self.carries_data = carries_data  # loaded from a file holding its split: no data file was read

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

    def scores(self, users: Any, items: Any = None) -> np.ndarray:
        """Scores of ``items`` (item indices, ``(len(users), C)``: row u the items to score for
        ``users[u]``; None = every item) for user indices ``users`` (0..n_users-1), each under
        its own state (a federated user's private parameters). Indices, not raw ids:
        `user_index` turns a raw id into one."""
        users = _indices(users, self.split.n_users, "users", dims=1)
        if items is not None:
            items = _indices(items, self.split.n_items, "items", dims=2)
            if len(items) != len(users):
                raise FedrecError(f"items must have a row per user: {len(users)} users, {len(items)} rows")
        with torch.no_grad(), on(self.device):
            return self.model.scores(users, items)

    def user_index(self, user: Any) -> int:
        """The index of raw user id ``user`` (compared as text, so ``196`` and ``"196"`` match;
        without the spaces around it, as a file's ids are read)."""
        ids = self.split.data.user_ids
        hit = np.flatnonzero(ids.astype(str) == str(user).strip())
        if not len(hit):
            raise FedrecError(f"user {user!r} is not in this run's data ({len(ids)} users)")
        return int(hit[0])

    def recommend(self, user: Any, k: int = 10) -> list[Any]:
        """The ``k`` best items (raw ids) for raw user id ``user``, excluding the items the user
        trained on; ties are broken by item index."""
        if not is_whole(k):
            raise FedrecError(f"k must be a whole number (got {k!r})")
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
        """Write the run (configuration, results, server and client state, and the raw ids and
        training items of its users) to one file (`fedrec.tensorfile`: tensors and JSON,
        nothing that runs when read). It needs no data file to be loaded again."""
        blob = {"config": asdict(self.config), "result": self.result.to_dict(),
                "state": self.model.state_dict(), "data": data_signature(self.split),
                "portable": portable_data(self.split)}
        _check_arguments(path=(path, str | PathLike))
        return tensorfile.save(check_writable(path, "run file"), blob, KIND, FORMAT)


def _ids(values: np.ndarray) -> np.ndarray | list[str]:
    """Raw ids as an int64 array, or as text (a JSON list) when the file's ids are not numbers."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    return [str(v) for v in values]


def portable_data(split: Split) -> dict[str, Any]:
    """What a trained run needs of its data besides the model: the raw user and item ids, each
    user's training items (with their values: the model may be built from them, and
    recommendations leave them out), and where the data came from. With these a run file is
    recommended from on another machine, with no data file at hand."""
    train = split.train.tocsr()
    return {"user_ids": _ids(split.data.user_ids), "item_ids": _ids(split.data.item_ids),
            "indptr": train.indptr.astype(np.int64), "indices": train.indices.astype(np.int64),
            "values": train.data.astype(np.float32), "implicit": bool(split.data.implicit),
            "name": split.data.name, "source": split.data.source, "negatives": split.negatives,
            "held_out_by": split.held_out_by, "positive_at": split.protocol.positive_at}


def _split_from(config: RunConfig, stored: Any, where: str) -> Split:
    """The run's split rebuilt from `portable_data`: its training matrix and ids exactly, its
    evaluation stages empty (a loaded run recommends; `fedrec run` evaluates)."""
    import dataclasses

    import scipy.sparse as sp

    from fedrec.data.interactions import Interactions
    from fedrec.protocols.negatives import ComplementSampler
    from fedrec.protocols.protocol import EvalSet, get_protocol, with_cutoffs

    try:
        user_ids, item_ids = (np.asarray(stored[k], dtype=np.int64 if isinstance(stored[k], np.ndarray) else object)
                              for k in ("user_ids", "item_ids"))
        indptr, indices, values = (np.asarray(stored[k]) for k in ("indptr", "indices", "values"))
        shape = (len(user_ids), len(item_ids))
        train = sp.csr_matrix((values.astype(np.float32), indices, indptr), shape=shape)
        train.check_format(full_check=True)
        source = stored.get("source") or {}
        if not isinstance(source, dict):
            raise TypeError(f"source is a {type(source).__name__}")
        positive_at = None if stored.get("positive_at") is None else float(stored["positive_at"])
    except (KeyError, TypeError, ValueError) as e:
        raise FedrecError(f"{where}: not a fedrec run file (its training data: {type(e).__name__}: "
                          f"{str(e)[:120]})") from None
    coo = train.tocoo()
    data = Interactions(coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data.astype(np.float32),
                        np.zeros(coo.nnz, np.int64), user_ids, item_ids, name=str(stored.get("name", config.dataset)),
                        implicit=bool(stored.get("implicit")), source=dict(source), clock=False)
    protocol = with_cutoffs(get_protocol(config.protocol), config.ks)
    if positive_at is not None:
        protocol = dataclasses.replace(protocol, positive_at=positive_at)
    empty = sp.csr_matrix(shape, dtype=np.float32)
    none = np.zeros(0, np.int64)
    sampled = protocol.ranking == "sampled"
    stage = EvalSet(none, empty, candidates=np.zeros((0, protocol.eval_negatives + 1), np.int64) if sampled else None,
                    exclude=None if sampled or protocol.ranking == "rating" else train)
    binary = sp.csr_matrix(train, dtype=bool)
    return Split(protocol, data, np.zeros(coo.nnz, np.int8), train, stage, stage,
                 str(stored.get("negatives", config.negatives)), ComplementSampler(binary, user_ids),
                 str(stored.get("held_out_by", "time")))


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
    return config.trainer.device


def load(path: str | Path, data_dir: str | None = None, device: str = "cpu") -> Run:
    """A run saved by `Run.save`, its model on ``device`` (whichever device trained it), from
    any folder and with no data file: the file holds the raw ids and each user's training
    items. (A file of the older layout 2 re-reads its data set from the configuration, from
    the registry's cache or ``data_dir``.) A loaded run recommends; its evaluation stages are
    empty (its figures are in ``result``)."""
    _check_arguments(path=(path, str | PathLike))
    check_device(device)
    blob = tensorfile.load(path, KIND, READABLE, what="run file", device=device, legacy=LEGACY)
    problem = tensorfile.entries_mismatch(SHAPE, blob)
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
    try:
        split = _split_from(config, blob["portable"], str(path)) if "portable" in blob else prepare_split(config)
    except FedrecError as e:
        raise FedrecError(e if str(path) in str(e) else f"{path}: {e}") from None
    if blob.get("data") != data_signature(split):
        if "portable" in blob:
            raise FedrecError(f"{path}: the training data it holds are not the ones the run was trained on "
                              "(users, items or training interactions differ: an edited file)")
        from fedrec.experiment import random_holdout

        if random_holdout(blob["config"]):
            raise FedrecError(f"{path}: the data prepared now are not the ones the run was trained on: its "
                              "data file changed, or (an older run file on data without a time column) its "
                              "leave-one-out split held out each user's last rows, a split no longer made "
                              "(fedrec holds out random items there); train the run again with --save")
        raise FedrecError(f"{path}: the data set prepared now ({config.dataset}"
                          f"{', from ' + data_dir if data_dir else ''}) is not the one the run was "
                          "trained on (users, items or training interactions differ)")
    with on(device):
        try:
            _, model = build_trainable(config, split)
        except FedrecError as e:  # options that cannot build on its own data: an edited file
            raise FedrecError(f"{path}: its config does not build {config.algorithm} on the data it holds ({e})") from None
        load_state(model, blob["state"], f"{path}: its state does not fit {config.algorithm} under its config")
    res = dict(blob["result"])
    known = {f.name for f in fields(RunResult)}
    try:
        res["history"] = [RoundRecord(**h) for h in res["history"]]
        result = RunResult(**{k: v for k, v in res.items() if k in known})
    except (KeyError, TypeError) as e:
        raise FedrecError(f"{path}: not a fedrec run file (result: {type(e).__name__}: {str(e)[:120]})") from None
    return Run(config, result, model, split, carries_data="portable" in blob)


#: the kind of each entry `Run.save` writes (`tensorfile.mismatch` compares a file with it)
SHAPE: dict[str, Any] = {"config": {}, "result": {"history": [], "test": {}, "best_round": 0},
                          "state": {}, "data": {}}


def _indices(values: Any, n: int, name: str, dims: int) -> np.ndarray:
    """``values`` as an int64 array of ``dims`` dimensions, each in ``0..n-1``, or one error."""
    try:
        array = np.asarray(values)
    except ValueError:  # rows of unequal length
        raise FedrecError(f"{name}: rows of unequal length; give one row of C item indices per user") from None
    if array.ndim != dims:
        shape = "a list of user indices" if dims == 1 else "a (users, C) matrix of item indices"
        raise FedrecError(f"{name} must be {shape} (got {array.ndim} dimension(s))")
    if array.size and (array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer)):
        hint = "; Run.user_index turns a raw id into one" if name == "users" else ""
        raise FedrecError(f"{name} must be whole-number indices (got {array.dtype}){hint}")
    if array.size and (array.min() < 0 or array.max() >= n):
        bad = array[(array < 0) | (array >= n)].flat[0]
        raise FedrecError(f"{name}: index {bad} is outside 0..{n - 1}")
    return array.astype(np.int64, copy=False)


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
    paper: bool = False,
    ks: Sequence[int] = (),
    **data: Any,
) -> Run:
    """Train ``algorithm`` on ``dataset`` under ``protocol`` and return the trained `Run`.

    ``options``: the algorithm's typed options (``fedrec algorithms`` lists them);
    ``engine``: engine options (federated: `fedrec.federated.engine.FederatedConfig`'s fields,
    e.g. ``clients_per_round``, ``ldp``; centralised: `TrainConfig`'s); ``rounds``: rounds
    (epochs); ``paper``: a federated algorithm's paper setting under ``engine`` instead of
    fedrec's defaults (docs/defaults.md); ``ks``: further cut-offs of the ranking metrics,
    beside the protocol's (``(20,)``: HR@20, ...; `fedrec.protocols.protocol.with_cutoffs`);
    ``data``: preprocessing options of `RunConfig` (``min_user``, ``max_users``, ...).

    A run that diverges with no back-off left (fedrec's defaults take three; a paper's setting
    none) raises `fedrec.errors.Diverged` (a `FedrecError`): its ``round``, and its
    ``result``, the `RunResult` of the rounds before (``status`` ``"diverged"``), also written
    to ``out`` when given.
    """
    from fedrec.algorithms import get_algorithm
    from fedrec.federated.engine import FederatedConfig
    from fedrec.options import typed

    spec = get_algorithm(algorithm)
    _check_arguments(dataset=(dataset, str), protocol=(protocol, str), seed=(seed, int),
                     rounds=(rounds, int | None), negatives=(negatives, str), out=(out, str | PathLike | None))
    for name, value in (("options", options), ("engine", engine)):
        if value is not None and not isinstance(value, Mapping):
            raise FedrecError(f"{name} must be a dict of KEY: VALUE (got {type(value).__name__})")
        odd = [k for k in value or {} if not isinstance(k, str)]
        if odd:
            raise FedrecError(f"{name}: its keys are option names (text), not {odd[0]!r}")
    if on_round is not None and not callable(on_round):
        raise FedrecError(f"on_round must be a function of (record, best_round, valid_at_best) or None "
                          f"(got {on_round!r})")
    own = {"algorithm", "dataset", "protocol", "seed", "negatives", "data_dir", "model", "train",
           "federated", "ks"}
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
            _check_arguments(rounds=(rounds, int))
    cfg = RunConfig(algorithm=algorithm, dataset=dataset, protocol=protocol, seed=seed,
                    negatives=negatives, data_dir=data_dir, model=dict(options or {}), ks=ks, **data)
    if paper and spec.kind != "federated":
        raise FedrecError(f"'{algorithm}' is centralised: it has no paper setting to run (paper=True)")
    if spec.kind == "federated":
        cfg.federated = federated_config(algorithm, dataset, protocol, rounds=rounds, paper=paper,
                                         **typed(FederatedConfig, engine, "engine option"))
    else:
        train_opts = typed(TrainConfig, engine, "training option")
        train_opts.setdefault("lr", spec.lr or 1e-3)
        cfg.train = TrainConfig(**{"epochs": rounds if rounds is not None else 100, **train_opts})
    done = train(cfg, out=out, on_round=on_round, keep_best=True)
    cfg.model = dict(done.result.config["model"])  # the options as parsed and used
    return Run(cfg, done.result, done.model, done.split)
