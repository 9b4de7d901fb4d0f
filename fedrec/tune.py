"""`fedrec tune`: equal-budget hyper-parameter search on the validation split, with Optuna.

Every algorithm is tuned the same way: Optuna's TPE sampler (seeded) proposes the options of
the algorithm's search space (`search_space`), a trial trains the run's rounds and reports its
validation figure after every round, and the median pruner stops trials that fall behind
(after a quarter of the rounds). The budget counts trials that train: a setting the algorithm
refuses before its first round (`UnstableSetting`: a step that overshoots by construction) is
scored as the worst, so TPE learns to avoid it, and redrawn (at most `REFUSALS_PER_TRIAL` times
the budget), so an algorithm with such a check gets as many trained trials as one without.
A trial's value is its best validation figure, the one that selects a run's reported round.
The test split is never scored: trials train on the split with its test stage emptied
(`validation_only`), so no test figure exists to be read. ``--from-defaults`` makes the first
trial the algorithm's own settings (`defaults_trial`).

A search can outlive its process: with a ``journal`` (Optuna's journal file storage; the CLI
keeps one beside the config it will write) every finished trial is stored, and running the same
search again goes on from them (`_resume`): a trial cut off by the kill is run again with the
same settings, and the sampler is reseeded from the trials already done, so the new draws do not
repeat the old ones. A longer ``trials`` extends a finished search. With ``checkpoint_every``
each trial also saves itself every that many rounds beside the journal (`trial_checkpoints`), and
the cut-off trial goes on from its last save instead of its first round: it re-reports the saved
rounds to the pruner, whose decision reads the trial's best figure so far, so it ends as the same
trial left uncut would (a search whose trials outlast the process that runs them: an hour-long
search over 15-minute GPU leases, or two-hour trials on a CPU that a run cannot hold for long).

Trials can train side by side (``workers``, `_parallel`: a GPU's use, where one 100-round trial
leaves the device mostly idle): this process draws each trial's settings in order (Optuna's
ask-and-tell) and worker processes train them, reporting their rounds to the journal the pruner
reads; ``device`` is where trials train, not part of the config written.

The best options are written as a run config (`write_config`) that ``fedrec run --config``
reads (`read_config`): the engine options and model options a run takes, and how they were
found.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedrec.algorithms import AlgorithmSpec, get_algorithm
from fedrec.core.checkpoint import DATA_CONTENT, flatten, peek
from fedrec.errors import FedrecError, UnstableSetting
from fedrec.experiment import (
    RunConfig,
    check_seed,
    federated_config,
    fingerprint,
    prepare_split,
    saving_every,
    train,
)
from fedrec.files import atomic_write
from fedrec.progress import RoundNote, noting
from fedrec.protocols.protocol import PROTOCOLS, EvalSet, Split, get_protocol
from fedrec.results import environment, git_revision
from fedrec.train.centralised import TrainConfig

#: version 2 records a federated config's item-row rule, stopping rule and back-offs
#: (`read_config` reads version 1 as the papers' rule with a fixed budget and no back-off,
#: which its trials ran under)
CONFIG_VERSION = 2
READABLE_CONFIGS = (1, 2)
#: how many refused settings a search may redraw, per trial of its budget
REFUSALS_PER_TRIAL = 10


@dataclass(frozen=True)
class Param:
    """One searched option: an engine option (`FederatedConfig` / `TrainConfig` field) or a
    model option, drawn from ``[low, high]`` (log-uniform where ``log``; whole numbers where
    ``integer``)."""

    name: str
    where: str  # "engine" or "model"
    low: float
    high: float
    log: bool = True
    integer: bool = False
    default: float | None = None  # the algorithm's own setting (``--from-defaults``' first trial)


def search_space(spec: AlgorithmSpec, split: Split, dataset: str) -> list[Param]:
    """What is tuned: the learning rate (a decade either side of the default), the item rows'
    rate scale and the local epochs where the algorithm reads them, and the algorithm's own
    declared ranges (`AlgorithmSpec.search`: FedRAP's regularisers, and its rates, whose range
    it declares where a decade around the default would miss the rates that train)."""
    declared = dict(spec.search)
    space: list[Param] = []

    def rate(name: str, default: float) -> None:
        low, high = declared.pop(name, (default / 10, default * 10))
        space.append(Param(name, "engine", low, high, default=default))

    if spec.kind == "federated":
        engine = dataclasses.asdict(federated_config(spec.name, dataset, split.protocol.name))
        if "lr" not in spec.ignores:
            rate("lr", engine["lr"])
        if "item_lr_scale" not in spec.ignores and "lr_item" not in spec.ignores:
            rate("item_lr_scale", engine["item_lr_scale"] or split.n_items * 80.0)  # the engine's default rule
        if "local_epochs" not in spec.ignores:
            space.append(Param("local_epochs", "engine", 1, max(5, engine["local_epochs"]), log=False, integer=True,
                               default=engine["local_epochs"]))
    else:
        rate("lr", spec.lr or TrainConfig().lr)
    for name, (low, high) in declared.items():
        default = spec.defaults.get(name)
        space.append(Param(name, "model", low, high, default=default if isinstance(default, int | float) else None))
    return space


def defaults_trial(space: list[Param]) -> dict[str, float]:
    """The algorithm's own settings as a trial of ``space`` (each clipped into its range; an
    option without a numeric default is left to the sampler)."""
    return {p.name: (int if p.integer else float)(min(max(p.default, p.low), p.high))
            for p in space if p.default is not None}


def validation_only(split: Split) -> Split:
    """``split`` with an empty test stage: a tuning trial cannot score, let alone read, the test
    set."""
    shape = split.test.targets.shape
    empty = EvalSet(np.zeros(0, np.int64), sp.csr_matrix(shape, dtype=np.float32),
                    candidates=None if split.test.candidates is None else split.test.candidates[:0],
                    exclude=split.test.exclude)
    return dataclasses.replace(split, test=empty)


@dataclass
class TuneResult:
    """The search's outcome: the best options and how they were found."""

    algorithm: str
    dataset: str
    protocol: str
    negatives: str
    seed: int
    rounds: int
    metric: str
    engine: dict[str, Any]
    model: dict[str, Any]
    best_valid: float
    trials: int
    completed: int
    pruned: int
    history: list[dict[str, Any]]
    refused: int = 0  # settings refused before training and redrawn (not in ``trials``)
    from_defaults: bool = False  # the first trial was the algorithm's own settings
    #: where the search ran, read as it started (as a results file records its run): a chaotic
    #: run (GPFedRec) repeats its best trial digit for digit only on a like machine
    git_revision: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    #: the search's identity (`PlannedSearch.search`), so that a config can be told from one the
    #: same search would find now (`fedrec compare` reuses configs)
    search: dict[str, Any] | None = None

    def config(self) -> dict[str, Any]:
        """The run config `fedrec run --config` reads."""
        return {
            "fedrec_config": CONFIG_VERSION,
            "algorithm": self.algorithm, "dataset": self.dataset, "protocol": self.protocol,
            "negatives": self.negatives,
            "engine": {"rounds": self.rounds, **self.engine}, "model": self.model,
            "tuning": {"sampler": "optuna TPE", "pruner": "median", "seed": self.seed,
                       "trials": self.trials, "completed": self.completed, "pruned": self.pruned,
                       "diverged": self.trials - self.completed - self.pruned, "refused": self.refused,
                       "from_defaults": self.from_defaults,
                       "metric": f"best validation {self.metric}", "best_valid": self.best_valid,
                       "test_read": False, "history": self.history,
                       "git_revision": self.git_revision, "environment": self.environment,
                       **({"search": self.search} if self.search is not None else {})},
        }


