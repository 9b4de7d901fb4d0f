"""`fedrec flower`: run a federated algorithm on Flower (simulation engine or a loopback
deployment), or write the Flower app directory for `flwr run` on your own SuperLink."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from fedrec.errors import FedrecError

console = Console()
MODES = ("simulation", "loopback", "app")


#: `fedrec flower` options left out of its default results file name: those of `fedrec run`'s
#: stem, and how and where the deployment runs (a deployment ends with the figures of the run)
_NOT_IN_NAME = frozenset({
    "algorithm", "dataset", "protocol", "seed", "set_options", "columns", "data_dir", "device", "mode", "nodes",
    "round_timeout", "checkpoint", "resume", "client_state_dir", "secagg_range", "out", "app_dir", "insecure",
    "tls_host", "workdir", "ray_address", "node_cpus", "node_gpus", "overwrite",
})


def flower_command(
    algorithm: str = typer.Argument(..., help="An algorithm `fedrec algorithms` marks '+ Flower' (FedMF, FedNCF, FedRecon, PFedRec, MetaMF, FedRAP, PersonalFR, FedAvg-AE)."),
    mode: str = typer.Option("loopback", help="simulation (Flower's engine), loopback (a SuperLink and SuperNodes as processes here, started and stopped by fedrec) or app (write an app dir for `flwr run`)."),
    nodes: int = typer.Option(3, help="SuperNodes; node i holds the i-th of NODES blocks of users."),
    dataset: str = typer.Option("ml-100k", "--dataset", "-d", help="Data set name, synthetic[:USERSxITEMS], or your own CSV/TSV/Parquet file (with --columns); every node reads it."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING[,TIMESTAMP]] columns: header names, or 0-based positions for a file without a header."),
    protocol: str = typer.Option("loo-sampled", "--protocol", "-p", help="Evaluation protocol (ranking)."),
    ks: str | None = typer.Option(None, "--ks", help="Further cut-offs K of the ranking metrics, beside 10, as `fedrec run --ks` (e.g. 20 or 5,20)."),
    seed: int = typer.Option(0, help="Seed of every random choice (the same draws as `fedrec run`)."),
    rounds: int | None = typer.Option(None, help="Rounds (default: the algorithm's, else 100)."),
    clients_per_round: float | None = typer.Option(None, help="Fraction (<= 1) or number of clients (users) per round."),
    local_epochs: int | None = typer.Option(None, help="Local epochs per round."),
    lr: float | None = typer.Option(None, help="Learning rate (default: the algorithm's)."),
    lr_item: float | None = typer.Option(None, help="Learning rate of item rows."),
    aggregation: str | None = typer.Option(None, help="The server's rule for item rows, as `fedrec run --aggregation` (default: the algorithm's; under --secagg each row's senders are summed securely too)."),
    server_opt: str | None = typer.Option(None, "--server-opt", help="The server optimiser on the round's mean, as `fedrec run --server-opt` (e.g. yogi:lr=0.05)."),
    client_objective: str | None = typer.Option(None, "--client-objective", help="A term added to each client's local loss, as `fedrec run --client-objective` (e.g. prox:mu=0.01)."),
    paper: bool = typer.Option(False, "--paper", help="The algorithm's paper setting instead of fedrec's defaults, as `fedrec run --paper`."),
    dim: int | None = typer.Option(None, help="Embedding size."),
    eval_every: int = typer.Option(1, help="Evaluate every N rounds."),
    set_options: list[str] = typer.Option([], "--set", help="Model option KEY=VALUE, repeatable."),
    round_timeout: float = typer.Option(600.0, help="Seconds the server waits for a node's reply; later replies are dropped (logged)."),
    checkpoint: Path | None = typer.Option(None, help="Server checkpoint, written after every round."),
    resume: bool = typer.Option(False, "--resume", help="Continue from --checkpoint."),
    client_state_dir: Path | None = typer.Option(None, help="Where nodes also keep their clients' private state, for --resume."),
    ldp: float = typer.Option(0.0, help="Laplace noise scale each node adds to its clients' uploaded item tables (LDP)."),
    dp_clip: float | None = typer.Option(None, help="DP: clip each client's gradient w.r.t. the item table to this L2 norm (tau)."),
    dp_noise: float = typer.Option(0.0, help="DP: Gaussian noise multiplier z, drawn on the nodes; epsilon is reported."),
    dp_delta: float = typer.Option(1e-5, help="DP: delta of the reported (epsilon, delta)."),
    defence: str | None = typer.Option(None, help="Robust aggregation per item row, as `fedrec run --defence` (norm-bound, median, trimmed-mean, krum, multi-krum, union): the nodes then send each client's upload, not their sum."),
    trim: float = typer.Option(0.1, help="Share trimmed from each end by --defence trimmed-mean."),
    byzantine: float = typer.Option(0.1, help="Share of a row's uploaders Krum assumes malicious."),
    norm_bound: float | None = typer.Option(None, help="--defence norm-bound's L2 bound on a client's update (default: the round's median)."),
    union_step: str = typer.Option("share", help="--defence union: where it judges each client, as `fedrec run --union-step` (share or server)."),
    secagg: bool = typer.Option(False, "--secagg", help="Sum the nodes' item-table updates with Flower's SecAgg+ (FedMF, FedRecon, PFedRec and kin without shared weights): the server sees only the sum."),
    secagg_range: float = typer.Option(8192.0, help="SecAgg+: update entries must lie in +-this (quantised to 2 x range / 2^24); a node whose update does not is left out."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding the raw data files."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Results JSON (default runs/ALGO-DATASET-PROTOCOL-sSEED[-OPTIONS]-flower.json, named as `fedrec run` names its own), written by the ServerApp."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier run's --out file (kept by default, unless --resume goes on from an existing --checkpoint); app mode: write into a non-empty --app-dir and its deployment folder (new keys)."),
    app_dir: Path = typer.Option(Path("fedrec-flower-app"), help="App mode: the Flower app directory to write (its credentials and Flower config go beside it, in APP_DIR-deployment)."),
    insecure: bool = typer.Option(False, "--insecure", help="Loopback and app: plaintext and no node authentication (anyone who reaches the port can join as a node). Default: TLS with a CA made for the deployment, and only registered SuperNodes."),
    tls_host: list[str] = typer.Option([], "--tls-host", help="App mode: a host name or IP address the SuperLink is reached at, for its certificate; repeatable (default: 127.0.0.1 and localhost)."),
    workdir: Path | None = typer.Option(None, help="Loopback: folder for logs and Flower's home (default: a temporary one)."),
    device: str = typer.Option("cpu", help="Where nodes train their clients (cpu, cuda, cuda:1); the server aggregates on the CPU."),
    ray_address: str | None = typer.Option(None, help="Simulation: an existing Ray cluster (its head's HOST:PORT, or auto) whose machines run the nodes; see docs/scale.md."),
    node_cpus: int = typer.Option(1, help="Simulation: CPUs each node's Ray actor asks for."),
    node_gpus: float = typer.Option(0.0, help="Simulation: share of a GPU each node's Ray actor asks for (e.g. 0.25: four nodes a GPU); use with --device cuda."),
) -> None:
    """Run ALGORITHM on Flower: the simulator's algorithm objects as a ServerApp and ClientApp."""
    from fedrec import threads
    from fedrec.cli.experiments import model_options, parse_settings

    threads.apply()  # the server process; nodes are their own processes

    try:
        from fedrec.flower import launch
    except ImportError as e:
        raise FedrecError(f"Flower is not installed ({e}); pip install 'fedrec[flower]'") from e
    from fedrec.experiment import RunConfig, federated_config
    from fedrec.files import check_writable
    from fedrec.flower.roles import check_deployable

    if mode not in MODES:
        raise FedrecError(f"--mode must be one of {', '.join(MODES)}")
    ray_set = [name for name, given in (("--ray-address", ray_address is not None), ("--node-cpus", node_cpus != 1),
                                        ("--node-gpus", node_gpus != 0.0)) if given]
    if ray_set and mode != "simulation":
        raise FedrecError(f"{', '.join(ray_set)} only apply to --mode simulation (Ray)")
    if insecure and mode == "simulation":
        raise FedrecError("--insecure applies to --mode loopback and app (the simulation engine has no network)")
    if tls_host and (mode != "app" or insecure):
        raise FedrecError("--tls-host applies to a secure --mode app (loopback's SuperLink is 127.0.0.1)")
    if nodes < 1:
        raise FedrecError(f"--nodes must be >= 1 (got {nodes})")
    if node_cpus < 1 or node_gpus < 0:
        raise FedrecError("--node-cpus must be >= 1 and --node-gpus >= 0")
    if ray_address is not None:
        launch.check_ray_address(ray_address)
    from fedrec.protocols.protocol import parse_cutoffs

    cutoffs = parse_cutoffs(ks, protocol) if ks is not None else ()
    ks = ",".join(map(str, cutoffs)) or None  # the file's name, as `fedrec run` names it
    run = RunConfig(
        algorithm=algorithm, dataset=_for_nodes(dataset, columns), protocol=protocol, seed=seed,
        data_dir=os.path.abspath(data_dir) if data_dir else None, columns=columns, ks=cutoffs,
        model=model_options({"dim": dim}, parse_settings(set_options)),
        federated=federated_config(algorithm, dataset, protocol, paper=paper, rounds=rounds,
                                   clients_per_round=clients_per_round, local_epochs=local_epochs, lr=lr,
                                   lr_item=lr_item, aggregation=aggregation,
                                   eval_every=eval_every, ldp=ldp, dp_clip=dp_clip,
                                   dp_noise=dp_noise, dp_delta=dp_delta, server_opt=server_opt,
                                   client_objective=client_objective, device=device, defence=defence, trim=trim,
                                   byzantine=byzantine, norm_bound=norm_bound, union_step=union_step),
    )
    run.validate()
    run.federated.validate()
    check_deployable(run, secure=secagg)
    if out is None:  # as `fedrec run` names its results (the options that change the figures), "-flower" added
        from fedrec.cli.experiments import default_out, given_options

        given = given_options(locals(), True, flower_command, _NOT_IN_NAME)
        plain = default_out(algorithm, dataset, protocol, seed, given, parse_settings(set_options))
        out = plain.with_name(f"{plain.stem}-flower.json")
    replace = overwrite or (resume and checkpoint is not None and checkpoint.exists())
    kw = {"timeout": round_timeout, "checkpoint": checkpoint, "resume": resume, "overwrite": replace,
          "client_state_dir": client_state_dir, "secagg": secagg, "secagg_range": secagg_range}
    # an earlier run's results are kept unless asked, and a bad path is one line now, not after the
    # run; the ServerApp checks again when it starts (app mode: `flwr run`, perhaps elsewhere)
    from fedrec.experiment import dataset_files

    check_writable(out, "--out", overwrite=replace, reads=dataset_files(dataset))
    if mode == "app":
        if insecure:
            _warn_insecure()
        _write_app(app_dir, nodes, launch.options(run, nodes, out=out, **kw), insecure, tls_host, out, overwrite)
        return
    # the nodes will read the data on this machine: its errors (a missing file, too few items
    # for the protocol) come now, in one line, not from node logs after the processes start
    from fedrec.experiment import prepare_split

    split = prepare_split(run)
    check_deployable(run, secure=secagg, split=split)
    if nodes > split.n_users:
        raise FedrecError(f"--nodes {nodes} is more than the data's {split.n_users} users: a node would hold none")
    out.parent.mkdir(parents=True, exist_ok=True)
    before = _stamp(out)  # an earlier run's results there are not this run's
    if insecure:
        _warn_insecure()
    start = time.perf_counter()
    if mode == "simulation":
        # the ServerApp's exception is raised here; a node's failure is in it (`fedrec.flower.app`)
        launch.simulate(run, nodes, out=out, ray_address=ray_address, node_cpus=node_cpus,
                        node_gpus=node_gpus, **kw)
    else:
        with launch.Loopback(nodes, workdir=workdir, insecure=insecure) as deployment:
            how = "plaintext, unauthenticated" if insecure else "TLS, registered SuperNodes only"
            console.print(f"SuperLink on {deployment.address} ({how}), {nodes} SuperNodes; logs in "
                          f"{deployment.workdir / 'logs'}")
            proc = deployment.submit(run, out=out, **kw)
            if _stamp(out) in (None, before):
                raise FedrecError(deployment.failure(proc))
    if _stamp(out) in (None, before):
        raise FedrecError(f"the run wrote no results ({out}); see the Flower output above")
    _summary(json.loads(out.read_text()), out, time.perf_counter() - start)


