"""The runs behind a paper's tables, executed (or reused) and summarised beside its figures.

A plan lists runs by a canonical key (method, protocol, setting); tables share runs where the
paper does (Table 2's baselines are Table 1's rows), and across papers where the configuration is
the same (FedRAP's FedMF, FedNCF and PFedRec rows reuse the PFedRec plan's runs). Each run is done once per seed and
negative policy and stored as a results JSON in the output folder, so an interrupted
reproduction resumes where it stopped and a finished one re-renders instantly.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from fedrec.algorithms import get_algorithm
from fedrec.algorithms.cia import ENGINE as CIA_ENGINE
from fedrec.algorithms.cia import LIGHTGCN_ENGINE
from fedrec.errors import FedrecError, UnknownNameError
from fedrec.experiment import RunConfig, federated_config, run_resumable
from fedrec.progress import RoundNote, noting
from fedrec.reproduce.papers import load_figures
from fedrec.reproduce.planned import PlannedRun
from fedrec.reproduce.table import POLICY_GROUPS, negatives_of
from fedrec.results import check_events, diverged, known_contents, load_result, set_aside_files
from fedrec.train.centralised import TrainConfig

LEGACY = "legacy-exclude-heldout"
#: the official code whole: its leaky negatives on its split of the raw rows, repeated events
#: included and ties as pandas' rank(method='first') (`fedrec.protocols.protocol.make_split`);
#: on Lastfm-2K a test artist is then a training positive for half of the users
LEGACY_SPLIT = "legacy-split"
POLICY_CHOICES = {"both": ("leak-free", LEGACY), "leak-free": ("leak-free",), "legacy": (LEGACY,),
                  "legacy-split": (LEGACY_SPLIT,), "all": ("leak-free", LEGACY, LEGACY_SPLIT)}
#: the `RunConfig` fields each policy choice sets
POLICY_OPTIONS: dict[str, dict[str, Any]] = {
    LEGACY_SPLIT: {"negatives": LEGACY, "repeats": True, "tie_break": "earlier-row-later"},
}


def _pfedrec_tables() -> dict[str, list[PlannedRun]]:
    table1 = [PlannedRun(m, m) for m in ("fedmf", "fedncf", "fedrecon", "pfedrec")]
    dual = [PlannedRun(f"{m}+dual", m, dual=True) for m in ("fedncf", "fedrecon", "fedmf")]
    ldp = [PlannedRun("pfedrec", "pfedrec", setting=f"ldp={lam:g}", ldp=lam)
           for lam in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    full = [PlannedRun(m, m, protocol="loo-full") for m in ("fedmf", "fedncf", "fedrecon", "pfedrec")]
    return {"1": table1, "2": table1[:3] + dual, "7": ldp, "8": full}


#: FedRAP's differential privacy (Section 4.5): each client's gradient w.r.t. C clipped to
#: tau = 0.1, Gaussian noise multiplier z = 1. The setting is named after z.
DP_SETTING = "dp=1"
DP_ENGINE: tuple[tuple[str, object], ...] = (("dp_clip", 0.1), ("dp_noise", 1.0))
CURRICULA = ("fixed", "sin", "square", "frac")


def _fedrap_tables() -> dict[str, list[PlannedRun]]:
    """FedRAP's Tables 1 and 3-6 and the runs of its Figures 5 (ablation) and 6 (curricula)."""
    fedrap = PlannedRun("fedrap", "fedrap")
    baselines = [PlannedRun(m, m) for m in ("fedmf", "fedncf", "pfedrec")]  # as in _pfedrec_tables

    def with_dp(r: PlannedRun) -> PlannedRun:
        return replace(r, setting=DP_SETTING, engine=DP_ENGINE)

    main = [PlannedRun("centrap", "centrap"), *baselines, fedrap]
    degradation = [x for r in (*baselines, fedrap) for x in (r, with_dp(r))]
    variants = [PlannedRun(m, m) for m in ("fedrap-c", "fedrap-d", "fedrap-no", "fedrap-l2")]
    curricula = [PlannedRun("fedrap", "fedrap", setting=f"curriculum={c}", model=(("curriculum", c),))
                 for c in CURRICULA]
    return {
        "1": [fedrap, with_dp(fedrap)], "3": main, "4": main, "5": degradation, "6": degradation,
        "ablation": [fedrap, *variants, baselines[2]], "curriculum": [fedrap, *curricula],
    }


