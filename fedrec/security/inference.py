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
    #: the uploads were kept with the clients' own noise in them (FedCIA's noisy similarities):
    #: the audit adds none, and no row arrives exact
    noised: bool = False

    @property
    def exact(self) -> bool:
        """Whether an untouched row arrives as exactly zero (no noise on it)."""
        return self.ldp == 0 and self.dp_std == 0 and not self.noised

    def describe(self) -> str:
        parts = [f"ldp {self.ldp:g}"] if self.ldp else []
        parts += ["the clients' own noise, as sent"] if self.noised else []
        parts += [f"dp share std {self.dp_std:.3g}"] if self.dp_std else []
        parts += ["dense"] if self.dense and not parts else []
        parts += [f"secure aggregation of {self.secagg}"] if self.secagg else []
        return ", ".join(parts) or "as sent"


#: the refusal of an audit of a run whose clients send nothing
NOTHING_SENT = ("this algorithm's clients send their server nothing (each keeps its own model, or the server "
                "trains): there are no uploads to audit")


@dataclass
class PrivacyAudit:
    """Round by round, the inference attacks' figures against each client's training items
    (an observer of `fedrec.core.FederatedAlgorithm.train_round`)."""

    #: each client's training items, a row a client (`client_items`)
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
    _heard: bool = field(default=False, repr=False)

    def __call__(self, uploads: Uploads, plan: RoundPlan) -> None:
        if uploads.per_client is None:
            raise ValueError("the privacy audit needs each client's upload (keep_uploads)")
        n_users, n_items = self.train.shape
        if self._sum is None:
            self._sum = np.zeros((n_users, n_items), np.float32)
            self._seen = np.zeros(n_users, np.int64)
            self._always = np.ones((n_users, n_items), bool)
        if not uploads.per_client and not self._heard:
            raise FedrecError(NOTHING_SENT)
        self._heard = True
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


#: what the attacks read as a client's item rows, by the upload's tensor names, beside the item
#: family's row steps (`ITEMS`): the autoencoders' decoder output rows of the client's items
#: (PersonalFR, FedAvg-AE), FedAvg's item table as trained (FedLightGCN, FedCIA with
#: ``--set aggregation=waa``), GF-CF's item filter (a row an item)
ROW_NAMES = (ITEMS, "dec.out", "item", "filter")
#: the rank a similarity upload is read back to (`_gram_rows`): exact for item tables up to
#: this width, which covers every FedCIA backbone's default
GRAM_RANK = 128


def _row_tensor(u: ClientUpload) -> np.ndarray:
    """The upload's item rows ``(len(u.items), width)``, read by name (a shared (width, out) MLP
    weight has as many rows as a client with ``width`` items, and must not be read as rows).

    FedCIA's uploads are an item-item similarity S_k = E_k E_kᵀ of the client's item table, or
    its eigen-factors P_k diag(λ_k) P_kᵀ; the server reads rows back from them, E_k up to a
    rotation (P_k √λ_k, or `_gram_rows`), which keeps every row's norm and every projection the
    attacks take. GF-CF's factored filter U diag(s) Vᵀ is read as U diag(s) (its rows' norms)."""
    t = u.tensors
    for name in ROW_NAMES:
        if name in t:
            return t[name].detach().float().cpu().numpy()
    if "similarity" in t:
        return _gram_rows(t["similarity"].detach().double().cpu().numpy(), u.client)
    if "p" in t and "lam" in t:
        lam = t["lam"].detach().double().cpu().numpy().clip(min=0.0)
        return (t["p"].detach().double().cpu().numpy() * np.sqrt(lam)).astype(np.float32)
    if "u" in t and "s" in t:
        return (t["u"].detach().double().cpu().numpy() * t["s"].detach().double().cpu().numpy()).astype(np.float32)
    raise FedrecError(f"the privacy audit reads item rows or item similarities from each upload; this algorithm "
                      f"sends {', '.join(sorted(t)) or 'nothing'}")


