"""The round loop of the cohort-vectorised simulator.

A round: sample clients (seeded), draw the cohort's training negatives and shuffle keys, train
the cohort in memory-sized chunks (each chunk all at once), fold every chunk's uploads into
running sums, aggregate, evaluate on validation, checkpoint. All randomness of round r comes
from generators seeded by (seed, r), so a resumed run replays exactly what an uninterrupted
one would have done.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.errors import FedrecError
from fedrec.eval.evaluate import evaluate, restrict
from fedrec.federated import draws
from fedrec.federated.cohort import build_cohort, order_by_activity
from fedrec.federated.family import client_params
from fedrec.federated.state import Accumulator, CohortState
from fedrec.federated.upload import ENCODINGS, UploadPath
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord
from fedrec.train.selection import Selection, TrainOutcome


@dataclass
class FederatedConfig:
    """Options of a federated run (defaults: PFedRec's paper settings on ML-100K).

    ``clients_per_round``: a fraction of all clients when <= 1, else a count.
    ``lr_item``: learning rate of the item rows; None = ``lr * item_lr_scale``, and an
    ``item_lr_scale`` of None means the official PFedRec/GPFedRec rule ``n_items * 80``
    (13,456 on ML-100K at lr 0.1). The rule looks odd but is needed: the loss is a mean over a
    batch of 256 in which a given row rarely appears, so its gradient is tiny, and with rows
    initialised N(0, 1) smaller item rates leave the model at chance (measured: scales 1, 100
    and 2,560 give HR@10 ~0.10 after 10 rounds on ML-100K; the official rule 0.43).
    ``memory_budget_mb``: cohorts are trained in chunks whose working set is estimated to fit
    in it. Smaller chunks are faster as long as they stay big enough to vectorise: a chunk that
    fits the CPU's last-level cache avoids streaming rows from memory (measured, PFedRec, 2-core
    EPYC with 32 MB L3: ML-100K 0.21 s/round at 512 MB, 0.157 s at 32 MB; ML-1M scale 2.8 and
    1.5 s/round). Results do not depend on it.
    """

    rounds: int = 100
    clients_per_round: float = 1.0
    local_epochs: int = 1
    batch_size: int = 256
    lr: float = 0.1
    lr_item: float | None = None
    item_lr_scale: float | None = None
    item_std: float = 1.0
    negatives: int = 4
    eval_every: int = 1
    patience: int = 0
    ldp: float = 0.0
    clip: float | None = None
    encoding: str = "rows"
    dp_clip: float | None = None
    dp_noise: float = 0.0
    dp_delta: float = 1e-5
    memory_budget_mb: float = 32.0
    checkpoint_every: int = 0
    device: str = "cpu"

    def validate(self) -> None:
        problems = [
            (self.rounds < 1, f"--rounds must be >= 1 (got {self.rounds})"),
            (self.clients_per_round <= 0, "--clients-per-round must be > 0"),
            (self.local_epochs < 1, "--local-epochs must be >= 1"),
            (self.batch_size < 1, "--batch-size must be >= 1"),
            (self.lr <= 0 or (self.lr_item is not None and self.lr_item <= 0), "learning rates must be > 0"),
            (self.negatives < 0, "--num-negatives must be >= 0"),
            (self.ldp < 0, "--ldp must be >= 0"),
            (self.clip is not None and self.clip <= 0, "--clip must be > 0"),
            (self.dp_clip is not None and self.dp_clip <= 0, "--dp-clip must be > 0"),
            (self.dp_noise < 0, "--dp-noise must be >= 0"),
            (self.dp_noise > 0 and self.dp_clip is None, "--dp-noise needs --dp-clip (the sensitivity)"),
            (not 0 < self.dp_delta < 1, "--dp-delta must be in (0, 1)"),
            (self.encoding not in ENCODINGS, f"--encoding must be one of {', '.join(ENCODINGS)}"),
            (self.memory_budget_mb <= 0, "--memory-budget-mb must be > 0"),
            (self.eval_every < 1, "--eval-every must be >= 1"),
            (self.device != "cpu", "the federated engine runs on the CPU only so far (--device cpu)"),
        ]
        for bad, message in problems:
            if bad:
                raise FedrecError(message)

    def upload_path(self, lr_item: float = 1.0) -> UploadPath:
        """The clients' upload path. ``dp_clip`` bounds a client's gradient w.r.t. the item
        table, so its whole update (learning rate x gradient) is clipped to ``lr_item * dp_clip``.
        """
        return UploadPath(ldp=self.ldp, clip=self.clip, encoding=self.encoding,
                          dp_clip=None if self.dp_clip is None else lr_item * self.dp_clip,
                          dp_noise=self.dp_noise)

    def item_lr(self, n_items: int) -> float:
        """``lr_item``, or ``lr x item_lr_scale`` (default scale ``n_items x 80``)."""
        if self.lr_item is not None:
            return self.lr_item
        scale = self.item_lr_scale if self.item_lr_scale is not None else n_items * 80.0
        return self.lr * scale


def cohort_size(n_clients: int, per_round: float) -> int:
    """Clients per round: a fraction (<= 1) or a count (> 1) of ``n_clients``."""
    if per_round <= 1.0:
        return max(1, round(per_round * n_clients))
    return min(int(per_round), n_clients)


def sample_clients(n_clients: int, per_round: float, rng: np.random.Generator) -> np.ndarray:
    """All clients, a fraction (<= 1) or a count (> 1) of them, without replacement."""
    k = cohort_size(n_clients, per_round)
    if k >= n_clients:
        return np.arange(n_clients)
    return np.sort(rng.choice(n_clients, size=k, replace=False))


def chunk_bounds(samples: np.ndarray, bytes_per_sample: float, budget_mb: float) -> list[tuple[int, int]]:
    """Cut clients (in training order) into consecutive chunks estimated to fit the budget."""
    budget = budget_mb * 2**20
    cost = np.cumsum(samples * bytes_per_sample)
    bounds, start = [], 0
    while start < len(samples):
        base = cost[start - 1] if start else 0.0
        end = int(np.searchsorted(cost, base + budget, side="right"))
        end = max(end, start + 1)
        bounds.append((start, end))
        start = end
    return bounds


def client_draws(spec: Any, cfg: FederatedConfig, train: sp.csr_matrix, sampler: ComplementSampler,
                 rows: np.ndarray, clients: np.ndarray, seed: int, r: int
                 ) -> tuple[np.ndarray | None, np.ndarray, torch.Tensor | None]:
    """Round ``r``'s draws of ``clients`` (ids; their rows of ``train`` and ``sampler`` are
    ``rows``): training negatives ``(n_positives, k)`` in CSR order, shuffle keys
    ``(epochs, n_samples)`` and FedRecon's fresh user vectors. Each client's draws are keyed by
    (seed, round, client id) (`fedrec.federated.draws`), so a Flower node that holds a few
    clients makes exactly the draws the simulator makes for them.
    """
    counts = np.diff(train.indptr)[rows]
    negs = client_negatives(cfg.negatives, train, sampler, rows, clients, seed, r)
    samples = counts * (1 + cfg.negatives)
    keys = np.stack([draws.uniforms((seed, draws.SHUFFLE, r, e), clients, samples)
                     for e in range(cfg.local_epochs)])
    fresh = (client_params(spec, ["user"], clients, (seed, draws.FRESH_USER, r))["user"]
             if spec.reconstruct else None)
    return negs, keys, fresh


def client_negatives(k: int, train: sp.csr_matrix, sampler: ComplementSampler, rows: np.ndarray,
                     clients: np.ndarray, seed: int, r: int) -> np.ndarray | None:
    """Round ``r``'s ``k`` training negatives a positive of ``clients`` (see `client_draws`)."""
    if not k:
        return None
    counts = np.diff(train.indptr)[rows]
    u = draws.uniforms((seed, draws.NEGATIVES, r), clients, counts * k).reshape(-1, k)
    return sampler.sample_at(np.repeat(rows, counts), u)


