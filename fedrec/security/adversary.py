"""A run's attack, defence and their measurements, plugged into the upload stage of a round.

`Security.build` reads the engine options (``--attack``, ``--malicious``, ``--targets``,
``--prior-knowledge``, ``--attack-items``, ``--boost``, ``--defence``, ``--trim``,
``--byzantine``, ``--norm-bound``). In a round of the item-embedding family
(`fedrec.federated.family.algorithm.CohortAlgorithm`):

1. the benign clients train as always; their uploads are kept per client;
2. the sampled malicious clients (ids ``n_users ..``, the same share of them as of the benign
   clients) upload what the attack makes of the global table (`fedrec.security.attacks`),
   from nothing but what any client holds;
3. the server aggregates every upload, plain FedAvg or the defence's per-row robust rule
   (`fedrec.security.robust`);
4. the round's record gets the exposure of the targets (ER@5/10/20 and their NDCG@K over the
   benign users who never interacted with them, `fedrec.security.exposure`) and, for a
   defence that flags clients, the precision and recall of its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.core.contract import ClientUpload, row_senders
from fedrec.core.plan import extra_sample
from fedrec.errors import FedrecError
from fedrec.federated.family.model import ITEMS
from fedrec.federated.threats import RowStep
from fedrec.rounds.upload import FLOAT_BYTES, INDEX_BYTES
from fedrec.security.attacks import UNTARGETED, Attack, Knowledge, choose_targets, public_share
from fedrec.security.exposure import exposure, known_interactions
from fedrec.security.robust import FLAGGING, RobustRule
from fedrec.security.surrogate import Surrogate

DEFAULT_BOOST = {"boost": 10.0}  # explicit boosting; every other attack sends at the benign norm


def _carried(rows: torch.Tensor, wire: Any) -> torch.Tensor:
    """``rows`` as the best upload ``wire``'s messages carry (`Security.malicious_uploads`)."""
    if wire.wire_width == rows.shape[1]:  # a message carries a row whole
        return rows
    sent = wire.unwire_rows(wire.wire_rows(rows)).to(rows)
    norm = sent.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, sent * (rows.norm(dim=1, keepdim=True) / norm.clamp_min(1e-30)), sent)


def honest_batch(cfg: Any, train: sp.csr_matrix, whole: bool = False) -> int | None:
    """How many samples the batch of a typical honest row holds (`Knowledge.batch`): a client's
    batch is the run's ``--batch-size`` or, where it has fewer training samples (positives
    and their ``--num-negatives``), all of them; ``whole``: all of them always (a method whose
    clients take one step on the mean over all their samples, as FedPerGNN's do). The median of
    that over the samples (a client with more samples sends more rows, so the honest rows'
    median norm is theirs). These are statistics of the data set that its published
    description gives an attacker; a malicious Flower node reads them from the split it holds,
    as the simulator does. None where the run has no batch size."""
    size = getattr(cfg, "batch_size", None)
    if size is None and not whole:
        return None
    samples = np.diff(sp.csr_matrix(train).indptr) * (1 + int(getattr(cfg, "negatives", 0)))
    samples = samples[samples > 0]
    if not len(samples):
        return None if size is None else int(size)
    batch = samples if whole else np.minimum(samples, size)
    order = np.argsort(batch, kind="stable")
    weight = np.cumsum(samples[order])
    return int(batch[order][np.searchsorted(weight, weight[-1] / 2)])