def _for_nodes(dataset: str, columns: str | None) -> str:
    """``dataset`` as the nodes are handed it: a file path made absolute, since a node runs in
    another folder (a loopback SuperNode in the deployment's, a Ray worker in Ray's); a name
    stays a name (`fedrec.experiment.load_interactions` resolves it on each node)."""
    from fedrec.data.user_sets import looks_like_a_file

    return os.path.abspath(dataset) if columns is not None or looks_like_a_file(dataset) else dataset


def _stamp(path: Path) -> tuple[int, int] | None:
    """When ``path`` was last written (modification time, size), or None where it is not."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _warn_insecure() -> None:
    Console(stderr=True).print(
        "[bold yellow]warning:[/] --insecure: the SuperLink speaks plaintext and admits any "
        "SuperNode; anyone who can reach its port can read the item rows sent down and send uploads",
        highlight=False)


def _write_app(app_dir: Path, nodes: int, opts: dict, insecure: bool,  # type: ignore[type-arg]
               tls_host: list[str], out: Path, overwrite: bool) -> None:
    """App mode: the app directory; beside it (never inside: `flwr run` ships the app
    directory to the SuperLink) APP_DIR-deployment/ with the deployment's credentials (unless
    insecure) and its FLWR_HOME; then the commands that deploy it by hand."""
    from fedrec.files import check_folder
    from fedrec.flower import launch
    from fedrec.flower.tls import LOOPBACK_HOSTS, make_credentials

    deployment = app_dir.parent / f"{app_dir.name}-deployment"
    for folder, what in ((app_dir, "--app-dir"), (deployment, "deployment folder")):
        check_folder(folder, what)
        if folder.is_dir() and any(folder.iterdir()) and not overwrite:
            # a folder of the user's own, or an earlier app's, whose SuperNodes are registered with its keys
            raise FedrecError(f"{what} {folder} is not empty (an earlier app's, or other files); pass --overwrite "
                              "to replace its files (new keys: register the SuperNodes again) or choose another")
    try:
        creds = None if insecure else make_credentials(deployment / "credentials", nodes,
                                                       tuple(tls_host) or LOOPBACK_HOSTS)
        home = (deployment / "flwr-home").resolve()
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(launch.federation_config("fedrec", launch.superlink_address(creds), creds))
        app_dir.mkdir(parents=True, exist_ok=True)
        launch.write_app(app_dir, opts)
    except OSError as e:  # check_folder passes a folder the OS still refuses (/proc, a read-only mount)
        raise FedrecError(f"cannot write the app to {app_dir} and {deployment}: {e.strerror or e}") from None
    console.print(f"wrote {app_dir / 'pyproject.toml'}, and in {deployment}: " + (
        f"the deployment's CA, SuperLink certificate and {nodes} SuperNode keys (credentials/), "
        if creds else "") + "Flower's config naming the federation 'fedrec' (flwr-home/)")
    console.print(f"deploy it by hand; the ServerApp writes {out.resolve()}:")
    for line in launch.by_hand(app_dir, nodes, creds, home):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


def _summary(result: dict, out: Path, seconds: float) -> None:  # type: ignore[type-arg]
    table = Table(title=f"{result['algorithm']} on Flower · {result['dataset']} · {result['protocol']}")
    table.add_column("metric")
    table.add_column(f"valid (round {result['best_round']})", justify="right")
    table.add_column("test", justify="right")
    for key, value in result["test"].items():
        if key != "users":
            table.add_row(key, f"{result['valid_at_best'].get(key, float('nan')):.4f}", f"{value:.4f}")
    console.print(table)
    dropped = sum(h["extra"].get("dropped_nodes", 0) for h in result["history"])
    rejected = sum(h["extra"].get("rejected_nodes", 0) for h in result["history"])
    console.print(f"{len(result['history'])} rounds, {dropped:g} node replies missing, "
                  f"{rejected:g} uploads rejected; wrote {out} ({seconds:.1f} s)")
