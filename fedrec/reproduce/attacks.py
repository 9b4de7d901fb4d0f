"""`fedrec reproduce attacks`: FedRecAttack's anchor in its own setting, then every attack and
defence under fedrec's methods, and what the server infers from uploads under each defence.

Three tables, each run cached as a JSON file in the output folder (a rerun only does what is
missing):

1. **Anchor** — FedRecAttack's setting (`fedrec.security.legacy`) on ML-100K with its published
   options, iteration by iteration, beside the figures its README prints.
2. **Poisoning** — method × attack × defence under fedrec's engine: ER@5/10/20 and the target's
   NDCG@10 at the last round, clean test HR@10/NDCG@10 (at the best validation round), the
   defence's flag precision/recall and its aggregation time; then ER@10 of the boosted attacks
   as the attacker's share of the clients goes from 0.1% to 10%, undefended and under the median.
3. **Inference** — method × server view (none, dense, LDP at PFedRec's λ, DP shares, pseudo
   items, secure aggregation of K): precision/recall/F1/AUC of the ``rows``, ``direction`` and
   ``rounds`` attacks and the run's test HR@10/NDCG@10.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.results import check_events

POISON_METHODS = ("fedmf", "pfedrec", "fedncf")
ALL_ATTACKS = ("none", "fedrecattack", "a-ra", "a-hum", "pipattack", "pieck-ipe", "pieck-uea", "poisonfrs", "boost",
               "random", "bandwagon", "popular", "fedattack", "clusterattack")
#: attacks set against every defence, each with the factor on its rows' norm (at the benign
#: median norm, x1, none of the targeted attacks moves fedrec's FedAvg; see docs/security.md)
DEFENDED_ATTACKS = (("fedrecattack", 10.0), ("boost", 10.0), ("fedattack", 10.0), ("poisonfrs", 10.0),
                    ("clusterattack", 10.0))
DEFENCES = ("none", "norm-bound", "median", "trimmed-mean", "krum", "multi-krum", "union")
#: the attacker's share of the clients in the main table (the engine's ``--malicious`` default),
#: and the shares swept for the boosted attacks
MAIN_SHARE = 0.05
SHARES = (0.001, 0.01, MAIN_SHARE, 0.1)
SHARE_DEFENCES = ("none", "median")
INFER_METHODS = ("fedmf", "fedncf", "fedrecon", "pfedrec")
VIEWS: dict[str, dict[str, Any]] = {
    "none": {}, "dense": {"encoding": "dense"},
    **{f"ldp={lam}": {"ldp": lam} for lam in (0.1, 0.2, 0.3, 0.4, 0.5)},
    "dp z=1": {"dp_clip": 0.1, "dp_noise": 1.0}, "pad 100": {"pad_items": 100},
    "secagg 10": {"secagg": 10}, "secagg 100": {"secagg": 100},
}


@dataclass
class AttackTables:
    """What `reproduce_attacks` measured (each entry one run's figures)."""

    anchor: list[dict[str, float]] = field(default_factory=list)
    poisoning: list[dict[str, Any]] = field(default_factory=list)
    inference: list[dict[str, Any]] = field(default_factory=list)
    #: reused files whose recorded settings differ from the run the tables would make now,
    #: ``(file name, {"federated.rounds": (then, now)})`` (`fedrec.reproduce.runner.config_changes`)
    stale: list[tuple[str, dict[str, tuple[Any, Any]]]] = field(default_factory=list)
    #: reused files that record no settings (written before the files held them): not checked
    unchecked: int = 0
    #: files whose runs read other events than the data at hand, ``(file name, digest then,
    #: digest now, outcome)``: ``run again`` or ``given back`` (set aside,
    #: `fedrec.results.set_aside_other_events`), or ``left out`` (nothing run, nothing renamed)
    set_aside: list[tuple[str, str, str, str]] = field(default_factory=list)


def cached_figures(path: Path, make: Callable[[], Any], run_missing: bool, planned: Callable[[], Any] | None = None,
            tables: AttackTables | None = None, content: str | None = None) -> Any:
    """The figures in ``path``, or those ``make()`` measures (then written to ``path``) when it
    has none and ``run_missing``. A file is found by its name, which does not hold every
    setting: a reused file's recorded ``config`` is compared with ``planned()``, the run it
    stands for now, and what differs is noted in ``tables.stale`` (still used: deleting the
    file runs it again). Nor does the name say where the data's copy lives: with ``content``,
    the content digest of the copy at hand (`fedrec.experiment.content_at_hand`), a file whose
    run recorded another one (``data.source.content``) is set aside and its run is missing again,
    or an earlier set-aside file of the copy at hand given back
    (`fedrec.results.set_aside_other_events`); without ``run_missing`` it is left out, renamed
    nothing. Each is noted in ``tables.set_aside``."""
    if content is not None:
        then, outcome = check_events(path, content, rename=run_missing)
        if then is not None and tables is not None:
            tables.set_aside.append((path.name, then, content, outcome))
        if outcome == "left out" and then is not None:
            return None
    if path.exists():
        blob = json.loads(path.read_text())
        if planned is not None and tables is not None:
            changes = budget_change(blob)  # a file records its attack, with or without its config
            if "config" not in blob:
                tables.unchecked += 1
            else:
                from fedrec.reproduce.runner import config_changes

                changes = {**config_changes(blob["config"], planned()), **changes}
            if changes:
                tables.stale.append((path.name, changes))
        return blob
    if not run_missing:
        return None
    blob = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(blob, indent=1))
    tmp.replace(path)
    return blob