@dataclass
class Security:
    """The run's adversary and defence (see the module docstring)."""

    n_benign: int
    n_malicious: int
    targets: np.ndarray
    known: sp.csr_matrix
    clients_per_round: float
    seed: int
    attack: Attack | None = None
    rule: RobustRule | None = None
    last: dict[str, float] = field(default_factory=dict)
    #: the users whose exposure is measured, when the clients are not one user each
    #: (PersonalFR's clients hold groups of users); None: the ``n_benign`` clients
    n_users: int | None = None

    @staticmethod
    def build(cfg: Any, split: Any, lr_item: float, seed: int, n_clients: int | None = None,
              step_bound: float | None = None, whole_batch: bool = False) -> Security | None:
        """The security layer ``cfg`` asks for, or None (no attack, defence or targets).
        ``n_clients``: the benign clients when they are not the data's users (the malicious are
        ``--malicious`` of them); ``step_bound``: an Adam client's movement of a coordinate in a
        round (`Knowledge.step_bound`); ``whole_batch``: the clients step on the mean over all
        their samples, not on ``--batch-size`` of them (`honest_batch`)."""
        if cfg.attack is None and cfg.defence is None and not cfg.targets:
            return None
        n_targets = cfg.targets or (1 if cfg.attack is not None and cfg.attack not in UNTARGETED else 0)
        check_sizes(cfg.attack, n_targets, cfg.attack_items, split.n_items)
        targets = choose_targets(split.train, n_targets, seed) if n_targets else np.zeros(0, np.int64)
        n_benign = split.n_users if n_clients is None else n_clients
        n_mal = max(1, int(n_benign * cfg.malicious)) if cfg.attack is not None else 0
        sec = Security(n_benign, n_mal, targets, known_interactions(split), cfg.clients_per_round, seed,
                       n_users=None if n_clients is None else split.n_users)
        if cfg.attack is not None:
            know = Knowledge(split.n_items, targets, public_share(split.train, cfg.prior_knowledge, seed), lr_item,
                             cfg.lr, row_clip=cfg.clip, step_bound=step_bound,
                             per_sample=getattr(cfg, "aggregation", "clients") == "samples",
                             batch=honest_batch(cfg, split.train, whole_batch))
            boost = cfg.boost if cfg.boost is not None else DEFAULT_BOOST.get(cfg.attack, 1.0)
            sec.attack = Attack(cfg.attack, know, n_mal, seed, attack_items=cfg.attack_items, boost=boost)
        if cfg.defence is not None:
            sec.rule = RobustRule(cfg.defence, trim=cfg.trim, byzantine=cfg.byzantine, norm_bound=cfg.norm_bound,
                                  union_step=cfg.union_step)
        return sec

    @staticmethod
    def defence(cfg: Any, n_benign: int, n_malicious: int, n_items: int, seed: int) -> Security:
        """The run's defence alone (a deployment's server: it has no data to draw targets from;
        ``n_malicious`` clients beyond the ``n_benign`` users are an attacker's, which the
        defence's detection figures count against). Without ``--defence``, the plain mean of the
        clients' uploads (a server that reads each client's upload as the simulator's attacked
        round does: FedCIA's)."""
        rule = (RobustRule(cfg.defence, trim=cfg.trim, byzantine=cfg.byzantine, norm_bound=cfg.norm_bound,
                           union_step=cfg.union_step) if cfg.defence is not None else None)
        return Security(n_benign, n_malicious, np.zeros(0, np.int64), sp.csr_matrix((n_benign, n_items)),
                        cfg.clients_per_round, seed, rule=rule)

    @property
    def keeps_uploads(self) -> bool:
        """Whether the round must keep each client's upload (a defence looks at each)."""
        return self.rule is not None

    def malicious_clients(self, r: int) -> np.ndarray:
        """The malicious clients (0-based among them) sampled in round ``r`` (`extra_sample`)."""
        return extra_sample(self.n_malicious, self.clients_per_round, self.seed, r)

    def malicious_uploads(self, spec: Any, table: torch.Tensor, shared: dict[str, torch.Tensor],
                          r: int, clients: np.ndarray | None = None, wire: Any = None, norm: float | None = None
                          ) -> tuple[list[ClientUpload], int]:
        """Round ``r``'s uploads of the sampled malicious clients (``clients``, 0-based among
        them; default `malicious_clients`), made from the global ``table`` and ``shared``
        weights of the run's model ``spec`` (shared weights sent back as they came, unless the
        attack poisons them), and the bytes they send. ``wire``: the round's state, whose
        messages carry a row as ``wire_width`` numbers (`wire_rows`); a crafted row is then the
        best those numbers can carry, and costs what they cost (CoLR: the row's direction
        projected onto the round's subspace, at the row's own norm: of the rows in the subspace
        within the attack's norm budget, the one that moves furthest along the crafted row).
        ``norm``: the honest row norm, where the method measures it (FedCIA's similarity rows);
        default the attack's own estimate (`Attack.budget`)."""
        clients = self.malicious_clients(r) if clients is None else clients
        if self.attack is None or not len(clients):
            return [], 0
        sent = self.attack.uploads(table, clients, r, Surrogate(spec, shared), norm=norm)
        shared_floats = sum(v.numel() for v in shared.values())
        out, n_bytes = [], 0
        for c, p in zip(clients, sent, strict=True):
            weights = {k: v + p.shared[k] if k in p.shared else v.clone() for k, v in shared.items()}
            rows = p.rows if wire is None else _carried(p.rows, wire)
            width = p.rows.shape[1] if wire is None else wire.wire_width
            out.append(ClientUpload(self.n_benign + int(c), p.items, {ITEMS: rows, **weights}))
            n_bytes += len(p.items) * (INDEX_BYTES + width * FLOAT_BYTES) + shared_floats * FLOAT_BYTES
        return out, n_bytes

    def forged_users(self, spec: Any, table: torch.Tensor, shared: dict[str, torch.Tensor], r: int,
                     clients: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """Round ``r``'s sampled malicious clients (run ids, after the benign ones) and the
        private parameters each sends where the method asks for them (`Attack.forged_users`)."""
        clients = self.malicious_clients(r) if clients is None else clients
        assert self.attack is not None
        users = self.attack.forged_users(table.detach().float().cpu(), clients, r, Surrogate(spec, shared))
        return self.n_benign + np.asarray(clients, np.int64), users

    def sums(self, per_client: list[ClientUpload], n_items: int, width: int,
             shared: dict[str, torch.Tensor], table: torch.Tensor | None = None, r: int = 0,
             step: RowStep | None = None, senders: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """Round ``r``'s item-row sums, shared-weight sums and accepted count, by the defence's
        rule (plain sums without one; ``table``, the global item table, and ``step``, how the
        server moves its rows (`fedrec.federated.threats.RowStep`, which UNION reads under
        ``--union-step server``; None: a plain average's), for the rules that read them);
        records the defence's detection figures. Uploads a filter dropped (UNION) do not
        count. ``senders``: given where the server divides each row by its senders (fedrec's
        item-row rules, `fedrec.federated.family.state.Accumulator.item_count`), it is
        overwritten with each row's count of the uploads the sums hold, and UNION judges a
        client at its share of each row's average."""
        rule = self.rule or RobustRule("mean")
        item_sum, shared_sum, flagged = rule.aggregate(per_client, n_items, width, shared, table, (self.seed, r),
                                                       step, per_row=senders is not None)
        self._detected(per_client, flagged)
        dropped = flagged if rule.name == "union" else np.zeros(len(per_client), bool)
        kept = [u for u, d in zip(per_client, dropped, strict=True) if u.accepted and not d]
        if senders is not None:
            senders.copy_(row_senders(kept, n_items).to(senders))
        return item_sum, shared_sum, len(kept)

    def admit(self, per_client: list[ClientUpload], table: torch.Tensor, r: int) -> list[torch.Tensor]:
        """Round ``r``'s item rows as the defence's rule keeps them client by client
        (`RobustRule.admit`: a server that uses each client's table, not a sum); records the
        defence's detection figures. ``table``: the global table the rows' deltas apply to."""
        rule = self.rule or RobustRule("mean")
        kept, flagged = rule.admit(per_client, table, (self.seed, r))
        self._detected(per_client, flagged)
        return kept

    def _detected(self, per_client: list[ClientUpload], flagged: np.ndarray) -> None:
        """The round's detection figures of a rule that flags clients: how many, their precision
        and recall against the malicious ones."""
        self.last = {}
        if self.rule is not None and self.rule.name in FLAGGING:
            bad = np.array([u.client >= self.n_benign for u in per_client])
            tp = float((flagged & bad).sum())
            self.last["flagged"] = float(flagged.sum())
            self.last["flag_precision"] = tp / max(float(flagged.sum()), 1.0)
            self.last["flag_recall"] = tp / max(float(bad.sum()), 1.0) if bad.any() else float("nan")

    def figures(self, scores: Any) -> dict[str, float]:
        """The round's security figures: exposure of the targets, the defence's detection."""
        out = dict(self.last)
        if len(self.targets):
            users = self.n_benign if self.n_users is None else self.n_users
            out.update(exposure(scores, self.known, self.targets, users=np.arange(users)))
            out["targets"] = float(len(self.targets))  # as run: --targets 0 under a targeted attack is 1
        if self.attack is not None:
            out["malicious_clients"] = float(self.n_malicious)
        return out


#: the methods whose server averages item rows, where the security layer plugs in
PLAIN_AVERAGE = ("the methods whose server averages item rows (FedMF, FedNCF, FedRecon, PFedRec, MetaMF, "
                 "FedRAP, FedPerGNN, CoLR, PerFedRec, PersonalFR's decoder, FedAvg-AE's item rows, FedDAE's "
                 "gradient rows, FedCIA's similarity rows and their variants)")


def attach(algorithm: Any, split: Any, cfg: Any, seed: int, label: str | None = None) -> None:
    """Plug the run's attack and defence (``cfg``: ``--attack``, ``--defence``, ``--targets``)
    into ``algorithm``'s upload stage (its ``security`` slot), or refuse in one line: where it has
    no slot (an algorithm registered from outside fedrec), and an attack or a defence where its
    server neither plainly averages item rows nor admits each client's rows (``admit_uploads``:
    GPFedRec, GFed-PP and FedCA) (CentRAP, the one-client Joint autoencoder, FedCIA's parameter
    averaging, FedLightGCN and GF-CF filters: not yet); pseudo-item padding
    (``--pad-items``) likewise, unless the algorithm draws its own pseudo rows (``pads_uploads``:
    FedPerGNN)."""
    asked = cfg.attack is not None or cfg.defence is not None or bool(cfg.targets)
    if not (asked or cfg.pad_items):
        return
    state = getattr(algorithm, "state", None)
    # the messages name the run's algorithm (``label``), else the class that trains it
    name = label or (type(state).__name__ if state is not None else type(algorithm).__name__)
    slot = bool(getattr(algorithm, "takes_security", False))
    plain = slot and bool(getattr(state, "plain_average", False))
    # the graph methods' server keeps every client's table and admits its rows one by one
    guarded = plain or (slot and hasattr(state, "admit_uploads"))
    if cfg.pad_items and not plain and not getattr(algorithm, "pads_uploads", False):
        raise FedrecError(f"--pad-items runs on {PLAIN_AVERAGE}, not on {name}'s aggregation yet")
    if not asked:
        return
    if not slot:
        raise FedrecError(f"--attack, --defence and --targets run on the methods of the item-embedding family, "
                          f"FedRAP, FedPerGNN, PersonalFR, FedDAE, FedCIA, FedCA, GPFedRec and GFed-PP, not on {name} yet")
    # a method whose clients are not the data's users, step by Adam, or step once on all their
    # samples, says so
    sec = Security.build(cfg, split, algorithm.lr_item, seed, n_clients=getattr(algorithm, "security_clients", None),
                         step_bound=getattr(algorithm, "step_bound", None),
                         whole_batch=bool(getattr(algorithm, "whole_batch", False)))
    if sec is not None and (sec.keeps_uploads or sec.attack is not None) and not guarded:
        raise FedrecError(f"--attack and --defence run on {PLAIN_AVERAGE} and on the tables GPFedRec's, GFed-PP's "
                          f"and FedCA's servers keep of each client, not on {name}'s aggregation yet")
    if sec is not None and sec.rule is not None and (cfg.dp_noise > 0 or cfg.ldp > 0):
        raise FedrecError("--defence aggregates each client's upload; with --ldp/--dp-noise the simulator "
                          "adds the round's noise as one sum, so the two do not combine yet")
    algorithm.security = sec
    admit = getattr(state, "admit_attackers", None)  # a server that keeps every client, or a graph of them
    if admit is not None and sec is not None and sec.attack is not None:
        admit(sec.n_malicious, sec.attack)


#: the shilling attacks, whose fake users rate a profile and as many negatives (`Attack._profile`)
SHILLING = ("boost", "random", "bandwagon", "popular")


def check_sizes(attack: str | None, n_targets: int, attack_items: int, n_items: int) -> None:
    """Targets and fake profiles the data's ``n_items`` can hold, in one line before training."""
    if n_targets > n_items:
        raise FedrecError(f"--targets {n_targets} is more than the data's {n_items} items")
    profile = max(attack_items // 2, n_targets)
    if attack in SHILLING and 2 * profile > n_items:
        raise FedrecError(f"--attack {attack}'s fake users rate {profile} items (the targets and --attack-items / 2) "
                          f"and as many negatives, more than the data's {n_items} items: lower --attack-items "
                          "or --targets")