@dataclass
class PlannedSearch:
    """What a search is before its first trial (`plan_search`)."""

    base: RunConfig  # the run every trial varies
    split: Split  # its validation split (no test targets)
    space: list[Any]  # the options drawn (`search_space`)
    rounds: int
    fixed: dict[str, Any]  # model options every trial holds
    #: the search's identity: what a journal must match to be continued, and what a config
    #: records so that a later search can tell whether it would be the same one
    search: dict[str, Any]


def plan_search(algorithm: str, dataset: str, *, rounds: int | None = None, protocol: str | None = None,
                seed: int = 0, negatives: str = "leak-free", data_dir: str | None = None,
                from_defaults: bool = False, fixed: dict[str, Any] | None = None, device: str = "cpu",
                columns: str | None = None) -> PlannedSearch:
    """The search `tune` would run with these arguments (checked; the data are read and split)."""
    spec = get_algorithm(algorithm)
    protocol = protocol or ("ratio-rating" if "sampled" not in spec.rankings and "full" not in spec.rankings
                            else "loo-sampled")
    base = RunConfig(algorithm=algorithm, dataset=dataset, protocol=protocol, seed=seed,
                     negatives=negatives, data_dir=data_dir, columns=columns)
    if spec.kind == "federated":
        base.federated = dataclasses.replace(federated_config(algorithm, dataset, protocol, rounds=rounds),
                                             device=device)
        rounds = base.federated.rounds
    else:
        base.train = TrainConfig(epochs=rounds or 100, lr=spec.lr or TrainConfig().lr, device=device)
        rounds = base.train.epochs
    base.validate()
    check_seed(seed, limit=2**32, why=" (Optuna's sampler takes no more)")
    fixed = _fixed_options(spec, fixed or {})
    split = validation_only(prepare_split(base))
    space = search_space(spec, split, dataset)
    search = {"algorithm": algorithm, "dataset": dataset, "protocol": protocol, "negatives": negatives,
              "seed": seed, "rounds": rounds, "from_defaults": from_defaults,
              "space": [[p.name, p.where, p.low, p.high, p.log, p.integer] for p in space]}
    if fixed:  # only when given, so that journals of searches without it still resume
        search["fixed"] = fixed
    search["base"] = _base_identity(base, spec, fixed, split, {(p.where, p.name) for p in space}, from_defaults)
    return PlannedSearch(base, split, space, rounds, fixed, json.loads(json.dumps(search)))


