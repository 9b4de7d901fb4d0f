"""`fedrec run`, `fedrec recommend`, `fedrec audit-protocol` and the listings of algorithms and
protocols (`fedrec reproduce` is in `fedrec.cli.reproduce`)."""

from __future__ import annotations

import hashlib
import inspect
import re
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fedrec.cli.run_progress import RunBars, batch_progress, status
from fedrec.errors import FedrecError, Interrupted
from fedrec.progress import RoundNote, noting

console = Console()
#: the help of every command's --device (torch is imported only once a command runs)
DEVICE_HELP = "Where the runs train: cpu, cuda (cuda:1, ...) or auto (cuda when PyTorch sees one)."


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("audit-protocol")(audit_command)
    app.command("algorithms")(algorithms_command)
    app.command("protocols")(protocols_command)
    app.command("recommend")(recommend_command)
    app.command("convert")(convert_command)
    app.command("plot")(plot_command)


def _refuse_ignored(algorithm: str, federated: bool, federated_only: dict[str, bool],
                    centralised_only: dict[str, bool]) -> None:
    """An option the algorithm's trainer would not read is an error, not silently dropped."""
    ignored = [k for k, given in (centralised_only if federated else federated_only).items() if given]
    if ignored:
        kind = "federated" if federated else "centralised"
        raise FedrecError(f"'{algorithm}' is {kind}: {', '.join(ignored)} "
                          f"{'does' if len(ignored) == 1 else 'do'} not apply to it")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a run as Ctrl-C does (one line, nothing partial written)."""
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt_message(last: int, total: int, checkpoint: Path, resumed: bool) -> str:
    """Which round was last finished and checkpointed, and the exact command that goes on."""
    from fedrec.core.checkpoint import peek_round

    done = f"after round {last} of {total}" if last else "before the first round ended"
    saved = peek_round(checkpoint) if checkpoint.exists() else 0
    if not saved:
        return f"{done}; no checkpoint was written (run with --checkpoint-every N to be able to resume)"
    argv = ["fedrec", *sys.argv[1:]] + ([] if resumed else ["--resume"])
    return f"{done}; {checkpoint} holds round {saved}; go on with: {shlex.join(argv)}"


def _stop(bar: Progress) -> None:
    """Stop the bar if it ever started: stopping one that did not prints an empty line (before
    an error's one line, say)."""
    if bar.live.is_started:
        bar.stop()


def _check_outputs(out: Path, save: Path | None, checkpoint: Path, resume: bool, overwrite: bool,
                   reads: list[str], out_given: bool = True) -> None:
    """Before any work: every file the run writes can be written, none is a file it ``reads``,
    and an earlier run's files are replaced only when asked (``--overwrite``) or continued
    (``--resume``)."""
    from fedrec.files import check_writable

    # resuming replaces the results of the run it continues, not those of a finished one
    check_writable(out, "--out" if out_given else "the results file", reads=reads,
                   overwrite=overwrite or (resume and checkpoint.exists()))
    if save is not None:
        check_writable(save, "--save", overwrite=overwrite, reads=reads)
        if save.resolve() in (out.resolve(), checkpoint.resolve()):
            raise FedrecError(f"--save {save} is the run's {'--out' if save.resolve() == out.resolve() else 'checkpoint'} "
                              "file too: give it a name of its own")
    if resume and not checkpoint.exists():
        typer.echo(f"no checkpoint at {checkpoint}: starting from the first round", err=True)
    if checkpoint.exists() and not (resume or overwrite):
        raise FedrecError(f"{checkpoint} holds an earlier run's checkpoint: --resume to continue it, "
                          "--overwrite to start again")


def run_command(
    algorithm: str = typer.Argument(..., help="Algorithm name (see `fedrec algorithms`)."),
    dataset: str = typer.Option("ml-100k", "--dataset", "-d", help="Data set name, synthetic[:USERSxITEMS], or your own CSV/TSV/Parquet file (with --columns)."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING[,TIMESTAMP]] columns: header names, or 0-based positions for a file without a header."),
    protocol: str = typer.Option("loo-sampled", "--protocol", "-p", help="Evaluation protocol (see `fedrec protocols`)."),
    ks: str | None = typer.Option(None, "--ks", help="Further cut-offs K of the ranking metrics, beside the protocol's 10, e.g. 20 or 5,20 (hr@20, ndcg@20, ...: a paper's own K); the round is still chosen at 10."),
    seed: int = typer.Option(0, help="Seed of every random choice in the run."),
    rounds: int | None = typer.Option(None, "--rounds", "--epochs", help="Federated rounds (centralised: epochs); default: the algorithm's, else 100."),
    batch_size: int | None = typer.Option(None, help="Minibatch size (default: the algorithm's, else 256)."),
    lr: float | None = typer.Option(None, help="Learning rate (default: the algorithm's, see `fedrec algorithms`)."),
    weight_decay: float = typer.Option(0.0, help="L2 weight decay (centralised)."),
    num_negatives: int | None = typer.Option(None, help="Training negatives per positive, redrawn every epoch/round (default: the algorithm's, else 4)."),
    negatives: str = typer.Option("leak-free", help="Training-negative policy (see `fedrec protocols`)."),
    patience: int | None = typer.Option(None, help="Stop after this many evaluations without a better validation figure (0: never; default 10 centralised, 30 federated, 0 under --paper)."),
    eval_every: int = typer.Option(1, help="Evaluate on validation every N epochs/rounds."),
    dim: int | None = typer.Option(None, help="Embedding size (default: the algorithm's, see `fedrec algorithms`)."),
    dual: bool = typer.Option(False, "--dual", help="Federated: add PFedRec's dual personalisation."),
    reconstruct_epochs: int | None = typer.Option(None, help="FedRecon: epochs re-training the user vector each round (default: the algorithm's)."),
    clients_per_round: float | None = typer.Option(None, help="Federated: fraction (<= 1) or number of clients per round (default: the algorithm's, else all)."),
    local_epochs: int | None = typer.Option(None, help="Federated: local epochs per round (default: the algorithm's, else 1)."),
    lr_item: float | None = typer.Option(None, help="Federated: learning rate of item rows (default lr x item-lr-scale)."),
    item_lr_scale: float | None = typer.Option(None, help="Federated: item-row learning rate as a multiple of --lr (default: the algorithm's; under the papers' rule n_items x 80, the official PFedRec rule)."),
    item_std: float | None = typer.Option(None, help="Federated: std of the initial item vectors (N(0, std²); default 1.0 as nn.Embedding, 0.1 where a model fits ratings)."),
    ldp: float = typer.Option(0.0, help="Federated: Laplace noise scale on uploaded item tables (LDP, PFedRec Eq. 12); no epsilon is accounted for it: --dp-clip with --dp-noise is the accounted mechanism."),
    clip: float | None = typer.Option(None, help="Federated: clip each uploaded row delta to this L2 norm."),
    dp_clip: float | None = typer.Option(None, help="Federated DP: clip each client's gradient w.r.t. the item table to this L2 norm (tau)."),
    dp_noise: float = typer.Option(0.0, help="Federated DP: Gaussian noise multiplier z (noise std z x sensitivity); epsilon is reported."),
    dp_delta: float = typer.Option(1e-5, help="Federated DP: delta of the reported (epsilon, delta)."),
    encoding: str | None = typer.Option(None, help="Federated: item-table upload encoding: rows, sparse or dense (default: the algorithm's, else rows)."),
    backoffs: int | None = typer.Option(None, help="Federated: on divergence (a loss or scores not finite, or a loss 1,000 times its lowest) go back to the best round's state and halve the learning rates, up to N times in the run (each recorded in the round history); 0 stops at the first divergence (default 3; 0 under --paper)."),
    aggregation: str | None = typer.Option(None, help="Federated: the server's rule for item rows: clients (the papers' FedAvg: each row's summed deltas over all the round's clients, with the papers' rates), contributors (over the clients that sent the row) or samples (as contributors, each client's item step on its batch's summed loss, not its mean; FedMF's and PFedRec's default). Item-embedding family."),
    cold_items: str | None = typer.Option(None, help="Federated, rating protocols: what is predicted for an item no training rating names: model (its untrained row's score) or user-mean (the user's training mean; default, but model under --paper)."),
    rating_baseline: str | None = typer.Option(None, help="Federated, rating protocols: the baseline beneath the item-embedding family's score: user-item (the user's training mean, computed on the client, plus a learned item bias; default) or none (the score is the rating, as the papers; under --paper)."),
    server_opt: str | None = typer.Option(None, "--server-opt", help="Federated, the item-embedding family and MetaMF: the server optimiser on the round's mean, NAME[:KEY=VALUE,...]: avg (FedAvg), avgm (momentum), adam or yogi (Reddi et al. 2021), e.g. yogi:lr=0.05 (keys lr, momentum, beta1, beta2, tau; default: the algorithm's own, FedAvg for most)."),
    client_objective: str | None = typer.Option(None, "--client-objective", help="Federated, the item-embedding family and MetaMF: a term added to each client's local loss, NAME[:KEY=VALUE,...], e.g. prox:mu=0.01 (FedProx's proximal term; default: the algorithm's own, none for most)."),
    paper: bool = typer.Option(False, "--paper", help="Federated: the papers' setting instead of fedrec's defaults: the seed papers' item-row rule, the rates they give for this data set, a fixed budget of rounds (as `fedrec reproduce` runs; for the newer methods, FedMF's: see each method's page)."),
    set_options: list[str] = typer.Option([], "--set", help="Model option KEY=VALUE, repeatable (see `fedrec algorithms`), e.g. --set curriculum=sin."),
    memory_budget_mb: float | None = typer.Option(None, help="Federated: working set of one trained chunk of the cohort, in MB (default: 32 on the CPU, about its last-level cache; 1024 on a GPU)."),
    attack: str | None = typer.Option(None, help="Federated: poisoning attack by malicious clients: fedrecattack, a-ra, a-hum, pipattack, pieck-ipe, pieck-uea, poisonfrs, boost, random, bandwagon, popular (targeted), fedattack or clusterattack (untargeted; see docs/security.md)."),
    malicious: float = typer.Option(0.05, help="Federated: malicious clients added, as a share of the benign ones (FedRecAttack's rho)."),
    targets: int = typer.Option(0, help="Federated: target items to promote (default 1 under a targeted --attack); also measures their exposure (ER@K) without an attack."),
    prior_knowledge: float = typer.Option(0.01, help="Federated: share of the training interactions the attacker sees (FedRecAttack's xi; PipAttack's popularity)."),
    attack_items: int = typer.Option(60, help="Federated: rows a malicious client uploads (FedRecAttack's kappa)."),
    boost: float | None = typer.Option(None, help="Federated: factor on the malicious rows' norm (default 10 for --attack boost, else 1: they match the benign median)."),
    attacker_norm: str = typer.Option("honest", help="Federated, FedCA, FedDAE and FedCIA: the norm the malicious rows are held to (times --boost): honest (the round's median honest step or similarity-row change, given to the attacker) or own (the attack's own estimate from a cover client it runs, as every other method's attackers make it and a deployment's malicious node can)."),
    defence: str | None = typer.Option(None, help="Federated: robust aggregation per item row: norm-bound, median, trimmed-mean, krum, multi-krum, union (per client), or mean (the plain average through the same path, a control)."),
    trim: float = typer.Option(0.1, help="Federated: share trimmed from each end by --defence trimmed-mean."),
    byzantine: float = typer.Option(0.1, help="Federated: share of a row's uploaders Krum assumes malicious."),
    norm_bound: float | None = typer.Option(None, help="Federated: --defence norm-bound's L2 bound on a client's update (default: the round's median)."),
    union_step: str = typer.Option("share", help="Federated, --defence union: judge each client after its share (1/n) of a plain average of the round's rows (share), or after the server's own next step with its change as the round's (server: the official code's form where the server steps by Adam, FedDAE and --server-opt adam/yogi)."),
    checkpoint_every: int = typer.Option(0, help="Write a checkpoint every N rounds (epochs) (0: never)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's checkpoint."),
    threshold: float | None = typer.Option(None, help="Implicit feedback: keep ratings >= this (default: every rating)."),
    min_user: int = typer.Option(0, help="Drop users with fewer interactions (iterated with --min-item)."),
    min_item: int = typer.Option(0, help="Drop items with fewer interactions."),
    one_pass_core: bool = typer.Option(False, "--one-pass-core", help="Apply --min-user/--min-item once, counting on the input (PersonalFR's Anime), instead of until every count holds."),
    max_users: int | None = typer.Option(None, help="Keep the first N users left after filtering, in the order they first appear in the data."),
    tie_break: str = typer.Option("later-row-later", help="Equal timestamps: which row counts as later (earlier-row-later = official PFedRec code)."),
    legacy_repeats: bool = typer.Option(False, "--legacy-repeats", help="Legacy: split repeated (user, item) events as they are, as the official PFedRec/FedRAP/GFed-PP code does on Lastfm-2K (a test item can be a training positive; loo-sampled only)."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding the raw data files."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    out: Path | None = typer.Option(None, "--out", "-o", help="Results JSON (default runs/ALGO-DATASET-PROTOCOL-sSEED[-OPTIONS].json, OPTIONS the options given that change the figures, e.g. -rounds5-lr0.01-curriculum=sin, past 48 characters the rest as a hash: the same command finds its file again, another never does; --device, --threads, --memory-budget-mb, --checkpoint-every and --data-dir are not in it)."),
    save: Path | None = typer.Option(None, "--save", help="Also save the trained run (model at the best validation round) to this file, for `fedrec recommend` and `fedrec.load`."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier run's results, checkpoint and --save file."),
    threads: int | None = typer.Option(None, "--threads", help="PyTorch threads (default: OMP_NUM_THREADS, else 1, which does not collapse on a busy machine; 0: PyTorch's default)."),
    config: Path | None = typer.Option(None, "--config", help="A run config written by `fedrec tune`: its engine and model options, under any given here."),
) -> None:
    """Train and evaluate ALGORITHM; test figures are taken at the best validation epoch/round."""
    from fedrec import threads as torch_threads

    torch_threads.apply(threads)
    tuned_model: dict[str, object] = {}  # a --config's model options, under the command line's
    if config is not None:
        from fedrec.tune import read_config

        tuned = read_config(config)
        if tuned["algorithm"] != algorithm:
            raise FedrecError(f"--config {config} was tuned for {tuned['algorithm']}, not {algorithm}")
        engine = dict(tuned["engine"])
        rounds = rounds if rounds is not None else engine.pop("rounds", None)
        lr = lr if lr is not None else engine.pop("lr", None)
        local_epochs = local_epochs if local_epochs is not None else engine.pop("local_epochs", None)
        item_lr_scale = item_lr_scale if item_lr_scale is not None else engine.pop("item_lr_scale", None)
        lr_item = lr_item if lr_item is not None else engine.pop("lr_item", None)
        batch_size = batch_size if batch_size is not None else engine.pop("batch_size", None)
        aggregation = aggregation if aggregation is not None else engine.pop("aggregation", None)
        patience = patience if patience is not None else engine.pop("patience", None)
        backoffs = backoffs if backoffs is not None else engine.pop("backoffs", None)
        # a version-1 config of a rating protocol says the papers' baseline: it applies where
        # this run scores ratings too, and ranking has no baseline to set
        from fedrec.protocols.protocol import get_protocol as protocol_of

        baseline = engine.pop("rating_baseline", None)
        if rating_baseline is None and protocol_of(protocol).ranking == "rating":
            rating_baseline = baseline
        unread = sorted(set(engine) - {"rounds", "lr", "local_epochs", "item_lr_scale", "lr_item", "batch_size",
                                       "aggregation", "patience", "backoffs"})
        if unread:
            raise FedrecError(f"--config {config}: engine option(s) {', '.join(unread)} are not read from configs")
        tuned_model = dict(tuned["model"])
        if tuned.get("dataset") not in (None, dataset) and not quiet:
            console.print(f"note: {config} was tuned on {tuned['dataset']}, this run is on {dataset}", highlight=False)
    from fedrec.algorithms import get_algorithm
    from fedrec.experiment import RunConfig, federated_config, no_negatives_under_ratings, train
    from fedrec.protocols.protocol import get_protocol, negative_policy, parse_cutoffs
    from fedrec.train.centralised import TrainConfig

    cutoffs = parse_cutoffs(ks, protocol) if ks is not None else ()  # said first, if the protocol cannot take them
    ks = ",".join(map(str, cutoffs)) or None  # the file's name: 5,20 whichever order they were given in
    spec = get_algorithm(algorithm)
    federated = spec.kind == "federated"
    negatives = negative_policy(negatives)  # an alias (legacy) is recorded by the policy's own name
    flags = {"dim": dim, "dual": True if dual else None, "reconstruct_epochs": reconstruct_epochs}
    model = {**tuned_model, **model_options(flags, parse_settings(set_options))}
    settings = {k: v for k, v in model.items() if flags.get(k) is None}  # the options not given by their own flag
    given = given_options(locals(), federated)
    _refuse_ignored(algorithm, federated, {
        "--dual": dual, "--reconstruct-epochs": reconstruct_epochs is not None,
        "--clients-per-round": clients_per_round is not None, "--local-epochs": local_epochs is not None,
        "--lr-item": lr_item is not None, "--item-lr-scale": item_lr_scale is not None,
        "--item-std": item_std is not None, "--ldp": ldp != 0.0, "--clip": clip is not None,
        "--dp-clip": dp_clip is not None, "--dp-noise": dp_noise != 0.0, "--dp-delta": dp_delta != 1e-5,
        "--encoding": encoding is not None, "--memory-budget-mb": memory_budget_mb is not None,
        "--aggregation": aggregation is not None, "--backoffs": backoffs is not None, "--paper": paper,
        "--cold-items": cold_items is not None, "--rating-baseline": rating_baseline is not None,
        "--server-opt": server_opt is not None, "--client-objective": client_objective is not None,
        "--attack": attack is not None, "--targets": targets != 0, "--defence": defence is not None,
        "--malicious": malicious != 0.05, "--prior-knowledge": prior_knowledge != 0.01,
        "--attack-items": attack_items != 60, "--boost": boost is not None, "--attacker-norm": attacker_norm != "honest",
        "--trim": trim != 0.1, "--byzantine": byzantine != 0.1, "--norm-bound": norm_bound is not None,
        "--union-step": union_step != "share",
    }, {"--weight-decay": weight_decay != 0.0})
    if num_negatives is not None and get_protocol(protocol).ranking == "rating":
        raise no_negatives_under_ratings(protocol, algorithm, num_negatives)
    for flag, value in (("--cold-items", cold_items), ("--rating-baseline", rating_baseline)):
        if value is not None and get_protocol(protocol).ranking != "rating":
            raise FedrecError(f"{flag} says what a rating model predicts; protocol '{protocol}' ranks items")
    from fedrec.core.device import resolve

    device = resolve(device)
    given_lr = lr  # None: federated_config takes the algorithm's (its engine options)
    lr = lr if lr is not None else float(spec.lr or 1e-3)
    cfg = RunConfig(
        algorithm=algorithm, dataset=dataset, protocol=protocol, seed=seed, negatives=negatives,
        tie_break=tie_break, repeats=legacy_repeats, threshold=threshold, min_user=min_user, min_item=min_item,
        one_pass_core=one_pass_core, max_users=max_users,
        data_dir=data_dir, columns=columns, ks=cutoffs,
        model=model,
        train=TrainConfig(
            epochs=100 if rounds is None else rounds, batch_size=256 if batch_size is None else batch_size, lr=lr,
            weight_decay=weight_decay, negatives=4 if num_negatives is None else num_negatives,
            patience=10 if patience is None else patience,
            eval_every=eval_every, device=device, checkpoint_every=checkpoint_every,
        ),
        federated=federated_config(
            algorithm, dataset, protocol, paper=paper,
            rounds=rounds, clients_per_round=clients_per_round, local_epochs=local_epochs,
            batch_size=batch_size, lr=given_lr, lr_item=lr_item, item_lr_scale=item_lr_scale,
            item_std=item_std, negatives=num_negatives, eval_every=eval_every,
            patience=patience, ldp=ldp, clip=clip, dp_clip=dp_clip,
            dp_noise=dp_noise, dp_delta=dp_delta, encoding=encoding, aggregation=aggregation, backoffs=backoffs,
            cold_items=cold_items, rating_baseline=rating_baseline, server_opt=server_opt,
            client_objective=client_objective,
            memory_budget_mb=memory_budget_mb, checkpoint_every=checkpoint_every, device=device,
            attack=attack, malicious=malicious, targets=targets, prior_knowledge=prior_knowledge,
            attack_items=attack_items, boost=boost, attacker_norm=attacker_norm, defence=defence, trim=trim, byzantine=byzantine,
            norm_bound=norm_bound, union_step=union_step,
        ),
    )
    ours = spec.engine_for(dataset, get_protocol(protocol).ranking).get("aggregation", "clients") if federated else None
    if (federated and not paper and aggregation is None and ours != "clients"
            and (ldp or dp_noise or attack is not None or defence is not None)):
        # said even with --quiet: the same seed with and without them differs by more than they do
        fed = cfg.federated
        rates = ", ".join([f"lr {fed.lr:g}"] + ([f"lr-item {fed.lr_item:g}"] if fed.lr_item is not None else [])
                          + ([f"item-lr-scale {fed.item_lr_scale:g}"] if fed.item_lr_scale is not None else []))
        noise = [flag for flag, on in (("--ldp", ldp), ("--dp-noise", dp_noise)) if on]
        threats = [flag for flag, on in (("--attack", attack is not None), ("--defence", defence is not None)) if on]
        named = " and ".join(noise + threats)
        ours_too = (f", or give --aggregation {ours} to run {' and '.join(threats)} under fedrec's rule"
                    if threats and not noise else "")
        console.print(f"note: {named} run{'s' if len(noise + threats) == 1 else ''} under the papers' item-row "
                      f"rule (--aggregation clients, not {ours}) and its rates ({rates}); compare with a run of "
                      f"--aggregation clients{ours_too}", highlight=False)
    # data errors the first line of a file (or a folder) tells are said before an earlier run's file is
    if columns is not None:
        from fedrec.data.tables import check_columns
        from fedrec.experiment import refuse_columns_for_a_registered_name

        refuse_columns_for_a_registered_name(dataset)
        check_columns(dataset, columns)
    elif data_dir is not None:
        from fedrec.data.registry import data_directory, list_datasets

        if dataset in list_datasets():
            data_directory(data_dir)
    out_given = out is not None
    out = out or default_out(algorithm, dataset, protocol, seed, given, settings)
    if out.is_dir() or not out.name:  # '', '.', '/': no file name to put a checkpoint beside
        raise FedrecError(f"--out {out} is a folder; give a file name")
    checkpoint = out.with_suffix(".ckpt")
    from fedrec.experiment import data_files

    reads = data_files(cfg) + ([str(config)] if config is not None else [])
    _check_outputs(out, save, checkpoint, resume, overwrite, reads, out_given)
    continuing = resume and checkpoint.exists()  # replaces the results of the run it goes on with
    note = get_algorithm(algorithm).untuned_note(dataset, get_protocol(protocol).ranking)
    if paper and dataset in spec.per_dataset:
        note = None  # the paper gives its settings for this data set
    if note and not quiet:
        console.print(f"note: {note}", highlight=False)
    bar = batch_progress(console, disable=quiet)
    total = cfg.federated.rounds if federated else cfg.train.epochs
    task = bar.add_task(f"{algorithm} on {dataset}", total=total, status="")

    last = [0]
    log = RunBars(bar, log=typer.echo)  # without a terminal: the first and last round, every
    # tenth of the run and at least every 30 s

    def show(note: RoundNote) -> None:
        last[0] = note.round
        if not console.is_terminal:
            if not quiet:
                log.note("run", "", note)
            return
        bar.start()  # only once data and options have been accepted: errors print alone
        bar.update(task, completed=note.round, status=status(note))

    on_round = noting(0, cfg, show)

    try:
        with _sigterm_as_interrupt():
            done = train(cfg, out=out, on_round=on_round, resume=resume, checkpoint=checkpoint,
                         keep_best=save is not None, exclusive=not (overwrite or continuing))
    except KeyboardInterrupt:
        _stop(bar)
        raise Interrupted(_interrupt_message(last[0], total, checkpoint, resume)) from None
    finally:
        _stop(bar)
    result = done.result
    for line in done.split.notes:  # said even with --quiet: the figures are of the data kept
        console.print(f"note: {line}", highlight=False)
    # said even with --quiet: a leave-one-out split without a clock holds out at random, which
    # changes what the figures mean (a ratio split always draws its held-out rows)
    if done.split.held_out_by == "random" and done.split.protocol.split == "loo":
        console.print(f"note: {dataset} has no time column: each user's held-out items were drawn at random "
                      f"(seed {seed}), not taken as the latest (`data.split.held_out_by` in {out})", highlight=False)
    if save is not None:
        from fedrec.api import Run

        Run(cfg, result, done.model, done.split).save(save)
    table = titled(f"{algorithm} · {dataset} · {protocol} · seed {seed}")
    table.add_column("metric")
    table.add_column(f"valid ({'round' if federated else 'epoch'} {result.best_round})", justify="right")
    table.add_column("test", justify="right")
    for key, value in result.test.items():
        if key == "users":
            continue
        table.add_row(key, f"{result.valid_at_best.get(key, float('nan')):.4f}", f"{value:.4f}")
    if federated and result.history:
        up = sum(h.bytes_up for h in result.history) / len(result.history)
        console.print(f"upload per round: {up / 2**20:.2f} MiB (all clients)")
        last = result.history[-1].extra
        if "er@10" in last:
            shown = ", ".join(f"{k.upper()} {last[k]:.4f}" for k in ("er@5", "er@10", "er@20") if k in last)
            console.print(f"exposure of the target items after round {result.history[-1].round}: {shown} "
                          f"(round 1: ER@10 {result.history[0].extra['er@10']:.4f})")
        privacy = result.extra.get("privacy")
        if isinstance(privacy, dict) and "epsilon" in privacy:
            console.print(f"differential privacy: (ε = {privacy['epsilon']:.3g}, δ = {privacy['delta']:g}) after "
                          f"{privacy['rounds']} rounds (noise multiplier {privacy['noise_multiplier']:g}, clip "
                          f"{privacy['clip']:g}, sample rate {privacy['sample_rate']:g}; {privacy['accountant']})")
        if ldp and not (isinstance(privacy, dict) and "epsilon" in privacy):
            console.print(f"local noise: Laplace of scale {ldp:g} on every uploaded entry; no ε is "
                          "accounted for it (--dp-clip with --dp-noise is the accounted mechanism)", highlight=False)
        if "flag_precision" in last:
            recall = last["flag_recall"]  # NaN: no malicious upload among the round's to find
            none = ("no malicious client's upload among the round's" if cfg.federated.attack is not None
                    else "none malicious (no attack)")
            console.print(f"{cfg.federated.defence} flagged {last['flagged']:.0f} uploads in the last round: "
                          + (f"precision {last['flag_precision']:.3f}, recall {recall:.3f}" if recall == recall
                             else none))
    console.print(table)
    # soft_wrap: a long path stays on one line, to be copied whole
    console.print(f"wrote {out}  ({result.wall_seconds:.1f} s, peak {result.peak_memory_mb:.0f} MB)", soft_wrap=True)
    if save is not None:
        console.print(f"saved the trained run to {save}  (fedrec recommend {save} --user ID)", soft_wrap=True)


#: `fedrec run` options left out of the default results file name: the four in its stem, where and
#: how fast the run is done (its figures do not depend on it) and what it writes; `--set` is
#: named by its own KEY=VALUE, `--config` by its file's stem. Every other option given a value
#: other than its default is in it.
_NOT_IN_NAME = frozenset({
    "algorithm", "dataset", "protocol", "seed", "set_options", "data_dir", "device", "threads",
    "memory_budget_mb", "checkpoint_every", "resume", "out", "save", "quiet", "overwrite",
})
#: the longest options part of a default results file name before the rest is hashed
_NAME_BUDGET = 48


def given_options(values: Mapping[str, Any], federated: bool, command: Any = None,
                  skip: frozenset[str] = _NOT_IN_NAME) -> list[tuple[str, object]]:
    """(flag name, value) of each option of ``command`` (default `run_command`) in ``values``
    (its parameters by name) set to other than its default, that changes the figures (not in
    ``skip``), in the order of the command's options; a file's value is its stem."""
    given = []
    for name, param in inspect.signature(command or run_command).parameters.items():
        if name in skip:
            continue
        default = getattr(param.default, "default", param.default)
        value = values[name]
        if value is None or value == default:
            continue
        if isinstance(value, Path):
            value = value.stem
        given.append(("epochs" if name == "rounds" and not federated else name.replace("_", "-"), value))
    return given


def default_out(algorithm: str, dataset: str, protocol: str, seed: int,
                given: list[tuple[str, object]], settings: Mapping[str, object]) -> Path:
    """``runs/ALGO-DATASET-PROTOCOL-sSEED[-OPTIONS].json``: OPTIONS name the options given
    (``given``: flag name and value) and the ``--set`` model options (``settings``), e.g.
    ``-rounds5-lr0.01-curriculum=sin``, so two runs with different figures never share a file
    while the same command finds its own again (options in any order). Past `_NAME_BUDGET`
    characters the options that do not fit are replaced by a hash of all of them (``+1a2b3c``)."""
    parts = [_name_part(flag, value) for flag, value in given]
    parts += [f"{key}={_plain(value)}" for key, value in sorted(settings.items())]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:6]
    parts = [re.sub(r"[^A-Za-z0-9._=+-]", "_", p) for p in parts]  # a file name's characters
    suffix = "".join(f"-{p}" for p in parts)
    if len(suffix) > _NAME_BUDGET:
        kept = ""
        for p in parts:
            if len(kept) + len(p) + 1 > _NAME_BUDGET - 7:
                break
            kept += f"-{p}"
        suffix = f"{kept}+{digest}"
    stem = f"{algorithm}-{Path(dataset).stem.replace(':', '_')}-{protocol}-s{seed}"
    return Path("runs") / f"{stem}{suffix}.json"


def _name_part(flag: str, value: object) -> str:
    """``rounds5``, ``lr0.01``, ``dual`` (a switch), ``negatives-train-only`` (a word)."""
    if value is True:
        return flag
    text = _plain(value)
    return f"{flag}{text}" if isinstance(value, int | float) and not isinstance(value, bool) else f"{flag}-{text}"


def _plain(value: object) -> str:
    """A value as short text: 0.01, 1e-05, 5 (a whole float), true."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def recommend_command(
    run_file: Path = typer.Argument(..., help="A run saved with `fedrec run --save FILE` or `Run.save`."),
    user: list[str] = typer.Option(..., "--user", "-u", help="Raw user id (as in the data file); repeatable."),
    k: int = typer.Option(10, "-k", help="How many items."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding the raw data files."),
) -> None:
    """Print each user's top-K items (raw ids), excluding the items the user trained on: one
    line a user, the user's id then its items, best first, separated by tabs.

    A federated user is scored with that user's own private state."""
    from fedrec.api import load

    if k < 1:
        raise FedrecError(f"-k must be >= 1 (got {k})")
    trained = load(run_file, data_dir=data_dir)
    if trained.carries_data and data_dir is not None and _given_on_command_line("data_dir"):
        Console(stderr=True).print(f"note: {run_file} holds its own training data; --data-dir is not read",
                                   highlight=False)
    rows = [trained.user_index(u) for u in user]  # every id checked before any line is printed
    indptr = trained.split.train.indptr
    for u, i in zip(user, rows, strict=True):
        if indptr[i + 1] == indptr[i]:  # its interactions all held out: nothing trained its own state
            Console(stderr=True).print(f"note: user {u!r} has no training interaction in this run: its items "
                                       "come from a user state no interaction of its own trained", highlight=False)
        items = trained.recommend(u, k)
        # every field tab-separated, for scripts (an id may hold a space: "Song 70, live")
        typer.echo("\t".join(str(v) for v in [u.strip(), *items]))


def _given_on_command_line(parameter: str) -> bool:
    """Whether the running command's ``parameter`` was typed, not taken from its environment
    variable or default."""
    import click
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(parameter) is ParameterSource.COMMANDLINE


def convert_command(
    file: Path = typer.Argument(..., help="A run file or checkpoint an older fedrec wrote (a pickle)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Where to write it (default: in its place)."),
) -> None:
    """Convert a run file or checkpoint that an older fedrec pickled to the safe format, once.

    Only for a file you trust: it is read by PyTorch's restricted unpickler, which builds
    tensors and NumPy arrays and refuses anything else, but its figures are whoever wrote it's."""
    from fedrec.legacy import convert

    written, what = convert(file, out)
    typer.echo(f"wrote {what} {written}")


def plot_command(
    results: list[Path] = typer.Argument(..., help="Results JSON files of `fedrec run` (or `fedrec flower`)."),
    out: Path = typer.Option(Path("runs/plot.png"), "--out", "-o", help="The figure to write: .png, .pdf or .svg."),
    metric: str | None = typer.Option(None, help="Validation metric (default: the one that selected the runs' best rounds)."),
) -> None:
    """Draw validation curves (best rounds marked) and bytes per round of one or more runs.

    One row of panels per data set and protocol; runs that differ only by seed are one line per
    algorithm, their mean with a band from the lowest to the highest seed."""
    from fedrec.plot import runs_figure

    typer.echo(f"wrote {runs_figure(results, out, metric)}")


def audit_command(
    dataset: str = typer.Option("ml-100k", "--dataset", "-d", help="Data set name (built in or added with `fedrec data add`), synthetic[:USERSxITEMS], or your own file with --columns."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING[,TIMESTAMP]] columns (as `fedrec run --columns`)."),
    protocol: str = typer.Option("loo-sampled", "--protocol", "-p", help="Evaluation protocol."),
    rounds: int = typer.Option(100, help="Rounds of training-negative sampling."),
    num_negatives: int = typer.Option(4, help="Training negatives per positive per round."),
    seed: int = typer.Option(0),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA"),
) -> None:
    """Score the negative-frequency oracle (a scorer that learns nothing) under each negative
    policy, and measure the split's timeline leak.

    Near chance means training negatives do not reveal the held-out items; near 1.0 means
    the protocol leaks. The timeline leak is the training interactions later than the test
    ones (a per-user split's; none under time-full).
    """
    from fedrec.errors import FedrecError
    from fedrec.eval.audit import negative_frequency_oracle
    from fedrec.experiment import RunConfig, prepare_split
    from fedrec.protocols.protocol import get_protocol, make_split
    from fedrec.protocols.split import timeline_leak

    if rounds < 1 or num_negatives < 1:
        raise FedrecError("--rounds and --num-negatives must be >= 1")
    if get_protocol(protocol).ranking == "rating":  # scores ratings: no training negatives to audit
        raise FedrecError(f"protocol {protocol} predicts ratings and draws no training negatives: the oracle "
                          "audits a ranking protocol's (loo-sampled, loo-full, time-full, ratio-full, ...)")
    base = prepare_split(RunConfig(algorithm="-", dataset=dataset, protocol=protocol, seed=seed, data_dir=data_dir,
                                   columns=columns))
    marks = tuple(r for r in (1, 20, 50) if r < rounds)
    table = Table(title=f"negative-frequency oracle · {dataset} · {protocol} · test set")
    table.add_column("negative policy")
    table.add_column("rounds", justify="right")
    ks = base.protocol.ks[0]
    audits = []
    for policy in ["leak-free", "train-only", "legacy-exclude-heldout"]:
        split = make_split(base.data, base.protocol, seed=seed, negatives=policy)
        res = negative_frequency_oracle(split, rounds, num_negatives, seed, checkpoints=marks)
        audits.append((policy if policy != "leak-free" else f"leak-free ({split.negatives}, default)", res))
    # the protocol's own figures: HR where it reports one, else its selection metric (F1 under a
    # ratio split), with NDCG where it has one
    figures = audits[0][1].metrics[0]
    cols = [c for c in dict.fromkeys([f"hr@{ks}" if f"hr@{ks}" in figures else base.protocol.select, f"ndcg@{ks}"])
            if c in figures]
    for c in cols:
        table.add_column(c, justify="right")
    for name, res in audits:
        for r, m in zip(res.rounds, res.metrics, strict=True):
            table.add_row(name, str(r), *(f"{m[c]:.4f}" for c in cols))
            name = ""
    console.print(table)
    if base.protocol.ranking == "sampled":
        console.print("chance level with 1 target among C candidates: hr@10 = 10/C.")
    leak = timeline_leak(base.data, base.label)
    if base.data.clock:  # the other leak: training rows later than the test rows (Ji et al., TOIS 2023)
        console.print(f"timeline: {100 * leak['targets_with_later_train']:.1f}% of test interactions have a "
                      f"later training interaction; on average {100 * leak['later_train_share']:.1f}% of "
                      "training interactions are later than a test one (0 under time-full, one cut-off "
                      "time for every user)", highlight=False)
    else:
        console.print("timeline: the data set has no timestamps, so no split of it is by time", highlight=False)


def algorithms_command(
    name: str | None = typer.Argument(None, help="An algorithm: show its typed options and engine defaults."),
) -> None:
    """List the registered algorithms, or show one algorithm's options."""
    from fedrec.algorithms import ALGORITHMS, get_algorithm
    from fedrec.federated.engine import engine_flag

    if name is None:
        table = titled("algorithms (fedrec algorithms NAME: its options)")
        table.add_column("name", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("description", overflow="fold")
        for spec in ALGORITHMS.values():
            table.add_row(spec.name, spec.kind + ("+Flower" if spec.flower else ""), spec.description)
        console.print(table)
        return
    spec = get_algorithm(name)
    console.print(f"[bold]{spec.name}[/] ({spec.kind}{', runs on Flower' if spec.flower else ''}): "
                  f"{spec.description}", highlight=False)
    console.print(f"evaluated under {', '.join(spec.rankings)} protocols (`fedrec protocols`)", highlight=False)
    table = titled("options (--set KEY=VALUE)")
    table.add_column("option", no_wrap=True)
    table.add_column("default", overflow="fold")
    table.add_column("type", overflow="fold")
    table.add_column("description", overflow="fold", min_width=20)
    types, helps = spec.options.describe(), spec.options.help()
    for key, value in spec.defaults.items():
        fixed = " (fixed by this algorithm)" if key in spec.fixed else ""
        table.add_row(key, _shown(value), types[key], helps[key] + fixed)
    console.print(table)
    engine = titled("engine defaults (command-line options)")
    engine.add_column("option", no_wrap=True)
    engine.add_column("default")
    for key, value in spec.engine_for(None).items():
        engine.add_row(engine_flag(key), str(value))
    console.print(engine)
    if spec.paper or spec.per_dataset:
        papers = titled("its paper's setting (--paper, `fedrec reproduce`): over the defaults, a fixed budget")
        papers.add_column("data set", no_wrap=True)
        papers.add_column("engine options", overflow="fold")
        shown = {"any": spec.paper, **spec.per_dataset}
        for dataset, opts in shown.items():
            if opts:
                papers.add_row(dataset, ", ".join(f"{engine_flag(k)} {'n_items x 80' if v is None else v}"
                                                  for k, v in opts.items()))
        console.print(papers)
    if spec.rating_engine or (spec.kind == "federated" and "rating" in spec.rankings):
        ours = {k: v for k, v in spec.engine_for(None, "rating").items() if spec.engine_for(None).get(k) != v}
        flags = ", ".join(f"{engine_flag(k)} {v}" for k, v in ours.items())
        console.print(f"under rating protocols (squared error on the ratings): {flags}", highlight=False)
    if spec.rating_paper:
        flags = ", ".join(f"{engine_flag(k)} {v}" for k, v in spec.rating_paper.items())
        console.print(f"and under its paper's setting for ratings: {flags}", highlight=False)


def _shown(value: object) -> str:
    """An option's value as `--set` takes it (lists as a/b/c)."""
    if isinstance(value, tuple):
        return "/".join(map(str, value)) or "''"
    return str(value).lower() if isinstance(value, bool) else str(value)


def protocols_command() -> None:
    """List the evaluation protocols and training-negative policies."""
    from fedrec.protocols.protocol import NEGATIVE_ALIASES, NEGATIVE_POLICIES, PROTOCOLS

    table = titled("protocols", caption="*: the validation metric that selects the best round")
    table.add_column("name", no_wrap=True)
    table.add_column("metrics", no_wrap=True)
    table.add_column("description", overflow="fold")
    for p in PROTOCOLS.values():
        metrics = [f"{m}@{p.ks[0]}" if m != "rmse" else m for m in p.metrics]
        metrics += [] if p.select in metrics else [p.select]
        table.add_row(p.name, "\n".join(m + ("*" if m == p.select else "") for m in metrics), p.description)
    console.print(table)
    neg = titled("training-negative policies (--negatives)")
    neg.add_column("name", no_wrap=True)
    neg.add_column("draws from", overflow="fold")
    for name, text in NEGATIVE_POLICIES.items():
        aliases = [alias for alias, policy in NEGATIVE_ALIASES.items() if policy == name]
        neg.add_row(name, text + (f" (also called {', '.join(aliases)})" if aliases else ""))
    console.print(neg)


def titled(title: str, **options: Any) -> Table:
    """A table at least as wide as its title, which then stays on one line where it fits."""
    return Table(title=title, min_width=len(title), **options)


def model_options(flags: dict[str, object], settings: dict[str, object]) -> dict[str, object]:
    """The model options of a command: those given as their own flags (``--dim``; None where not
    given) and the ``--set`` ones. One given both ways is refused, not settled silently."""
    from fedrec.errors import FedrecError

    given = {key: value for key, value in flags.items() if value is not None}
    for key in given.keys() & settings.keys():
        flag = "--" + key.replace("_", "-") + ("" if given[key] is True else f" {given[key]}")
        raise FedrecError(f"{flag} and --set {key}=... both give the model's {key}; give it once")
    return {**given, **settings}


def parse_settings(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings as model options (booleans, numbers, else text)."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            from fedrec.errors import FedrecError

            raise FedrecError(f"--set expects KEY=VALUE, got '{item}'")
        value: object = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        if key.replace("-", "_") in out:
            from fedrec.errors import FedrecError

            raise FedrecError(f"--set {key} is given twice; give it once")
        out[key.replace("-", "_")] = value
    return out