def budget_change(blob: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{"attack budget": (then, now)}`` where an attacked cell was made under another rule for
    its attacker's budget than `fedrec.security.attacks.BUDGET_RULE` (a cell that records none
    was made under the "cover batch" one); empty for a clean cell, and under ``--aggregation
    samples``, whose clients step on their batch's summed loss, which the rule does not
    change. Where the clients step by Adam the budget is their step bound
    (`fedrec.security.attacks.Knowledge.step_bound`) and did not move either, and where a method
    measures its honest clients' norm (``--attacker-norm honest``) the budget is not used by
    most attacks; a cell records neither, so it is noted all the same."""
    from fedrec.security.attacks import BUDGET_RULE

    if blob.get("attack", "none") == "none":
        return {}
    if "samples" in (blob.get("config", {}).get("federated", {}).get("aggregation"),
                     (blob.get("engine") or {}).get("aggregation")):  # the engine options a file names
        return {}
    then = blob.get("budget_rule", "cover batch")
    return {} if then == BUDGET_RULE else {"attack budget": (then, BUDGET_RULE)}


def anchor_figures(path: Path, make: Callable[[], list[dict[str, float]]], run_missing: bool,
                   tables: AttackTables | None = None, content: str | None = None) -> list[dict[str, float]] | None:
    """The anchor run's figures by iteration, cached in ``path`` as `cached_figures` caches a
    run: written beside the content digest of the events it read (``content``), so a file of
    other events is set aside as the other tables' files are. A file of the list alone (written
    before the anchor recorded its events) is reused as it is."""
    def made() -> dict[str, Any]:
        return {"figures": make(), "data": {"source": {"content": content}}}

    blob = cached_figures(path, made, run_missing, None, tables, content)
    return blob.get("figures") if isinstance(blob, dict) else blob


def anchor_split(data_dir: str | None) -> tuple[Any, Any, int, str | None]:
    """ML-100K as FedRecAttack uses it: each user's latest interaction is its test item, the rest
    trains; the target is item 895 (index 894 in its files, the target of its README's run).
    Last, the content digest of the events read (`Interactions.content_digest`)."""
    import scipy.sparse as sp

    from fedrec.experiment import RunConfig, prepare_split

    split = prepare_split(RunConfig(algorithm="fedmf", dataset="ml-100k", protocol="loo-sampled", data_dir=data_dir))
    train = sp.csr_matrix(split.train + split.valid.targets)
    train.data[:] = 1
    test = np.full(split.n_users, -1, np.int64)
    t = split.test.targets.tocoo()
    test[t.row] = t.col
    target = int(np.flatnonzero(np.asarray(split.data.item_ids).astype(str) == "895")[0])
    return train, test, target, split.data.source.get("content")


def reproduce_attacks(out_dir: Path, data_dir: str | None, *, seeds: list[int], rounds: int = 20,
                      iterations: int = 5, run_missing: bool = True,
                      on_run: Callable[[str], None] | None = None) -> AttackTables:
    """Run (or reuse) every run of the three tables (see the module docstring)."""
    from fedrec.experiment import RunConfig, federated_config
    from fedrec.security.inference import audit_privacy
    from fedrec.security.legacy import run_legacy

    tell = on_run or (lambda _: None)
    out = AttackTables()
    tr, test, target, content = anchor_split(data_dir)
    for seed in seeds:
        tell(f"anchor s{seed}")
        figs = anchor_figures(out_dir / f"anchor-s{seed}.json",
                              lambda seed=seed: run_legacy(tr, test, np.array([target]), iterations, seed=seed),
                              run_missing, out, content)
        if figs:
            out.anchor.extend({**f, "iteration": i, "seed": seed} for i, f in enumerate(figs))

    def poison(method: str, attack: str, boost: float | None, defence: str, seed: int,
               share: float) -> dict[str, Any]:
        return poison_run(method, attack, boost, defence, seed, share, rounds, data_dir)

    def poisoned(method: str, attack: str, boost: float | None, defence: str, seed: int, share: float) -> Any:
        return poison_config(method, attack, boost, defence, seed, share, rounds, data_dir)

    cells: list[tuple[str, str, float | None, str]] = [
        (m, a, None, "none") for m in POISON_METHODS for a in ALL_ATTACKS]
    cells += [(m, a, 10.0, "none") for m in POISON_METHODS for a in ALL_ATTACKS[1:] if a != "boost"]  # boost: x10 already
    cells += [(m, a, b, d) for m in POISON_METHODS for a, b in DEFENDED_ATTACKS for d in DEFENCES if d != "none"]
    swept = [(m, a, b, d, p) for m in POISON_METHODS for a, b in DEFENDED_ATTACKS[:2] for d in SHARE_DEFENCES
             for p in SHARES if p != MAIN_SHARE]
    for seed in seeds:
        for m, a, b, d, p in [(*c, MAIN_SHARE) for c in cells] + swept:
            tell(f"poison {m} {a} x{b or 1:g} {d} p={p:g} s{seed}")
            tag = ("" if b is None else f"-b{b:g}") + ("" if p == MAIN_SHARE else f"-p{p:g}")
            blob = cached_figures(out_dir / f"poison-{m}-{a}{tag}-{d}-r{rounds}-s{seed}.json",
                           lambda m=m, a=a, b=b, d=d, p=p, seed=seed: poison(m, a, b, d, seed, p), run_missing,
                           lambda m=m, a=a, b=b, d=d, p=p, seed=seed: poisoned(m, a, b, d, seed, p), out,
                           content)
            if blob:
                out.poisoning.append({**blob, "malicious": p, "attack": _label(a, b)})

    def inferred(method: str, view: str, seed: int) -> RunConfig:
        opts = {k: v for k, v in VIEWS[view].items() if k != "secagg"}
        return RunConfig(algorithm=method, dataset="ml-100k", seed=seed, data_dir=data_dir,
                         federated=federated_config(method, "ml-100k", paper=True, rounds=rounds, **opts))

    def infer(method: str, view: str, seed: int) -> dict[str, Any]:
        res, audit = audit_privacy(inferred(method, view, seed), secagg=VIEWS[view].get("secagg", 0))
        return {"method": method, "view": view, "seed": seed, **audit.summary(),
                "hr@10": res.test.get("hr@10"), "ndcg@10": res.test.get("ndcg@10"),
                "epsilon": res.extra.get("privacy", {}).get("epsilon"),
                "bytes_up": float(np.mean([h.bytes_up for h in res.history])),
                "config": res.config, "data": {"source": res.data.get("source", {})}, "git_revision": res.git_revision}

    for seed in seeds:
        for m in INFER_METHODS:
            for v in VIEWS:
                tell(f"infer {m} {v} s{seed}")
                slug = v.replace(" ", "").replace("=", "")
                blob = cached_figures(out_dir / f"infer-{m}-{slug}-r{rounds}-s{seed}.json",
                               lambda m=m, v=v, seed=seed: infer(m, v, seed), run_missing,
                               lambda m=m, v=v, seed=seed: inferred(m, v, seed), out, content)
                if blob:
                    out.inference.append(blob)
    return out


def _label(attack: str, boost: float | None) -> str:
    """An attack's name in the tables, with its factor on the rows when boosted (``boost`` is
    explicit boosting, x10 by definition: its name alone)."""
    return attack if boost in (None, 1.0) or attack == "boost" else f"{attack} x{boost:g}"


def _mean(rows: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None and np.isfinite(r[key])]
    if not vals:
        return "–"
    m = float(np.mean(vals))
    return f"{m:.4f}" if len(vals) == 1 else f"{m:.4f} ± {float(np.std(vals, ddof=1)):.4f}"


def to_markdown(t: AttackTables) -> str:
    """The three tables as Markdown (means ± std over seeds where there are several)."""
    from fedrec.reproduce.papers import figure

    lines = ["### FedRecAttack's setting (ML-100K, ρ = 5%, κ = 60, ξ = 1%, target item 895)", "",
             "| iteration | ER@10 ours | ER@10 paper | ER@5 ours | ER@5 paper | NDCG@10 ours | NDCG@10 paper | "
             "HR@10 ours | HR@10 paper |", "|---|---|---|---|---|---|---|---|---|"]
    for i in sorted({int(r["iteration"]) for r in t.anchor}):
        rows = [r for r in t.anchor if r["iteration"] == i]
        cells = []
        for ours, theirs in (("er@10", "er@10"), ("er@5", "er@5"), ("target_ndcg@10", "target_ndcg@10"),
                             ("hr@10", "hr@10")):
            f = figure("fedrecattack", "readme", "fedrecattack", "ml-100k", theirs, f"iteration={i}")
            cells += [_mean(rows, ours), f"{f.mean:.4f}" if f else "–"]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += ["", "### Poisoning under fedrec's methods (ML-100K, 5% malicious, ξ = 1%, one target)", "",
              "| method | attack | defence | ER@5 | ER@10 | ER@20 | target NDCG@10 | HR@10 | NDCG@10 | "
              "flag precision | flag recall | aggregation s/round |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    main = [r for r in t.poisoning if _share(r) == MAIN_SHARE]
    keys = list(dict.fromkeys((r["method"], r["attack"], r["defence"]) for r in main))
    for m, a, d in keys:
        rows = [r for r in main if (r["method"], r["attack"], r["defence"]) == (m, a, d)]
        lines.append(f"| {m} | {a} | {d} | " + " | ".join(_mean(rows, k) for k in (
            "er@5", "er@10", "er@20", "target_ndcg@10", "hr@10", "ndcg@10", "flag_precision", "flag_recall",
            "aggregate_seconds")) + " |")
    shares = sorted({_share(r) for r in t.poisoning})
    swept = list(dict.fromkeys((r["method"], r["attack"], r["defence"]) for r in t.poisoning
                               if _share(r) != MAIN_SHARE))
    if swept:
        lines += ["", "### ER@10 (HR@10) by the attacker's share of the clients (ML-100K, ξ = 1%, one target)", "",
                  "| method | attack | defence | " + " | ".join(f"{p:.1%}" for p in shares) + " |",
                  "|---|---|---|" + "---|" * len(shares)]
        for m, a, d in swept:
            cells = []
            for p in shares:
                rows = [r for r in t.poisoning if (r["method"], r["attack"], r["defence"], _share(r)) ==
                        (m, a, d, p)]
                cells.append(f"{_mean(rows, 'er@10').split(' ±')[0]} ({_mean(rows, 'hr@10').split(' ±')[0]})"
                             if rows else "–")
            lines.append(f"| {m} | {a} | {d} | " + " | ".join(cells) + " |")
    lines += ["", "### What the server infers from uploads (ML-100K; mean over clients of the last round, "
              "`rounds` over all rounds)", "",
              "| method | server view | rows P / R / F1 / AUC | direction P / R / F1 / AUC | rounds P / R / F1 / AUC | "
              "random P | "
              "HR@10 | NDCG@10 | ε | MiB up/round |", "|---|---|---|---|---|---|---|---|---|---|"]
    keys2 = list(dict.fromkeys((r["method"], r["view"]) for r in t.inference))
    for m, v in keys2:
        rows = [r for r in t.inference if (r["method"], r["view"]) == (m, v)]
        trio = [" / ".join(_mean(rows, f"{a}_{k}").split(" ±")[0] for k in ("precision", "recall", "f1", "auc"))
                for a in ("rows", "direction", "rounds")]
        eps = _mean(rows, "epsilon")
        mib = f"{np.mean([r['bytes_up'] for r in rows]) / 2**20:.1f}"
        lines.append(f"| {m} | {v} | " + " | ".join(trio) + f" | {_mean(rows, 'random_precision').split(' ±')[0]} | "
                     f"{_mean(rows, 'hr@10')} | {_mean(rows, 'ndcg@10')} | {eps} | {mib} |")
    return "\n".join(lines) + "\n"


def _share(run: dict[str, Any]) -> float:
    """The attacker's share of the clients in a poisoning run (runs cached before the sweep
    carry none: they ran at the main table's)."""
    return run.get("malicious", MAIN_SHARE)