def search_changes(stored: dict[str, Any], search: dict[str, Any]) -> list[str]:
    """Where a recorded search identity (a journal's, a config's) differs from ``search``, as
    ``"key (then ..., now ...)"`` (a record from before identities held ``base`` is not
    compared on it)."""
    if "base" not in stored:
        search = {k: v for k, v in search.items() if k != "base"}
    mine, theirs = flatten(search, free=frozenset()), flatten(stored, free=frozenset())  # rounds count here
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return [f"{k} (then {theirs.get(k)!r}, now {mine.get(k)!r})" for k in changed]


def tune(algorithm: str, dataset: str, *, trials: int, rounds: int | None = None,
         protocol: str | None = None, seed: int = 0, negatives: str = "leak-free",
         data_dir: str | None = None, on_trial: Callable[[dict[str, Any]], None] | None = None,
         from_defaults: bool = False, journal: str | Path | None = None,
         on_round: Callable[[RoundNote], None] | None = None,
         fixed: dict[str, Any] | None = None, device: str = "cpu", workers: int = 1,
         checkpoint_every: int = 0, columns: str | None = None) -> TuneResult:
    """Search ``algorithm``'s options on ``dataset``'s validation split with ``trials`` trials.
    ``on_trial`` is told of each trial as it ends (its history entry), ``on_round`` of each
    round a trial ends (a `fedrec.progress.RoundNote` whose ``job`` is the trial's number).
    ``from_defaults``: the first trial is the algorithm's own settings (`defaults_trial`), so the
    search cannot end below them; it is one of the ``trials``. ``journal``: a file that stores
    each finished trial, from which the same search goes on after a kill (`_resume`).
    ``fixed``: model options every trial holds (``--set``, e.g. MetaMF's ``clip=5``), written
    into the config's model options; an option the search draws cannot also be fixed.
    ``device``: where the trials train (not part of the config written: a setting found on a
    GPU runs anywhere). ``workers``: trials trained at once, each in its own process
    (`_parallel`); they need a ``journal``, through which their pruner sees the others.
    ``checkpoint_every``: each trial saves itself every that many rounds (`trial_checkpoints`),
    so a cut-off trial goes on from its last save; it needs a ``journal``. ``columns``: ``dataset``
    is a file of one's own, read as `fedrec run --columns` reads it."""
    import optuna

    revision, started_in = git_revision(), environment()
    spec = get_algorithm(algorithm)
    if trials < 1:
        raise FedrecError("--trials must be >= 1")
    if workers < 1:
        raise FedrecError("--workers must be >= 1")
    if workers > 1 and journal is None:
        raise FedrecError("trials in parallel (--workers > 1) share their progress through a journal; pass one")
    if checkpoint_every < 0:
        raise FedrecError("--checkpoint-every must be >= 0")
    if checkpoint_every and journal is None:
        raise FedrecError("trial checkpoints (--checkpoint-every) are kept beside the search's journal; pass one")
    saves = None if not checkpoint_every else trial_checkpoints(journal)
    planned = plan_search(algorithm, dataset, rounds=rounds, protocol=protocol, seed=seed, negatives=negatives,
                          data_dir=data_dir, from_defaults=from_defaults, fixed=fixed, device=device, columns=columns)
    base, split, space, search = planned.base, planned.split, planned.space, planned.search
    protocol, rounds, fixed = base.protocol, planned.rounds, planned.fixed
    select = get_protocol(protocol).select
    maximise = select != "rmse"
    history: list[dict[str, Any]] = []

    def draw(trial: optuna.Trial) -> tuple[RunConfig, dict[str, Any]]:
        """The trial's settings, drawn here (in this process, in the trials' order), as a run
        config and the trial's history entry."""
        engine: dict[str, Any] = {}
        model: dict[str, Any] = dict(fixed)
        for p in space:
            value = (trial.suggest_int(p.name, int(p.low), int(p.high)) if p.integer
                     else trial.suggest_float(p.name, p.low, p.high, log=p.log))
            (engine if p.where == "engine" else model)[p.name] = value
        cfg = dataclasses.replace(base, model=model)
        if spec.kind == "federated":
            cfg.federated = dataclasses.replace(base.federated, **engine)
        else:
            cfg.train = dataclasses.replace(base.train, **engine)
        entry: dict[str, Any] = {"trial": trial.number, "engine": engine, "model": model}
        if "resumes" in trial.user_attrs:  # trains a trial that a kill cut off again
            entry["resumes"] = trial.user_attrs["resumes"]
        if saves is not None:
            cfg = saving_every(cfg, checkpoint_every)
        return cfg, entry

    def saved(entry: dict[str, Any]) -> Path | None:
        """Where the trial saves itself: named by the trial it continues, if any."""
        return None if saves is None else saves / f"trial-{entry.get('resumes', entry['trial'])}.ckpt"

    def tell(trial: optuna.Trial, entry: dict[str, Any]) -> None:
        trial.set_user_attr("entry", entry)  # what a resumed search rebuilds its history from
        if on_trial is not None:
            on_trial(entry)

    def objective(trial: optuna.Trial) -> float:
        cfg, entry = draw(trial)
        history.append(entry)
        noted = None if on_round is None else noting(trial.number, cfg, on_round)
        entry.update(train_trial(trial, cfg, split, select, noted, saved(entry)))
        tell(trial, entry)
        if entry["state"] == "pruned":
            raise optuna.TrialPruned()
        return trial_value(entry, maximise)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler, pruner = optuna.samplers.TPESampler(seed=seed), _pruner(rounds)
    try:
        study = optuna.create_study(
            direction="maximize" if maximise else "minimize", sampler=sampler, pruner=pruner,
            storage=None if journal is None else _journal_storage(journal),
            study_name=STUDY, load_if_exists=True,
        )
    except (ValueError, KeyError, TypeError) as e:  # a file that is not an Optuna journal
        if journal is None:
            raise
        raise FedrecError(f"--journal {journal}: not a journal of a search ({type(e).__name__}: {e}); "
                          "give another path, or remove it to start the search again") from None
    if study.trials:
        history.extend(_resume(study, search, journal, seed))
    else:
        study.set_user_attr("search", search)
        if saves is not None:  # a new journal: saves left in its folder belong to a removed one
            for stale in saves.glob("trial-*.ckpt"):
                stale.unlink()
        if from_defaults:
            study.enqueue_trial(defaults_trial(space))
    if workers > 1:
        assert journal is not None
        _parallel(study, draw, saved, tell, history, trials, workers, maximise,
                  (split, str(journal), rounds, select), on_round)
    else:
        while _wants_more(history, trials):
            study.optimize(objective, n_trials=1)
    refused = sum(h["state"] == "refused" for h in history)
    # a diverged or refused trial is scored as the worst, "complete" to Optuna
    states = [h["state"] for h in history if h["state"] != "refused"]
    scored = [h for h in history if h["state"] == "complete" and math.isfinite(trial_value(h, True))]
    if not scored:  # no config from trials that all failed, or that no round scored
        reasons = sorted({h.get("reason", h["state"] if h["state"] != "complete" else "no round scored")
                          for h in history})
        raise FedrecError(f"no trial of {algorithm} completed on {dataset} ({'; '.join(reasons)})")
    best = study.best_trial
    engine = {p.name: best.params[p.name] for p in space if p.where == "engine"}
    if spec.kind == "federated":  # the rule and stop the trials ran under, so later defaults cannot move them
        engine = {"aggregation": base.federated.aggregation, "patience": base.federated.patience,
                  "backoffs": base.federated.backoffs, **engine}
        if get_protocol(protocol).ranking == "rating":  # and the rating model they fitted
            engine = {"rating_baseline": base.federated.rating_baseline, **engine}
    model = {**fixed, **{p.name: best.params[p.name] for p in space if p.where == "model"}}
    return TuneResult(algorithm, dataset, protocol, negatives, seed, rounds, select, engine, model,
                      float(best.value), len(states), states.count("complete"), states.count("pruned"), history,
                      refused, from_defaults, revision, {**started_in, "device": device, "workers": str(workers)},
                      search)


