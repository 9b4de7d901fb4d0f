"""PersonalFR, FedAvg and Joint: the rating autoencoder (`fedrec.models.autoencoder`) over
clients that hold groups of users (Li et al., PersonalFR, Algorithm 1).

* ``share="decoder"`` (PersonalFR's partially federated learning): each client keeps its own
  encoder, the server averages the decoder;
* ``share="all"`` (FedAvg): the whole autoencoder is averaged;
* one client holding every user is the centralised "Joint" model.

**Partial compression, for real.** A client's users rated n' ≪ n items. The first-layer and
output-layer weights of the other items never meet a gradient on that client, so with
``compression`` (PersonalFR's PC) the server sends a client only the dense hidden layers and the
output rows and biases of its items (and, when the encoder is shared, its first-layer rows),
and takes back exactly those; Equation (5) then keeps every other row of that client's model at
the previous global value, so the average of the round is
``G_j + (1/|S|) Σ_{clients with j} (row_j - G_j)``. The client tells the server its item ids
once, in round 1 (counted). Without compression the whole model travels (counted so); the rows
a client did not touch then differ from the global ones only by weight decay, which the server
applies in closed form (`fedrec.rounds.optim.decay_factor`) instead of simulating n rows.

**All clients of a round at once.** A client's local data are its users' rating vectors,
trained for ``local_epochs`` in batches of ``batch_size`` users. Clients are ordered by their
number of local steps, so those still training at step t are a prefix; the step runs every
active client's own layers with batched matmuls over a client axis and the row tables as one
flat table (client k's rows at ``row offset k``), and each active client takes its own
optimiser step (`fedrec.rounds.optim`). Optimiser state starts afresh every round, as a
client that receives a new model does; the Joint model (one client) keeps it across epochs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.contract import ClientUpload
from fedrec.federated.family.model import ITEMS
from fedrec.models.autoencoder import (
    ROW_TABLES,
    codes,
    decode_hidden,
    encode,
    forward_macs,
    init_params,
    layer_shapes,
    pair_outputs,
)
from fedrec.partition import Partition
from fedrec.protocols.protocol import Split, user_means
from fedrec.rounds import draws
from fedrec.rounds.optim import adam_, clip_scale, decay_factor, sgd_
from fedrec.rounds.ragged import ranges

_SCORE_CHUNK = 512  # users whose codes are computed at once when scoring


def apply_round(glob: dict[str, torch.Tensor], idx: torch.Tensor, sums: dict[str, torch.Tensor],
                n: int, scale: float = 1.0) -> None:
    """Equation 5 from sums over the round's ``n`` clients: a shared row table moves by the
    sum of its row deltas at ``idx`` (repeats add up) over n, after scaling by ``scale`` (the
    mean weight decay of rows nobody trained); a dense layer becomes its sum over n (the mean).
    The simulator passes every client's rows; a Flower server the nodes' sums."""
    for k, s in sums.items():
        if k in ROW_TABLES:
            if scale != 1.0:
                glob[k].mul_(scale)
            glob[k].index_add_(0, idx, s / n)
        else:
            glob[k] = s / n


def row_table_of(glob: dict[str, torch.Tensor], tables: dict[str, torch.Tensor] | None = None,
                 idx: torch.Tensor | None = None) -> torch.Tensor:
    """The shared row tables of ``glob`` side by side, ``(rows, width)``: the decoder's output
    rows and biases, then (FedAvg) the encoder's first-layer rows; taken from ``tables`` (default
    ``glob``), at ``idx`` or whole."""
    tables = glob if tables is None else tables
    parts = [tables[k] if idx is None else tables[k][idx] for k in ("dec.out", "dec.out.b", "enc.in") if k in glob]
    return torch.cat([p if p.dim() == 2 else p[:, None] for p in parts], 1)


def apply_row_sums(glob: dict[str, torch.Tensor], item_sum: torch.Tensor, dense_sum: dict[str, torch.Tensor],
                   n: int, scale: float = 1.0) -> None:
    """Equation 5 from sums over ``n`` uploads: the `row_table_of` layout's row-delta sums
    (after ``scale``, the weight decay of untrained rows) and the dense layers' sums."""
    at = 0
    for k in ("dec.out", "dec.out.b", "enc.in"):
        if k not in glob:
            continue
        t = glob[k]
        width = t.shape[1] if t.dim() == 2 else 1
        if scale != 1.0:
            t.mul_(scale)
        t += (item_sum[:, at : at + width] if t.dim() == 2 else item_sum[:, at]) / n
        at += width
    for k, v in dense_sum.items():
        glob[k] = v / n


