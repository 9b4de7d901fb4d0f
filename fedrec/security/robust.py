"""Robust aggregation applied per item row, over the clients that updated that row.

Item uploads are sparse: a client sends the rows it touched, so a whole-vector robust rule
(the median of every client's full table, Krum over full tables) mostly compares zeros with
zeros and lets a few poisoned rows through (Spattack, AAAI 2025, makes this point). Every rule
here is therefore applied to one item row at a time, over the clients that uploaded that row,
and gives a robust estimate of the row's *mean* delta; the server then adds ``count x estimate``
where plain FedAvg adds the rows' sum, so with the rule ``mean`` the aggregate is exactly
FedAvg's (tested) and the other rules change only what they are meant to change.

Rules (`DEFENCES`):

* ``norm-bound`` — scale each client's whole update to L2 norm <= M (``--norm-bound``; default:
  the median client norm of the round, an adaptive bound), then sum (Sun et al., 2019);
* ``median`` — coordinate-wise median (Yin et al., ICML 2018);
* ``trimmed-mean`` — coordinate-wise mean after dropping the ``--trim`` share of the largest and
  of the smallest values (Yin et al., ICML 2018);
* ``krum`` / ``multi-krum`` — the upload(s) whose summed squared distance to its c - f - 2
  nearest neighbours is smallest, f = floor(``--byzantine`` x c) for a row uploaded by c
  clients (Blanchard et al., NeurIPS 2017); Multi-Krum averages the c - f best.

* ``union`` — UNION's server filter (Yu et al., AAAI 2023, against ClusterAttack; official code
  yflyl613/FedRec, read at f45cecb): for each client, the table after the server's step from
  its upload alone (below), on a sample of 500 items; its *uniformity*, the mean pairwise L2
  distance of those rows;
  the clients' uniformities scaled to [0, 1] and split in two by one-dimensional 2-means; the
  smaller group dropped when the gap statistic (Tibshirani et al., 2001: 50 reference draws
  uniform on [0, 1]) finds two clusters, or when it holds at most ceil(``--byzantine`` x n)
  clients (the official code takes that count from the true attacker ratio; here it is the
  defence's declared assumption, as Krum's f); the rest are averaged per row as FedAvg does
  (the official code ships the filter only beside Multi-Krum or the norm bound). The table is
  taken after a server step from the client's upload (`fedrec.federated.threats.RowStep`), in one of two forms
  (``--union-step``):

  - ``share`` (the default): the client's share of the round's average, its row changes divided
    by the n accepted uploads judged (`share`; the server then divides by the uploads UNION
    kept, slightly fewer), or under fedrec's item-row rules (``--aggregation contributors|samples``),
    which average each row over its senders, each row's change divided by that row's senders
    among the uploads judged (`row_share`). That is the step of a server that averages the round's rows (the
    item family at its default server step, FedPerGNN, FedCIA, PersonalFR, PerFedRec's tables,
    the global table of GPFedRec and GFed-PP). Where a server steps otherwise (FedDAE's Adam, a
    server optimiser, FedCA's mixtures of clients' tables, GPFedRec's personalised tables) it is
    the same share of a plain average, not that server's step. A client's whole change taken
    as the round's would be larger than the table's rows under the papers' rule (a median
    honest row change of 14 on ML-100K), and uniformity would then read the upload's size more
    than whether it pulls the table together (docs/security.md).
  - ``server``: the server's own next step with the client's change as the round's, as the
    official code takes its Adam server's step (about the learning rate's size whatever the
    gradient's): FedDAE's Adam (`fedrec.federated.dae.state.TableView.adam_rows`) and a server
    optimiser's Adam or Yogi (`fedrec.federated.family.server_opt.Adam.row_step`), every sampled
    row moved by the server's moments and the client's rows by its change as well; the share
    where the server averages. It is not the default because it caught less where measured
    (docs/security.md): on FedMF with ``--server-opt adam`` it flags no ClusterAttack client at
    x1 or x10, where the share flags 96-100% of them every round, and on FedDAE it flags
    FedRecAttack's clients in two early rounds only (the share: in each of the first seven).

  UNION's client-side term is `fedrec.federated.family.objective.Contrast`
  (``--client-objective union``).

Krum and Multi-Krum *flag* clients: a client is flagged when the rule dropped more than half of
the rows it uploaded; UNION flags the clients it drops (the detection figures count these).

Shared dense weights (FedNCF's MLP) are one "row" uploaded by every client.

A server that uses every client's rows rather than their sum (GPFedRec's and GFed-PP's graph
step) asks what a rule keeps of each client's rows instead (`RobustRule.admit`): the same
judgement per row, applied client by client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedrec.core.contract import ClientUpload, row_senders
from fedrec.federated.family.model import ITEMS
from fedrec.federated.threats import DEFENCES, UNION_STEPS, RowStep

FLAGGING = ("krum", "multi-krum", "union")
#: UNION's sample of items and its gap statistic's reference draws (the official code's values)
UNION_ITEMS, UNION_REFERENCES = 500, 50


def share(n: int) -> RowStep:
    """The step of a server that averages ``n`` uploads' rows: a client's change / n."""
    return lambda rows, at, change: rows if change is None else rows + change / n


def row_share(senders: torch.Tensor) -> RowStep:
    """The step of a server that averages each row over the uploads that sent it (fedrec's
    item-row rules, ``--aggregation contributors|samples``): a client's change to a row / that
    row's ``senders`` (one count per item row)."""
    def step(rows: torch.Tensor, at: torch.Tensor, change: torch.Tensor | None) -> torch.Tensor:
        if change is None:
            return rows
        return rows + change / senders[at.cpu()].clamp(min=1).to(change)[:, None]

    return step