def round_plan(n_clients: int, per_round: float, seed: int, r: int
               ) -> tuple[np.ndarray, torch.Generator]:
    """The server's draws of round ``r``: the clients it samples and the generator of its own
    noise (DP). Public given the seed: a Flower node computes when its clients take part."""
    rng = np.random.default_rng([seed, r])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return sample_clients(n_clients, per_round, rng), gen


def train_cohort(state: CohortState, spec: Any, cfg: FederatedConfig, train: sp.csr_matrix,
                 sampler: ComplementSampler, rows: np.ndarray, clients: np.ndarray, seed: int,
                 r: int, path: UploadPath, acc: Accumulator) -> None:
    """Train ``clients`` (ids; rows ``rows`` of ``train``, in `order_by_activity` order) for
    round ``r`` in memory-sized chunks, folding their uploads into ``acc``. The simulator calls
    it with the whole cohort, a Flower node with its own clients."""
    counts = np.diff(train.indptr)[rows]
    negs, keys, fresh = client_draws(spec, cfg, train, sampler, rows, clients, seed, r)
    samples = counts * (1 + cfg.negatives)
    pos_end, smp_end = np.cumsum(counts), np.cumsum(samples)
    # rows and activations are per sample; the steps' index arrays (16 bytes a slot) per epoch
    per_sample = spec.bytes_per_sample + (16 * cfg.local_epochs if spec.bytes_per_sample else 0)
    for a, b in chunk_bounds(samples, per_sample, cfg.memory_budget_mb):
        p0, s0 = (pos_end[a - 1], smp_end[a - 1]) if a else (0, 0)
        chunk_negs = negs[p0 : pos_end[b - 1]] if negs is not None else None
        batches = build_cohort(train, rows[a:b], chunk_negs, cfg.batch_size,
                               keys[:, s0 : smp_end[b - 1]])
        state.accumulate(acc, state.local_update(batches, path, None if fresh is None else fresh[a:b]))