#: GFed-PP's public-user ratios and personalisation levels alpha swept for its Figures 5-6
#: (the paper steps both by 0.1; a coarser grid keeps a full reproduction to hours, not days).
GFEDPP_RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0)
GFEDPP_ALPHAS = (0.1, 0.5, 0.9)
GFEDPP_LDP = (0.1, 0.2, 0.3, 0.4, 0.5)
#: The official MetaMF code's gradient clip (`torch.nn.utils.clip_grad_norm_` at 5 per client)
METAMF_CLIP = 5.0
METAMF_CLIP_SETTING = f"clip={METAMF_CLIP:g}"


def gfedpp_cell(ratio: float, alpha: float) -> PlannedRun:
    """GFed-PP at a public ratio and alpha; the registered defaults are the plain ``gfedpp`` run."""
    defaults = get_algorithm("gfedpp").defaults
    if (ratio, alpha) == (defaults["public_ratio"], defaults["alpha"]):
        return PlannedRun("gfedpp", "gfedpp")
    return PlannedRun("gfedpp", "gfedpp", setting=f"ratio={ratio:g},alpha={alpha:g}",
                      model=(("public_ratio", ratio), ("alpha", alpha)))


def _gfedpp_tables() -> dict[str, list[PlannedRun]]:
    """GFed-PP's Tables 2-4 (ML-100K rows), its public-ratio sweep (Table 6 / Figure 5) and the
    ratio x alpha grid of Figure 6. Table 2's GFed-PP row is the alpha chosen on validation among
    the all-public runs (`fedrec.reproduce.gfedpp.choose_alpha`)."""
    alpha = get_algorithm("gfedpp").defaults["alpha"]
    baselines = [PlannedRun(m, m) for m in ("fedmf", "fedncf", "fedrecon", "pfedrec", "metamf", "gpfedrec")]
    official = PlannedRun("gpfedrec", "gpfedrec", setting="official-graph",
                          model=(("similarity", "legacy-distance"),))
    # the official MetaMF clips each client's gradient at norm 5; its defaults alone diverge in
    # two of five Lastfm-2K runs (docs/leaderboard-notes.md)
    clipped = PlannedRun("metamf", "metamf", setting=METAMF_CLIP_SETTING, model=(("clip", METAMF_CLIP),))
    choose = [gfedpp_cell(1.0, a) for a in GFEDPP_ALPHAS]
    ablations = [PlannedRun(m, m) for m in ("gfedpp-no-iei", "gfedpp-no-ugc", "gfedpp-no-upie")]
    default = gfedpp_cell(1.0, alpha)
    ldp = [PlannedRun("gfedpp", "gfedpp", setting=f"ldp={d:g}", ldp=d) for d in GFEDPP_LDP]
    return {
        "2": [*baselines, official, clipped, *choose],
        "3": [*ablations, default],
        "4": [default, *ldp],
        "ratio": [gfedpp_cell(r, alpha) for r in GFEDPP_RATIOS],
        "heatmap": [gfedpp_cell(r, a) for r in GFEDPP_RATIOS for a in (GFEDPP_ALPHAS if r > 0 else (alpha,))],
    }


#: Embedding size of FedCIA's parameter models (the official code uses 512; see docs/fedcia.md).
FEDCIA_DIM = 64


