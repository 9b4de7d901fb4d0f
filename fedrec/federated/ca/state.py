"""FedCA: personalised federated recommendation with composite aggregation (Zhang et al.,
arXiv 2406.03933; official code hongleizhang/FedCA).

Every client (one user) keeps a whole model of its own: an item table, its user vector and, on
the ``ncf`` backbone, an MLP tower. A round:

1. **Local training.** Each sampled client trains its own model for ``local_epochs`` on its
   training positives and ``negatives`` fresh leak-free negatives each (BCE, Adam with a fresh
   optimiser each round, batches of ``batch_size``), from where it stopped last round.
2. **Upload.** The server draws a share (``aggregated``) of the round's clients, A. Each of
   them uploads its item table, its tower and ``principal`` principal directions of the item
   rows it trained this round (its complementarity signature).
3. **Composite aggregation** (`fedrec.federated.ca.composite`). Each client i of A gets its own
   weights w_i over A, from the FedAvg weights, its models' similarity and its data's
   complementarity, and the server sends it sum_j w_ij θ_j.
4. **Interpolation.** Client i keeps ``interpolation`` of its own model and takes the rest
   from what the server sent; a client outside A keeps its own.

Items a client never trained still move at step 4, through the clients it is complementary
to: the "embedding skew" the paper names is that plain averaging updates only the rows
clients trained.

**Exactness and memory.** A client's Adam step with a dense gradient leaves a row it has not
touched this round where it is (zero moments, zero step), so training gathers only the rows a
client touches this round (its positives and negatives: the cohort's local rows,
`fedrec.rounds.cohort`) and steps them, which equals a torch Adam on the whole table (tested
against one). The clients' tables themselves are whole: each client's model covers every
item, and after one aggregation every row of it has moved. The simulator holds them all,
n_users x n_items x dim floats (101 MB on ML-100K, 1.3 GB on Lastfm-2K's 1,600 x 12,454, at
dim 16).

**Departures from the official code**, each for the reason given: the principal angles are
the singular values' arc-cosines (`complementarity`); the simplex projection replaces cvxpy's
solver (the same minimiser); the aggregated clients' weights are computed as soon as they
have trained, and each takes its share at once, so an aggregated client that is not sampled
the next round keeps what it was sent (the official server forgets it); negatives are drawn
from the items the protocol allows (never a validation or test item), and the local early
stop on a relative loss change below 1e-4 is not taken (it rarely fires in 10 epochs). Its
evaluation, the best round chosen by its test score, is fedrec's validation-chosen round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.core.device import here
from fedrec.federated.ca.composite import (
    complementarity,
    composite_weights,
    principal_basis,
    similarity,
)
from fedrec.federated.engine import client_negatives
from fedrec.federated.family.model import ITEMS, batch_loss, client_params, init_params
from fedrec.federated.threats import MINING
from fedrec.protocols.protocol import Split
from fedrec.rounds import draws
from fedrec.rounds.cohort import CohortBatches, build_cohort, chunk_clients, order_by_activity
from fedrec.rounds.optim import adam_

#: item-row cells (users x items x dim) scored at once
SCORE_CELLS = 1 << 23
#: local rows (touched (client, item) pairs) a cohort chunk trains at once
CHUNK_ROWS = 1 << 21
#: columns of the clients' flattened tables a mixture block takes on the CPU (`sparse_product`)
PRODUCT_COLUMNS = 2048


class CAState:
    """Every client's model (item tables ``(n_users, n_items, dim)``, user vectors, towers)
    and the common start of the item table (which the similarity is measured from)."""

    def __init__(self, spec: Any, split: Split, cfg: Any, seed: int, client_ids: np.ndarray | None = None) -> None:
        """``client_ids``: the run's id of each row of ``split.train`` (a deployment's node
        holds some of the users; draws are keyed by these ids), by default the rows' numbers."""
        self.spec, self.split, self.seed = spec, split, seed
        self.model = spec.model
        n, m, d = split.n_users, split.n_items, spec.dim
        self.ids = np.arange(n) if client_ids is None else np.asarray(client_ids, np.int64)
        self.start, gen = common_start(m, d, cfg.item_std, seed)
        self.tables = self.start.expand(n, m, d).clone()
        score = list(self.model.score_shapes())
        #: the start every client's tower takes
        self.tower = init_params(self.model, score, 1, gen)
        self.params = {k: v.expand(n, *v.shape[1:]).clone() for k, v in self.tower.items()}
        #: the user vector every client copies (``user_start`` common; drawn after the tower);
        #: None: each client draws its own by its id
        self.user_start = init_params(self.model, ["user"], 1, gen)["user"] if spec.user_start == "common" else None
        self.params["user"] = self._user_vectors(self.ids)
        self.received = np.zeros(n, bool)  # has downloaded the start

    def _user_vectors(self, ids: np.ndarray) -> torch.Tensor:
        """The starting user vectors of the clients ``ids``."""
        if self.user_start is not None:
            return self.user_start.expand(len(ids), *self.user_start.shape[1:]).clone()
        return client_params(self.model, ["user"], ids, (self.seed, draws.INIT))["user"]

    @property
    def floats_per_model(self) -> int:
        """Floats of what an aggregated client uploads and downloads: its table and tower."""
        n_items = self.tables.shape[1]
        return n_items * self.spec.dim + sum(int(np.prod(s)) for s in self.model.score_shapes().values())

    # ---- local training ------------------------------------------------------------------

    def train(self, clients: np.ndarray, cfg: Any, r: int) -> tuple[float, int, dict[int, np.ndarray]]:
        """Round ``r``'s local training of ``clients`` (rows of the training matrix); (loss
        sum, client batches, each client's trained rows of this round by row)."""
        train, sampler = self.split.train, self.split.sampler
        cohort = order_by_activity(train, np.asarray(clients, np.int64))
        cohort = cohort[np.diff(train.indptr)[cohort] > 0]
        rows = np.diff(train.indptr)[cohort] * (1 + cfg.negatives)
        loss, batches, trained = 0.0, 0, {}
        # chunks of whole clients: a client's draws are keyed by its id, so a chunk trains it as
        # the whole cohort would
        for part in chunk_clients(cohort, rows, CHUNK_ROWS):
            negs = client_negatives(cfg.negatives, train, sampler, part, self.ids[part], self.seed, r)
            counts = np.diff(train.indptr)[part] * (1 + cfg.negatives)
            keys = np.stack([draws.uniforms((self.seed, draws.SHUFFLE, r, e), self.ids[part], counts)
                             for e in range(cfg.local_epochs)])
            layout = build_cohort(train, part, negs, cfg.batch_size, keys)
            s, n = self._train_chunk(layout, cfg.lr)
            loss, batches = loss + s, batches + n
            for k, client in enumerate(part.tolist()):
                trained[client] = layout.row_items[layout.row_ptr[k] : layout.row_ptr[k + 1]]
        return loss, batches, trained

    def _train_chunk(self, layout: CohortBatches, lr: float) -> tuple[float, int]:
        """Adam on the chunk's local rows and parameters, stepped as a prefix of clients
        (`fedrec.rounds.optim.adam_`); written back into the clients' models."""
        clients = torch.as_tensor(layout.clients)
        owner = torch.as_tensor(np.repeat(np.arange(len(layout.clients)), np.diff(layout.row_ptr)))
        items = torch.as_tensor(layout.row_items)
        rows = self.tables[clients[owner], items]
        params = {k: v[clients] for k, v in self.params.items()}
        moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in {**params, "rows": rows}.items()}
        decay = {k: self.spec.weight_decay for k in self.model.score_shapes()}
        steps = torch.zeros(len(layout.clients))
        loss_sum = torch.zeros((), dtype=torch.float64)
        batches = 0
        for step in layout.steps:
            n = step.n_active
            idx = torch.as_tensor(step.rows)
            v = rows[idx].requires_grad_(True)
            p = {k: t[:n].clone().requires_grad_(True) for k, t in params.items()}
            loss = batch_loss(self.model, p, v, torch.as_tensor(step.labels), torch.as_tensor(step.mask))
            grads = torch.autograd.grad(loss, [v, *p.values()])
            with torch.no_grad():
                end = int(layout.row_ptr[n])
                g_rows = torch.zeros((end, rows.shape[1]), dtype=rows.dtype).index_add_(
                    0, idx.reshape(-1), grads[0].reshape(-1, rows.shape[1]))
                steps[:n] += 1
                m, s = moments["rows"]
                adam_(rows[:end], g_rows, m[:end], s[:end], steps[owner[:end]], lr)
                for (k, t), g in zip(params.items(), grads[1:], strict=True):
                    m, s = moments[k]
                    adam_(t[:n], g, m[:n], s[:n], steps[:n], lr, decay.get(k, 0.0))
            loss_sum += loss.detach()
            batches += n
        self.tables[clients[owner], items] = rows
        for k, t in params.items():
            self.params[k][clients] = t
        return float(loss_sum), batches

    # ---- aggregation ---------------------------------------------------------------------

    def uploads(self, members: np.ndarray, trained: dict[int, np.ndarray]) -> dict[str, torch.Tensor]:
        """What the aggregated clients ``members`` upload: item tables, towers, principal bases
        of the rows each trained this round, and training sizes."""
        idx = torch.as_tensor(members)
        bases = torch.stack([principal_basis(self.tables[int(c), torch.as_tensor(trained[int(c)])],
                                             self.spec.principal) for c in members])
        samples = torch.as_tensor(np.diff(self.split.train.indptr)[members], dtype=torch.float64,
                                  device=self.tables.device)
        return {"tables": self.tables[idx], "bases": bases, "samples": samples,
                **{f"score.{k}": self.params[k][idx] for k in self.model.score_shapes()}}

    def weights(self, up: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each aggregated client's weights over the aggregated clients (rows sum to 1)."""
        return mix_weights(self.spec, up, self.start)

    def apply(self, members: np.ndarray, up: dict[str, torch.Tensor], w: torch.Tensor) -> None:
        """Each aggregated client takes its new model (`mixtures`)."""
        idx = torch.as_tensor(members)
        for k, v in mixtures(self.spec, up, w).items():
            target = self.tables if k == "tables" else self.params[k.removeprefix("score.")]
            target[idx] = v

    # ---- the security layer's view (`fedrec.security.adversary`) -------------------------------

    def admit_attackers(self, n: int, attack: Any = None, first: int | None = None) -> None:
        """Give ``n`` malicious clients, ids after the users (``first``: the first one's id,
        by default the row after the last client's), a model as any client has one: the common
        start's table, the towers' start, the user vectors' start."""
        if n <= 0:
            return
        first = self.tables.shape[0] if first is None else first
        ids = np.arange(first, first + n)
        self.tables = torch.cat([self.tables, self.start.expand(n, *self.start.shape).to(self.tables)])
        fresh = {k: v.expand(n, *v.shape[1:]).clone() for k, v in self.tower.items()}
        fresh["user"] = self._user_vectors(ids)
        self.params = {k: torch.cat([v, fresh[k].to(v)]) for k, v in self.params.items()}
        self.received = np.concatenate([self.received, np.zeros(n, bool)])

    def admit_uploads(self, security: Any, members: np.ndarray, up: dict[str, torch.Tensor],
                      known: torch.Tensor, r: int) -> None:
        """Round ``r``'s tables of the aggregated ``members`` as the defence's rule admits them
        (`admit_tables`)."""
        admit_tables(security, members, up, known, r)

    # ---- scores ------------------------------------------------------------------------------

    @torch.no_grad()
    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        users = np.asarray(users, np.int64)
        m = self.tables.shape[1] if items is None else items.shape[1]
        out = np.empty((len(users), m), np.float32)
        step = max(1, SCORE_CELLS // (m * self.spec.dim))
        for a in range(0, len(users), step):
            u = torch.as_tensor(users[a : a + step])
            v = self.tables[u] if items is None else self.tables[u[:, None], torch.as_tensor(items[a : a + step])]
            p = {k: t[u] for k, t in self.params.items()}
            out[a : a + step] = self.model.scorer.logits(self.model, p, v).cpu().numpy()
        return out


def common_start(n_items: int, dim: int, item_std: float, seed: int) -> tuple[torch.Tensor, torch.Generator]:
    """The start every client's item table takes (the official code's shared init), and the
    generator the towers' start is drawn from next: from ``seed`` alone, so a deployment's
    server and nodes draw the same."""
    gen = torch.Generator().manual_seed(seed)
    return here(torch.randn((n_items, dim), generator=gen, device="cpu")) * item_std, gen


def admit_tables(security: Any, members: np.ndarray, up: dict[str, torch.Tensor], known: torch.Tensor,
                 r: int) -> None:
    """Round ``r``'s tables of the aggregated ``members`` (``up["tables"]``, replaced) as the
    defence's rule admits them before the weights are computed: each client's steps are its
    table less the server's copy of it (``known``: the common start, or what the server computed
    for it at its last aggregation), non-zero on the rows it trained since; the rule judges them
    row by row over the clients that moved each row (`Security.admit`; UNION's table: the
    copies' mean), and each table loses what the rule took off its steps (a simulator's server
    and a deployment's run this one step)."""
    idx = torch.as_tensor(members)
    steps = up["tables"] - known[idx]
    moved = steps.abs().sum(2) > 0
    per_client = [ClientUpload(int(c), torch.nonzero(moved[j]).flatten().cpu().numpy(), {ITEMS: steps[j][moved[j]]})
                  for j, c in enumerate(members.tolist())]
    kept = security.admit(per_client, known[idx].mean(0), r)
    tables = up["tables"].clone()
    for j, rows in enumerate(kept):  # what the rule took off each step (zero: the table as sent)
        tables[j, moved[j]] += rows.to(tables) - steps[j][moved[j]]
    up["tables"] = tables


def mix_weights(spec: Any, up: dict[str, torch.Tensor], start: torch.Tensor) -> torch.Tensor:
    """Each aggregated client's weights over the aggregated clients (rows sum to 1), from
    their uploads (`CAState.uploads`) and the common start."""
    n = len(up["samples"])
    if spec.aggregation == "fedavg":
        return composite_weights(up["samples"], torch.zeros(n, n, dtype=torch.float64),
                                 torch.zeros(n, n, dtype=torch.float64), 0.0, 0.0)
    s = similarity(up["tables"], start).double()
    c = complementarity(up["bases"]).double()
    return composite_weights(up["samples"], c, s, spec.complementarity, spec.similarity)


def mixtures(spec: Any, up: dict[str, torch.Tensor], w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each aggregated client's new table and tower (keys ``tables``, ``score.*``): it keeps
    ``interpolation`` of its own and takes the rest from its weighted mixture of the
    aggregated clients' models."""
    keep = spec.interpolation
    # each distinct row of weights is mixed once: under FedAvg's weights (``aggregation
    # fedavg``) every row is the same, and one mixture serves every client (on Lastfm-2K's
    # 1,600 clients, a 1,600th of the work: its rows are dense, and a sparse product over all
    # of them grows with the square of the clients). The composite weights' projection onto the
    # simplex leaves few weights a row (about 60 of 1,600 clients on Lastfm-2K), so the
    # mixtures are a sparse product: a tenth of the dense one's work there. On the CPU a row's
    # mixture is the same sums with or without the rows that repeat it (tested).
    rows, which = torch.unique(w, dim=0, return_inverse=True)  # rows sorted
    if len(rows) == len(w):
        rows, which = w, None
    wf = rows.to(up["tables"].dtype).to_sparse()
    out = {}
    for k in ["tables", *(f"score.{k}" for k in spec.model.score_shapes())]:
        own = up[k]
        theirs = sparse_product(wf, own.reshape(len(own), -1))
        theirs = (theirs if which is None else theirs[which]).reshape(own.shape)
        out[k] = theirs.mul_(1 - keep).add_(own, alpha=keep)
    return out


def sparse_product(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``w @ x`` for a sparse COO ``w`` and a dense ``x``, on the CPU in blocks of
    `PRODUCT_COLUMNS` columns of ``x``.

    PyTorch's CPU kernel adds, weight by weight, the weight times a whole row of ``x`` into a
    whole row of the output: on Lastfm-2K a row is a client's table, 800 KB, so every weight
    streams two table rows through memory. A block of columns keeps the rows it adds in cache,
    which halves the product's time there (measured: ``benchmarks/fedca_mixture.py``). Each
    output entry is the same sum, taken in the same order (the weights' order), so the result
    is bitwise the whole product's (tested). On a GPU the product is one call."""
    if x.device.type != "cpu" or x.shape[1] <= PRODUCT_COLUMNS:
        return torch.sparse.mm(w, x)
    out = torch.empty(w.shape[0], x.shape[1], dtype=x.dtype)
    for a in range(0, x.shape[1], PRODUCT_COLUMNS):
        out[:, a : a + PRODUCT_COLUMNS] = torch.sparse.mm(w, x[:, a : a + PRODUCT_COLUMNS].contiguous())
    return out


def step_bound(train: Any, cfg: Any) -> float:
    """How far an honest client's round moves a coordinate at most: the Adam rate x the local
    steps of a client of the mean training size (`fedrec.security.attacks.Knowledge.step_bound`)."""
    rows = train.nnz / max(train.shape[0], 1) * (1 + cfg.negatives)
    return float(cfg.lr * cfg.local_epochs * np.ceil(rows / cfg.batch_size))


def typical_size(train: Any) -> float:
    """The users' median training size (the lower middle one, as torch's median, so a whole
    number; at least 1, as every aggregated client has trained): what a malicious client claims
    where it measures no honest client's."""
    return max(1.0, float(torch.as_tensor(np.diff(train.indptr)).median()))


def aggregated_attackers(sampled: np.ndarray, aggregated: float, seed: int, r: int) -> np.ndarray:
    """Round ``r``'s aggregated malicious clients (0-based among them, sorted) of the ``sampled``
    ones: the users' share (``aggregated``), drawn from a stream of its own, so the users'
    draw does not change; a simulator's and a deployment's server draw the same."""
    n_bad = int(len(sampled) * aggregated)
    if not n_bad:
        return np.zeros(0, np.int64)
    return np.sort(np.random.default_rng([seed, r, 0xCA]).choice(sampled, n_bad, replace=False))


def attacker_uploads(security: Any, spec: Any, tables: torch.Tensor, params: dict[str, torch.Tensor],
                     sampled: np.ndarray, r: int, norm: float | None, claim: float) -> dict[str, torch.Tensor]:
    """What round ``r``'s aggregated malicious clients ``sampled`` (0-based among them) upload
    (`CAAlgorithm`'s docstring), keyed as `CAState.uploads`: each its table plus crafted rows,
    their principal basis, the training size ``claim`` and its tower as it is. ``tables`` and
    ``params``: every malicious client's model, by that index; ``norm``: the honest row norm
    the rows are held to (None: the attack's own estimate). A simulator's round and a
    deployment's malicious node (`fedrec.flower.malicious.CAMaliciousNode`) both run this."""
    model = spec.model
    score = list(model.score_shapes())
    towers = {c: {k: params[k][c] for k in score} for c in sampled.tolist()}
    if security.attack.name in MINING:  # one round's rows against the one table it watches
        crafted, _ = security.malicious_uploads(model, tables.mean(0), towers[int(sampled[0])], r, clients=sampled,
                                                norm=norm)
    else:  # each attacker's rows against its own table
        crafted = [security.malicious_uploads(model, tables[c], towers[c], r, clients=np.array([c]), norm=norm)[0][0]
                   for c in sampled.tolist()]
    bad: dict[str, list[torch.Tensor]] = {"tables": [], "bases": [], "samples": []}
    for c, u in zip(sampled.tolist(), crafted, strict=True):
        rows = torch.as_tensor(u.items, dtype=torch.int64)
        sent = tables[c].clone()
        sent[rows] += u.tensors[ITEMS].to(sent)
        bad["tables"].append(sent)
        bad["bases"].append(principal_basis(sent[rows], spec.principal))
        bad["samples"].append(torch.tensor(claim, dtype=torch.float64, device=sent.device))
        for k in score:
            bad.setdefault(f"score.{k}", []).append(towers[c][k])
    return {k: torch.stack(v) for k, v in bad.items()}


class CAAlgorithm(FederatedAlgorithm):
    """A `CAState` as the round driver's federated algorithm: the sampled clients train, a
    share of them upload, the server weighs them and each takes its mixture.

    **Attacks and defences** (`fedrec.security.adversary`). The server keeps no global table;
    it mixes the aggregated clients' own tables, so the security layer plugs in where they are:

    * a malicious client is one more client with a model of its own (`CAState.admit_attackers`),
      sampled as the users are, and aggregated at the same share (``aggregated``, from a stream
      of its own). It uploads its table plus crafted row steps against its table (on the
      backbone's score, its tower as it is; `attacker_uploads`), held to the median norm of
      the honest aggregated clients' row steps this round (measured, as for FedCIA's
      similarity rows: an upper bound of what a cover client would estimate); its principal
      directions are those of its crafted rows, and it claims the honest aggregated clients'
      median training size (FedCA weighs a client by the size it reports). Under
      ``--attacker-norm own`` it knows neither: its rows go at the attack's own estimate (an
      Adam client's `step_bound` on every coordinate) and it claims the users' median
      training size (`typical_size`), as a deployment's malicious node does
      (`fedrec.flower.malicious.CAMaliciousNode`). It then takes its mixture as any aggregated
      client does. (FedRecAttack's approximated users are refitted once a round, to the first
      sampled attacker's table.) The attacks that mine popular items from one table's movement
      over rounds (PIECK, PoisonFRS: `fedrec.federated.threats.MINING`) watch one
      table, the mean of every malicious client's (the adversary holds all
      its clients' models, and each moves only by the mixtures of trained tables it takes), and
      craft one round's rows against it, which each sampled attacker adds to its own table
      (their surrogate's tower is the first sampled attacker's, read only for the attack's own
      budget: under ``--attacker-norm own``, or in a round where no honest client is aggregated);
    * a defence's rule admits each aggregated client's table before the weights
      (`CAState.admit_uploads`): steps against the server's copy of each table, judged row by
      row over the clients that moved the row. Towers and bases are taken as sent.
    """

    #: the run's attack and defence (`fedrec.security.adversary.attach`); None: plain rounds
    security: Any = None
    takes_security = True

    def __init__(self, state: CAState, cfg: Any) -> None:
        self.state, self.cfg = state, cfg
        self.n_clients, self.seed = state.split.n_users, state.seed
        self.clients_per_round = cfg.clients_per_round
        self.divergence_hint = "lower --lr"
        #: the server's copy of each client's table, kept only while uploads are kept (audits)
        self._known: torch.Tensor | None = None

    def scale_rates(self, factor: float) -> bool:
        """Scale the clients' Adam rate (the driver's back-off)."""
        import dataclasses

        self.cfg = dataclasses.replace(self.cfg, lr=self.cfg.lr * factor)
        self.divergence_hint = f"lower --lr (now {self.cfg.lr:g})"
        return True

    @property
    def lr_item(self) -> float:
        """The rate of a row step (the clients' Adam rate; its round's bound is `step_bound`)."""
        return float(self.cfg.lr)

    @property
    def step_bound(self) -> float:
        """How far an honest client's round moves a coordinate at most: the rate x the local
        steps of a client of the mean training size."""
        return step_bound(self.state.split.train, self.cfg)

    def local_update(self, plan: RoundPlan) -> Uploads:
        state, spec = self.state, self.state.spec
        loss, batches, trained = state.train(plan.clients, self.cfg, plan.round)
        cohort = np.array(sorted(trained), np.int64)
        n_agg = int(len(cohort) * spec.aggregated)
        members = np.sort(plan.rng.choice(cohort, n_agg, replace=False)) if n_agg else cohort[:0]
        up = state.uploads(members, trained) if len(members) else None
        per = state.floats_per_model
        new = cohort[~state.received[cohort]]
        state.received[new] = True
        bytes_up = len(members) * (per + spec.principal * spec.dim) * 4
        bytes_down = (len(members) + len(new)) * per * 4
        kept = self._per_client(members, up) if self.keep_uploads and up is not None else None
        honest = len(members)
        extra = {"aggregated": float(honest)}
        if self.security is not None and self.security.attack is not None:
            members, up, n_bad, norm = self._with_attackers(members, up, plan.round)
            bytes_up += n_bad * (per + spec.principal * spec.dim) * 4
            bytes_down += n_bad * per * 4
            if norm is not None:  # the attackers' row budget before the boost
                extra["attacker_row_norm"] = norm
        return Uploads(payload=(members, up, honest), per_client=kept, loss_sum=loss, client_batches=batches,
                       bytes_up=bytes_up, bytes_down=bytes_down, extra=extra)

    def _known_tables(self) -> torch.Tensor:
        """The server's copy of each client's table (the common start until it aggregates one)."""
        if self._known is None:
            self._known = self.state.start.expand_as(self.state.tables).clone()
        return self._known

    def _with_attackers(self, members: np.ndarray, up: dict[str, torch.Tensor] | None, r: int
                        ) -> tuple[np.ndarray, dict[str, torch.Tensor] | None, int, float | None]:
        """Round ``r``'s aggregated clients and uploads with the sampled malicious clients'
        (class docstring), how many of them joined, and the honest row norm their rows were
        held to (None: none joined, or the attack's own estimate)."""
        st, sec, spec = self.state, self.security, self.state.spec
        sampled = aggregated_attackers(sec.malicious_clients(r), spec.aggregated, self.seed, r)
        if not len(sampled):
            return members, up, 0, None
        norm, claim = None, typical_size(st.split.train)
        if up is not None and self.cfg.attacker_norm == "honest":  # the honest aggregated clients' figures
            steps = (up["tables"] - self._known_tables()[torch.as_tensor(members)]).norm(dim=2)
            norm = float(steps[steps > 0].median()) if bool((steps > 0).any()) else None
            claim = float(up["samples"].median())
        first, n_mal = self.n_clients, sec.n_malicious
        extra = attacker_uploads(sec, spec, st.tables[first : first + n_mal],
                                 {k: v[first : first + n_mal] for k, v in st.params.items()}, sampled, r, norm, claim)
        ids = first + sampled
        if up is None:
            return ids, extra, len(ids), norm
        return np.concatenate([members, ids]), {k: torch.cat([up[k], extra[k]]) for k in up}, len(ids), norm

    def _per_client(self, members: np.ndarray, up: dict[str, torch.Tensor]) -> list[ClientUpload]:
        """Each aggregated client's upload as the server reads it: its basis and tower, and as
        its item rows (``ITEMS``) its table less the server's last copy of it (the common start,
        or the table the server computed for it at its last aggregation). That difference is
        exactly the client's training since then, zero on every row it did not touch, which is
        what a privacy audit (`fedrec.security.inference`) reads."""
        state = self.state
        if self._known is None:
            self._known = state.start.expand_as(state.tables).clone()
        idx = torch.as_tensor(members)
        steps = up["tables"] - self._known[idx]
        items = np.arange(state.tables.shape[1])
        return [ClientUpload(int(c), items, {ITEMS: steps[j], **{k: v[j] for k, v in up.items()
                                                              if k not in ("samples", "tables")}})
                for j, c in enumerate(members)]

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        members, up, honest = uploads.payload
        if up is None:
            return
        sec = self.security
        if sec is not None and sec.rule is not None:
            self.state.admit_uploads(sec, members, up, self._known_tables(), plan.round)
        elif sec is not None and sec.attack is not None and self.cfg.attacker_norm == "honest":
            self._known_tables()  # the attackers' norm reads the honest steps against it
        w = self.state.weights(up)
        self.state.apply(members, up, w)
        if self._known is not None:  # the server computed what each aggregated client now holds
            self._known[torch.as_tensor(members)] = self.state.tables[torch.as_tensor(members)]
        uploads.extra["self_weight"] = float(torch.diagonal(w[:honest, :honest]).mean()) if honest else 0.0
        if len(members) > honest and honest:  # the attackers' mean share of an honest client's mixture
            uploads.extra["attacker_weight"] = float(w[:honest, honest:].sum(1).mean())

    def round_extra(self) -> dict[str, float]:
        return self.security.figures(self.scores) if self.security is not None else {}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        s = self.state.spec
        return {"backbone": s.backbone, "aggregation": s.aggregation}

    def server_state_dict(self) -> dict[str, Any]:
        """The common start of the item table (the similarity's origin), and under a defence
        or an audit the server's copy of each client's table."""
        return {"start": self.state.start, **({"known": self._known} if self._known is not None else {})}

    def client_state_dict(self) -> dict[str, Any]:
        """Every client's own model, and which clients have downloaded the start."""
        return {"tables": self.state.tables, "params": self.state.params, "received": self.state.received}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.start = blob["start"]
        self._known = blob.get("known")

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.tables, self.state.params = blob["tables"], blob["params"]
        self.state.received = np.asarray(blob["received"], bool)