#: the one study a journal holds
STUDY = "fedrec-tune"


def _wants_more(history: list[dict[str, Any]], trials: int, running: int = 0) -> bool:
    """Whether the search draws another trial: fewer than ``trials`` have trained or are
    training (a refused setting does not count), and the refusals are within their cap."""
    refused = sum(h["state"] == "refused" for h in history)
    return len(history) - refused + running < trials and refused < REFUSALS_PER_TRIAL * trials


def _pruner(rounds: int) -> Any:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=max(1, rounds // 4))


def trial_checkpoints(journal: str | Path) -> Path:
    """The folder beside a search's journal where its trials save themselves."""
    return Path(journal).with_suffix(".trials")


def train_trial(trial: Any, cfg: RunConfig, split: Split, select: str,
                noted: Callable[..., None] | None, checkpoint: Path | None = None) -> dict[str, Any]:
    """Train one trial, reporting its validation figure each round to the pruner; its outcome
    as history fields: ``state`` (complete, pruned, failed or refused) and the best validation
    figure and round, or the reason it did not train. ``checkpoint``: where the trial saves
    itself (``cfg`` says how often); if a cut-off run of it saved there, it goes on from that
    round (``resumed_at``), first reporting the saved rounds, and the save is removed once the
    trial ends (a kill leaves it)."""
    import optuna

    resumed = checkpoint is not None and checkpoint.exists()
    outcome: dict[str, Any] = {}
    if resumed:
        assert checkpoint is not None
        kept = peek(checkpoint)
        for h in kept["history"]:
            if h["valid"]:
                trial.report(h["valid"][select], h["round"])
        outcome["resumed_at"] = kept["round"]

    def report(record: Any, best_round: int, valid_at_best: dict[str, float]) -> None:
        if noted is not None:
            noted(record, best_round, valid_at_best)
        if record.valid:
            trial.report(record.valid[select], record.round)
            if trial.should_prune():
                raise optuna.TrialPruned()

    try:
        done = train(cfg, on_round=report, split=split, checkpoint=checkpoint, resume=resumed).result
        outcome.update(state="complete", best_valid=done.valid_at_best.get(select), best_round=done.best_round)
    except optuna.TrialPruned:
        outcome["state"] = "pruned"
    except UnstableSetting as e:  # refused before training: redrawn, not counted
        outcome.update(state="refused", reason=str(e))
    except FedrecError as e:  # diverged: a bad region of the space, not a failed search
        outcome.update(state="failed", reason=str(e))
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    return outcome


def trial_value(entry: dict[str, Any], maximise: bool) -> float:
    """What Optuna is told a finished trial scored: its best validation figure, the worst
    possible for a setting that diverged or was refused, or that no round scored."""
    best = entry.get("best_valid") if entry["state"] == "complete" else None
    if best is not None and math.isfinite(float(best)):
        return float(best)
    return -math.inf if maximise else math.inf


def _parallel(study: Any, draw: Callable[[Any], tuple[RunConfig, dict[str, Any]]],
              saved: Callable[[dict[str, Any]], Path | None], tell: Callable[[Any, dict[str, Any]], None], history: list[dict[str, Any]], trials: int,
              workers: int, maximise: bool, shared: tuple[Any, ...],
              on_round: Callable[[RoundNote], None] | None) -> None:
    """Train ``workers`` trials at once, each in a worker process of one thread (for a GPU, whose
    runs of these models leave it mostly idle one at a time: docs/scale.md).

    This process draws every trial's settings (Optuna's ask-and-tell) in the trials' order, so
    while fewer trials have finished than TPE's ten random start-up draws, the settings are
    those the one-at-a-time search draws; a worker reports each round to the journal's study,
    where the median pruner compares it with the trials finished so far (fewer than one at a
    time would have, so fewer trials are pruned); this process records each trial as it ends.
    Left by an exception, the running trials stay "running" in the journal and `_resume` runs
    them again."""
    import optuna

    from fedrec.pool import WorkerPool

    running: dict[Any, tuple[Any, dict[str, Any]]] = {}
    with WorkerPool(workers, on_round, setup=_trial_worker, setup_args=shared) as pool:
        while True:
            while len(running) < workers and _wants_more(history, trials, running=len(running)):
                trial = study.ask()
                cfg, entry = draw(trial)
                job = pool.executor.submit(_trial_job, trial._trial_id, trial.number, cfg, saved(entry))
                running[job] = (trial, entry)
            if not running:
                return
            done, _ = pool.wait(set(running))
            for future in sorted(done, key=lambda f: running[f][0].number):
                trial, entry = running.pop(future)
                entry.update(future.result())
                history.append(entry)
                tell(trial, entry)
                if entry["state"] == "pruned":
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(trial, trial_value(entry, maximise))
            history.sort(key=lambda h: h["trial"])


_shared: tuple[Any, ...] = ()  # a trial worker's split, journal, rounds and metric (`_trial_worker`)


def _trial_worker(split: Split, journal: str, rounds: int, select: str) -> None:
    """Set up a worker of `_parallel`: what every trial shares, sent once."""
    global _shared
    _shared = (split, journal, rounds, select)


def _trial_job(trial_id: int, number: int, cfg: RunConfig, checkpoint: Path | None) -> dict[str, Any]:
    """Worker: train trial ``number`` of the journal's study, one thread; its outcome fields."""
    import optuna

    from fedrec import threads
    from fedrec.pool import round_notes

    threads.apply(1)
    split, journal, rounds, select = _shared
    study = optuna.load_study(study_name=STUDY, storage=_journal_storage(journal), pruner=_pruner(rounds))
    return train_trial(optuna.Trial(study, trial_id), cfg, split, select, round_notes(number, cfg), checkpoint)


def _fixed_options(spec: AlgorithmSpec, fixed: dict[str, Any]) -> dict[str, Any]:
    """``fixed`` as the algorithm's typed options, refused before any data is read if unknown,
    malformed (rather than scored as a diverged trial) or among the model options the
    algorithm's search draws (`AlgorithmSpec.search`)."""
    if not fixed:
        return {}
    typed = spec.parse(fixed).values()
    names = [k.replace("-", "_") for k in fixed]
    searched = sorted(set(names) & set(spec.search))
    if searched:
        raise FedrecError(f"--set {', '.join(searched)}: {spec.name}'s search draws "
                          f"{'it' if len(searched) == 1 else 'them'}; fix only options it does not search")
    return {k: typed[k] for k in names}


def _journal_storage(path: str | Path) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def _resume(study: Any, search: dict[str, Any], journal: str | Path | None, seed: int) -> list[dict[str, Any]]:
    """Go on from the trials a journal stored: refuse a journal of another search, run the trial
    the kill cut off again (failed, its settings queued), reseed the sampler from the number of trials
    done (a fresh sampler seeded as before would draw the first trials' settings again), and
    return the finished trials' history entries."""
    from optuna.samplers import TPESampler
    from optuna.trial import TrialState

    stored = study.user_attrs.get("search")
    changed = search_changes(stored if isinstance(stored, dict) else {}, search)
    if changed:
        raise FedrecError(f"tune journal {journal} holds another search: {', '.join(changed[:4])}; "
                          "remove it or pass another path")
    cut = [t for t in study.trials if t.state == TrialState.RUNNING]  # killed (several: `_parallel`)
    for t in cut:
        study.tell(t.number, state=TrialState.FAIL)
    last = study.trials[-1]
    if not cut and last.state == TrialState.FAIL and "entry" not in last.user_attrs:
        cut = [last]  # interrupted (Ctrl-C fails it), not finished: again
    for t in cut:  # the same settings again, named by the first trial they were drawn for (its saves)
        study.enqueue_trial(t.params, user_attrs={"resumes": t.user_attrs.get("resumes", t.number)})
    study.sampler = TPESampler(seed=int(np.random.SeedSequence([seed, len(study.trials)]).generate_state(1)[0]))
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return [t.user_attrs["entry"] for t in done if "entry" in t.user_attrs]


#: base-run options that do not tell one search from another: where the trials train (a search
#: may go on on another device) and how often and in what chunks they save and score
NOT_SEARCH = frozenset({"device", "checkpoint_every", "memory_budget_mb"})


def _base_identity(base: RunConfig, spec: AlgorithmSpec, fixed: dict[str, Any], split: Split,
                   drawn: set[tuple[str, str]], from_defaults: bool) -> dict[str, Any]:
    """What every trial of a search shares and its other entries do not name: the base run's
    options as they resolve (defaults included, the model's with ``fixed``; `NOT_SEARCH` left
    out) and the sha256 of the data file, so that a journal is not continued, nor a config
    reused, after a default changed or the file was edited. The defaults of the ``drawn``
    options (``(where, name)``: ``engine`` or ``model``) reach a trial only ``from_defaults``
    (its first trial); otherwise they are left out."""
    blob = fingerprint(base, spec.parse(fixed).values(), split.data.source)
    blob.pop(DATA_CONTENT, None)  # a search is tied to its file, as the journals and configs written so far are
    unused = set() if from_defaults else drawn
    for part, where in (("federated", "engine"), ("train", "engine"), ("model", "model")):
        if isinstance(blob.get(part), dict):
            blob[part] = {k: v for k, v in blob[part].items() if k not in NOT_SEARCH and (where, k) not in unused}
    return json.loads(json.dumps(blob, default=str))


def write_config(result: TuneResult, path: str | Path) -> None:
    text = json.dumps(result.config(), indent=2) + "\n"
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text))


