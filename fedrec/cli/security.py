"""`fedrec audit-privacy`: what the server learns from a method's uploads (`fedrec.security.inference`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from fedrec.errors import FedrecError

console = Console()


def audit_privacy_command(
    algorithm: str = typer.Argument(..., help="A federated algorithm (`fedrec algorithms`)."),
    dataset: str = typer.Option("ml-100k", "--dataset", "-d", help="Data set name (built in or added with `fedrec data add`), synthetic[:USERSxITEMS], or your own file with --columns."),
    columns: str | None = typer.Option(None, "--columns", help="Your own file's USER,ITEM[,RATING[,TIMESTAMP]] columns (as `fedrec run --columns`)."),
    protocol: str = typer.Option("loo-sampled", "--protocol", "-p", help="Evaluation protocol (the utility figures)."),
    rounds: int = typer.Option(20, "--rounds", help="Rounds to train and audit."),
    seed: int = typer.Option(0, help="Seed of every random choice."),
    clients_per_round: float | None = typer.Option(None, help="Fraction (<= 1) or number of clients a round."),
    ldp: float = typer.Option(0.0, help="Defence: Laplace LDP scale on every uploaded entry (PFedRec Eq. 12)."),
    dp_clip: float | None = typer.Option(None, help="Defence: DP clip of a client's item gradient."),
    dp_noise: float = typer.Option(0.0, help="Defence: DP noise multiplier (each client adds its share)."),
    encoding: str | None = typer.Option(None, help="Upload encoding: rows, sparse or dense."),
    pad_items: int = typer.Option(0, help="Defence: pseudo items a client also uploads noisy rows for (FedGNN/FedMF padding)."),
    secagg: int = typer.Option(0, help="Defence: secure aggregation over groups of this many clients (the server sees only their sum; 0: off)."),
    data_dir: str | None = typer.Option(None, "--data-dir", envvar="FEDREC_DATA", help="Folder holding the raw data files."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Audit JSON (default runs/audit-ALGO-DATASET-PROTOCOL-sSEED[-OPTIONS].json, OPTIONS the options given that change its figures, e.g. -ldp0.3)."),
    threads: int | None = typer.Option(None, "--threads", help="PyTorch threads (default: OMP_NUM_THREADS, else 1)."),
    set_options: list[str] = typer.Option([], "--set", help="Model option KEY=VALUE, repeatable (see `fedrec algorithms`), e.g. --set neighbours=0."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
) -> None:
    """Train ALGORITHM for a few rounds and measure how well an honest-but-curious server infers
    each client's training items from its uploads (docs/security.md), beside the utility."""
    from fedrec import threads as torch_threads
    from fedrec.algorithms import get_algorithm
    from fedrec.cli.experiments import parse_settings
    from fedrec.experiment import RunConfig, federated_config
    from fedrec.files import atomic_write, check_writable
    from fedrec.security.inference import INFERENCE_ATTACKS, audit_privacy

    torch_threads.apply(threads)
    if get_algorithm(algorithm).kind != "federated":
        raise FedrecError(f"'{algorithm}' is centralised: there are no uploads to audit")
    if out is None:  # one file per audit: the options that change its figures are in its name
        from fedrec.cli.experiments import default_out

        given = [(flag, value) for flag, value, default in (
            ("columns", columns, None), ("rounds", rounds, 20), ("clients-per-round", clients_per_round, None),
            ("ldp", ldp, 0.0),
            ("dp-clip", dp_clip, None), ("dp-noise", dp_noise, 0.0), ("encoding", encoding, None),
            ("pad-items", pad_items, 0), ("secagg", secagg, 0)) if value != default]
        out = default_out(f"audit-{algorithm}", dataset, protocol, seed, given, parse_settings(set_options))
    from fedrec.experiment import dataset_files

    check_writable(out, "--out", overwrite=overwrite, reads=dataset_files(dataset))  # before the training
    cfg = RunConfig(algorithm=algorithm, dataset=dataset, protocol=protocol, seed=seed, data_dir=data_dir, columns=columns,
                    model=parse_settings(set_options), federated=federated_config(algorithm, dataset, protocol, rounds=rounds, clients_per_round=clients_per_round,
                                               ldp=ldp, dp_clip=dp_clip, dp_noise=dp_noise, encoding=encoding,
                                               pad_items=pad_items))
    with console.status(f"auditing {algorithm} on {dataset} for {rounds} rounds"):
        result, audit = audit_privacy(cfg, secagg=secagg)
    summary = audit.summary()
    table = Table(title=f"{algorithm} · {dataset} · server view: {audit.view.describe()}"
                        + (f" · {pad_items} pseudo items" if pad_items else ""))
    for col in ("attack", "precision", "recall", "F1", "AUC"):
        table.add_column(col, justify="left" if col == "attack" else "right")
    for name in INFERENCE_ATTACKS:
        if f"{name}_auc" in summary:
            table.add_row(name, *(f"{summary[f'{name}_{k}']:.3f}" for k in ("precision", "recall", "f1", "auc")))
    table.add_row("random guess", f"{summary['random_precision']:.3f}", "", "", "0.500")
    console.print(table)
    select = result.select
    hr = f", HR@10 {result.test['hr@10']:.4f}" if "hr@10" in result.test and select != "hr@10" else ""
    console.print(f"utility: test {select} {result.test.get(select, float('nan')):.4f}{hr} "
                  f"at round {result.best_round} of {rounds}", highlight=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    blob = {"algorithm": algorithm, "dataset": dataset, "view": audit.view.describe(), "pad_items": pad_items,
            "secagg": secagg, "summary": summary, "rounds": audit.rounds, "test": result.test,
            "best_round": result.best_round, "config": result.config}
    text = json.dumps(blob, indent=1)
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    console.print(f"wrote {out}")
