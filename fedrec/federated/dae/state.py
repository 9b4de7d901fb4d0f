"""FedDAE: personalised federated collaborative filtering with a gated dual-encoder VAE (Li,
Long, Zhou, Jiang and Zhang, AAAI 2025; official code mtics/FedDAE, read at commit 04d0f77,
never copied).

Each client is one user, and its data is its bag of training items x. Its model is a
multinomial VAE (Liang et al., WWW 2018) with two encoders of x: a global one, shared by every
client, and a local one of its own; a gating network of its own weighs their codes, and a
shared decoder turns the code into a distribution over the items:

    (mu_g, logvar_g) = E_g(x),  (mu_l, logvar_l) = E_l(x),  (w_l, w_g) = softmax(G(x)),
    z = w_l z_l + w_g z_g,  loss = -<log softmax(D(z)), x> + beta_t KL(N(mu, var) || N(0, I))

with mu = w_l mu_l + w_g mu_g and var = w_l^2 var_l + w_g^2 var_g (the official code's
combination). An encoder normalises x to unit length, drops out entries (``dropout``), and
runs tanh layers ``hidden``; the gate reads x through a ReLU layer with dropout.

**A round** (the paper's Algorithm 1). Every sampled client downloads the global encoder and
decoder, trains its whole model for ``local_epochs`` Adam steps on its bag (a fresh optimiser
each round; its bag is one batch), keeps its local encoder and gate, and uploads the sum of its
gradients of the global parts over its steps; the server averages those sums over the round's
clients and takes one Adam step of its own with them.

**Memory follows the data.** A first layer's input is the user's bag, so only the rows of the
user's items ever meet it or a gradient: each client's private first layers (local encoder,
gate) are kept as those rows alone, in the training matrix's order, and a client trains a copy
of the global first layer's rows of its items only. The private deeper layers are whole, a
client's own (hidden[0] x hidden[1] + hidden[1] x 2 latent floats: 655,360 at the defaults).

**Departures from the official code**, each for the reason given:

* Its clients' local encoders and gates are not kept: it writes them into a dictionary that
  ``state_dict()`` returns, which does not change the model, so each round every client takes
  the local encoder from the global model and the gate from its initial weights (and is
  evaluated with that untrained gate). fedrec keeps them, as the paper's Algorithm 1 says.
* Its KL weight is beta_t = tanh(t / 10) beta_{t-1} from beta_0 = 1, which is 0 from the first
  round on. fedrec's is beta tanh(t / 10), the curriculum its authors use in FedRAP; ``beta=0``
  is the official behaviour.
* It never zeroes a client's gradients between local steps, so the server receives the sum of
  the running sums (step 1 counted five times, step 5 once). fedrec sends the sum of the steps'
  gradients, the accumulated gradient of the paper's Appendix.
* The official evaluation chooses the round by validation and stops on a relative change of the
  training loss below 1e-2; fedrec chooses by validation and stops on it (its defaults).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.core.device import here
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.spec import FamilySpec
from fedrec.federated.threats import RowStep
from fedrec.protocols.protocol import Split
from fedrec.rounds import draws
from fedrec.rounds.optim import BETA1, BETA2, EPS, adam_
from fedrec.rounds.ragged import ranges

#: the draws of a local step, by purpose (`fedrec.rounds.draws` keys under DROPOUT)
_DROP_LOCAL, _DROP_GLOBAL, _DROP_GATE, _NOISE_LOCAL, _NOISE_GLOBAL = range(5)
#: bytes of a chunk's copies of the global parts, their moments, gradients and sums
CHUNK_BYTES = 1 << 30
#: users scored at once
SCORE_USERS = 256
#: the global encoder's first layer: an item's row, which a client uses (and sends) for its bag
FIRST = "g.W0"


def _mlp(prefix: str, widths: list[int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Linear layers ``widths`` as ``nn.Linear`` draws them: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    out = {}
    for j, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        bound = 1.0 / math.sqrt(a)
        out[f"{prefix}.W{j}"] = here((torch.rand((a, b), generator=gen, device="cpu") * 2 - 1) * bound)
        out[f"{prefix}.b{j}"] = here((torch.rand((b,), generator=gen, device="cpu") * 2 - 1) * bound)
    return out


@dataclasses.dataclass
class _Bags:
    """A chunk of users' bags as one flat layout: ``items`` of each entry, its ``owner`` (the
    user's place in the chunk), ``pos`` (its place in the training matrix) and the dense bags."""

    users: np.ndarray
    items: torch.Tensor
    owner: torch.Tensor
    pos: torch.Tensor
    counts: np.ndarray
    dense: torch.Tensor

    @classmethod
    def of(cls, train: Any, users: np.ndarray) -> _Bags:
        starts, ends = train.indptr[users], train.indptr[users + 1]
        counts = (ends - starts).astype(np.int64)
        pos = ranges(starts, counts)
        owner = np.repeat(np.arange(len(users)), counts)
        items = train.indices[pos].astype(np.int64)
        dense = torch.zeros(len(users), train.shape[1])
        dense[torch.as_tensor(owner), torch.as_tensor(items)] = 1.0
        return cls(users, torch.as_tensor(items), torch.as_tensor(owner), torch.as_tensor(pos.astype(np.int64)),
                   counts, dense)


