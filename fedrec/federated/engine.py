"""Options of a federated run, and the cohort-vectorised training of the item-embedding family.

A round of that family (`fedrec.federated.family.algorithm.CohortAlgorithm`, driven by the one round
driver `fedrec.core.run_rounds`): sample clients (seeded), draw the cohort's training negatives
and shuffle keys, train the cohort in memory-sized chunks (each chunk all at once, `train_cohort`),
fold every chunk's uploads into running sums, aggregate. All randomness of round r comes from
draws keyed by (seed, r, client id), so a resumed run replays exactly what an uninterrupted one
would have done.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.core.contract import FederatedAlgorithm
from fedrec.core.device import check as check_device
from fedrec.core.driver import run_rounds
from fedrec.core.plan import cohort_size
from fedrec.core.selection import TrainOutcome
from fedrec.errors import FedrecError
from fedrec.federated.family.model import client_params
from fedrec.federated.family.state import Accumulator, CohortState
from fedrec.federated.threats import ATTACKS, DEFENCES, UNION_STEPS, UNTARGETED
from fedrec.options import FLOAT32_MAX, check
from fedrec.protocols.negatives import ComplementSampler
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord
from fedrec.rounds import draws
from fedrec.rounds.cohort import build_cohort
from fedrec.rounds.device_cohort import device_cohort, use_device_layout
from fedrec.rounds.padding import pseudo_rows
from fedrec.rounds.uncopied import MAX_STEPS
from fedrec.rounds.upload import ENCODINGS, UploadPath, clip_rows

CPU_BUDGET_MB = 32.0  # about a CPU's last-level cache (measured: see FederatedConfig)
CUDA_BUDGET_MB = 1024.0  # a small share of a GPU's memory, far fewer launches than 32 MB
#: the server's rules for item rows (`FederatedConfig.aggregation`)
AGGREGATIONS = ("clients", "contributors", "samples")
#: what a rating model predicts for an item no training rating names (`FederatedConfig.cold_items`)
COLD_ITEMS = ("model", "user-mean")
#: the baselines beneath a rating model's score (`FederatedConfig.rating_baseline`)
RATING_BASELINES = ("none", "user-item")
SECURITY_FIELDS = ("pad_items", "attack", "malicious", "targets", "prior_knowledge", "attack_items", "boost", "defence",
                   "trim", "byzantine", "norm_bound", "attacker_norm", "union_step")
#: where a malicious row's norm comes from (`FederatedConfig.attacker_norm`)
ATTACKER_NORMS = ("honest", "own")


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
    1.5 s/round). Results do not depend on it. None (the default) picks it by device: 32 MB on
    the CPU, `CUDA_BUDGET_MB` on a GPU, where a chunk is one batch of kernel launches and
    bigger chunks launch fewer (not tuned yet: on the one GPU measured, an H200, a round is
    bound by the host's layout work, not the chunks' kernels; `docs/scale.md`).
    ``patience``: the run stops after this many evaluations without a better validation
    figure, under the ``rounds`` cap; 0 runs every round (a paper's fixed budget). fedrec's
    defaults take 30 (`fedrec.algorithms.FEDREC_ENGINE`: over the 89 runs of the item-row
    rule sweep, 100 rounds each, none lost more than 0.0014 validation NDCG@10 to it, while the
    sparse runs that peak by round 20 stop by round 50; docs/defaults.md).
    ``aggregation``: how the server turns a round's summed item-row deltas into a step.
    ``clients`` (the papers' FedAvg) divides every row's sum by all the round's accepted
    clients, so the step a row takes depends on how many of them touched it, i.e. on the data's
    size and density (what the ``n_items x 80`` rule compensates for on ML-100K only;
    docs/learning-rates.md). ``contributors`` divides each row's sum by the clients that sent
    that row: FedAvg restricted to the row's contributors, a step that does not grow with the
    number of clients. ``samples`` is ``contributors`` with each client's item step taken on
    its batch's summed loss rather than its mean, so a row's step does not shrink as the
    client's batch grows either (`AGGREGATIONS`).
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
    #: evaluations without a better validation figure before the run stops (0: run every round)
    patience: int = 0
    ldp: float = 0.0
    clip: float | None = None
    encoding: str = "rows"
    pad_items: int = 0
    dp_clip: float | None = None
    dp_noise: float = 0.0
    dp_delta: float = 1e-5
    memory_budget_mb: float | None = None
    checkpoint_every: int = 0
    device: str = "cpu"
    # attacks and defences (`fedrec.security`; docs/security.md)
    attack: str | None = None
    malicious: float = 0.05
    targets: int = 0
    prior_knowledge: float = 0.01
    attack_items: int = 60
    boost: float | None = None
    #: the norm the malicious rows are held to, times ``boost``, where a method measures its
    #: honest clients' steps (FedCA, FedDAE, FedCIA's similarity rows): "honest", the round's
    #: median honest step, given to the attacker (a strong attacker, the default); "own", the
    #: attack's own estimate from what any client holds (`fedrec.security.attacks.Attack.budget`;
    #: FedCIA's: `fedrec.federated.cia.cover`), which every other method's attackers use and all
    #: a deployment's malicious node can compute
    attacker_norm: str = "honest"
    defence: str | None = None
    trim: float = 0.1
    byzantine: float = 0.1
    norm_bound: float | None = None
    #: where ``--defence union`` judges each client's table (`fedrec.security.robust`): "share",
    #: after the client's share (1/n) of a plain average of the round's rows (what an averaging
    #: server steps; the default everywhere, by measurement: docs/security.md); "server", after
    #: the server's own next step with that client's change as the round's, the official code's
    #: form where the server steps by Adam (FedDAE, ``--server-opt adam`` or ``yogi``) and the
    #: share where it averages
    union_step: str = "share"
    aggregation: str = "clients"
    #: on divergence, go back to the best round and halve the rates, up to this many times (0:
    #: stop; fedrec's defaults take 3, `fedrec.algorithms.FEDREC_ENGINE`)
    backoffs: int = 0
    #: under rating protocols, what is predicted for an item no training rating names: the
    #: model's score ("model", its untrained row) or the user's training mean ("user-mean",
    #: fedrec's default for ratings; `fedrec.protocols.protocol.ColdFallback`)
    cold_items: str = "model"
    #: under rating protocols, the baseline beneath the item-embedding family's score: none
    #: (the score is the rating, as the papers) or "user-item" (the client's training mean
    #: plus a learned item bias; fedrec's default for ratings, `FamilySpec.baseline`)
    rating_baseline: str = "none"
    #: the server optimiser on the round's mean item table and shared weights, as
    #: ``NAME[:KEY=VALUE,...]`` (`fedrec.federated.family.server_opt.ServerOpt.parse`: avg, avgm, adam,
    #: yogi); None: the algorithm's own (FedAvg, or FedAvgM's, FedAdam's, FedYogi's)
    server_opt: str | None = None
    #: a term added to each client's local loss, as ``NAME[:KEY=VALUE,...]``
    #: (`fedrec.federated.family.objective.parse_objective`, e.g. FedProx's ``prox:mu=0.01``); None: the
    #: algorithm's own (none, or FedProx's)
    client_objective: str | None = None

    def validate(self) -> None:
        if self.server_opt is not None:
            from fedrec.federated.family.server_opt import ServerOpt

            ServerOpt.parse(self.server_opt)  # one line for a bad name, key or value
        if self.client_objective is not None:
            from fedrec.federated.family.objective import parse_objective

            parse_objective(self.client_objective)
        floats = {"--lr": self.lr, "--lr-item": self.lr_item, "--item-lr-scale": self.item_lr_scale,
                  "--item-std": self.item_std, "--ldp": self.ldp, "--clip": self.clip,
                  "--dp-clip": self.dp_clip, "--dp-noise": self.dp_noise, "--dp-delta": self.dp_delta,
                  "--memory-budget-mb": self.memory_budget_mb, "--clients-per-round": self.clients_per_round}
        not_finite = [k for k, v in floats.items() if v is not None and not math.isfinite(v)]
        check(
            (bool(not_finite), f"{', '.join(not_finite)} must be finite numbers"),
            (self.rounds < 1, f"--rounds must be >= 1 (got {self.rounds})"),
            (self.clients_per_round <= 0, "--clients-per-round must be > 0"),
            (self.clients_per_round > 1 and self.clients_per_round != int(self.clients_per_round),
             f"--clients-per-round is a fraction (<= 1) or a whole number of clients (got "
             f"{self.clients_per_round})"),
            (self.local_epochs < 1, "--local-epochs must be >= 1"),
            (self.batch_size < 1, "--batch-size must be >= 1"),
            (self.lr <= 0 or (self.lr_item is not None and self.lr_item <= 0), "learning rates must be > 0"),
            (max(self.lr, self.lr_item or 0.0) > FLOAT32_MAX,
             f"learning rates must be at most {FLOAT32_MAX:.3g}, the largest float32 (the tensors' type)"),
            (self.lr_item is None and self.item_lr_scale is not None and self.lr * self.item_lr_scale > FLOAT32_MAX,
             f"the item rows' rate --lr x --item-lr-scale must be at most {FLOAT32_MAX:.3g}, the largest float32"),
            (self.negatives < 0, "--num-negatives must be >= 0"),
            (self.ldp < 0, "--ldp must be >= 0"),
            (self.clip is not None and self.clip <= 0, "--clip must be > 0"),
            (self.dp_clip is not None and self.dp_clip <= 0, "--dp-clip must be > 0"),
            (self.dp_noise < 0, "--dp-noise must be >= 0"),
            (self.dp_noise > 0 and self.dp_clip is None, "--dp-noise needs --dp-clip (the sensitivity)"),
            (not 0 < self.dp_delta < 1, "--dp-delta must be in (0, 1)"),
            (self.dp_noise == 0 and self.dp_delta != 1e-5,
             "--dp-delta is the delta of --dp-noise's (epsilon, delta); no --dp-noise is given"),
            (self.encoding not in ENCODINGS, f"--encoding must be one of {', '.join(ENCODINGS)}"),
            (self.memory_budget_mb is not None and self.memory_budget_mb <= 0, "--memory-budget-mb must be > 0"),
            (self.eval_every < 1, "--eval-every must be >= 1"),
            (self.patience < 0, f"--patience must be >= 0 (got {self.patience})"),
            (self.checkpoint_every < 0, f"--checkpoint-every must be >= 0 (got {self.checkpoint_every})"),
            (self.item_std < 0, f"--item-std must be >= 0 (got {self.item_std})"),
            (self.pad_items < 0, "--pad-items must be >= 0"),
            (self.backoffs < 0, "--backoffs must be >= 0"),
            (self.cold_items not in COLD_ITEMS,
             f"--cold-items must be one of {', '.join(COLD_ITEMS)} (got {self.cold_items!r})"),
            (self.rating_baseline not in RATING_BASELINES,
             f"--rating-baseline must be one of {', '.join(RATING_BASELINES)} (got {self.rating_baseline!r})"),
            (self.aggregation not in AGGREGATIONS,
             f"--aggregation must be one of {', '.join(AGGREGATIONS)} (got {self.aggregation!r})"),
            (self.aggregation != "clients" and (self.ldp > 0 or self.dp_noise > 0),
             f"--aggregation {self.aggregation} does not yet combine with --ldp or --dp-noise "
             "(their noise is calibrated per round's clients): leave --aggregation out, "
             "or give --aggregation clients"),
            (self.pad_items > 0 and (self.encoding == "dense" or self.ldp > 0 or self.dp_noise > 0),
             "--pad-items hides which rows a client sends; a dense or noised upload already sends every row"),
            *self._security_checks(),
        )
        check_device(self.device)

    def _security_checks(self) -> list[tuple[bool, str]]:
        return [
            (self.attack is not None and self.attack not in ATTACKS,
             f"unknown --attack '{self.attack}'; known: {', '.join(ATTACKS)}"),
            (self.defence is not None and self.defence not in DEFENCES,
             f"unknown --defence '{self.defence}'; known: {', '.join(DEFENCES)}"),
            (not 0 < self.malicious <= 1, f"--malicious is a share of the clients in (0, 1] (got {self.malicious})"),
            (self.targets < 0, "--targets must be >= 0"),
            (not 0 <= self.prior_knowledge <= 1, "--prior-knowledge is a share in [0, 1]"),
            (self.attack_items < 1, "--attack-items must be >= 1"),
            (self.boost is not None and not (math.isfinite(self.boost) and self.boost > 0), "--boost must be > 0"),
            (not 0 <= self.trim < 0.5, "--trim is the share cut from each end, in [0, 0.5)"),
            (not 0 <= self.byzantine < 0.5, "--byzantine is the share Krum assumes malicious, in [0, 0.5)"),
            (self.norm_bound is not None and not (math.isfinite(self.norm_bound) and self.norm_bound > 0),
             "--norm-bound must be > 0"),
            (self.attacker_norm not in ATTACKER_NORMS,
             f"--attacker-norm must be one of {', '.join(ATTACKER_NORMS)} (got '{self.attacker_norm}')"),
            (self.attack is None and (self.boost is not None or self.malicious != 0.05 or self.attack_items != 60
                                      or self.prior_knowledge != 0.01 or self.attacker_norm != "honest"),
             "--malicious, --prior-knowledge, --attack-items, --boost and --attacker-norm describe an --attack; "
             "none is given"),
            (self.union_step not in UNION_STEPS,
             f"--union-step must be one of {', '.join(UNION_STEPS)} (got '{self.union_step}')"),
            (self.defence is None and (self.trim != 0.1 or self.byzantine != 0.1 or self.norm_bound is not None
                                       or self.union_step != "share"),
             "--trim, --byzantine, --norm-bound and --union-step describe a --defence; none is given"),
            *[(self.defence is not None and given and self.defence not in readers,
               f"{flag} is read by --defence {' and '.join(readers)}, not by --defence {self.defence}")
              for flag, given, readers in (("--trim", self.trim != 0.1, ("trimmed-mean",)),
                                           ("--byzantine", self.byzantine != 0.1, ("krum", "multi-krum", "union")),
                                           ("--norm-bound", self.norm_bound is not None, ("norm-bound",)),
                                           ("--union-step", self.union_step != "share", ("union",)))],
            (self.attack in UNTARGETED and self.targets > 0, f"--attack {self.attack} is untargeted: it has no --targets"),
        ]

    @staticmethod
    def identity(blob: dict[str, Any]) -> dict[str, Any]:
        """``blob`` (this config as a dict) less the security options when no attack, defence or
        target is asked for, and less ``aggregation`` at the papers' rule (and the other options
        at the value that was their only behaviour before they existed): they change nothing
        then, so a cache key or checkpoint made before they existed still matches."""
        blob = {k: v for k, v in blob.items()
                if not ((k == "aggregation" and v == "clients") or (k == "backoffs" and not v)
                        or (k == "cold_items" and v == "model") or (k == "rating_baseline" and v == "none")
                        or (k in ("server_opt", "client_objective") and v is None)
                        or (k == "attacker_norm" and v == "honest") or (k == "union_step" and v == "share"))}
        if (blob.get("attack") is None and blob.get("defence") is None and not blob.get("targets")
                and not blob.get("pad_items")):
            return {k: v for k, v in blob.items() if k not in SECURITY_FIELDS}
        return blob

    def driver(self) -> dict[str, Any]:
        """How the round driver (`fedrec.core.run_rounds`) runs these options."""
        return {"rounds": self.rounds, "eval_every": self.eval_every, "patience": self.patience,
                "checkpoint_every": self.checkpoint_every, "backoffs": self.backoffs}

    def chunk_budget_mb(self) -> float:
        """The working set of one trained chunk: ``memory_budget_mb``, else the device's default."""
        if self.memory_budget_mb is not None:
            return self.memory_budget_mb
        return CUDA_BUDGET_MB if self.device.startswith("cuda") else CPU_BUDGET_MB

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


