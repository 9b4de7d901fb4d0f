"""One run, end to end: data -> preprocess -> protocol split -> model -> training -> results."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.algorithms import ALGORITHMS, AlgorithmSpec, get_algorithm
from fedrec.core.device import on
from fedrec.core.driver import run_rounds
from fedrec.core.selection import TrainOutcome
from fedrec.data.interactions import Interactions
from fedrec.data.user_sets import looks_like_a_file
from fedrec.errors import Diverged, FedrecError
from fedrec.federated.engine import FederatedConfig, engine_flag
from fedrec.files import check_writable
from fedrec.options import Options, check
from fedrec.protocols.protocol import (
    NEGATIVE_POLICIES,
    POSITIVE_AT,
    PROTOCOLS,
    ColdFallback,
    Split,
    check_cutoffs,
    get_protocol,
    make_split,
    with_cutoffs,
)
from fedrec.results import COMPLETED, DIVERGED, RoundRecord, RunResult, git_revision, peak_memory_mb
from fedrec.train.centralised import CentralisedModel, TrainConfig

_SYNTHETIC = re.compile(r"^synthetic(?::(\d+)x(\d+))?$")

#: PyTorch's seeds are unsigned 64-bit numbers (numpy's take any whole number >= 0)
SEED_LIMIT = 2**64


def check_seed(seed: object, where: str = "--seed", limit: int = SEED_LIMIT, why: str = "") -> None:
    """Refuse a seed the generators cannot take: not a whole number, negative (numpy), or from
    ``limit`` on (PyTorch's 2^64, or a narrower one a caller names with ``why``)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < limit:
        bound = f"2^{limit.bit_length() - 1}"
        raise FedrecError(f"{where} must be a whole number in [0, {bound}){why}, not {seed!r}")


@dataclass
class RunConfig:
    """Every option of `fedrec run`; stored whole in the results JSON."""

    algorithm: str
    dataset: str = "ml-100k"
    protocol: str = "loo-sampled"
    seed: int = 0
    negatives: str = "leak-free"
    tie_break: str = "later-row-later"
    #: legacy: split repeated events as they are (`fedrec.protocols.protocol.make_split`)
    repeats: bool = False
    threshold: float | None = None
    min_user: int = 0
    min_item: int = 0
    one_pass_core: bool = False
    max_users: int | None = None
    data_dir: str | None = None
    #: a user's own file as ``--dataset``: its user, item[, rating[, timestamp]] columns
    columns: str | None = None
    #: a user's data set declared inline (a bench or compare file's ``[datasets.NAME]``), as
    #: `fedrec.data.user_sets.UserDataset.to_dict` gives it: read instead of looking NAME up
    user_data: dict[str, Any] | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)
    model: dict[str, Any] = field(default_factory=dict)
    #: further cut-offs K of the ranking metrics, beside the protocol's own (``--ks``,
    #: `fedrec.protocols.protocol.with_cutoffs`); the round is still chosen by the protocol's figure
    ks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        from fedrec.data.catalogue import REGISTRY
        from fedrec.protocols.protocol import NEGATIVE_ALIASES

        self.ks = _cutoffs(self.ks, self.protocol)

        # the leaky policy's short name (as `fedrec reproduce` calls it) is recorded in full
        self.negatives = NEGATIVE_ALIASES.get(self.negatives, self.negatives)
        # a data set registered with `fedrec data add` travels with the run: worker processes,
        # Flower nodes and results files then hold which file (and which sha256) it was
        if self.user_data is None and self.columns is None and self.dataset not in REGISTRY \
                and not _SYNTHETIC.match(self.dataset) and not looks_like_a_file(self.dataset):
            from fedrec.data import user_sets

            entry = user_sets.get(self.dataset)
            if entry is not None:
                self.user_data = entry.to_dict()

    @staticmethod
    def from_dict(blob: dict[str, Any]) -> RunConfig:
        """The inverse of ``dataclasses.asdict`` (unknown keys are a `FedrecError`)."""
        blob = dict(blob)
        try:
            blob["train"] = TrainConfig(**blob.get("train", {}))
            blob["federated"] = FederatedConfig(**blob.get("federated", {}))
            unknown = sorted(set(blob) - {f.name for f in fields(RunConfig)})
            if unknown:
                raise TypeError(f"unknown option(s) {', '.join(unknown)}")
            return RunConfig(**blob)
        except TypeError as e:
            raise FedrecError(f"not a fedrec run configuration: {e}") from e

    @staticmethod
    def identity(blob: dict[str, Any]) -> dict[str, Any]:
        """``blob`` (this config as a dict) less ``repeats`` when it is off, and ``user_data``
        and ``ks`` when there are none: a default changes nothing, so a cache key or checkpoint made before
        the option existed still matches. Inline data count by content, not by path. A
        leave-one-out split of data without a time column is marked (``held_out: random``): its
        held-out items are drawn, not the latest, so results of the row-order split it replaced
        are never taken for its own."""
        from fedrec.data.user_sets import UserDataset

        out = {k: v for k, v in blob.items() if not (k in ("repeats", "user_data", "ks") and not v)}
        if out.get("user_data"):
            out["user_data"] = UserDataset.from_dict(out["user_data"], "user_data").identity
        if random_holdout(blob):
            out["held_out"] = "random"
        return out

    @property
    def trainer_field(self) -> str:
        """Which of ``federated`` and ``train`` the algorithm trains with: the one place a run
        tells a federated algorithm from a centralised one (`AlgorithmSpec.kind`)."""
        return "federated" if get_algorithm(self.algorithm).kind == "federated" else "train"

    @property
    def trainer(self) -> FederatedConfig | TrainConfig:
        """The options of the loop the algorithm trains with: the federated engine's or the
        centralised trainer's (both give ``device``, ``negatives``, ``rounds``, ``validate()``
        and ``driver()``, the round driver's settings)."""
        return getattr(self, self.trainer_field)  # type: ignore[no-any-return]

    def with_trainer(self, **changes: Any) -> RunConfig:
        """This config with ``changes`` to its trainer's options."""
        return replace(self, **{self.trainer_field: replace(self.trainer, **changes)})

    def validate(self) -> None:
        """Reject impossible options before any data is read: the data options, and the
        options of the trainer the algorithm runs with (the engine's or the centralised one's)."""
        check_seed(self.seed)
        check(
            (self.min_user < 0 or self.min_item < 0, "--min-user/--min-item must be >= 0"),
            (self.max_users is not None and self.max_users < 1, "--max-users must be >= 1"),
            (self.threshold is not None and not math.isfinite(self.threshold), "--threshold must be a finite number"),
        )
        check_cutoffs(self.ks)
        if self.negatives not in NEGATIVE_POLICIES:
            raise FedrecError(
                f"unknown negative policy '{self.negatives}'; known: {', '.join(NEGATIVE_POLICIES)}"
            )
        self.trainer.validate()