class TableView:
    """The security layer's view of FedDAE's global parts (`fedrec.security.adversary`), shared
    by the simulator's state and a Flower server: needs ``glob``, ``spec`` and ``n_items``."""

    glob: dict[str, torch.Tensor]
    spec: Any
    n_items: int

    #: the server averages the clients' gradients of every global part, so the security layer
    #: reads its item rows as a table and aggregates them row by row (`row_table`)
    plain_average = True

    @property
    def out_keys(self) -> tuple[str, str]:
        """The decoder's output layer, weight ``(hidden[0], n_items)`` and bias: item j's logit
        for a user whose last decoder layer is h is (h, 1) · (W[:, j], b_j), a dot product."""
        n = len(self.spec.hidden)
        return f"d.W{n}", f"d.b{n}"

    def out_table(self) -> torch.Tensor:
        """The output layer as item rows, ``(n_items, hidden[0] + 1)``: W's columns beside b."""
        w, b = self.out_keys
        return torch.cat([self.glob[w].T, self.glob[b][:, None]], 1)

    def row_table(self) -> torch.Tensor:
        """Every item table the server averages, as rows of one width: `out_table`'s m rows, then
        (a global encoder) its first layer's m rows, a zero after each. A client sends every
        output row (its softmax reaches every item) and the encoder rows of its bag, so a rule
        judges each row over the clients that sent it."""
        rows = self.n_items * (2 if FIRST in self.glob else 1)
        return self.table_rows(self.glob, torch.arange(rows))

    def table_rows(self, parts: dict[str, torch.Tensor], at: torch.Tensor) -> torch.Tensor:
        """Rows ``at`` of `row_table`'s layout of ``parts`` (tensors laid out as `glob`: the
        global parts or the server's Adam moments)."""
        w, b = self.out_keys
        at = at.to(parts[w].device)
        out = parts[w].new_zeros((len(at), parts[w].shape[0] + 1))
        dec = at < self.n_items
        i = at[dec]
        out[dec] = torch.cat([parts[w][:, i].T, parts[b][i][:, None]], 1)
        if FIRST in parts:
            out[~dec, :-1] = parts[FIRST][at[~dec] - self.n_items]
        return out

    def adam_rows(self, moments: dict[str, tuple[torch.Tensor, torch.Tensor]], steps: int, lr: float) -> RowStep:
        """How the server's next Adam step (`server_step`, from ``moments`` after ``steps``
        steps) moves `row_table`'s rows, as UNION reads a client (`fedrec.federated.threats.RowStep`):
        the client's upload (`DAEState.client_uploads`: -lr x its accumulated gradient) taken as
        the round's mean gradient, as the official UNION takes its Adam server's step; rows no
        client changed move by their moments and the weight decay. Only the moments of the rows
        asked for are read."""
        wd = self.spec.weight_decay
        bc1, bc2 = 1 - BETA1 ** (steps + 1), 1 - BETA2 ** (steps + 1)
        first = {k: m for k, (m, _) in moments.items()}
        second = {k: v for k, (_, v) in moments.items()}

        def step(rows: torch.Tensor, at: torch.Tensor, change: torch.Tensor | None) -> torch.Tensor:
            g = torch.zeros_like(rows) if change is None else -change / lr
            if wd:
                g = g + wd * rows
            m = BETA1 * self.table_rows(first, at).to(rows) + (1 - BETA1) * g
            v = BETA2 * self.table_rows(second, at).to(rows) + (1 - BETA2) * g * g
            return rows - lr * (m / bc1) / ((v / bc2).sqrt() + EPS)

        return step

    def dense_keys(self) -> list[str]:
        """The global parts outside `row_table`: one dense row each, sent whole by every client."""
        return [k for k in self.glob if k not in (FIRST, *self.out_keys)]

    def gradient_sums(self, item_sum: torch.Tensor, dense_sum: dict[str, torch.Tensor], lr: float
                      ) -> dict[str, torch.Tensor]:
        """The global parts' gradient sums from the security layer's sums of `client_uploads`'
        steps (their inverse: ``-1 / lr`` x, laid out as `glob`)."""
        m = self.n_items
        w, b = self.out_keys
        width = self.glob[w].shape[0]
        sums = {w: item_sum[:m, :width].T, b: item_sum[:m, width]}
        if FIRST in self.glob:
            sums[FIRST] = item_sum[m:, :width]
        sums.update(dense_sum)
        return {k: -sums[k].reshape(v.shape) / lr for k, v in self.glob.items()}