def engine_flag(field: str) -> str:
    """The command-line flag of a `FederatedConfig` field (``negatives`` is ``--num-negatives``)."""
    return "--num-negatives" if field == "negatives" else "--" + field.replace("_", "-")


def chunk_bounds(samples: np.ndarray, bytes_per_sample: float, budget_mb: float,
                 bytes_per_client: float = 0.0) -> list[tuple[int, int]]:
    """Cut clients (in training order) into consecutive chunks estimated to fit the budget: a
    client costs its samples' bytes plus ``bytes_per_client`` (at least one client a chunk)."""
    budget = budget_mb * 2**20
    cost = np.cumsum(samples * bytes_per_sample + bytes_per_client)
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
    ``(epochs, n_samples)`` and FedRecon's fresh user vectors (``spec``: the state's model, whose
    ``reconstruct_epochs`` asks for them). Each client's draws are keyed by
    (seed, round, client id) (`fedrec.rounds.draws`), so a Flower node that holds a few
    clients makes exactly the draws the simulator makes for them.
    """
    counts = np.diff(train.indptr)[rows]
    negs = client_negatives(cfg.negatives, train, sampler, rows, clients, seed, r)
    samples = counts * (1 + cfg.negatives)
    keys = np.stack([draws.uniforms((seed, draws.SHUFFLE, r, e), clients, samples)
                     for e in range(cfg.local_epochs)])
    return negs, keys, fresh_users(spec, clients, seed, r)


def fresh_users(spec: Any, clients: np.ndarray, seed: int, r: int) -> torch.Tensor | None:
    """FedRecon's freshly drawn user vectors of ``clients`` in round ``r`` (None for a model that
    keeps its user vectors)."""
    return client_params(spec, ["user"], clients, (seed, draws.FRESH_USER, r))["user"] if spec.reconstruct_epochs else None


def client_negatives(k: int, train: sp.csr_matrix, sampler: ComplementSampler, rows: np.ndarray,
                     clients: np.ndarray, seed: int, r: int) -> np.ndarray | None:
    """Round ``r``'s ``k`` training negatives a positive of ``clients`` (see `client_draws`)."""
    if not k:
        return None
    counts = np.diff(train.indptr)[rows]
    u = draws.uniforms((seed, draws.NEGATIVES, r), clients, counts * k).reshape(-1, k)
    return sampler.sample_at(np.repeat(rows, counts), u)