def _gram_rows(gram: np.ndarray, client: int) -> np.ndarray:
    """Rows R with R Rᵀ = ``gram`` (a client's similarity upload, symmetric and positive
    semi-definite up to noise), by a randomised range finder of rank `GRAM_RANK` (keyed by
    client): exact where the Gram's rank is at most that, at the cost of a few products with it
    rather than a full eigendecomposition. Negative eigenvalues (noise) are dropped."""
    m = gram.shape[0]
    k = min(m, GRAM_RANK)
    omega = np.random.default_rng([0x6A4, client]).standard_normal((m, k))
    q, _ = np.linalg.qr(gram @ omega)
    lam, w = np.linalg.eigh(q.T @ gram @ q)
    return ((q @ w) * np.sqrt(lam.clip(min=0.0))).astype(np.float32)


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


def client_items(train: sp.csr_matrix, partition: Any = None) -> sp.csr_matrix:
    """What the audit holds each client's guess against: its users' training items, a row a
    client (``train`` itself where each client is one user; where a `fedrec.partition.Partition`
    groups users, as PersonalFR's clients, the union of its users' items)."""
    if partition is None:
        return train
    k = partition.n_clients
    member = sp.csr_matrix((np.ones(partition.n_users, np.float32), (partition.client_of_user,
                                                                     np.arange(partition.n_users))),
                           shape=(k, partition.n_users))
    union = (member @ (train != 0).astype(np.float32)).tocsr()
    union.data[:] = 1.0
    union.sort_indices()
    return union


def audit_privacy(cfg, secagg: int = 0, on_round=None):  # type: ignore[no-untyped-def]
    """Train ``cfg`` (a `fedrec.experiment.RunConfig` of a federated algorithm) while auditing
    every round's uploads; returns the run's result and the audit (`PrivacyAudit`)."""
    from fedrec.algorithms import get_algorithm
    from fedrec.errors import FedrecError
    from fedrec.experiment import train

    if get_algorithm(cfg.algorithm).kind != "federated":
        raise FedrecError(f"'{cfg.algorithm}' is centralised: there are no uploads to audit")
    if secagg < 0 or secagg == 1:  # a group of one sums nothing: its view is the upload as sent
        raise FedrecError("--secagg is a group size >= 2 (0: off)")
    needs_each = getattr(get_algorithm(cfg.algorithm).build(None, cfg.model), "needs_each_upload", None) \
        if secagg else None
    if needs_each:  # the view audited would be one its server could not train with
        raise FedrecError(f"--secagg: '{cfg.algorithm}' cannot run on secure sums: {needs_each}")
    holder: list[PrivacyAudit] = []

    def attach(trainable, split) -> None:  # type: ignore[no-untyped-def]
        state = getattr(trainable, "state", None)
        if getattr(state, "uploads_nothing", False):  # FedRAP-D, CentRAP
            raise FedrecError(NOTHING_SENT)
        width = getattr(state, "wire_width", None)  # the item family's; other states send no rows to compare
        other_wire = width is not None and width != state.items.shape[1]
        if (getattr(trainable, "pads_uploads", False) or other_wire) and (cfg.federated.ldp > 0
                                                                          or cfg.federated.dp_noise > 0):
            # the audit's noisy view is a dense d-wide table: FedPerGNN's clients noise only the
            # rows they send, CoLR's their r coordinates a row
            raise FedrecError(f"the audit's server view of {cfg.algorithm} under --ldp/--dp-noise is not modelled: "
                              "its clients noise only what they send (the rows they touched, or their coordinates)")
        lr_item = getattr(trainable, "lr_item", 1.0)
        partition = getattr(state, "partition", None)
        view = view_for(cfg.federated, lr_item, split.n_users, secagg)
        if getattr(trainable, "keeps_noisy_uploads", False):  # noised on the client already
            view = ServerView(secagg=secagg, noised=cfg.federated.ldp > 0 or cfg.federated.dp_noise > 0)
        audit = PrivacyAudit(client_items(split.train, partition), cfg.federated.negatives, view, cfg.seed)
        from fedrec.security.imia import for_algorithm

        audit.imia = for_algorithm(trainable, cfg.federated.negatives)
        trainable.keep_uploads = True
        trainable.observers = (*trainable.observers, audit)
        holder.append(audit)

    done = train(cfg, on_round=on_round, prepare=attach)
    return done.result, holder[0]