def _cutoffs(ks: Any, protocol: str) -> Any:
    """``ks`` as `check_cutoffs` gives them, less the protocol's own cut-offs (``--ks 10`` is the
    run without ``--ks``); anything else as it is, for `RunConfig.validate` to refuse in one line."""
    try:
        ks = check_cutoffs(ks)
    except FedrecError:
        return ks
    own = PROTOCOLS[protocol].ks if protocol in PROTOCOLS else ()
    return tuple(k for k in ks if k not in own)


def random_holdout(blob: dict[str, Any]) -> bool:
    """Whether a run (its config as a dict) holds out random items: a leave-one-out protocol
    on data without a time column (`fedrec.data.user_sets.has_clock`)."""
    from fedrec.data.user_sets import has_clock
    from fedrec.protocols.protocol import PROTOCOLS

    protocol = PROTOCOLS.get(str(blob.get("protocol")))
    return (protocol is not None and protocol.split == "loo"
            and not has_clock(str(blob.get("dataset")), blob.get("columns"), blob.get("user_data")))


def load_interactions(dataset: str, data_dir: str | None, seed: int,
                      columns: str | None = None, user_data: dict[str, Any] | None = None) -> Interactions:
    """The events of ``dataset``: a user's own file (``columns`` given, or a path), a data set
    declared inline (``user_data``) or registered with `fedrec data add`,
    ``synthetic[:USERSxITEMS]`` generated with the run's seed, or a built-in data set."""
    from fedrec.data import user_sets

    if columns is not None or looks_like_a_file(dataset):
        return read_own_file(dataset, columns)
    if user_data is not None:
        return user_sets.load(user_sets.UserDataset.from_dict(user_data, f"data set '{dataset}'"))
    m = _SYNTHETIC.match(dataset)
    if m:
        from fedrec.data.synthetic import synthetic

        users, items = (int(m.group(1)), int(m.group(2))) if m.group(1) else (1000, 1000)
        data = synthetic(users, items, seed=seed)
        return replace(data, source={"generator": "fedrec.data.synthetic.synthetic", "users": users,
                                     "items": items, "seed": seed})
    from fedrec.data.catalogue import REGISTRY
    from fedrec.data.registry import load

    if dataset in REGISTRY:  # built-in names come first: the catalogue never shadows them
        return load(dataset, data_dir=data_dir)
    registered = user_sets.get(dataset)
    if registered is not None:
        return user_sets.load(registered)
    raise _unknown_dataset(dataset)