def fedcia_run(method: str, backbone: str, aggregation: str, setting: str = "",
               **options: object) -> PlannedRun:
    """A FedCIA-paper run on clients that each hold a whole model (`stacked`), under ratio-full;
    LightGCN clients take 4 negatives per positive, as the registered LightGCN algorithms."""
    model = (("backbone", backbone), ("aggregation", aggregation), ("dim", FEDCIA_DIM),
             *sorted(options.items()))
    engine = tuple(sorted(LIGHTGCN_ENGINE.items())) if backbone == "lightgcn" else ()
    return PlannedRun(method, "stacked", protocol="ratio-full", setting=setting, model=model,
                      engine=engine)


#: FedCIA's stopping rule for every row of its tables (the official code stops each method after
#: 10 evaluations without a better validation F1@10, PEER-NOTES): the ``stacked`` runs register
#: it; PFedRec's and GPFedRec's rows, whose own default is no early stopping, are given it here,
#: so that no row of a table trains on for longer than the others
FEDCIA_STOPPING: tuple[tuple[str, object], ...] = (("patience", CIA_ENGINE["patience"]),)


def _fedcia_tables() -> dict[str, list[PlannedRun]]:
    """FedCIA's Table 1 (100 clients of consecutive users), Table 3 (one user per client) and the
    heterogeneous clients of its Figure 5 (MF at 128/256/512 dims; MF, MLP and LightGCN mixed)."""
    table1 = [
        fedcia_run("mf-im", "mf", "none"), fedcia_run("lightgcn-im", "lightgcn", "none"),
        fedcia_run("gfcf-im", "gfcf", "none"), fedcia_run("fedmf", "mf", "waa"),
        fedcia_run("fedncf", "mlp", "waa"),
        PlannedRun("pfedrec", "pfedrec", protocol="ratio-full", engine=FEDCIA_STOPPING),
        PlannedRun("gpfedrec", "gpfedrec", protocol="ratio-full", engine=FEDCIA_STOPPING),
        fedcia_run("fedlightgcn", "lightgcn", "waa"), fedcia_run("fedcia-mf", "mf", "cia"),
        fedcia_run("fedcia-lightgcn", "lightgcn", "cia"), fedcia_run("fedcia-gfcf", "gfcf", "cia"),
    ]
    aggregations = (("im", "none"), ("waa", "waa"), ("cia", "cia"))
    table3 = [fedcia_run(f"{b}-{a}", b, agg, "per-user", clients=0)
              for b in ("mlp", "mf") for a, agg in aggregations]
    table3.insert(2, PlannedRun("mlp-gga", "gpfedrec", protocol="ratio-full", setting="per-user",
                                engine=FEDCIA_STOPPING))
    sizes = [fedcia_run(f"mf-{a}", "mf", agg, "dims=128-256-512", dims="128/256/512")
             for a, agg in aggregations]
    mixed = [fedcia_run(f"mixed-{a}", "mixed", agg, "mf-mlp-lightgcn") for a, agg in aggregations]
    return {"1": table1, "3": table3, "hetero": sizes + mixed}


def _personalfr_tables() -> dict[str, list[PlannedRun]]:
    from fedrec.reproduce.personalfr import tables

    return tables()


PLANS: dict[str, Callable[[], dict[str, list[PlannedRun]]]] = {
    "pfedrec": _pfedrec_tables, "fedrap": _fedrap_tables, "gfedpp": _gfedpp_tables,
    "fedcia": _fedcia_tables, "personalfr": _personalfr_tables,
}

#: Rounds a paper's runs take unless the user says otherwise (others: 100)
ROUNDS: dict[str, int] = {"personalfr": 800}

#: Preprocessing a paper applies to a data set (`RunConfig` fields): PersonalFR's Anime keeps
#: users and items with 20 ratings or more (one pass) and then the first 6,000 users
DATA_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("personalfr", "anime"): {"min_user": 20, "min_item": 20, "one_pass_core": True, "max_users": 6000},
}

#: Tables drawn as convergence plots (validation metric per round), with the paper's figure.
PLOTS: dict[str, dict[str, str]] = {
    "fedrap": {"ablation": "Fig. 5 (ablation)", "curriculum": "Fig. 6 (curricula)"},
}


