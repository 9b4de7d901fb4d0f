"""What an honest-but-curious server learns about a client's interactions from its uploads.

For every benign upload of a round the server scores each item by how likely it is one of the
client's training items, from what it received (`ServerView`: the upload itself, a dense table
with the client's LDP or DP noise, or, under secure aggregation, only the sum over a group of
K clients):

* ``rows`` — which rows changed: the L2 norm of each received row (exactly zero for a row the
  client never touched, unless noise or a dense table hides it);
* ``direction`` — an interaction-level membership inference in the spirit of IMIA (Yuan et al.,
  WWW 2023): a client's item step is ±(its user vector or score weights) scaled per row, +
  for a positive, - for a sampled negative, so the rows' first principal direction separates
  the two; it is oriented so the positive side holds the fewer rows (there are ``k`` negatives
  a positive) and each row is scored by its projection;
* ``imia`` — IMIA itself (`fedrec.security.imia`; item-family clients only, uploads as sent):
  the server retrains a fresh copy of the client on guessed labels and confirms the labels whose
  simulated step is closest to the sent one; scored among the rows the client sent;
* ``rounds`` — over rounds: positives are sent every round, negatives are redrawn, so the mean
  over the client's rounds of the ``rows`` score (a row's frequency without noise) singles out
  positives; the noise on a dense table also averages out.

Each attack's guess is the set of items whose score is above a cut: the sent rows without noise
(``rows``), the positive side of the projection (``direction``), rows sent in every round the
client took part (``rounds``), and under noise a two-means split of the scores. Reported per
round as means over clients: precision, recall, F1 and AUC against the client's training items,
beside the random guess (precision = the client's density, AUC 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.stats import rankdata

from fedrec.core.contract import ClientUpload, RoundPlan, Uploads
from fedrec.errors import FedrecError
from fedrec.federated.family.model import ITEMS

INFERENCE_ATTACKS = ("rows", "direction", "rounds", "imia")


@dataclass(frozen=True)
class ServerView:
    """How the server receives one client's upload: with Laplace(``ldp``) or a Gaussian share
    of std ``dp_std`` on every entry of a dense table (the client's own noise), as a dense
    table without noise (``dense``), or only as the sum over groups of ``secagg`` clients."""

    ldp: float = 0.0
    dp_std: float = 0.0
    dense: bool = False
    secagg: int = 0

    @property
    def exact(self) -> bool:
        """Whether an untouched row arrives as exactly zero (no noise on it)."""
        return self.ldp == 0 and self.dp_std == 0

    def describe(self) -> str:
        parts = [f"ldp {self.ldp:g}"] if self.ldp else []
        parts += [f"dp share std {self.dp_std:.3g}"] if self.dp_std else []
        parts += ["dense"] if self.dense and not parts else []
        parts += [f"secure aggregation of {self.secagg}"] if self.secagg else []
        return ", ".join(parts) or "as sent"


@dataclass
class PrivacyAudit:
    """Round by round, the inference attacks' figures against each client's training items
    (an observer of `fedrec.core.FederatedAlgorithm.train_round`)."""

    train: sp.csr_matrix
    negatives: int
    view: ServerView
    seed: int
    rounds: list[dict[str, float]] = field(default_factory=list)
    #: the IMIA attack (`fedrec.security.imia`) where the algorithm's uploads allow it, on
    #: ``imia_clients`` benign uploads of a round spread over the round's order (most active
    #: first): it retrains each client several times
    imia: Any = None
    imia_clients: int = 50
    _sum: np.ndarray | None = field(default=None, repr=False)
    _seen: np.ndarray | None = field(default=None, repr=False)
    _always: np.ndarray | None = field(default=None, repr=False)

    def __call__(self, uploads: Uploads, plan: RoundPlan) -> None:
        if uploads.per_client is None:
            raise ValueError("the privacy audit needs each client's upload (keep_uploads)")
        n_users, n_items = self.train.shape
        if self._sum is None:
            self._sum = np.zeros((n_users, n_items), np.float32)
            self._seen = np.zeros(n_users, np.int64)
            self._always = np.ones((n_users, n_items), bool)
        benign = [u for u in uploads.per_client if u.client < n_users and u.accepted]
        tables = self._received(benign, n_items, np.random.default_rng([self.seed, plan.round, 0x1D1A]))
        figures: dict[str, list[float]] = {}
        for u, table in zip(benign, tables, strict=True):
            truth = np.zeros(n_items, bool)
            truth[self.train.indices[self.train.indptr[u.client]:self.train.indptr[u.client + 1]]] = True
            norm = np.linalg.norm(table, axis=1)
            sent = norm > 0 if self.view.exact else np.ones(n_items, bool)
            self._sum[u.client] += norm
            self._seen[u.client] += 1
            self._always[u.client] &= sent if self.view.exact else True
            proj = self._projection(table, sent)
            guesses = {"rows": (norm, norm > 0 if self.view.exact else _two_means(norm)),
                       "direction": (np.where(sent, proj, proj[sent].min() - 1 if sent.any() else 0.0), sent & (proj > 0))}
            for name, (score, guess) in guesses.items():
                for k, v in _scores(score, guess, truth).items():
                    figures.setdefault(f"{name}_{k}", []).append(v)
            figures.setdefault("random_precision", []).append(truth.mean())
        if self.imia is not None and self.view.exact and not self.view.secagg and not self.view.dense:
            for u in benign[:: max(1, len(benign) // self.imia_clients)][: self.imia_clients]:  # every activity level
                truth = np.isin(u.items, self.train.indices[self.train.indptr[u.client]:self.train.indptr[u.client + 1]])
                sent = _row_tensor_torch(u)
                guess = self.imia.guess(self.imia.rows_sent(u.items), sent, seed=[self.seed, plan.round, u.client])
                for k, v in _scores(guess.astype(float), guess, truth).items():
                    figures.setdefault(f"imia_{k}", []).append(v)
        self.rounds.append({k: float(np.nanmean(v)) for k, v in figures.items()} | {"round": float(plan.round)})

    def _received(self, ups: list[ClientUpload], n_items: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Each client's upload as the server receives it: a dense ``(n_items, width)`` table."""
        tables = []
        for u in ups:
            rows = _row_tensor(u)
            t = np.zeros((n_items, rows.shape[1]), np.float32)
            t[u.items] = rows
            if self.view.ldp:
                t += rng.laplace(0.0, self.view.ldp, t.shape).astype(np.float32)
            if self.view.dp_std:
                t += rng.normal(0.0, self.view.dp_std, t.shape).astype(np.float32)
            tables.append(t)
        if not self.view.secagg:
            return tables
        order = rng.permutation(len(tables))
        out: list[np.ndarray] = [np.empty(0)] * len(tables)
        # groups of K; a remainder joins the last full group (no client is ever summed alone)
        bounds = list(range(0, len(order), self.view.secagg))[: max(1, len(order) // self.view.secagg)]
        for s, e in zip(bounds, [*bounds[1:], len(order)], strict=True):
            group = order[s:e]
            total = np.sum([tables[g] for g in group], axis=0)
            for g in group:
                out[g] = total
        return out

    def _projection(self, table: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """Each row's projection on the sent rows' first principal direction, oriented so that
        the positive side holds the fewer rows (1 positive for ``negatives`` negatives)."""
        rows = table[sent]
        if len(rows) < 2:
            return np.zeros(len(table))
        _, _, vt = np.linalg.svd(rows, full_matrices=False)
        proj = table @ vt[0]
        if (proj[sent] > 0).sum() > (proj[sent] < 0).sum():
            proj = -proj
        return proj

    def summary(self) -> dict[str, float]:
        """Figures over all rounds: the ``rounds`` attack at the end, and the last round's."""
        assert self._sum is not None and self._seen is not None and self._always is not None
        took = self._seen > 0
        figures: dict[str, list[float]] = {}
        for c in np.flatnonzero(took):
            truth = np.zeros(self.train.shape[1], bool)
            truth[self.train.indices[self.train.indptr[c]:self.train.indptr[c + 1]]] = True
            score = self._sum[c] / self._seen[c]
            guess = self._always[c] & (score > 0) if self.view.exact else _two_means(score)
            for k, v in _scores(score, guess, truth).items():
                figures.setdefault(f"rounds_{k}", []).append(v)
        out = {k: float(np.nanmean(v)) for k, v in figures.items()}
        last = self.rounds[-1] if self.rounds else {}
        return {**{k: v for k, v in last.items() if k != "round"}, **out, "rounds_seen": float(len(self.rounds))}


def _row_tensor_torch(u: ClientUpload):  # type: ignore[no-untyped-def]
    """`_row_tensor` as a float32 CPU tensor."""
    import torch

    return torch.as_tensor(_row_tensor(u))


def _row_tensor(u: ClientUpload) -> np.ndarray:
    """The upload's item rows, read by name: a shared (width, out) MLP weight has as many rows
    as a client with ``width`` items, and must not be read as rows."""
    rows = u.tensors.get(ITEMS)
    if rows is None:
        raise FedrecError("the privacy audit's attacks read uploaded item rows, which this algorithm "
                          "does not upload (FedCIA: item similarities)")
    return rows.detach().float().cpu().numpy()


def _two_means(score: np.ndarray, iters: int = 20) -> np.ndarray:
    """The upper group of a one-dimensional two-means split of ``score``."""
    lo, hi = float(score.min()), float(score.max())
    if hi <= lo:
        return np.zeros(len(score), bool)
    for _ in range(iters):
        cut = (lo + hi) / 2
        up = score > cut
        if up.all() or not up.any():
            break
        lo, hi = float(score[~up].mean()), float(score[up].mean())
    return score > (lo + hi) / 2


def _scores(score: np.ndarray, guess: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Precision, recall and F1 of ``guess`` and the AUC of ``score`` against ``truth``."""
    tp = float((guess & truth).sum())
    p = tp / max(float(guess.sum()), 1.0)
    r = tp / max(float(truth.sum()), 1.0)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    n_pos, n_neg = int(truth.sum()), int((~truth).sum())
    auc = float("nan")
    if n_pos and n_neg:
        ranks = rankdata(score)
        auc = (ranks[truth].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {"precision": p, "recall": r, "f1": f1, "auc": auc}


def view_for(cfg, lr_item: float, n_clients: int, secagg: int = 0) -> ServerView:  # type: ignore[no-untyped-def]
    """What the server receives from a client under ``cfg``'s upload path (a
    `fedrec.federated.engine.FederatedConfig`): each client adds its own share of the DP noise,
    N(0, (2 z S)² / n), as a Flower node does (`fedrec.rounds.upload.UploadPath.local_noise`)."""
    from fedrec.core.plan import cohort_size

    path = cfg.upload_path(lr_item)
    n = cohort_size(n_clients, cfg.clients_per_round)
    dp_std = 2.0 * path.dp_noise * path.dp_clip / n**0.5 if path.dp_noise and path.dp_clip else 0.0
    return ServerView(ldp=path.ldp, dp_std=dp_std, dense=path.sends_dense, secagg=secagg)


def audit_privacy(cfg, secagg: int = 0, on_round=None):  # type: ignore[no-untyped-def]
    """Train ``cfg`` (a `fedrec.experiment.RunConfig` of a federated algorithm) while auditing
    every round's uploads; returns the run's result and the audit (`PrivacyAudit`)."""
    from fedrec.algorithms import get_algorithm
    from fedrec.errors import FedrecError
    from fedrec.experiment import train

    if get_algorithm(cfg.algorithm).kind != "federated":
        raise FedrecError(f"'{cfg.algorithm}' is centralised: there are no uploads to audit")
    if secagg < 0:
        raise FedrecError("--secagg is a group size >= 1 (0: off)")
    holder: list[PrivacyAudit] = []

    def attach(trainable, split) -> None:  # type: ignore[no-untyped-def]
        state = getattr(trainable, "state", None)
        other_wire = state is not None and getattr(state, "wire_width", None) not in (None, state.items.shape[1])
        if (getattr(trainable, "pads_uploads", False) or other_wire) and (cfg.federated.ldp > 0
                                                                          or cfg.federated.dp_noise > 0):
            # the audit's noisy view is a dense d-wide table: FedPerGNN's clients noise only the
            # rows they send, CoLR's their r coordinates a row
            raise FedrecError(f"the audit's server view of {cfg.algorithm} under --ldp/--dp-noise is not modelled: "
                              "its clients noise only what they send (the rows they touched, or their coordinates)")
        lr_item = getattr(trainable, "lr_item", 1.0)
        audit = PrivacyAudit(split.train, cfg.federated.negatives, view_for(cfg.federated, lr_item, split.n_users, secagg),
                             cfg.seed)
        from fedrec.security.imia import for_algorithm

        audit.imia = for_algorithm(trainable, cfg.federated.negatives)
        trainable.keep_uploads = True
        trainable.observers = (*trainable.observers, audit)
        holder.append(audit)

    done = train(cfg, on_round=on_round, prepare=attach)
    return done.result, holder[0]