def train_cohort(state: CohortState, spec: Any, cfg: FederatedConfig, train: sp.csr_matrix,
                 sampler: ComplementSampler, rows: np.ndarray, clients: np.ndarray, seed: int,
                 r: int, path: UploadPath, acc: Accumulator, keep: list[Any] | None = None,
                 pad_seed: int | None = None) -> None:
    """Train ``clients`` (ids; rows ``rows`` of ``train``, in `order_by_activity` order) for
    round ``r`` in memory-sized chunks, folding their uploads into ``acc`` (and appending each
    chunk's per-client uploads to ``keep`` when given). The simulator calls it with the whole
    cohort, a Flower node with its own clients. A chunk's draws are made with the chunk (they
    are keyed by client, so chunking does not change them): the round never holds the whole
    cohort's negatives and shuffle keys at once. ``pad_seed``: the key of the clients'
    ``--pad-items`` pseudo rows, by default ``seed`` (a Flower node's own, which its server
    cannot redraw)."""
    ratings = getattr(state.spec, "loss", "bce") == "mse"
    if ratings and cfg.negatives:  # `fedrec.experiment.ratings_without_negatives` sets 0
        raise FedrecError("a model fitted to ratings draws no training negatives: --num-negatives 0")
    samples = np.diff(train.indptr)[rows] * (1 + cfg.negatives)
    # rows and activations are per sample; the steps' index arrays (16 bytes a slot) per epoch
    per_sample = spec.bytes_per_sample + (16 * cfg.local_epochs if spec.bytes_per_sample else 0)
    budget = cfg.chunk_budget_mb()
    # clients of at most MAX_STEPS local steps train without copies of the shared weights where
    # the state can (`FamilyState.train_uncopied`): a suffix of the activity order, charged their
    # activations and their steps' history only, so it is chunked apart from the clients before it
    # the rating baseline's offset of each state client (a row of ``train``), which it fits beneath
    offsets = getattr(state, "offsets", None)
    offsets = None if offsets is None else offsets.cpu().numpy()
    steps = cfg.local_epochs * -(-samples // cfg.batch_size)
    uncopied = np.zeros(len(rows), bool)
    if state.uncopied_open(summed=keep is None):
        uncopied = steps <= MAX_STEPS
    first = int(np.argmax(uncopied)) if uncopied.any() else len(uncopied)
    assert uncopied[first:].all(), "clients must come in decreasing activity (`order_by_activity`)"

    on_device = use_device_layout(state)

    def chunk(a: int, b: int, without_copies: bool) -> None:
        label_offsets = None if offsets is None else offsets[rows[a:b]]
        if on_device:  # the same draws and layout, built where the steps run
            batches = device_cohort(train, sampler, rows[a:b], clients[a:b], cfg.negatives, cfg.local_epochs,
                                    cfg.batch_size, seed, r, ratings=ratings, label_offsets=label_offsets)
            fresh = fresh_users(state.spec, clients[a:b], seed, r)
        else:
            negs, keys, fresh = client_draws(state.spec, cfg, train, sampler, rows[a:b], clients[a:b], seed, r)
            batches = build_cohort(train, rows[a:b], negs, cfg.batch_size, keys, ratings=ratings,
                                   label_offsets=label_offsets)
        up = state.train_uncopied(batches, path) if without_copies else None
        if without_copies and up is None:  # a gradient not finite: the copies, in chunks sized for them
            for a2, b2 in chunk_bounds(samples[a:b], per_sample, budget, spec.bytes_per_client):
                chunk(a + a2, a + b2, False)
            return
        if up is None:
            up = state.local_update(batches, path, fresh)
        if cfg.pad_items:  # drawn as a message carries rows (CoLR: coordinates), at their spread there,
            # and held to the real rows' bound (a row beyond it would be a pseudo one)
            ptr, items, pad, extra = pseudo_rows(clients[a:b], batches.row_items, batches.row_ptr,
                                                 state.wire_rows(up.delta), state.items.shape[0], cfg.pad_items,
                                                 seed if pad_seed is None else pad_seed, r)
            up.padding = (ptr, items, clip_rows(state.unwire_rows(pad).to(up.delta), path.clip))
            up.bytes_up += extra
        state.accumulate(acc, up)
        if keep is not None:
            keep.append(up)

    for a, b in chunk_bounds(samples[:first], per_sample, budget, spec.bytes_per_client):
        chunk(a, b, False)
    if first < len(rows):  # (a spec whose state has no uncopied path need not size it)
        per_client = spec.bytes_per_uncopied_client + int(steps[first]) * spec.bytes_per_uncopied_step
        for a, b in chunk_bounds(samples[first:], per_sample, budget, per_client):
            chunk(first + a, first + b, True)


def run_federated(
    spec: Any,
    split: Split,
    cfg: FederatedConfig,
    seed: int = 0,
    on_round: Callable[[RoundRecord, int, dict[str, float]], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    fingerprint: dict[str, Any] | None = None,
    keep_best: bool = False,
) -> TrainOutcome:
    """Simulate ``cfg.rounds`` rounds of ``spec``'s algorithm; test at the best validation round.

    ``spec`` is an algorithm's frozen description; ``spec.algorithm(split, cfg, seed)`` builds
    the `fedrec.core.FederatedAlgorithm` that the one round driver (`fedrec.core.run_rounds`)
    trains. ``fingerprint``: what a checkpoint must match to be resumed (default: the spec and
    the engine options).
    """
    cfg.validate()
    if cfg.attack is not None or cfg.defence is not None or cfg.targets:
        # the security layer sits above the engine and plugs in where a run is built
        raise FedrecError("--attack, --defence and --targets plug in where a run is built: train it with "
                          "fedrec.experiment.train (or fedrec.run), not the engine's run_federated")
    algorithm = spec.algorithm(split, cfg, seed)
    return train_federated(algorithm, spec, split, cfg, on_round=on_round, checkpoint=checkpoint,
                           resume=resume, fingerprint=fingerprint, keep_best=keep_best)


def train_federated(algorithm: FederatedAlgorithm, spec: Any, split: Split, cfg: FederatedConfig,
                    **driver: Any) -> TrainOutcome:
    """Drive a built algorithm with ``cfg``'s rounds, evaluation and checkpoint options."""
    if driver.get("fingerprint") is None:
        driver["fingerprint"] = {"spec": asdict(spec), "config": asdict(cfg)}
    return run_rounds(algorithm, split, **cfg.driver(), **driver)


def privacy_spent(cfg: FederatedConfig, n_clients: int, rounds: int) -> dict[str, float | str]:
    """(epsilon, delta) of the run's Gaussian mechanism, by Opacus' RDP accountant.

    Each noised aggregate the server forms is one application with noise multiplier z and
    sampling rate q = the share of clients taking part (1 under full participation, where
    subsampling gives no amplification). ``rounds`` counts them: a round a back-off discarded was
    released all the same.
    """
    from opacus.accountants import RDPAccountant

    q = cohort_size(n_clients, cfg.clients_per_round) / n_clients
    accountant = RDPAccountant()
    accountant.history = [(cfg.dp_noise, q, rounds)]
    return {"epsilon": float(accountant.get_epsilon(cfg.dp_delta)), "delta": cfg.dp_delta,
            "noise_multiplier": cfg.dp_noise, "clip": float(cfg.dp_clip or 0.0), "sample_rate": q,
            "rounds": rounds, "accountant": "opacus.accountants.RDPAccountant"}