#: A data set that ships the paper's own split: its runs take the split's ``given-*`` protocol
#: instead of re-splitting (FedCIA's ML-1M), and the model options the paper gives for it
#: (official GF-CF beta on ML-1M: 25, against 60 on ML-100K; PEER-NOTES)
GIVEN_SPLITS: dict[tuple[str, str], tuple[dict[str, str], dict[str, dict[str, object]]]] = {
    ("fedcia", "ml-1m-fedcia"): ({"ratio-full": "given-full"}, {"gfcf": {"beta": 25.0}}),
}


def _on_given_split(run: PlannedRun, protocols: dict[str, str],
                    by_backbone: dict[str, dict[str, object]]) -> PlannedRun:
    model = dict(run.model)
    extra = by_backbone.get(str(model.get("backbone")), {})
    return replace(run, protocol=protocols.get(run.protocol, run.protocol),
                   model=tuple(sorted({**model, **extra}.items())) if extra else run.model)


def plan(paper: str, tables: Iterable[str] | None = None,
         dataset: str | None = None) -> dict[str, list[PlannedRun]]:
    """The runs of the requested tables of ``paper`` (all tables when None) on ``dataset``
    (which changes them only where it carries the paper's own split: `GIVEN_SPLITS`)."""
    if paper not in PLANS:
        raise UnknownNameError("paper", paper, list(PLANS))
    everything = PLANS[paper]()
    chosen = list(everything) if tables is None else [str(t) for t in tables]
    for t in chosen:
        if t not in everything:
            raise FedrecError(f"{paper} has no reproducible table '{t}'; known: {', '.join(everything)}")
    given = GIVEN_SPLITS.get((paper, dataset or ""))
    if given is None:
        return {t: everything[t] for t in chosen}
    return {t: [_on_given_split(r, *given) for r in everything[t]] for t in chosen}


def only_methods(chosen: dict[str, list[PlannedRun]], methods: Iterable[str]) -> dict[str, list[PlannedRun]]:
    """The tables of ``chosen`` cut to the rows of ``methods`` (tables left without a row are
    dropped); a name no table has is an error, not an empty table."""
    return _only(chosen, list(dict.fromkeys(methods)), lambda r: r.method, "row named", "rows")


#: how `only_settings` names the setting of a row that has none (the algorithm's defaults)
DEFAULT_SETTING = "default"


def only_settings(chosen: dict[str, list[PlannedRun]], settings: Iterable[str]) -> dict[str, list[PlannedRun]]:
    """The tables of ``chosen`` cut to the rows of ``settings`` (as result files name them, e.g.
    ``ratio=1,alpha=0.9``; `DEFAULT_SETTING` for a row without one), so that one cell of a
    sweep can be run alone; a setting no row has is an error, not an empty table."""
    return _only(chosen, list(dict.fromkeys(settings)), lambda r: r.setting or DEFAULT_SETTING,
                 "row with setting", "settings")


def _only(chosen: dict[str, list[PlannedRun]], wanted: list[str], name: Callable[[PlannedRun], str],
          what: str, known_as: str) -> dict[str, list[PlannedRun]]:
    known = {name(r) for runs in chosen.values() for r in runs}
    if not wanted:
        raise FedrecError(f"no {known_as} given; {known_as}: {'; '.join(sorted(known))}")
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise FedrecError(f"no {what} {', '.join(unknown)} in these tables; {known_as}: {'; '.join(sorted(known))}")
    cut = {t: [r for r in runs if name(r) in wanted] for t, runs in chosen.items()}
    return {t: runs for t, runs in cut.items() if runs}


#: `RunConfig` fields that say where and how a run was kept, not what it measured
NOT_COMPARED = frozenset({"data_dir", "checkpoint_every", "device", "memory_budget_mb"})