#: the type of each engine option a config sets (`fedrec run --config` and a grid's ``[tuned]``)
ENGINE_TYPES: dict[str, type] = {"rounds": int, "lr": float, "local_epochs": int, "item_lr_scale": float,
                                 "lr_item": float, "batch_size": int, "aggregation": str, "patience": int,
                                 "backoffs": int}
#: engine options whose null means "as the algorithm sets it" (`FederatedConfig`)
NULLABLE = {"lr_item", "item_lr_scale"}


def _of_type(value: Any, kind: type) -> bool:
    """``value`` is a ``kind`` as JSON writes one: a whole number for int (not true/false), any
    number for float."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)


def read_config(path: str | Path) -> dict[str, Any]:
    """A run config written by `fedrec tune` (one clear error for anything else)."""
    p = Path(path)
    try:
        blob = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: bad JSON, or not UTF-8 (a --save file given)
        raise FedrecError(f"--config {p}: not a readable fedrec config ({e})") from None
    if not isinstance(blob, dict) or blob.get("fedrec_config") not in READABLE_CONFIGS:
        raise FedrecError(f"--config {p}: not a fedrec run config (written by `fedrec tune`)")
    for key in ("algorithm", "engine", "model"):
        if key not in blob:
            raise FedrecError(f"--config {p}: no '{key}'")
    for key in ("engine", "model"):
        if not isinstance(blob[key], dict):
            raise FedrecError(f"--config {p}: '{key}' must be an object of options, not {blob[key]!r}")
    for key, value in blob["engine"].items():
        kind = ENGINE_TYPES.get(key)
        if kind is not None and not (_of_type(value, kind) or (value is None and key in NULLABLE)):
            raise FedrecError(f"--config {p}: engine.{key} must be {kind.__name__ if kind is not float else 'a number'}, "
                              f"not {value!r}")
    scalar = str | int | float | bool
    for key, value in blob["model"].items():  # a typed --set option is a list (layers=64,32)
        if not (isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))):
            raise FedrecError(f"--config {p}: model.{key} must be a number, text, true/false or a list of them, "
                              f"not {value!r}")
    if blob["fedrec_config"] == 1 and isinstance(blob["engine"], dict):
        from fedrec.algorithms import ALGORITHMS

        spec = ALGORITHMS.get(str(blob["algorithm"]))
        if spec is not None and spec.kind == "federated":
            # written before fedrec's own item-row rule, stop on validation and rating baseline:
            # its trials ran under the papers' rule with a fixed budget, the score the rating
            engine = {"aggregation": "clients", "patience": 0, "backoffs": 0}
            if blob.get("protocol") in PROTOCOLS and PROTOCOLS[blob["protocol"]].ranking == "rating":
                engine["rating_baseline"] = "none"
            blob["engine"] = {**engine, **blob["engine"]}
    return blob