@dataclass(frozen=True)
class RobustRule:
    """A per-row robust aggregation rule and its parameters (see the module docstring)."""

    name: str
    trim: float = 0.1
    byzantine: float = 0.1
    norm_bound: float | None = None
    budget_mb: float = 64.0
    #: UNION: "share" judges each client at its share of a plain average whatever ``step`` the
    #: server gives; "server" at the server's ``step`` (`aggregate`; module docstring)
    union_step: str = "share"

    def __post_init__(self) -> None:
        if self.name not in DEFENCES:
            raise ValueError(f"unknown defence '{self.name}'; known: {', '.join(DEFENCES)}")
        if self.union_step not in UNION_STEPS:
            raise ValueError(f"unknown union step '{self.union_step}'; known: {', '.join(UNION_STEPS)}")

    def aggregate(self, uploads: list[ClientUpload], n_items: int, width: int,
                  shared: dict[str, torch.Tensor], table: torch.Tensor | None = None,
                  key: tuple[int, ...] = (), step: RowStep | None = None, per_row: bool = False
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]:
        """Sum-equivalents of a round's accepted ``uploads``: the item table's ``(n_items, width)``
        row sums, each shared weight's sum (``shared`` gives their shapes), and which uploads
        the rule flagged (a boolean per upload, all False for rules that do not flag). A row's
        sum-equivalent is its senders x the rule's estimate of the row's mean, so a server
        that divides each row by its senders (``per_row``: fedrec's item-row rules) takes the
        estimate itself. UNION reads the global item ``table`` the uploads' deltas apply to,
        moved by the server's ``step`` under ``union_step`` "server" (otherwise, or without
        one, by the client's share of the average of the uploads judged: `share`, or
        `row_share` under ``per_row``), and draws its sample keyed by ``key`` (the run's seed
        and the round); its dropped uploads are flagged and left out of the sums."""
        if self.name == "union":
            if table is None:
                raise ValueError("the union defence needs the global item table")
            accepted = [i for i, u in enumerate(uploads) if u.accepted]
            judged = [uploads[i] for i in accepted]
            if self.union_step == "server" and step is not None:
                form: RowStep | None = step
            else:
                form = row_share(row_senders(judged, n_items)) if per_row else None
            dropped = union_filter(judged, table, self.byzantine, key, form)
            flagged = np.zeros(len(uploads), bool)
            flagged[np.asarray(accepted, np.int64)[dropped]] = True
            kept = [u for i, u in enumerate(uploads) if u.accepted and not flagged[i]]
            item_sum, shared_sum, _ = RobustRule("mean", budget_mb=self.budget_mb).aggregate(kept, n_items, width,
                                                                                           shared)
            return item_sum, shared_sum, flagged
        ok = [u for u in uploads if u.accepted]
        flagged = np.zeros(len(uploads), bool)
        item_sum = torch.zeros(n_items, width)
        if not ok:
            return item_sum, {k: torch.zeros_like(v) for k, v in shared.items()}, flagged
        items = np.concatenate([u.items for u in ok]).astype(np.int64)
        rows = torch.cat([u.tensors[ITEMS] for u in ok]).float()
        owner = np.repeat(np.arange(len(ok)), [len(u.items) for u in ok])
        if not len(items):  # accepted uploads without a single row (only shared weights)
            dropped = np.zeros(0, bool)
        elif self.name == "norm-bound":
            rows = self._bound(rows, owner, len(ok))
            item_sum.index_add_(0, torch.as_tensor(items), rows)
            dropped = np.zeros(len(rows), bool)
        else:
            order = np.argsort(items, kind="stable")
            items, rows, owner = items[order], rows[torch.as_tensor(order)], owner[order]
            starts = np.flatnonzero(np.r_[True, items[1:] != items[:-1]])
            counts = np.diff(np.r_[starts, len(items)])
            loc, dropped = self._grouped(rows, starts, counts)
            item_sum.index_add_(0, torch.as_tensor(items[starts]), loc * torch.as_tensor(counts)[:, None].float())
        shared_sum = {}
        for k, v in shared.items():
            stacked = torch.stack([u.tensors[k].reshape(-1).float() for u in ok])
            if self.name == "norm-bound":
                shared_sum[k] = stacked.sum(0).reshape(v.shape)
                continue
            loc, _ = self._grouped(stacked, np.array([0]), np.array([len(ok)]))
            shared_sum[k] = (loc[0] * len(ok)).reshape(v.shape)
        if self.name in FLAGGING:
            flagged[[i for i, u in enumerate(uploads) if u.accepted]] = _dropped_most(owner, dropped, len(ok))
        return item_sum, shared_sum, flagged

    def _bound(self, rows: torch.Tensor, owner: np.ndarray, n: int) -> torch.Tensor:
        """Each client's rows scaled so its whole update has L2 norm <= the bound."""
        own = torch.as_tensor(owner)
        norms = torch.zeros(n).index_add_(0, own, rows.square().sum(1)).sqrt()
        bound = self.norm_bound if self.norm_bound is not None else float(norms.median())
        scale = (bound / norms.clamp_min(1e-12)).clamp(max=1.0)
        return rows * scale[own, None]

    def _grouped(self, rows: torch.Tensor, starts: np.ndarray, counts: np.ndarray, locate: Any = None
                 ) -> tuple[torch.Tensor, np.ndarray]:
        """The rule's location estimate of each group of consecutive ``rows`` (group g:
        ``counts[g]`` rows from ``starts[g]``), and which rows it dropped (Krum rules);
        ``locate``: what to estimate of a group (default `_locate`; `_kept_range`).

        Groups are taken in blocks of similar size, largest first, padded to the block's first
        (largest) group (NaN padding) so a block is one tensor operation within ``budget_mb``."""
        width = rows.shape[1]
        locate = self._locate if locate is None else locate
        out: torch.Tensor | None = None
        dropped = np.zeros(len(rows), bool)
        by_size = np.argsort(-counts, kind="stable")  # largest first: a block's first group sizes it
        g = 0
        while g < len(by_size):
            c_max = int(counts[by_size[min(len(by_size) - 1, g)]])
            per_group = c_max * (width + (c_max if self.name in FLAGGING else 0)) * 4
            take = max(1, int(self.budget_mb * 2**20 // max(per_group, 1)))
            block = by_size[g : g + take]
            c_max = int(counts[block].max())
            pos = np.arange(c_max)
            valid = pos[None, :] < counts[block][:, None]  # (G, C)
            src = (starts[block][:, None] + pos[None, :])[valid]
            padded = torch.full((len(block), c_max, width), float("nan"))
            padded[torch.as_tensor(valid)] = rows[torch.as_tensor(src)]
            loc, keep = locate(padded, torch.as_tensor(counts[block]))
            if out is None:
                out = torch.empty(len(counts), loc.shape[1])
            out[torch.as_tensor(block)] = loc
            if keep is not None:
                dropped[src] = ~keep[torch.as_tensor(valid)].cpu().numpy()
            g += take
        return (out if out is not None else torch.empty(0, width)), dropped

    def _locate(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Location of each group in ``x`` ``(G, C, D)`` (NaN-padded past ``c[g]`` rows)."""
        if self.name == "mean":
            return x.nan_to_num(0.0).sum(1) / c[:, None], None
        if self.name in ("median", "trimmed-mean"):
            s = x.nan_to_num(float("inf")).sort(dim=1).values  # padding sorts last
            lo, hi = self._kept(c)
            if self.name == "median":
                return (_pick(s, lo) + _pick(s, hi)) / 2, None
            pos = torch.arange(x.shape[1])[None, :]
            inside = (pos >= lo[:, None]) & (pos <= hi[:, None])
            vals = torch.where(inside[:, :, None], s, torch.zeros(()))
            return vals.sum(1) / inside.sum(1, keepdim=True), None
        # Krum and Multi-Krum
        z = x.nan_to_num(0.0)
        d = torch.cdist(z, z).square()
        pos = torch.arange(x.shape[1])
        real = pos[None, :] < c[:, None]
        d = d.masked_fill(~(real[:, :, None] & real[:, None, :]), float("inf"))
        d = d.masked_fill(torch.eye(x.shape[1], dtype=torch.bool)[None], float("inf"))
        f = torch.floor(self.byzantine * c.double()).long()
        m = (c - f - 2).clamp(min=1)
        near = d.sort(dim=2).values.nan_to_num(posinf=0.0)
        within = pos[None, None, :] < m[:, None, None]
        score = torch.where(within, near, torch.zeros(())).sum(2)
        score = score.masked_fill(~real, float("inf"))
        if self.name == "krum":
            best = score.argmin(1)
            keep = torch.zeros_like(real)
            keep[torch.arange(len(c)), best] = True
        else:
            n_keep = (c - f).clamp(min=1)
            rank = score.argsort(1).argsort(1)
            keep = (rank < n_keep[:, None]) & real
        chosen = torch.where(keep[:, :, None], z, torch.zeros(()))
        return chosen.sum(1) / keep.sum(1, keepdim=True), keep

    def _kept(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first and last sorted positions a coordinate rule keeps of ``c`` values: the
        middle one or two (median), all but ``--trim`` of each tail (trimmed mean, at least one)."""
        if self.name == "median":
            return (c - 1) // 2, c // 2
        k = torch.floor(self.trim * c.double()).long()  # float64: 0.45 x 20 is 9
        k = torch.minimum(k, (c - 1) // 2)
        return k, c - k - 1

    def _kept_range(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Per group of ``x`` ``(G, C, D)``, the lowest and highest value the coordinate rule
        keeps of each coordinate, ``(G, 2D)``."""
        s = x.nan_to_num(float("inf")).sort(dim=1).values
        lo, hi = self._kept(c)
        return torch.cat([_pick(s, lo), _pick(s, hi)], 1), None

    def admit(self, uploads: list[ClientUpload], table: torch.Tensor | None = None,
              key: tuple[int, ...] = ()) -> tuple[list[torch.Tensor], np.ndarray]:
        """What the rule keeps of each upload's item rows, client by client, for a server that
        uses every client's rows rather than their sum (GPFedRec's and GFed-PP's graph step):
        norm-bound scales a client's rows as `aggregate` does; Krum and Multi-Krum zero the
        rows they drop, UNION every row of a client it drops; the median and the trimmed mean
        clamp each coordinate into the range of the values they keep of that row (the middle
        one or two; all but the trimmed tails), so no client's row moves further than the
        rule's own estimate allows: under the median every sender of a row moves it by the
        median (its sum is `aggregate`'s), under the trimmed mean the tails are winsorised.
        ``mean`` keeps every row. Returns each upload's kept rows (zeros for a rejected one)
        and the flags (`aggregate`'s)."""
        kept = [u.tensors[ITEMS].float() if u.accepted else torch.zeros_like(u.tensors[ITEMS].float())
                for u in uploads]
        flagged = np.zeros(len(uploads), bool)
        ok = [i for i, u in enumerate(uploads) if u.accepted]
        if self.name == "union":
            if table is None:
                raise ValueError("the union defence needs the global item table")
            dropped = union_filter([uploads[i] for i in ok], table, self.byzantine, key)
            flagged[np.asarray(ok, np.int64)[dropped]] = True
            return [torch.zeros_like(k) if f else k for k, f in zip(kept, flagged, strict=True)], flagged
        sizes = [len(uploads[i].items) for i in ok]
        if self.name == "mean" or not sum(sizes):
            return kept, flagged
        items = np.concatenate([uploads[i].items for i in ok]).astype(np.int64)
        rows = torch.cat([kept[i] for i in ok])
        owner = np.repeat(np.arange(len(ok)), sizes)
        if self.name == "norm-bound":
            rows = self._bound(rows, owner, len(ok))
        else:
            order = np.argsort(items, kind="stable")
            by_item = rows[torch.as_tensor(order)]
            sorted_items = items[order]
            starts = np.flatnonzero(np.r_[True, sorted_items[1:] != sorted_items[:-1]])
            counts = np.diff(np.r_[starts, len(sorted_items)])
            if self.name in FLAGGING:  # Krum, Multi-Krum
                _, dropped = self._grouped(by_item, starts, counts)
                by_item = by_item * torch.as_tensor(~dropped)[:, None]
                flagged[np.asarray(ok, np.int64)] = _dropped_most(owner[order], dropped, len(ok))
            else:
                bounds, _ = self._grouped(by_item, starts, counts, locate=self._kept_range)
                group = torch.as_tensor(np.repeat(np.arange(len(starts)), counts))
                lo, hi = bounds[:, : rows.shape[1]], bounds[:, rows.shape[1]:]
                by_item = torch.minimum(torch.maximum(by_item, lo[group]), hi[group])
            rows = torch.empty_like(rows)
            rows[torch.as_tensor(order)] = by_item
        for i, part in zip(ok, rows.split(sizes), strict=True):
            kept[i] = part
        return kept, flagged


def _dropped_most(owner: np.ndarray, dropped: np.ndarray, n: int) -> np.ndarray:
    """Which of ``n`` uploads a Krum rule flags: those with more than half of their rows
    (row k sent by ``owner[k]``) dropped."""
    sent = np.bincount(owner, minlength=n)
    return np.bincount(owner, weights=dropped, minlength=n) > sent / 2


def _pick(s: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """Row ``i[g]`` of each group ``g`` of ``s`` ``(G, C, D)``: ``(G, D)``."""
    return s.gather(1, i[:, None, None].expand(-1, 1, s.shape[2]))[:, 0]


def union_filter(uploads: list[ClientUpload], table: torch.Tensor, byzantine: float,
                 key: tuple[int, ...] = (), step: RowStep | None = None) -> np.ndarray:
    """Which of ``uploads`` UNION drops (module docstring), a boolean each, each judged on
    ``table`` after the server's ``step`` from its upload (default: `share` of the n uploads).

    The items are drawn without replacement (the official code draws 500 with replacement), a
    new sample each round: by a generator keyed by ``key`` (the run's seed and the round), so
    the simulator and a Flower server draw the same. Everything runs on the host."""
    n = len(uploads)
    if n < 3:
        return np.zeros(n, bool)
    q = table.detach().float().cpu()
    rng = np.random.default_rng([0x0410, *key])
    sample = np.sort(rng.choice(len(q), min(UNION_ITEMS, len(q)), replace=False))
    spread = uniformities(uploads, q, sample, share(n) if step is None else step)
    lo, hi = spread.min(), spread.max()
    if hi <= lo:
        return np.zeros(n, bool)
    x = (spread - lo) / (hi - lo)
    upper, w1, w2 = _two_means_1d(x)
    ref = np.random.default_rng([0x0411, *key, n]).random((UNION_REFERENCES, n))
    log_w = np.array([[np.log(max(w, 1e-300)) for w in _two_means_1d(r)[1:]] for r in ref])  # (B, 2)
    gap = log_w.mean(0) - np.log(np.maximum([w1, w2], 1e-300))
    s2 = log_w[:, 1].std() * np.sqrt(1 + 1 / UNION_REFERENCES)
    small = upper if upper.sum() <= n / 2 else ~upper  # ties: the upper group
    two = gap[0] < gap[1] - s2
    return small if (two or small.sum() <= int(np.ceil(byzantine * n))) else np.zeros(n, bool)


def uniformities(uploads: list[ClientUpload], table: torch.Tensor, sample: np.ndarray,
                 step: RowStep | None = None) -> np.ndarray:
    """Each upload's uniformity: the mean pairwise L2 distance of the ``sample`` rows of
    ``table`` after the server's ``step`` (`fedrec.federated.threats.RowStep`; default the whole change, `share` (1))
    from that upload alone (`union_filter` passes the client's share of the round's average, or
    the server's own step). The distances of the rows the upload leaves as the step moves them
    anyway are computed once, so an upload costs its moved rows x the sample, not the sample
    squared."""
    step = share(1) if step is None else step
    table = table.detach().cpu()
    ids = torch.as_tensor(sample, dtype=torch.int64, device="cpu")
    before = table[ids].double()
    base = step(before, ids, None)
    dist = torch.cdist(base, base)
    total0, row_sums = float(dist.sum()), dist.sum(1)
    where = np.full(len(table), -1, np.int64)
    where[sample] = np.arange(len(sample))
    pairs = len(sample) * (len(sample) - 1)
    out = np.empty(len(uploads))
    for k, u in enumerate(uploads):
        at = where[np.asarray(u.items, np.int64)]
        hit = np.flatnonzero(at >= 0)
        p = torch.as_tensor(at[hit], device="cpu")
        change = u.tensors[ITEMS].detach().double().cpu()[torch.as_tensor(hit, device="cpu")]
        moved = step(before[p], ids[p], change)
        rest = torch.ones(len(sample), dtype=torch.bool, device="cpu")
        rest[p] = False
        total = (total0 - 2 * float(row_sums[p].sum()) + float(dist[p][:, p].sum())
                 + 2 * float(torch.cdist(moved, base[rest]).sum()) + float(torch.cdist(moved, moved).sum()))
        out[k] = total / pairs
    return out


def _two_means_1d(x: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The exact 2-means split of the values ``x``: the upper group (a boolean each) and the
    within-cluster sums of squares of one cluster and of the two (the best cut of the sorted
    values, found from prefix sums)."""
    s = np.sort(x)
    n = len(s)
    c1, c2 = np.cumsum(s), np.cumsum(s * s)
    w1 = float(c2[-1] - c1[-1] ** 2 / n)
    k = np.arange(1, n)  # the first k values below the cut
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    best = int(np.argmin(left + right))
    cut = s[best]
    return x > cut, w1, float(max(left[best] + right[best], 0.0))