def config_changes(stored: dict[str, Any], planned: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Where a result file's config differs from the run the plan would make now, as
    ``{"federated.patience": (stored, planned)}``: a reused file is taken by its name, and its name
    does not hold every setting (a plan's rule changed since, or another ``--rounds``).

    Fields missing from the file (written before they existed) are not compared, nor
    `NOT_COMPARED`; model options are compared as they resolve now, defaults included
    (`AlgorithmSpec.changed_options`).
    """
    now = json.loads(json.dumps(asdict(planned)))
    changes: dict[str, tuple[Any, Any]] = {}
    for name in stored.keys() & now.keys() - NOT_COMPARED:
        old, new = stored[name], now[name]
        if name == "model":
            try:
                resolved = get_algorithm(planned.algorithm).changed_options(planned.model, old)
            except FedrecError:  # an option the plan sets that the algorithm no longer has
                resolved = {}
            changes.update({f"model.{k}": v for k, v in resolved.items()})
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes.update({f"{name}.{k}": (old[k], new[k]) for k in old.keys() & new.keys() - NOT_COMPARED
                            if old[k] != new[k]})
        elif old != new:
            changes[name] = (old, new)
    return dict(sorted(changes.items()))


def execute(
    runs: Iterable[PlannedRun], *, dataset: str, seeds: Iterable[int], policies: Iterable[str],
    rounds: int, out_dir: Path, data_dir: str | None = None,
    on_run: Callable[[PlannedRun, str, int, bool], None] | None = None,
    on_fail: Callable[[PlannedRun, str, int, str], None] | None = None,
    run_missing: bool = True, data_options: dict[str, Any] | None = None, checkpoint_every: int = 0,
    workers: int = 1, on_progress: Callable[[PlannedRun, str, int, RoundNote], None] | None = None,
    device: str = "cpu",
    on_stale: Callable[[PlannedRun, str, int, dict[str, tuple[Any, Any]]], None] | None = None,
    patience: int | None = None,
    on_set_aside: Callable[[Path, str, str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run (or reuse) every planned run for every policy and seed; return their result dicts.

    Each dict is labelled for `fedrec.reproduce.table.summarise`: ``algorithm`` is the
    paper's method name and ``config["setting"]`` the setting (e.g. ``ldp=0.1``). With
    ``run_missing`` False, runs without a result file are left out instead of run.
    ``data_options`` are preprocessing fields of `RunConfig` (see `DATA_OPTIONS`).
    ``checkpoint_every``: each run saves itself every N rounds (epochs) beside its result file
    (``.ckpt``) and a run killed part-way goes on from there the next time; the checkpoint is
    removed once the result is written. ``workers`` > 1 runs the missing runs side by side in
    that many processes of one thread each (`fedrec.pool`). ``on_run`` reports each run as it
    ends (``on_fail`` one that failed), in turn or side by side alike; reused runs are
    reported after the runs.
    ``on_progress`` is told of every round (epoch) a run ends (`fedrec.progress.RoundNote`), in
    this process whichever process runs it. ``device`` is where every run trains (cpu, cuda);
    a result file records its machine, not its device in its name, so a run found on disk is
    reused whichever device made it. One failed run never ends the reproduction.
    ``on_stale`` is told of each reused file whose config differs from the run the plan would
    make now (`config_changes`); its result is still used: deleting the file runs it again.
    ``patience`` replaces every run's stopping rule (evaluations without a better validation
    figure; 0: never stop early) for a sensitivity check; file names do not hold it, so such
    runs belong in an ``out_dir`` of their own.
    A run that diverges is reported to ``on_fail`` and still returned, from the results file it
    wrote (``status: diverged``; `fedrec.experiment.train`), so that its table says it diverged
    (`fedrec.reproduce.table.summarise`); a later reproduction reuses it as it reuses any result.
    A file is found by its name, which does not say where the data set's copy lives, so a reused
    file whose run read other events than the copy at hand (an edited or filtered file, another
    release: its recorded content digest differs) is set aside as ``<name>.other-data-<digest>.json``
    and its run is missing again, or given back from an earlier set-aside file of the copy at
    hand (`fedrec.results.set_aside_other_events`); with ``run_missing`` False nothing is renamed
    and such a file is left out. ``on_set_aside(path, then, now, outcome)`` is told of each, with
    both digests and ``run again``, ``given back`` or ``left out``. The copy is looked at only
    when a result file is there, without downloading (hashed, not parsed, when its bytes are
    those the results record); one not at hand is not checked.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = [(planned, negatives, seed) for planned in dict.fromkeys(runs)
            for negatives in policies for seed in seeds]

    def path_of(key: tuple[PlannedRun, str, int]) -> Path:
        planned, negatives, seed = key
        return out_dir / dataset / planned.file_name(negatives, seed)

    def config_of(key: tuple[PlannedRun, str, int]) -> RunConfig:
        planned, negatives, seed = key
        options = POLICY_OPTIONS.get(negatives, {"negatives": negatives})
        stop = {} if patience is None else {"patience": patience}
        return RunConfig(
            algorithm=planned.algorithm, dataset=dataset, protocol=planned.protocol,
            seed=seed, data_dir=data_dir, **options, **(data_options or {}),
            model=_model_options(planned), train=TrainConfig(device=device, **stop),
            federated=federated_config(planned.algorithm, dataset, planned.protocol, paper=True, rounds=rounds,
                                       ldp=planned.ldp, device=device, **{**dict(planned.engine), **stop}),
        )

    left_out = _check_events([path_of(key) for key in keys], dataset, data_dir, run_missing, on_set_aside)
    # one run a file: a later planned run of the same file name reuses its result
    first: dict[Path, tuple[PlannedRun, str, int]] = {}
    for key in keys if run_missing else []:
        if not path_of(key).exists():
            first.setdefault(path_of(key), key)
    todo, jobs = [], []
    for key in first.values():
        try:
            jobs.append((config_of(key), path_of(key)))
            todo.append(key)
        except FedrecError as e:
            if on_fail is not None:
                on_fail(*key, str(e))
    if workers > 1 and len(jobs) > 1:
        from fedrec.pool import run_files

        def on_note(note: RoundNote) -> None:
            if on_progress is not None:
                on_progress(*todo[note.job], note)

        notes = on_note if on_progress is not None else None
        for i, reason in run_files(jobs, workers, checkpoint_every, on_round=notes):
            if reason is None and on_run is not None:
                on_run(*todo[i], False)
            elif reason is not None:
                _drop_diverged_checkpoint(path_of(todo[i]))
                if on_fail is not None:
                    on_fail(*todo[i], reason)
    else:
        for i, (key, (cfg, path)) in enumerate(zip(todo, jobs, strict=True)):
            on_round = None if on_progress is None else noting(i, cfg, partial(on_progress, *key))
            try:
                run_resumable(cfg, path, checkpoint_every, on_round=on_round)
            except FedrecError as e:  # one failed run must not end the reproduction
                _drop_diverged_checkpoint(path)
                if on_fail is not None:
                    on_fail(*key, str(e))
            else:
                if on_run is not None:
                    on_run(*key, False)
    ran = set(first.values())
    results = []
    for key in keys:
        path = path_of(key)
        if not path.exists() or path in left_out:  # not run (--reuse-only), failed, or of other events
            continue
        if key not in ran and on_run is not None:
            on_run(*key, True)
        result = load_result(path)  # a diverged run's too: its table says it diverged
        if key not in ran and on_stale is not None:
            try:
                changes = config_changes(result["config"], config_of(key))
            except FedrecError:  # the plan's run is not valid any more: nothing to compare with
                changes = {}
            if changes:
                on_stale(*key, changes)
        result["algorithm"] = key[0].method
        result["config"]["setting"] = key[0].setting
        results.append(result)
    return results


def _check_events(paths: list[Path], dataset: str, data_dir: str | None, rename: bool,
                  on_set_aside: Callable[[Path, str, str, str], None] | None) -> set[Path]:
    """Set aside each of ``paths`` whose run read other events of ``dataset`` than the copy at
    hand, and give back set-aside results of that copy; without ``rename``, rename nothing and
    return the paths of other events instead, to be left out (see `execute`)."""
    from fedrec.experiment import content_at_hand

    paths = list(dict.fromkeys(paths))
    cached = [path for path in paths if path.exists()]
    if not cached and not (rename and any(set_aside_files(path) for path in paths)):
        return set()  # nothing cached: the runs read the data themselves
    now = content_at_hand(dataset, data_dir, known_contents(load_result(path) for path in cached))
    if now is None:
        return set()
    left_out = set()
    for path in paths:
        then, outcome = check_events(path, now, rename)
        if then is not None and outcome == "left out":
            left_out.add(path)
        if then is not None and on_set_aside is not None:
            on_set_aside(path, then, now, outcome)
    return left_out


def _drop_diverged_checkpoint(path: Path) -> None:
    """A run that diverged wrote its results (status ``diverged``) and is done: its checkpoint
    would only diverge again, and is removed as a finished run's is."""
    if path.exists() and diverged(load_result(path)):
        path.with_suffix(".ckpt").unlink(missing_ok=True)


def _model_options(planned: PlannedRun) -> dict[str, Any]:
    """The run's model options: 32 dimensions where the algorithm has them, --dual if planned."""
    has = get_algorithm(planned.algorithm).defaults
    return {**({"dim": 32} if "dim" in has else {}), **({"dual": True} if planned.dual else {}),
            **dict(planned.model)}


def _groups(
    results: Iterable[dict[str, Any]], by_policy: bool
) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Results by (method, setting, data set), and by negative-policy group when asked."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        key = (r["algorithm"], str(r["config"].get("setting") or ""), r["dataset"])
        if by_policy:
            neg = negatives_of(r)
            key += (POLICY_GROUPS.get(neg, neg),)
        groups[key].append(r)
    return groups


def privacy_notes(results: Iterable[dict[str, Any]]) -> list[str]:
    """One line per DP run group: the (epsilon, delta) its results record, mean over runs.

    Epsilon depends on the noise, the share of clients per round and the rounds, not on the
    negative policy, so the policies are pooled.
    """
    lines = []
    dp = [r for r in results if (r.get("extra") or {}).get("privacy") and not diverged(r)]
    for (method, setting, dataset), runs in _groups(dp, by_policy=False).items():
        eps = statistics.fmean(float(r["extra"]["privacy"]["epsilon"]) for r in runs)
        delta = statistics.fmean(float(r["extra"]["privacy"]["delta"]) for r in runs)
        lines.append(f"privacy of {method}{' ' + setting if setting else ''} on {dataset}: "
                     f"epsilon = {eps:.3g}, delta = {delta:g} (mean over {len(runs)} run(s))")
    return lines


def sparsity_notes(paper: str, results: Iterable[dict[str, Any]]) -> list[str]:
    """Share of entries of C above 1e-1 and 1e-2, per policy group, beside the paper's figures.

    Only for the methods and settings the paper reports it for (its "sparsity" figures).
    """
    keys = ("c_above_1e-1", "c_above_1e-2")
    published = [f for f in load_figures(paper) if f.table == "sparsity"]
    lines = []
    have = [r for r in results if (r.get("extra") or {}).get("sparsity_of_c") and not diverged(r)]
    for (method, setting, dataset, policy), runs in _groups(have, by_policy=True).items():
        theirs = {(f.dataset, f.metric): f.mean for f in published
                  if (f.method, f.setting) == (method, setting)}
        if not theirs:
            continue
        ours = [statistics.fmean(float(r["extra"]["sparsity_of_c"][k]) for r in runs) for k in keys]
        on = dataset if any(d == dataset for d, _ in theirs) else next(iter(theirs))[0]
        lines.append(
            f"C of {method}{' ' + setting if setting else ''} on {dataset} ({policy}, mean over "
            f"{len(runs)} seed(s)): {ours[0]:.2%} of entries above 1e-1, {ours[1]:.2%} above 1e-2; "
            f"paper on {on}: {theirs.get((on, keys[0]), float('nan')):.2%}, "
            f"{theirs.get((on, keys[1]), float('nan')):.2%}"
        )
    return lines