class AEState:
    """Global (shared) parameters, every client's private ones, and the data's row layout.

    Row layout: client m's items (those its users rated in training, sorted) are rows
    ``row_ptr[m]:row_ptr[m + 1]`` of a flat table (``row_item`` gives their item ids); a private
    first layer is stored that way, and ``pair_pos`` places each training rating in it.
    """

    def __init__(self, spec: Any, split: Split, partition: Partition, seed: int,
                 client_ids: np.ndarray | None = None) -> None:
        """``spec``: the method's `fedrec.federated.ae.spec.AESpec` (not imported: the spec builds
        this state). ``client_ids``: the ids of the partition's clients when the state holds only
        some (a Flower node's); each client's shuffles and dropout are drawn by id and round."""
        self.spec, self.hidden = spec, spec.hidden
        self.seed = seed
        self.partition = partition
        self.n_users, self.n_items, self.K = split.n_users, split.n_items, partition.n_clients
        self.client_ids = np.arange(self.K) if client_ids is None else np.asarray(client_ids, np.int64)
        train = split.train
        self.indptr = train.indptr.astype(np.int64)
        self.items = train.indices.astype(np.int64)
        self.implicit = split.protocol.ranking == "rated"
        values = train.data.astype(np.float32)
        if self.implicit:  # binarised ratings: input and target are 1 for a positive, 0 otherwise
            values = (values >= split.protocol.positive_at).astype(np.float32)
        self.degree = np.diff(self.indptr)
        pair_user = np.repeat(np.arange(self.n_users), self.degree)
        # the rating baseline: each user's training mean, taken from its ratings (input and target)
        # and added to its predictions; the decoder's output bias is the baseline's item half
        self.offsets = user_means(train) if spec.baseline and not self.implicit else None
        if self.offsets is not None:
            values = values - self.offsets[pair_user]
        self.values = torch.as_tensor(values)
        key = partition.client_of_user[pair_user] * self.n_items + self.items
        keys = np.unique(key)
        self.row_item = keys % self.n_items
        self.row_ptr = np.r_[0, np.cumsum(np.bincount(keys // self.n_items, minlength=self.K))]
        self.pair_pos = np.searchsorted(keys, key) - self.row_ptr[partition.client_of_user[pair_user]]
        self.client_items = np.diff(self.row_ptr)

        init = init_params(self.n_items, self.hidden, spec.norm, torch.Generator().manual_seed(seed))
        enc, dec = layer_shapes(self.hidden, spec.norm)
        self.dense_names = [*enc, *dec]
        self.glob = {k: v for k, v in init.items() if not spec.private(k)}
        # each user's code (the encoder's output) as its client's private encoder last left it:
        # scoring runs the encoder only for the users of clients trained since (a tenth a round
        # at PersonalFR's defaults); a shared encoder changes every round, so nothing is kept
        private_encoder = all(spec.private(k) for k in init if k.startswith("enc."))
        self._code = torch.zeros(self.n_users, self.hidden[-1]) if private_encoder else None
        self._code_fresh = np.zeros(self.n_users, bool)
        # one draw shared by every client: the common start of a federated model
        self.priv = {k: (v[self.row_item].clone() if k in ROW_TABLES else v.expand(self.K, *v.shape).clone())
                     for k, v in init.items() if spec.private(k)}
        self.opt: dict[str, Any] | None = None  # kept across rounds only by the Joint model

    @property
    def priv(self) -> dict[str, torch.Tensor]:
        """Every client's private parameters (client k's dense layers at index k, its row
        table's rows at its row offsets); setting them forgets the kept codes."""
        return self._priv

    @priv.setter
    def priv(self, value: dict[str, torch.Tensor]) -> None:
        self._priv = value
        self._code_fresh[:] = False

    # ---- one round ------------------------------------------------------------------------------

    def training_order(self, cohort: np.ndarray, cfg: Any) -> tuple[np.ndarray, np.ndarray]:
        """The cohort ordered by local steps, most first (so the active clients of a lockstep
        step are a prefix), and those steps."""
        steps = cfg.local_epochs * -(-self.partition.sizes()[cohort] // cfg.batch_size)
        order = np.argsort(-steps, kind="stable")
        return cohort[order], steps[order]

    def cohort_rows(self, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat-row positions (in the all-clients layout) of the cohort's rows, and the cohort's
        own row offsets (client k's rows at ``offsets[k]:offsets[k + 1]``)."""
        lengths = self.client_items[cohort]
        return ranges(self.row_ptr[cohort], lengths), np.r_[0, np.cumsum(lengths)]

    def download(self, cohort: np.ndarray) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """What the server sends the cohort: every shared dense layer, and of each shared row
        table the rows of each client's items only (client k's at its row offsets), with
        compression or not (without it the rest of the table also travels, unused; it is
        counted in `round_bytes`). Returns the payload and the item id of each row."""
        flat, _ = self.cohort_rows(cohort)
        items = self.row_item[flat]
        idx = torch.as_tensor(items)
        payload = {k: (v[idx] if k in ROW_TABLES else v) for k, v in self.glob.items()}
        return payload, items

    def local_update(self, cohort: np.ndarray, payload: dict[str, torch.Tensor], cfg: Any,
                     r: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Train the cohort (ordered by local steps, most first) from ``payload`` in round
        ``r``; keep private parameters, return the upload (shared parameters as trained) and the
        round's figures. Shuffles and dropout are each client's own keyed draws."""
        spec, C = self.spec, len(cohort)
        flat, offsets = self.cohort_rows(cohort)
        local: dict[str, torch.Tensor] = {}
        for k, v in payload.items():
            local[k] = v.clone() if k in ROW_TABLES else v.expand(C, *v.shape).clone()
        flat_t, cohort_t = torch.as_tensor(flat), torch.as_tensor(cohort)
        for k, v in self.priv.items():
            local[k] = v[flat_t].clone() if k in ROW_TABLES else v[cohort_t].clone()
        for v in local.values():
            v.requires_grad_(True)

        users, table = self._batches(cohort, cfg.batch_size, cfg.local_epochs, r)
        ids = self.client_ids[cohort]
        width = self.hidden[-1]
        steps_k = (table >= 0).any(axis=2).sum(axis=1)
        opt = self._optimiser(local)
        row_client = torch.as_tensor(np.repeat(np.arange(C), self.client_items[cohort]))
        n_out = self.client_items[cohort] if spec.compression else np.full(C, self.n_items)
        macs = macs_sparse = 0.0
        loss_sum = torch.zeros((), dtype=torch.float64)  # on the device: read once, not once a step
        batches = 0
        for t in range(table.shape[1]):
            A = int((steps_k > t).sum())
            slot_user = table[:A, t].reshape(-1)
            real = slot_user >= 0
            lengths, nnz, slots = self._bags(slot_user)
            k_of_pair = slots // cfg.batch_size
            rows = torch.as_tensor(offsets[k_of_pair] + self.pair_pos[nnz])
            vals = self.values[nnz]
            bag = torch.as_tensor(np.r_[0, np.cumsum(lengths)[:-1]])
            noise = None
            if spec.dropout > 0:
                u = draws.uniforms((self.seed, draws.DROPOUT, r, t), ids[:A], cfg.batch_size * width)
                noise = torch.as_tensor(u.astype(np.float32)).view(A, cfg.batch_size, width)
            h = codes(local, self.hidden, rows, bag, vals, A, cfg.batch_size, spec.dropout, noise)
            pred = pair_outputs(h, torch.as_tensor(slots), rows, local)
            if self.implicit:
                err = F.binary_cross_entropy_with_logits(pred, vals, reduction="none")
            else:
                err = (pred - vals) ** 2
            k_t = torch.as_tensor(k_of_pair)
            count = torch.as_tensor(np.bincount(k_of_pair, minlength=A).clip(min=1))  # (the host's: no wait)
            per_client = torch.zeros(A).index_add_(0, k_t, err) / count
            for v in local.values():
                v.grad = None
            per_client.sum().backward()
            self._step(local, opt, A, row_client[: offsets[A]], cfg.lr)
            loss_sum += per_client.detach().sum()
            batches += A
            per_user = lengths[real]
            n_out_user = np.repeat(n_out[:A], real.reshape(A, -1).sum(1))
            macs += forward_macs(self.n_items, n_out_user, self.hidden)
            macs_sparse += forward_macs(per_user, per_user, self.hidden)
        for k, v in self.priv.items():
            v[flat_t if k in ROW_TABLES else cohort_t] = local[k].detach()
        self._code_fresh[np.isin(self.partition.client_of_user, cohort)] = False
        if self.K == 1:
            self.opt = opt
        upload = {k: local[k].detach() for k in self.glob}
        stats = {"loss_sum": float(loss_sum), "macs": macs, "macs_fedrec": macs_sparse,
                 "users_trained": float(len(users)), "client_batches": float(batches)}
        return upload, stats

    def _batches(self, cohort: np.ndarray, batch: int, epochs: int,
                 r: int) -> tuple[np.ndarray, np.ndarray]:
        """The cohort's users and a ``(clients, steps, batch)`` table of user ids (-1: empty
        slot): every epoch reshuffles each client's users (keyed draws) and cuts them into
        batches."""
        users = self.partition.users_of(cohort)
        sizes = self.partition.sizes()[cohort]
        client = np.repeat(np.arange(len(cohort)), sizes)
        per_epoch = -(-sizes // batch)
        table = np.full((len(cohort), int(epochs * per_epoch.max(initial=0)), batch), -1, dtype=np.int64)
        pos_base = np.repeat(np.cumsum(sizes) - sizes, sizes)
        for e in range(epochs):
            keys = draws.uniforms((self.seed, draws.SHUFFLE, r, e), self.client_ids[cohort], sizes)
            order = np.lexsort((keys, client))
            pos = np.arange(len(users)) - pos_base
            table[client, e * per_epoch[client] + pos // batch, pos % batch] = users[order]
        return users, table

    def _optimiser(self, local: dict[str, torch.Tensor]) -> dict[str, Any]:
        if self.opt is not None:
            return self.opt
        slots = 2 if self.spec.optimizer == "adam" else 1
        return {"steps": 0, "state": {k: [torch.zeros_like(v) for _ in range(slots)] for k, v in local.items()}}

    def _step(self, local: dict[str, torch.Tensor], opt: dict[str, Any], A: int,
              row_client: torch.Tensor, lr: float) -> None:
        """One optimiser step of the first A clients: their dense layers and their rows (whose
        clients ``row_client`` gives)."""
        spec = self.spec
        opt["steps"] += 1
        n = {k: (len(row_client) if k in ROW_TABLES else A) for k in local}
        grads = {k: v.grad[: n[k]] for k, v in local.items()}
        if spec.clip > 0:  # each client's whole gradient to norm <= clip, as clip_grad_norm_
            scale = clip_scale([(g, row_client if k in ROW_TABLES else None) for k, g in grads.items()], A, spec.clip)
            grads = {k: g * (scale[row_client] if k in ROW_TABLES else scale).view(-1, *[1] * (g.dim() - 1))
                     for k, g in grads.items()}
        with torch.no_grad():
            for k, v in local.items():
                state = opt["state"][k]
                if spec.optimizer == "adam":
                    adam_(v[: n[k]], grads[k], state[0][: n[k]], state[1][: n[k]], opt["steps"], lr, spec.decay)
                else:
                    sgd_(v[: n[k]], grads[k], state[0][: n[k]], opt["steps"] == 1, lr, spec.momentum,
                         spec.decay, spec.nesterov)

    # ---- server ---------------------------------------------------------------------------------

    def aggregate(self, cohort: np.ndarray, items: np.ndarray, upload: dict[str, torch.Tensor],
                  steps: np.ndarray, lr: float) -> None:
        """The server's average over the cohort, equal weights (Algorithm 1). Rows a client did
        not have keep the previous global value in its model (Equation 5), or without
        compression the value weight decay left them at."""
        decays, scale = self._decays(cohort, steps, lr)
        row_decay = decays[torch.as_tensor(np.repeat(np.arange(len(cohort)), self.client_items[cohort]))]
        idx = torch.as_tensor(items)
        sums = {}
        for k, v in upload.items():
            if k in ROW_TABLES:
                old = self.glob[k][idx]
                sums[k] = v - row_decay.view((-1,) + (1,) * (old.dim() - 1)) * old
            else:
                sums[k] = v.sum(0)
        apply_round(self.glob, idx, sums, len(cohort), scale)

    def _decays(self, cohort: np.ndarray, steps: np.ndarray, lr: float) -> tuple[torch.Tensor, float]:
        """Each client's weight-decay factor of the rows it did not train (1 unless SGD decays
        a whole model sent without compression), and the rows' mean factor."""
        if self.spec.compression or self.spec.decay <= 0 or self.spec.optimizer != "sgd":
            return torch.ones(len(cohort)), 1.0
        decays = torch.tensor([decay_factor(int(s), lr, self.spec.momentum, self.spec.decay, self.spec.nesterov)
                               for s in steps])
        return decays, float(decays.mean())

    # ---- the security layer's view (PersonalFR: `fedrec.security.adversary`) -------------------

    @property
    def plain_average(self) -> bool:
        """Whether the server averages shared layers over several clients (PersonalFR's decoder,
        FedAvg's whole model), so their item rows are a table the security layer can read and
        aggregate row by row (`row_table`). The Joint model has one client."""
        return self.K > 1

    def out_table(self) -> torch.Tensor:
        """The decoder's output rows beside their biases, ``(n_items, hidden[0] + 1)``: item j's
        score for a user whose last decoder layer is h is (h, 1) · row j, a dot product."""
        return torch.cat([self.glob["dec.out"], self.glob["dec.out.b"][:, None]], 1)

    def row_table(self) -> torch.Tensor:
        """Every shared row table side by side, ``(n_items, width)``: `out_table`'s columns
        first, then (FedAvg) the encoder's first-layer rows. A client sends the rows of its
        items of all of them, so item j's row is one upload row."""
        return self._rows_of(self.glob)

    def _rows_of(self, tables: dict[str, torch.Tensor], idx: torch.Tensor | None = None) -> torch.Tensor:
        """``tables``' shared row tables (at ``idx``, or whole) as `row_table` lays them out."""
        return row_table_of(self.glob, tables, idx)

    def client_uploads(self, cohort: np.ndarray, items: np.ndarray, upload: dict[str, torch.Tensor],
                       steps: np.ndarray, lr: float) -> tuple[list[ClientUpload], float]:
        """Each client's upload as the security layer reads it: its items' `row_table` row
        deltas (what Equation 5 adds up) and its dense shared layers; and the weight-decay
        factor of the rows nobody trained (`apply_uploads`)."""
        decays, scale = self._decays(cohort, steps, lr)
        lengths = self.client_items[cohort]
        idx = torch.as_tensor(items)
        old = self._rows_of(self.glob, idx)
        new = self._rows_of(upload)
        deltas = new - decays[torch.as_tensor(np.repeat(np.arange(len(cohort)), lengths))][:, None] * old
        ptr = np.r_[0, np.cumsum(lengths)]
        dense = [k for k in upload if k not in ROW_TABLES]
        return [ClientUpload(int(c), items[ptr[k]:ptr[k + 1]],
                             {ITEMS: deltas[ptr[k]:ptr[k + 1]], **{name: upload[name][k] for name in dense}})
                for k, c in enumerate(cohort.tolist())], scale

    def apply_uploads(self, item_sum: torch.Tensor, dense_sum: dict[str, torch.Tensor], n: int,
                      scale: float = 1.0) -> None:
        """Equation 5 from the security layer's sums over ``n`` accepted uploads (`apply_row_sums`)."""
        apply_row_sums(self.glob, item_sum, dense_sum, n, scale)

    def round_bytes(self, cohort: np.ndarray, first_round: bool) -> tuple[int, int]:
        """Bytes up and down of a round (float32 values; with compression the item ids travel
        up once, in round 1, from every client)."""
        dense = sum(v.numel() for k, v in self.glob.items() if k not in ROW_TABLES)
        width = sum(v[0].numel() for k, v in self.glob.items() if k in ROW_TABLES)
        rows = self.client_items[cohort] if self.spec.compression else np.full(len(cohort), self.n_items)
        per_round = 4 * int((dense + rows * width).sum())
        ids = 4 * int(self.client_items.sum()) if first_round and self.spec.compression else 0
        return per_round + ids, per_round

    # ---- scoring --------------------------------------------------------------------------------

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        """Predicted ratings (explicit) or logits (binarised) of ``users``, each through its own
        client's encoder and the global decoder: every item, or ``items`` (n, C)."""
        if items is not None:  # rating protocols ask per (user, item) pair: code each user once
            distinct, back = np.unique(np.asarray(users, dtype=np.int64), return_inverse=True)
            h = torch.as_tensor(self._codes(distinct))[torch.as_tensor(back)]
            cols = torch.as_tensor(np.asarray(items, dtype=np.int64))
            with torch.no_grad():
                out = ((h[:, None, :] * self.glob["dec.out"][cols]).sum(-1)
                       + self.glob["dec.out.b"][cols]).cpu().numpy()
        else:
            h = torch.as_tensor(self._codes(np.asarray(users, dtype=np.int64)))
            with torch.no_grad():
                out = torch.addmm(self.glob["dec.out.b"], h, self.glob["dec.out"].T).cpu().numpy()
        if self.offsets is not None:
            out += self.offsets[np.asarray(users, dtype=np.int64)][:, None]
        return out

    def _codes(self, users: np.ndarray) -> np.ndarray:
        """Last hidden layer of ``users``: each through its client's encoder and the decoder.
        A private encoder's codes are kept (`_code`) and computed only for users whose client
        trained since; the decoder, shared, runs on every user each time."""
        users = np.asarray(users, np.int64)
        if self._code is None:
            return self._grouped(users)
        stale = np.unique(users[~self._code_fresh[users]])
        if len(stale):
            self._code[torch.as_tensor(stale)] = torch.as_tensor(self._grouped(stale, encode_only=True))
            self._code_fresh[stale] = True
        return self._grouped(users, coded=True)

    def _grouped(self, users: np.ndarray, encode_only: bool = False, coded: bool = False) -> np.ndarray:
        """The codes (``encode_only``) or last hidden layers of ``users``, from their ratings, or
        (``coded``) from the kept codes through the decoder.

        Users are laid out as in training, a group per client (one group when the encoder is
        shared), so a client's private layers are applied to all its users by one matmul."""
        private = bool(self.priv)
        group_of = self.partition.client_of_user[users] if private else np.zeros(len(users), np.int64)
        order = np.argsort(group_of, kind="stable")
        groups, first, counts = np.unique(group_of[order], return_index=True, return_counts=True)
        out = np.zeros((len(users), self.hidden[-1 if encode_only else 0]), dtype=np.float32)
        per_chunk = max(1, _SCORE_CHUNK // max(int(counts.max(initial=1)), 1))
        with torch.no_grad():
            for a in range(0, len(groups), per_chunk):
                g, f, c = groups[a : a + per_chunk], first[a : a + per_chunk], counts[a : a + per_chunk]
                A, B = len(g), int(c.max())
                pos = np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c)
                where = order[np.repeat(f, c) + pos]  # positions in ``users`` of the chunk's users
                table = np.full((A, B), -1, dtype=np.int64)
                table[np.repeat(np.arange(A), c), pos] = users[where]
                slot_user = table.reshape(-1)
                p = {k: (v.expand(A, *v.shape) if k in self.dense_names else v) for k, v in self.glob.items()}
                idx = torch.as_tensor(g)
                if coded:  # the kept codes (empty slots zero: each slot's rows are its own)
                    p.update({k: v[idx] for k, v in self.priv.items() if k.startswith("dec.")})
                    z = torch.zeros(A * B, self.hidden[-1])
                    z[torch.as_tensor(slot_user >= 0)] = self._code[torch.as_tensor(slot_user[slot_user >= 0])]
                    z = z.view(A, B, -1)
                else:
                    lengths, nnz, slots = self._bags(slot_user)
                    if private:
                        p.update({k: v[idx] for k, v in self.priv.items() if k not in ROW_TABLES})
                        p["enc.in"] = self.priv["enc.in"]
                        rows = self.row_ptr[g][slots // B] + self.pair_pos[nnz]
                    else:
                        rows = self.items[nnz]
                    bag = torch.as_tensor(np.r_[0, np.cumsum(lengths)[:-1]])
                    z = encode(p, self.hidden, torch.as_tensor(rows), bag, self.values[nnz], A, B)
                h = z.reshape(A * B, -1) if encode_only else decode_hidden(p, self.hidden, z, A)
                out[where] = h.cpu().numpy()[np.repeat(np.arange(A), c) * B + pos]
        return out

    def _bags(self, slot_user: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For slots holding users (-1: empty): ratings per slot, the ratings' positions in the
        training CSR, and the slot of each rating."""
        u = np.maximum(slot_user, 0)
        lengths = np.where(slot_user >= 0, self.degree[u], 0)
        return lengths, ranges(self.indptr[u], lengths), np.repeat(np.arange(len(slot_user)), lengths)

    # ---- checkpoints and results ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"glob": self.glob, "priv": self.priv, "opt": self.opt}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        self.glob, self.priv, self.opt = blob["glob"], blob["priv"], blob["opt"]

    def run_extra(self) -> dict[str, Any]:
        return {"clients": self.K, "share": self.spec.share, "compression": self.spec.compression,
                "optimizer": self.spec.optimizer, "client_items_mean": float(self.client_items.mean())}