class DAEState(TableView):
    """The global encoder and decoder (``glob``), the server's Adam state, and every client's
    local encoder and gate (``priv``: first layers as rows of the users' training items)."""

    def __init__(self, spec: Any, split: Split, seed: int, client_ids: np.ndarray | None = None) -> None:
        """``client_ids``: the run's id of each row of ``split.train`` (a deployment's node holds
        some of the users; the draws are keyed by these ids), by default the rows' own numbers."""
        self.spec, self.split, self.seed = spec, split, seed
        train = split.train.tocsr()
        self.matrix = train  # the users' bags
        n_users, m = train.shape
        self.ids = np.arange(n_users) if client_ids is None else np.asarray(client_ids, np.int64)
        self.glob, start = initial_parts(spec, m, seed)
        indices = torch.as_tensor(train.indices.astype(np.int64))
        self.priv = {k: v[indices].clone() if k.endswith(".W0") else v.expand(n_users, *v.shape).clone()
                     for k, v in start.items()}
        self.moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in self.glob.items()}
        self.server_steps = 0
        self.n_items = m

    # ---- the model ---------------------------------------------------------------------------

    def _encode(self, p: dict[str, torch.Tensor], prefix: str, bags: _Bags, keep: torch.Tensor | None
                ) -> torch.Tensor:
        """An encoder's output ``(C, 2 latent)``: x normalised, entries dropped (``keep``: each
        entry's kept-and-rescaled factor, None in evaluation), then the tanh layers."""
        x = torch.rsqrt(torch.as_tensor(np.maximum(bags.counts, 1), dtype=torch.float32))[bags.owner]
        if keep is not None:
            x = x * keep
        c = len(bags.users)
        h = torch.zeros((c, p[f"{prefix}.W0"].shape[1])).index_add_(0, bags.owner, x[:, None] * p[f"{prefix}.W0"])
        h = h + p[f"{prefix}.b0"]
        for j in range(1, len(self.spec.hidden) + 1):
            h = torch.tanh(h)
            h = _layer(h, p[f"{prefix}.W{j}"], p[f"{prefix}.b{j}"])
        return h

    def _gate(self, p: dict[str, torch.Tensor], bags: _Bags, keep: torch.Tensor | None) -> torch.Tensor:
        """The gate's weights ``(C, 2)`` (local, global) from the raw bag."""
        c = len(bags.users)
        h = torch.zeros((c, p["a.W0"].shape[1])).index_add_(0, bags.owner, p["a.W0"]) + p["a.b0"]
        h = F.relu(h)
        if keep is not None:
            h = h * keep
        return torch.softmax(_layer(h, p["a.W1"], p["a.b1"]), dim=1)

    def _decode(self, p: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        h = z
        n = len(self.spec.hidden) + 1
        for j in range(n):
            h = _layer(h, p[f"d.W{j}"], p[f"d.b{j}"])
            if j < n - 1:
                h = torch.tanh(h)
        return h

    def forward(self, p: dict[str, torch.Tensor], bags: _Bags, noise: dict[int, torch.Tensor] | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits ``(C, n_items)``, mu and logvar of the chunk's code; ``noise`` holds each draw
        of a training step (dropout factors, reparameterisation noise), None in evaluation."""
        spec, lat = self.spec, self.spec.latent
        codes = []
        for prefix, drop, eps in (("l", _DROP_LOCAL, _NOISE_LOCAL), ("g", _DROP_GLOBAL, _NOISE_GLOBAL)):
            if f"{prefix}.W0" not in p:
                continue
            h = self._encode(p, prefix, bags, None if noise is None else noise[drop])
            mu, logvar = h[:, :lat], h[:, lat:]
            z = mu if noise is None else mu + noise[eps] * torch.exp(0.5 * logvar)
            codes.append((z, mu, logvar))
        if spec.encoders != "dual":
            z, mu, logvar = codes[0]
        else:
            w = self._gate(p, bags, None if noise is None else noise[_DROP_GATE])
            (z1, mu1, lv1), (z2, mu2, lv2) = codes
            w1, w2 = w[:, :1], w[:, 1:]
            z, mu = w1 * z1 + w2 * z2, w1 * mu1 + w2 * mu2
            logvar = torch.log(w1**2 * lv1.exp() + w2**2 * lv2.exp())
        return self._decode(p, z), mu, logvar

    def losses(self, p: dict[str, torch.Tensor], bags: _Bags, noise: dict[int, torch.Tensor],
               beta: float) -> torch.Tensor:
        """Each client's loss ``(C,)``: the multinomial log-likelihood of its bag and beta KL."""
        logits, mu, logvar = self.forward(p, bags, noise)
        nll = -(F.log_softmax(logits, dim=1) * bags.dense).sum(1)
        kl = -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(1)
        return nll + beta * kl

    def _noise(self, bags: _Bags, r: int, e: int) -> dict[int, torch.Tensor]:
        """A local step's draws, keyed by (seed, round, epoch, client id)."""
        spec, ids = self.spec, self.ids[bags.users]
        keep = 1.0 - spec.dropout

        def mask(kind: int, counts: np.ndarray | int) -> torch.Tensor:
            u = draws.uniforms((self.seed, draws.DROPOUT, r, e, kind), ids, counts)
            return torch.as_tensor((u < keep).astype(np.float32) / keep)

        out = {_DROP_LOCAL: mask(_DROP_LOCAL, bags.counts), _DROP_GLOBAL: mask(_DROP_GLOBAL, bags.counts),
               _DROP_GATE: mask(_DROP_GATE, spec.gate_hidden).reshape(len(ids), -1)}
        for kind in (_NOISE_LOCAL, _NOISE_GLOBAL):
            z = draws.normals((self.seed, draws.DROPOUT, r, e, kind), ids, spec.latent)
            out[kind] = torch.as_tensor(np.asarray(z, np.float32)).reshape(len(ids), spec.latent)
        return out

    # ---- a round -----------------------------------------------------------------------------

    def beta(self, r: int) -> float:
        return self.spec.beta * math.tanh(r / 10)

    def train(self, clients: np.ndarray, cfg: Any, r: int, keep: list[ClientUpload] | None = None,
              norms: list[torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], float, int]:
        """Round ``r``'s local training of ``clients`` (those with a training item); the sums
        over them of their accumulated gradients of the global parts, the loss sum, and their
        number. ``keep``: each client's own upload is appended to it; ``norms``: the norms of
        the clients' accumulated gradients of their bag items' `out_table` rows (the rows an
        honest client moves most, which an attacker's rows match) are appended to it."""
        clients = np.asarray(clients, np.int64)
        clients = clients[np.diff(self.matrix.indptr)[clients] > 0]
        per_client = 5 * 4 * sum(v.numel() for k, v in self.glob.items() if k != FIRST)
        chunk = max(1, CHUNK_BYTES // max(per_client, 1))
        sums = {k: torch.zeros_like(v) for k, v in self.glob.items()}
        loss = 0.0
        for a in range(0, len(clients), chunk):
            loss += self._train_chunk(_Bags.of(self.matrix, clients[a : a + chunk]), cfg, r, sums, keep, norms)
        return sums, loss, len(clients)

    def _train_chunk(self, bags: _Bags, cfg: Any, r: int, sums: dict[str, torch.Tensor],
                     keep: list[ClientUpload] | None, norms: list[torch.Tensor] | None = None) -> float:
        c = len(bags.users)
        users = torch.as_tensor(bags.users)
        leaves = {k: (v[bags.items] if k == FIRST else v.expand(c, *v.shape)).clone() for k, v in self.glob.items()}
        leaves.update({k: (v[bags.pos] if k.endswith(".W0") else v[users]).clone() for k, v in self.priv.items()})
        moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in leaves.items()}
        acc = {k: torch.zeros_like(leaves[k]) for k in self.glob}
        beta, total = self.beta(r), 0.0
        for e in range(cfg.local_epochs):
            for v in leaves.values():
                v.requires_grad_(True)
            with torch.enable_grad():
                per = self.losses(leaves, bags, self._noise(bags, r, e), beta)
                grads = torch.autograd.grad(per.sum(), list(leaves.values()))
            total += float(per.detach().sum())
            with torch.no_grad():
                for (k, v), g in zip(leaves.items(), grads, strict=True):
                    v.requires_grad_(False)
                    if k in acc:
                        acc[k] += g
                    m, s = moments[k]
                    adam_(v, g, m, s, e + 1, cfg.lr, self.spec.weight_decay)
        for k, v in self.priv.items():
            v[bags.pos if k.endswith(".W0") else users] = leaves[k]
        if keep is not None:  # each client's accumulated gradients: its first-layer rows, the rest whole
            ptr = np.r_[0, np.cumsum(bags.counts)]
            for c, user in enumerate(self.ids[bags.users].tolist()):
                rows = slice(int(ptr[c]), int(ptr[c + 1]))
                # the first layer's rows travel as the upload's item rows (`ITEMS`): they are
                # exactly the rows of the client's items, which a privacy audit reads
                keep.append(ClientUpload(user, bags.items[rows].cpu().numpy(),
                                         {ITEMS if k == FIRST else k: g[rows] if k == FIRST else g[c]
                                          for k, g in acc.items()}))
        if norms is not None:
            w, b = self.out_keys
            norms.append((acc[w][bags.owner, :, bags.items].square().sum(1) + acc[b][bags.owner, bags.items].square()
                          ).sqrt())
        for k, g in acc.items():
            if k == FIRST:
                sums[k].index_add_(0, bags.items, g)
            else:
                sums[k] += g.sum(0)
        return total

    def server_step(self, sums: dict[str, torch.Tensor], n: int, lr: float) -> None:
        """The server's Adam step on the round's mean accumulated gradient."""
        self.server_steps = server_step(self.glob, self.moments, self.server_steps, sums, n, lr,
                                        self.spec.weight_decay)

    def client_uploads(self, kept: list[ClientUpload], lr: float) -> list[ClientUpload]:
        """Each client's upload (`train`'s ``keep``) as the security layer reads it: its rows of
        `row_table` and its dense parts, as steps ``-lr x`` its accumulated gradients (the step
        an SGD server at the clients' rate would take on it alone: the sign and scale of the
        row deltas the attacks craft; UNION turns them back into the gradient its Adam step
        takes, `TableView.adam_rows`)."""
        m = self.matrix.shape[1]
        w, b = self.out_keys
        out = []
        for u in kept:
            rows = [torch.cat([u.tensors[w].T, u.tensors[b][:, None]], 1)]
            items = [np.arange(m)]
            if FIRST in self.glob:
                g = u.tensors[ITEMS]
                rows.append(torch.cat([g, g.new_zeros((len(g), 1))], 1))
                items.append(m + np.asarray(u.items, np.int64))
            out.append(ClientUpload(u.client, np.concatenate(items), {
                ITEMS: -lr * torch.cat(rows), **{k: -lr * u.tensors[k] for k in self.dense_keys()}}))
        return out

    @torch.no_grad()
    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        users = np.asarray(users, np.int64)
        m = self.matrix.shape[1]
        out = np.empty((len(users), m if items is None else items.shape[1]), np.float32)
        for a in range(0, len(users), SCORE_USERS):
            bags = _Bags.of(self.matrix, users[a : a + SCORE_USERS])
            c = len(bags.users)
            u = torch.as_tensor(bags.users)
            p = {k: v[bags.items] if k == FIRST else v for k, v in self.glob.items()}
            p.update({k: v[bags.pos] if k.endswith(".W0") else v[u] for k, v in self.priv.items()})
            logits = self.forward(p, bags, None)[0] if c else torch.zeros((0, m))
            block = logits.cpu().numpy()
            out[a : a + c] = block if items is None else np.take_along_axis(block, items[a : a + c], axis=1)
        return out

    def payload_floats(self, clients: np.ndarray) -> int:
        """Floats the clients download (and upload as gradients): the global parts, of the first
        layer only the rows of each client's items."""
        counts = np.diff(self.matrix.indptr)[clients]
        dense = sum(v.numel() for k, v in self.glob.items() if k != FIRST)
        rows = int(counts.sum()) * (self.glob[FIRST].shape[1] if FIRST in self.glob else 0)
        return len(clients) * dense + rows


def attacker_uploads(security: Any, view: TableView, r: int, norm: float | None,
                     clients: np.ndarray | None = None) -> list[ClientUpload]:
    """Round ``r``'s uploads of the sampled malicious ``clients`` (0-based among them; default
    the round's sample), as `DAEState.client_uploads` lays an upload out: every output row,
    zero but the crafted ones (against a dot product on `TableView.out_table`, held to
    ``norm``, None: the attack's own estimate), and zero steps of every other part. A
    simulator's round and a deployment's malicious node (`fedrec.flower.malicious`) run this."""
    scoring = view.out_table()
    model = FamilySpec(score="dot", private_score=False, dual=False, dim=scoring.shape[1])
    bad, _ = security.malicious_uploads(model, scoring, {}, r, clients=clients, norm=norm)
    for u in bad:
        rows = torch.zeros_like(scoring)
        rows[torch.as_tensor(u.items, dtype=torch.int64)] = u.tensors[ITEMS]
        u.items, u.tensors = np.arange(len(scoring)), {ITEMS: rows, **{k: torch.zeros_like(view.glob[k])
                                                                        for k in view.dense_keys()}}
    return bad


def crafted_sums(view: TableView, bad: list[ClientUpload], lr: float) -> dict[str, torch.Tensor]:
    """The global parts' gradient sums the malicious uploads ``bad`` (`attacker_uploads`) add
    to the round's, where the server sums the clients' gradients (no robust rule)."""
    table = view.row_table()
    crafted = torch.zeros_like(table)
    for u in bad:
        crafted[: view.n_items] += u.tensors[ITEMS]
    return view.gradient_sums(crafted, {k: torch.zeros_like(view.glob[k]) for k in view.dense_keys()}, lr)


def attacker_bytes(view: TableView, n_bad: int) -> int:
    """Bytes ``n_bad`` malicious clients send (and as many download): every global part but
    the first layer, whose rows of an empty bag are none."""
    return n_bad * 4 * sum(v.numel() for k, v in view.glob.items() if k != FIRST)


def initial_parts(spec: Any, n_items: int, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The global encoder and decoder, and the one start every client's own parts (local
    encoder, gate) take, as the official clients do: drawn from ``seed`` alone, so a server
    and each node of a deployment draw the same."""
    gen = torch.Generator().manual_seed(seed)
    enc = [n_items, *spec.hidden, 2 * spec.latent]
    dec = [spec.latent, *reversed(spec.hidden), n_items]
    glob: dict[str, torch.Tensor] = {}
    if spec.encoders != "local":
        glob.update(_mlp("g", enc, gen))
    glob.update(_mlp("d", dec, gen))
    start: dict[str, torch.Tensor] = {}
    if spec.encoders != "global":
        start.update(_mlp("l", enc, gen))
    if spec.encoders == "dual":
        start.update(_mlp("a", [n_items, spec.gate_hidden, 2], gen))
    return glob, start


def server_step(glob: dict[str, torch.Tensor], moments: dict[str, tuple[torch.Tensor, torch.Tensor]],
                steps: int, sums: dict[str, torch.Tensor], n: int, lr: float, weight_decay: float) -> int:
    """The server's Adam step on the mean of ``n`` clients' accumulated gradients (``sums``);
    the server's step count after it (unchanged when no client trained)."""
    if not n:
        return steps
    steps += 1
    for k, v in glob.items():
        m, s = moments[k]
        adam_(v, sums[k] / n, m, s, steps, lr, weight_decay)
    return steps


def _layer(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h @ w + b`` for one weight (``w`` 2-d) or one a client (``w`` ``(C, a, b)``)."""
    if w.dim() == 2:
        return h @ w + b
    return torch.baddbmm(b[:, None, :], h[:, None, :], w)[:, 0]


class DAEAlgorithm(FederatedAlgorithm):
    """A `DAEState` as the round driver's federated algorithm.

    **Attacks and defences** (`fedrec.security.adversary`). The server averages every client's
    accumulated gradients, so the security layer reads FedDAE's item rows as the item family's
    table (`DAEState.row_table`: the decoder's output rows, a dot product with the user's last
    decoder layer, and the global encoder's first-layer rows), each client's upload as steps
    (`DAEState.client_uploads`), and hands the server's Adam step the sums its rule accepts:

    * a malicious client is one more user (ids after the data's users, sampled as the users
      are). It crafts row steps of the output table against matrix factorisation's dot product
      (the users' last layers, which pass through encoders and a gate, are what it
      approximates), at the norm of an honest client's bag rows (measured on the round's
      honest clients, as for FedCIA's similarity rows: an upper bound of what a cover client
      would estimate; under ``--attacker-norm own`` at the attack's own estimate, as a
      deployment's malicious node sends them, `fedrec.flower.malicious.DAEMaliciousNode`), and
      sends zero steps for every other part (a client whose gradients vanish);
    * a defence's rule judges each output row over every client, each encoder row over the
      clients whose bag holds the item, and each dense layer as one row every client sends;
      the server's mean divides by the accepted uploads.
    """

    #: the run's attack and defence (`fedrec.security.adversary.attach`); None: plain rounds
    security: Any = None
    takes_security = True

    def __init__(self, state: DAEState, cfg: Any) -> None:
        self.state, self.cfg = state, cfg
        self.n_clients, self.seed = state.matrix.shape[0], state.seed
        self.clients_per_round = cfg.clients_per_round
        self.divergence_hint = "lower --lr"

    @property
    def lr_item(self) -> float:
        """The rate of `DAEState.client_uploads`' steps: the clients' and the server's Adam rate."""
        return float(self.cfg.lr)

    def scale_rates(self, factor: float) -> bool:
        """Scale the clients' and the server's Adam rate (the driver's back-off)."""
        self.cfg = dataclasses.replace(self.cfg, lr=self.cfg.lr * factor)
        self.divergence_hint = f"lower --lr (now {self.cfg.lr:g})"
        return True

    def _guarded(self) -> tuple[bool, bool]:
        """Whether the round crafts malicious uploads, and whether a rule judges each upload."""
        sec = self.security
        return sec is not None and sec.attack is not None, sec is not None and sec.rule is not None

    def local_update(self, plan: RoundPlan) -> Uploads:
        attacked, judged = self._guarded()
        kept: list[ClientUpload] | None = [] if self.keep_uploads or judged else None
        norms: list[torch.Tensor] | None = [] if attacked else None
        sums, loss, n = self.state.train(plan.clients, self.cfg, plan.round, kept, norms)
        trained = np.asarray(plan.clients, np.int64)
        trained = trained[np.diff(self.state.matrix.indptr)[trained] > 0]
        floats = self.state.payload_floats(trained)
        return Uploads(payload=(sums, n, norms), per_client=kept, loss_sum=loss, client_batches=n * self.cfg.local_epochs,
                       bytes_up=4 * floats, bytes_down=4 * floats)

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        sums, n, norms = uploads.payload
        attacked, judged = self._guarded()
        if attacked or judged:
            sums, n, n_bytes = self._secured(uploads, sums, n, norms, plan.round)
            uploads.bytes_up += n_bytes
            uploads.bytes_down += n_bytes
        self.state.server_step(sums, n, self.cfg.lr)

    def _secured(self, uploads: Uploads, sums: dict[str, torch.Tensor], n: int,
                 norms: list[torch.Tensor] | None, r: int) -> tuple[dict[str, torch.Tensor], int, int]:
        """Round ``r``'s gradient sums and accepted count with the attack's uploads and by the
        defence's rule (class docstring), and the bytes the malicious clients send (and as many
        they download)."""
        st, sec, lr = self.state, self.security, self.cfg.lr
        table = st.row_table()
        bad = self.malicious_uploads(r, norms) if sec.attack is not None else []
        n_bytes = attacker_bytes(st, len(bad))
        if sec.rule is None:  # the honest sums as they are, the crafted steps added as gradients
            extra = crafted_sums(st, bad, lr)
            return {k: v + extra[k] for k, v in sums.items()}, n + len(bad), n_bytes
        assert uploads.per_client is not None
        dense = {k: st.glob[k] for k in st.dense_keys()}
        item_sum, dense_sum, accepted = sec.sums(st.client_uploads(uploads.per_client, lr) + bad, *table.shape,
                                                 dense, table, r, st.adam_rows(st.moments, st.server_steps, lr))
        return st.gradient_sums(item_sum, dense_sum, lr), accepted, n_bytes

    def malicious_uploads(self, r: int, norms: list[torch.Tensor] | None) -> list[ClientUpload]:
        """Round ``r``'s uploads of the sampled malicious clients (`attacker_uploads`), their
        crafted rows held to the median of the honest clients' bag-row ``norms`` as steps, or
        under ``--attacker-norm own`` to the attack's own estimate."""
        measured = norms and self.cfg.attacker_norm == "honest"  # else the attack's own estimate
        honest = self.cfg.lr * float(torch.cat(norms).median()) if measured else None
        return attacker_uploads(self.security, self.state, r, honest)

    def round_extra(self) -> dict[str, float]:
        return self.security.figures(self.scores) if self.security is not None else {}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        return {"encoders": self.state.spec.encoders}

    def server_state_dict(self) -> dict[str, Any]:
        """The global encoder and decoder and the server's Adam state."""
        return {"glob": self.state.glob, "moments": self.state.moments, "steps": self.state.server_steps}

    def client_state_dict(self) -> dict[str, Any]:
        """Every client's local encoder and gate."""
        return {"priv": self.state.priv}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.glob, self.state.moments = blob["glob"], blob["moments"]
        self.state.server_steps = int(blob["steps"])

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.priv = blob["priv"]