def _legend(ax: Any, **kw: Any) -> None:
    """A legend only where something was drawn (a panel may be empty when cells are missing)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def seeds_first(t: AttackTables) -> int:
    """The first seed run (the plots show one seed's curves)."""
    return min((r["seed"] for r in t.poisoning), default=0)


def plot(t: AttackTables, folder: Path) -> list[Path]:
    """ER@10 by round per attack (undefended), and each method's privacy-utility trade-off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    colour = {a: plt.get_cmap("tab10")(i) for i, a in enumerate(ALL_ATTACKS)}
    for m in sorted({r["method"] for r in t.poisoning}):
        ours = [r for r in t.poisoning if r["method"] == m and r["seed"] == seeds_first(t)]
        mine = [r for r in ours if _share(r) == MAIN_SHARE]
        fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
        for ax, boosted in zip(axes[:2], (False, True), strict=True):
            for r in mine:
                name, _, factor = r["attack"].partition(" x")
                curve = r["er@10_by_round"]
                if r["defence"] != "none" or bool(factor) != boosted or all(v is None for v in curve):
                    continue
                ax.plot(range(1, len(curve) + 1), curve, label=name, color=colour.get(name))
            ax.set(xlabel="round", ylabel="ER@10 of the target", ylim=(-0.02, 1.02),
                   title=f"{m}: no defence, {'rows x10' if boosted else 'rows at the honest norm'}")
            _legend(ax, fontsize=7, ncol=2)
        ax = axes[2]
        defended = [r for r in mine if r["defence"] != "none" or r["attack"] in
                    {f"{a} x{b:g}" if a != "boost" else a for a, b in DEFENDED_ATTACKS}]
        attacks = sorted({r["attack"] for r in defended if r.get("er@10") is not None})
        width = 0.8 / max(len(attacks), 1)
        for i, a in enumerate(attacks):
            er = [next((r["er@10"] for r in defended if r["attack"] == a and r["defence"] == d), np.nan)
                  for d in DEFENCES]
            ax.bar(np.arange(len(DEFENCES)) + i * width, er, width, label=a,
                   color=colour.get(a.partition(" x")[0]))
        hr = [[r["hr@10"] for r in defended if r["defence"] == d and r.get("hr@10") is not None] for d in DEFENCES]
        hr = [float(np.mean(v)) if v else np.nan for v in hr]
        ax.plot(np.arange(len(DEFENCES)) + 0.4 - width / 2, hr, "k^", label="HR@10 (mean over attacks)")
        ax.set_xticks(np.arange(len(DEFENCES)) + 0.4 - width / 2, DEFENCES, rotation=20, fontsize=8)
        ax.set(ylabel="ER@10 after the last round", ylim=(0, 1.05), title=f"{m}: defences")
        _legend(ax, fontsize=7)
        ax = axes[3]
        swept = sorted({r["attack"] for r in ours if _share(r) != MAIN_SHARE})
        styles = iter(("-o", "--o", "-s", "--s", "-^", "--^"))
        for a in swept:
            for d in SHARE_DEFENCES:
                pts = sorted((_share(r), r["er@10"]) for r in ours
                             if (r["attack"], r["defence"]) == (a, d) and r.get("er@10") is not None)
                if pts:
                    ax.plot(*zip(*pts, strict=True), next(styles, "-"), label=f"{a}, {d}",
                            color=colour.get(a.partition(" x")[0]))
        ax.set(xscale="log", xlabel="malicious share of the clients", ylabel="ER@10 after the last round",
               ylim=(-0.02, 1.02), title=f"{m}: the attacker's share")
        _legend(ax, fontsize=7)
        path = folder / f"attacks-{m}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    markers = "osD^v<>phX*P"
    for m in sorted({r["method"] for r in t.inference}):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        first = min(r["seed"] for r in t.inference)
        for i, r in enumerate(r for r in t.inference if r["method"] == m and r["seed"] == first):
            # the server uses its best attack: the view's privacy is the highest AUC of the three
            auc = max(r.get(f"{a}_auc", np.nan) for a in ("rows", "direction", "rounds"))
            ax.scatter(auc, r["hr@10"], marker=markers[i % len(markers)], s=50, label=r["view"],
                       color=plt.get_cmap("tab20")(i % 20))
        ax.axvline(0.5, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="inference AUC (the best of rows / direction / rounds; 0.5 = a random guess)",
               ylabel="test HR@10", title=f"{m}: privacy-utility by server view")
        _legend(ax, fontsize=7, ncol=2)
        path = folder / f"privacy-{m}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def poison_run(method: str, attack: str, boost: float | None, defence: str, seed: int, share: float,
               rounds: int, data_dir: str | None, protocol: str | None = None,
               model: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
               dataset: str = "ml-100k") -> dict[str, Any]:
    """One cell of the poisoning table: ``method`` on ML-100K in its paper setting for ``rounds``
    rounds, ``attack`` ("none": one target measured, no attacker) by a ``share`` of malicious
    clients with rows x ``boost``, under ``defence``; the figures the table reports. ``protocol``:
    the split (None: the run's default; a rating method such as PersonalFR names a ranking one,
    as ``ratio-rating-implicit``, so the target's exposure in a top 10 means something);
    ``model``: model options beside the method's defaults (GFed-PP's ``public_attackers``);
    ``engine``: engine options beside the paper setting (FedDAE's ``clients_per_round``);
    ``dataset``: another registered data set than ML-100K."""
    from fedrec.experiment import train
    from fedrec.security.attacks import BUDGET_RULE

    cfg = poison_config(method, attack, boost, defence, seed, share, rounds, data_dir, protocol, model, engine,
                        dataset)
    start = time.perf_counter()
    res = train(cfg).result
    last = res.history[-1].extra
    keep = ("er@5", "er@10", "er@20", "target_ndcg@10", "flag_precision", "flag_recall", "attacker_weight",
            "attacked_users")
    return {"method": method, "attack": _label(attack, boost), **({"dataset": dataset} if dataset != "ml-100k" else {}),
            "defence": defence, "seed": seed, "malicious": share, **({"model": model} if model else {}),
            **({"engine": engine} if engine else {}),
            **{k: last[k] for k in keep if k in last},
            "er@10_by_round": [h.extra.get("er@10") for h in res.history],
            **({"attacker_weight_by_round": [h.extra.get("attacker_weight") for h in res.history]}
               if "attacker_weight" in last else {}),
            **({"attacker_row_norm_by_round": [h.extra.get("attacker_row_norm") for h in res.history]}
               if "attacker_row_norm" in last else {}),
            "hr@10": res.test.get("hr@10"), "ndcg@10": res.test.get("ndcg@10"),
            **({"protocol": protocol, "test": res.test} if protocol is not None else {}),
            "aggregate_seconds": float(np.mean([h.extra["aggregate_seconds"] for h in res.history])),
            "wall_seconds": time.perf_counter() - start, "config": res.config,
            **({"budget_rule": BUDGET_RULE} if attack != "none" else {}),
            "data": {"source": res.data.get("source", {})}, "git_revision": res.git_revision}


def poison_config(method: str, attack: str, boost: float | None, defence: str, seed: int, share: float,
                  rounds: int, data_dir: str | None, protocol: str | None = None,
                  model: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
                  dataset: str = "ml-100k") -> Any:
    """The `fedrec.experiment.RunConfig` of a `poison_run` (its arguments)."""
    from fedrec.experiment import RunConfig, federated_config

    opts: dict[str, Any] = ({"targets": 1} if attack == "none" else
                            {"attack": attack, "boost": boost, "malicious": share})
    if defence != "none":
        opts["defence"] = defence
    where = {} if protocol is None else {"protocol": protocol}
    return RunConfig(algorithm=method, dataset=dataset, seed=seed, data_dir=data_dir, **where,
                     model=dict(model or {}),
                     federated=federated_config(method, dataset, paper=True, rounds=rounds, **where,
                                                **dict(engine or {}), **opts))