def run_federated(
    spec: Any,
    split: Split,
    cfg: FederatedConfig,
    seed: int = 0,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> TrainOutcome:
    """Simulate ``cfg.rounds`` rounds with one client per user; test at the best validation round.

    ``spec`` is an algorithm's frozen description (`FamilySpec`, `RAPSpec`): it builds the
    state (`spec.create_state`) that implements the batched algorithm interface.
    """
    cfg.validate()
    if hasattr(spec, "simulate"):  # clients that each hold a whole model (FedCIA and kin)
        return spec.simulate(split, cfg, seed, on_round, checkpoint, resume)
    n_clients, n_items = split.n_users, split.n_items
    lr_item = cfg.item_lr(n_items)
    state = spec.create_state(n_clients, n_items, lr=cfg.lr, lr_item=lr_item,
                              item_std=cfg.item_std, seed=seed, train=split.train)
    out = TrainOutcome()
    first = 1
    ckpt = Path(checkpoint) if checkpoint else None
    if resume and ckpt is not None and ckpt.exists():
        first = _load(ckpt, state, out, spec, cfg) + 1
    path = cfg.upload_path(lr_item)
    selection = Selection(split.protocol.select, cfg.patience, out)

    def scorer(users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return state.scores(users, items)

    # groups of users an algorithm reports apart (GFed-PP: public and private), tested apart too
    groups: dict[str, np.ndarray] = getattr(state, "user_groups", dict)()

    for r in range(first, cfg.rounds + 1):
        start = time.perf_counter()
        sampled, gen = round_plan(n_clients, cfg.clients_per_round, seed, r)
        cohort = order_by_activity(split.train, sampled)
        acc = state.begin_round(r)
        train_cohort(state, spec, cfg, split.train, split.sampler, cohort, cohort, seed, r, path, acc)
        if not math.isfinite(acc.loss_sum):
            raise FedrecError(
                f"training diverged in round {r} (the loss is not finite); lower --lr or "
                f"--lr-item (item rows use {lr_item:g})"
            )
        state.aggregate(acc, path, gen)
        record = RoundRecord(round=r, loss=acc.loss_sum / max(acc.client_batches, 1), seconds=0.0,
                             bytes_up=acc.bytes_up, bytes_down=acc.bytes_down,
                             rejected_uploads=acc.rejected, extra=state.round_extra())
        if r % cfg.eval_every == 0 or r == cfg.rounds:
            record.valid = evaluate(scorer, split.valid, split.protocol)
            if selection.observe(r, record.valid):
                out.test = evaluate(scorer, split.test, split.protocol)
                out.extra["test_groups"] = {
                    name: evaluate(scorer, restrict(split.test, mask), split.protocol)
                    for name, mask in groups.items() if mask.any()}
        record.seconds = time.perf_counter() - start
        out.history.append(record)
        if on_round is not None:
            on_round(record, out.best_round, out.valid_at_best)
        if ckpt is not None and cfg.checkpoint_every and (r % cfg.checkpoint_every == 0):
            _save(ckpt, r, state, out, spec, cfg)
        if selection.should_stop:
            break
    out.extra = {**state.run_extra(), **out.extra}
    if cfg.dp_noise > 0:
        out.extra["privacy"] = privacy_spent(cfg, n_clients, len(out.history))
    return out


def privacy_spent(cfg: FederatedConfig, n_clients: int, rounds: int) -> dict[str, float | str]:
    """(epsilon, delta) of the run's Gaussian mechanism, by Opacus' RDP accountant.

    Each round is one application with noise multiplier z and sampling rate q = the share of
    clients taking part (1 under full participation, where subsampling gives no amplification).
    """
    from opacus.accountants import RDPAccountant

    q = cohort_size(n_clients, cfg.clients_per_round) / n_clients
    accountant = RDPAccountant()
    accountant.history = [(cfg.dp_noise, q, rounds)]
    return {"epsilon": float(accountant.get_epsilon(cfg.dp_delta)), "delta": cfg.dp_delta,
            "noise_multiplier": cfg.dp_noise, "clip": float(cfg.dp_clip or 0.0), "sample_rate": q,
            "rounds": rounds, "accountant": "opacus.accountants.RDPAccountant"}


def _save(path: Path, r: int, state: CohortState, out: TrainOutcome, spec: Any,
          cfg: FederatedConfig) -> None:
    """Write the whole simulation state atomically (temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "round": r, "spec": asdict(spec), "config": asdict(cfg), "state": state.state_dict(),
        "history": [asdict(h) for h in out.history], "best_round": out.best_round,
        "valid_at_best": out.valid_at_best, "test": out.test, "extra": out.extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)


def _load(path: Path, state: CohortState, out: TrainOutcome, spec: Any,
          cfg: FederatedConfig) -> int:
    blob = torch.load(path, weights_only=False)
    if blob["spec"] != asdict(spec) or "state" not in blob:
        raise FedrecError(f"{path}: checkpoint was written by a different algorithm or model; "
                          "remove it or drop --resume")
    # options that may change on resume: how long to go on and when to stop or save
    free = {"rounds", "patience", "checkpoint_every"}
    mine = asdict(cfg)
    changed = sorted(k for k in set(blob["config"]) | set(mine)
                     if k not in free and mine.get(k) != blob["config"].get(k))
    if changed:
        raise FedrecError(f"{path}: checkpoint was written with other options ({', '.join(changed)}); "
                          "resume with the same options, or remove it")
    state.load_state_dict(blob["state"])
    out.history = [RoundRecord(**h) for h in blob["history"]]
    out.best_round, out.valid_at_best, out.test = blob["best_round"], blob["valid_at_best"], blob["test"]
    out.extra = blob.get("extra", {})
    return int(blob["round"])