def content_at_hand(dataset: str, data_dir: str | None = None, known: dict[str, str] | None = None) -> str | None:
    """The content digest (`Interactions.content_digest`) of the events a run of ``dataset``
    would read now: a built-in data set's copy found without downloading
    (`fedrec.data.registry.content_at_hand`, ``known`` as there), a registered or given file.
    None for generated data, or data not at hand or unreadable (a run fails or downloads on its
    own). What a cached run found by its name is checked against
    (`fedrec.results.set_aside_other_events`)."""
    from fedrec.data.catalogue import REGISTRY

    if _SYNTHETIC.match(dataset):
        return None
    if dataset in REGISTRY:
        from fedrec.data.registry import content_at_hand as built_in

        return built_in(dataset, data_dir, known)
    try:
        content = load_interactions(dataset, data_dir, 0).source.get("content")
    except (FedrecError, OSError):
        return None
    return None if content is None else str(content)


def check_dataset_name(dataset: str) -> None:
    """What `load_interactions` would say of an unknown ``dataset``, without reading any data:
    a file path, ``synthetic[:USERSxITEMS]``, a built-in or a registered name pass."""
    from fedrec.data import user_sets
    from fedrec.data.catalogue import REGISTRY

    if not (looks_like_a_file(dataset) or _SYNTHETIC.match(dataset) or dataset in REGISTRY or user_sets.get(dataset)):
        raise _unknown_dataset(dataset)


def _unknown_dataset(dataset: str) -> FedrecError:
    """The one error for a name that is no file, generator, built-in or registered data set."""
    from fedrec.data import user_sets
    from fedrec.data.catalogue import REGISTRY
    from fedrec.errors import UnknownNameError

    if dataset.lower().startswith("synthetic"):
        return FedrecError(f"data set '{dataset}': synthetic data is 'synthetic' (1000 x 1000) or "
                           "'synthetic:USERSxITEMS' with whole numbers, e.g. synthetic:200x300")
    return UnknownNameError("data set", dataset, [*REGISTRY, *user_sets.entries()])


def implicit_threshold(dataset: str, user_data: dict[str, Any] | None = None) -> float | None:
    """The threshold a user's data set was registered or declared with (``--implicit-threshold``;
    `RunConfig.user_data`), or None."""
    from fedrec.data import user_sets

    if user_data is None:
        return None
    return user_sets.UserDataset.from_dict(user_data, f"data set '{dataset}'").implicit_threshold


def federated_config(algorithm: str, dataset: str | None = None, protocol: str | None = None,
                     paper: bool = False, **options: Any) -> FederatedConfig:
    """Engine options for ``algorithm``: fedrec's defaults, then the algorithm's
    (`AlgorithmSpec.engine`, or its settings for ratings under a rating ``protocol``), then
    ``options`` (None means "not given").

    With ``paper`` the algorithm's paper setting replaces fedrec's defaults
    (`AlgorithmSpec.engine_for`): its item-row rule, the rates it gives for ``dataset`` and a
    fixed round budget. Where fedrec's item-row rule is not the papers', asking
    for the papers' rule (``aggregation="clients"``) takes the paper's rates too, which go with
    the rule; so do LDP and DP noise, whose noise is calibrated per round's clients, and a
    robust defence or an attack, as the attack tables ran them (the papers' setting), unless a
    rule is given (a defence and an attack run under fedrec's rules too)."""
    spec = get_algorithm(algorithm)
    known = {f.name for f in fields(FederatedConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise FedrecError(f"unknown engine option(s): {', '.join(unknown)}")
    default = FederatedConfig()
    ignored = [k for k, v in options.items()
               if k in spec.ignores and v is not None and v != getattr(default, k)]
    if options.get("attacker_norm") == "own" and "attacker_norm" not in spec.reads:
        raise FedrecError(f"'{algorithm}' does not use --attacker-norm: its attackers always make their own "
                          "estimate ('own'); the option is read by FedCA's, FedDAE's and FedCIA's")
    if ignored:
        names = ", ".join(engine_flag(k) for k in ignored)
        raise FedrecError(f"'{algorithm}' does not use {names}: {'it is' if len(ignored) == 1 else 'they are'} "
                          "not read by its training")
    if options.get("encoding") not in (None, "dense") and (options.get("ldp") or options.get("dp_noise")):
        raise FedrecError(f"--encoding {options['encoding']} is not read under --ldp or --dp-noise: a noised upload "
                          "sends every row (dense)")
    ranking = get_protocol(protocol).ranking if protocol else None
    ours = spec.engine_for(dataset, ranking)
    rule = options.get("aggregation")
    # noise is calibrated per round's clients; a defence and an attack run as the attack tables did
    papers_by_default = bool(options.get("ldp") or options.get("dp_noise") or options.get("defence")
                             or options.get("attack"))
    papers_rule = ours.get("aggregation", "clients") != "clients" and (
        rule == "clients" or (rule is None and papers_by_default))
    merged: dict[str, Any]
    if paper:
        merged = spec.engine_for(dataset, ranking, paper=True)
    elif papers_rule:  # the paper's rule and rates, with fedrec's stop and back-offs
        merged = {**ours, **spec.engine_for(dataset, ranking, paper=True)}
    else:
        merged = ours
    merged.update({k: v for k, v in options.items() if v is not None})
    return FederatedConfig(**merged)


def refuse_columns_for_a_registered_name(dataset: str) -> None:
    """``--columns`` with the name of a data set added with `fedrec data add` (no file of that
    name here): the name already carries its columns, so say that, not 'no such file'."""
    from fedrec.data import user_sets

    if not Path(dataset).exists() and user_sets.get(dataset) is not None:
        raise FedrecError(f"--dataset {dataset} is a data set you added (`fedrec data add`), which keeps "
                          "its columns: leave out --columns")


def data_files(cfg: RunConfig) -> list[str]:
    """The files a run may read its data from (its own file, a declared or registered data
    set's): never written over by its outputs."""
    return dataset_files(cfg.dataset, cfg.user_data)


def dataset_files(dataset: str, user_data: dict[str, Any] | None = None) -> list[str]:
    """`data_files` of ``-d dataset`` (and its declaration ``user_data``, where given)."""
    declared = user_data.get("path") if isinstance(user_data, dict) else None
    if declared is None and not (looks_like_a_file(dataset) or _SYNTHETIC.match(dataset)):
        from fedrec.data import user_sets

        entry = user_sets.get(dataset)
        declared = entry.path if entry is not None else None
    return [dataset] + ([str(declared)] if declared else [])


def check_own_file(path: str, columns: str | None) -> None:
    """A ``--dataset`` that names a file without ``columns``: one error saying it is missing, a
    folder, or a file whose columns must be said (with ``columns`` the reader says the rest)."""
    if columns:
        return
    if not Path(path).expanduser().exists():
        raise FedrecError(f"--dataset {path}: no such file (and no data set of that name: see `fedrec data list`)")
    if Path(path).expanduser().is_dir():
        raise FedrecError(f"--dataset {path} is a folder; give the data file in it")
    raise FedrecError(f"--dataset {path} is a file: say which columns hold what with --columns "
                      "USER,ITEM[,RATING][,TIME] (header names, or 0-based positions), or register "
                      "it once: fedrec data add NAME FILE --columns ...")


def read_own_file(path: str, columns: str | None) -> Interactions:
    """``path`` read with ``columns`` (`fedrec.data.user_sets.parse_columns`: the user, item and
    optionally rating and time columns, by header name or 0-based position)."""
    from fedrec.data import user_sets
    from fedrec.data.fetch import sha256_of

    check_own_file(path, columns)
    refuse_columns_for_a_registered_name(path)
    data = user_sets.read(path, columns)
    digest = sha256_of(Path(path))
    return replace(data, name=Path(path).stem, source={"file": str(Path(path).resolve()), "origin": "--dataset",
                                                       "sha256": digest, "content": data.content_digest()})


def prepare_split(cfg: RunConfig) -> Split:
    """Load, preprocess (as the protocol needs) and split the run's data set."""
    from fedrec.data.preprocess import PreprocessConfig, preprocess

    check_seed(cfg.seed)
    protocol = with_cutoffs(get_protocol(cfg.protocol), cfg.ks)
    threshold = cfg.threshold
    # a user's data set may say which ratings count as positive (`fedrec data add`)
    registered = implicit_threshold(cfg.dataset, cfg.user_data) if threshold is None else None
    if protocol.positive_at is not None:
        # binarised ratings: the threshold says which rated items are positive; all are kept
        at = next(t for t in (threshold, registered, POSITIVE_AT.get(cfg.dataset), protocol.positive_at)
                  if t is not None)
        protocol, threshold = replace(protocol, positive_at=at), None
    elif protocol.implicit and threshold is None:
        threshold = registered
    if threshold is not None and not protocol.implicit:
        raise FedrecError(
            f"--threshold turns ratings into implicit feedback, but protocol '{protocol.name}' "
            "evaluates explicit ratings"
        )
    raw = load_interactions(cfg.dataset, cfg.data_dir, cfg.seed, cfg.columns, cfg.user_data)
    where = f"--columns {cfg.columns!r} names" if cfg.columns is not None else f"'{cfg.dataset}' has"
    if cfg.threshold is not None and raw.implicit:
        raise FedrecError(f"--threshold {cfg.threshold:g} keeps ratings at or above it, and {where} no rating column")
    if not protocol.implicit and raw.implicit:
        # every row would be a rating of 1: an RMSE near 0, or no positive to rank
        spec = ALGORITHMS.get(cfg.algorithm)
        rankings = spec.rankings if spec is not None else ("sampled", "full")
        others = [p.name for p in PROTOCOLS.values() if p.implicit and p.ranking in rankings and p.split != "given"]
        column = " (USER,ITEM,RATING[,TIME])" if cfg.columns is not None else ""
        instead = (f"; for interactions alone take {', '.join(others)}" if others else
                   f"; {cfg.algorithm} runs on ratings alone")
        raise FedrecError(f"protocol '{protocol.name}' reads ratings, and {where} no rating column{column}{instead}")
    pre = PreprocessConfig(
        implicit=protocol.implicit, threshold=threshold,
        min_user=cfg.min_user, min_item=cfg.min_item, iterative_core=not cfg.one_pass_core,
        max_users=cfg.max_users, dedup="keep" if cfg.repeats else "last",
    )
    data = preprocess(raw, pre)
    if len(data) == 0:
        raise FedrecError(f"no interactions left in '{cfg.dataset}' after preprocessing ({pre.describe()})")
    split = make_split(data, protocol, seed=cfg.seed, negatives=cfg.negatives, tie_break=cfg.tie_break,
                       repeats=cfg.repeats)
    if cfg.ks and protocol.ranking != "sampled" and max(cfg.ks) >= split.n_items:
        raise FedrecError(f"--ks {max(cfg.ks)}: '{cfg.dataset}' has {split.n_items:,} items, so a top "
                          f"{max(cfg.ks)} holds every candidate; give cut-offs below {split.n_items:,}")
    split = replace(split, notes=preprocessing_notes(raw, data, pre) + few_candidates(split))
    trained_by = ALGORITHMS.get(cfg.algorithm)  # none for a split made without a method (the audits)
    if (protocol.ranking == "rating" and trained_by is not None and trained_by.kind == "federated"
            and cfg.federated.cold_items == "user-mean"):
        fallback = ColdFallback.user_means(split.train)
        split = replace(split, valid=replace(split.valid, fallback=fallback),
                        test=replace(split.test, fallback=fallback))
    return split


def preprocessing_notes(raw: Interactions, data: Interactions, pre: Any) -> tuple[str, ...]:
    """What preprocessing ``pre`` left out of ``raw`` to give ``data``, one line each: rows
    that repeat a (user, item) pair, and users and items filtered away."""
    notes = []
    if pre.dedup == "last" and len(raw):
        pairs = len(np.unique(raw.users.astype(np.int64) * raw.n_items + raw.items))
        if pairs < len(raw):
            notes.append(f"{len(raw) - pairs:,} rows repeat a (user, item) pair; the last of each is kept "
                         f"({pairs:,} interactions)")
    users, items = len(np.unique(raw.users)), len(np.unique(raw.items))
    if data.n_users < users or data.n_items < items:
        steps = [f"ratings >= {pre.threshold:g}" if pre.threshold is not None else "",
                 f"k-core user >= {pre.min_user}, item >= {pre.min_item}" if pre.min_user or pre.min_item else "",
                 f"first {pre.max_users} users" if pre.max_users is not None else ""]
        why = ", ".join(step for step in steps if step) or "preprocessing"
        notes.append(f"{why} kept {data.n_users:,} of {users:,} users and {data.n_items:,} of {items:,} items")
    return tuple(notes)


def few_candidates(split: Split) -> tuple[str, ...]:
    """Under full ranking, a line on the test users who rank no more candidate items than the
    metrics' largest cut-off K (they interacted with nearly every item): their top K holds every
    candidate, so their hit rate and recall are 1 whatever the model (NDCG and MRR still weigh
    where the held-out items rank)."""
    test = split.test
    if split.protocol.ranking != "full" or test.exclude is None or not len(test.users):
        return ()
    k = max(split.protocol.ks)
    candidates = split.n_items - np.diff(test.exclude.indptr)[test.users]
    few = int((candidates <= k).sum())
    if not few:
        return ()
    return (f"{few:,} of {len(test.users):,} test users rank at most {k} candidate items: every candidate is in "
            f"their top {k}, so their held-out items are found whatever the model",)


def build_trainable(cfg: RunConfig, split: Split, options: Options | None = None) -> tuple[Any, Any]:
    """The algorithm's model description (from ``options``, parsed from ``cfg.model`` if not
    given) and the `fedrec.core.Trainable` the driver trains."""
    spec = get_algorithm(cfg.algorithm)
    torch.manual_seed(cfg.seed)
    # a centralised module is built on the CPU: its initial draws come from the seeded CPU
    # generator on every device (CUDA's gives other numbers); CentralisedModel moves it
    with torch.device("cpu") if spec.kind != "federated" else nullcontext():
        model = spec.build(split, options if options is not None else cfg.model,
                           engine=cfg.federated if spec.kind == "federated" else None)
    if spec.kind == "federated":
        from fedrec.security.adversary import attach

        algorithm = model.algorithm(split, cfg.federated, cfg.seed)
        attach(algorithm, split, cfg.federated, cfg.seed, cfg.algorithm)  # the run's attack and defence, if any
        return model, algorithm
    return model, CentralisedModel(model, split, cfg.train, cfg.seed)


def recorded_config(cfg: RunConfig, options: dict[str, Any]) -> dict[str, Any]:
    """The run's options as the results JSON records them: the model options as parsed, and the
    engine's or the centralised trainer's options, whichever the algorithm runs with."""
    blob = asdict(cfg)
    blob["model"] = options
    blob["ks"] = list(cfg.ks)  # as the file holds them: a run's blob equals the blob read back
    blob.pop("train" if cfg.trainer_field == "federated" else "federated")
    return blob


def fingerprint(cfg: RunConfig, options: dict[str, Any], source: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint of this run must match to be resumed: its recorded options, less where
    the data lives, and the sha256 of the file its data were read from and the content digest
    of its events (``source``, the data's `Interactions.source`, where known): a file edited
    since is other data, a copy of the same events in another format is not
    (`fedrec.core.checkpoint`)."""
    blob = RunConfig.identity(recorded_config(cfg, options))
    blob.pop("data_dir")
    if "federated" in blob:
        blob["federated"] = FederatedConfig.identity(blob["federated"])
    from fedrec.core.checkpoint import DATA_CONTENT, DATA_SHA256

    if source and source.get("sha256"):
        blob[DATA_SHA256] = source["sha256"]
    if source and source.get("content"):
        blob[DATA_CONTENT] = source["content"]
    return blob


@dataclass
class Trained:
    """A finished run: its results, the trained model (a `fedrec.core.Trainable`) and its split."""

    result: RunResult
    model: Any
    split: Split


def run(
    cfg: RunConfig,
    out: str | Path | None = None,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> RunResult:
    """Train and evaluate ``cfg.algorithm``; write the results JSON to ``out`` if given.

    Runs write a checkpoint every ``federated.checkpoint_every`` rounds (centralised:
    ``train.checkpoint_every`` epochs) to ``checkpoint`` and, with ``resume``, continue from it.
    """
    return train(cfg, out, on_round, checkpoint, resume).result


def saving_every(cfg: RunConfig, every: int) -> RunConfig:
    """``cfg`` with its run saving itself every ``every`` rounds (centralised: epochs); how
    often is not part of a run's identity (`fedrec.core.checkpoint.FREE`)."""
    return cfg.with_trainer(checkpoint_every=every)


def run_resumable(cfg: RunConfig, out: str | Path, every: int,
                  on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None) -> RunResult:
    """`run` for a runner that keeps results by file (`fedrec bench`, `fedrec reproduce`): with
    ``every`` > 0 the run saves itself every ``every`` rounds (epochs) to ``out`` with the suffix
    ``.ckpt``, goes on from that checkpoint if an earlier, killed attempt left one (its
    fingerprint must match, `fedrec.core.checkpoint`), and removes it once ``out`` is written.
    ``on_round`` as `run`'s (a resumed run reports the rounds after its checkpoint)."""
    if not every:
        return run(cfg, out=out, on_round=on_round)
    cfg = saving_every(cfg, every)
    saved = Path(out).with_suffix(".ckpt")
    result = run(cfg, out=out, on_round=on_round, checkpoint=saved, resume=saved.exists())
    saved.unlink(missing_ok=True)
    return result


def no_negatives_under_ratings(protocol: str, algorithm: str, count: int) -> FedrecError:
    """The error for a negative count asked of a rating protocol (the CLI refuses any count
    given; `ratings_without_negatives` any but the algorithm's default, which it drops)."""
    return FedrecError(f"protocol '{protocol}' fits the observed ratings: '{algorithm}' draws no "
                       f"training negatives there (--num-negatives {count})")


def ratings_without_negatives(cfg: RunConfig, spec: AlgorithmSpec) -> RunConfig:
    """``cfg`` as it runs: under a rating protocol a federated model fits the observed ratings
    alone, so it draws no training negatives (the algorithm's default count is dropped, and
    recorded as 0; another count is an error). Ranking protocols, centralised trainers and
    algorithms that never draw negatives are left as they are."""
    if (get_protocol(cfg.protocol).ranking != "rating" or spec.kind != "federated"
            or "negatives" in spec.ignores or not cfg.federated.negatives):
        return cfg
    default = spec.engine_for(cfg.dataset).get("negatives", FederatedConfig().negatives)
    if cfg.federated.negatives != default:
        raise no_negatives_under_ratings(cfg.protocol, cfg.algorithm, cfg.federated.negatives)
    return replace(cfg, federated=replace(cfg.federated, negatives=0))


def train(
    cfg: RunConfig,
    out: str | Path | None = None,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    keep_best: bool = False,
    exclusive: bool = False,
    split: Split | None = None,
    prepare: Callable[[Any, Split], None] | None = None,
) -> Trained:
    """`run`, and also hand back the trained model (at its best validation round with
    ``keep_best``, else as the last round left it) and the split it was trained on.
    ``exclusive``: do not replace an ``out`` that another run wrote while this one trained.
    ``split``: ``cfg``'s split, already prepared (the tuner's, whose test stage is empty).
    ``prepare(trainable, split)`` is called once the trainable is built (an audit attaches its
    observer).

    A run whose loss (or scores) stops being finite is still a result: its `RunResult` (status
    ``diverged``, ``diverged_at``, the rounds before and what validation selected among them)
    is written to ``out``, then `Diverged` is raised with it as ``result``, so that each caller
    decides whether a diverged run ends its work (`fedrec run`) or is recorded and passed
    over (`fedrec bench`, `fedrec reproduce`, a tuning trial scored as the worst)."""
    start = time.perf_counter()
    revision = git_revision()  # the code this run loaded, not what HEAD holds hours later
    spec = get_algorithm(cfg.algorithm)
    cfg.validate()
    if out is not None:
        check_writable(out, reads=data_files(cfg))
    options = spec.parse(cfg.model)
    ranking = get_protocol(cfg.protocol).ranking
    if ranking not in spec.rankings:  # before any data is read
        why = ": its scores are not ratings" if ranking == "rating" else ""
        raise FedrecError(f"'{cfg.algorithm}' cannot be evaluated under protocol '{cfg.protocol}' "
                          f"({ranking}{why}); it runs under {', '.join(spec.rankings)} protocols, "
                          "see `fedrec protocols`")
    cfg = ratings_without_negatives(cfg, spec)
    split = split if split is not None else prepare_split(cfg)
    k = cfg.trainer.negatives
    if k >= split.n_items:  # drawn with replacement, but k per positive: memory grows with k
        raise FedrecError(f"training draws {k} negatives a positive (--num-negatives, the algorithm's default "
                          f"where not given) and the data has only {split.n_items} items: give --num-negatives "
                          f"below {split.n_items}, or use data with more items")
    device = cfg.trainer.device
    with on(device):  # every tensor the algorithm creates lives on the run's device
        model, trainable = build_trainable(cfg, split, options)
        if prepare is not None:
            prepare(trainable, split)
        config = recorded_config(cfg, options.values())
        driver: dict[str, Any] = {"on_round": on_round, "checkpoint": checkpoint, "resume": resume,
                                  "fingerprint": fingerprint(cfg, options.values(), split.data.source),
                                  "keep_best": keep_best}
        # the trainer's rounds, evaluation, stop and back-offs (the centralised one: always its best epoch)
        outcome, diverged = _until_divergence(lambda: run_rounds(trainable, split, **{**driver, **cfg.trainer.driver()}))
    result = RunResult(
        algorithm=cfg.algorithm,
        dataset=cfg.dataset,
        protocol=cfg.protocol,
        seed=cfg.seed,
        config=config,
        select=split.protocol.select,
        history=outcome.history,
        best_round=outcome.best_round,
        valid_at_best=outcome.valid_at_best,
        test=outcome.test,
        extra=outcome.extra,
        data={
            "users": split.n_users, "items": split.n_items, "interactions": len(split.data),
            "train": int(split.train.nnz), "valid_users": len(split.valid.users),
            "test_users": len(split.test.users), "negatives": split.negatives,
            "split": {"held_out_by": split.held_out_by}, "source": split.data.source,
        },
        wall_seconds=time.perf_counter() - start + outcome.earlier_seconds,
        resumed_at=outcome.resumed_at,
        peak_memory_mb=peak_memory_mb(),
        git_revision=revision,
        status=COMPLETED if diverged is None else DIVERGED,
        diverged_at=None if diverged is None else diverged.round,
    )
    if out is not None:
        result.write(out, exclusive=exclusive)
    if diverged is not None:
        wrote = f"; wrote {out} (status: {DIVERGED})" if out is not None else ""
        raise Diverged(f"{diverged}{wrote}", diverged.round, result) from None
    return Trained(result, trainable, split)


def _until_divergence(drive: Callable[[], TrainOutcome]) -> tuple[TrainOutcome, Diverged | None]:
    """``drive()``'s outcome, or, where training diverged, the outcome of the rounds before
    (empty where the driver did not say) and the `Diverged` error: `train` records a diverged
    run as a result before it raises the error again."""
    try:
        return drive(), None
    except Diverged as e:
        return (e.outcome if e.outcome is not None else TrainOutcome()), e
