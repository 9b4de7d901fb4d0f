"""FedCIA's round as the driver's federated algorithm (`CIAAlgorithm`), and what its attackers
send (`attacker_uploads`): the simulator's, and a malicious Flower node's
(`fedrec.flower.malicious.CIAMaliciousNode`). The clients and the server step are
`fedrec.federated.cia.state`; the attacker's cover client, which sizes its rows under
``--attacker-norm own``, `fedrec.federated.cia.cover`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.federated.cia.cover import CoverClient
from fedrec.federated.cia.similarity import reconstruct_sum
from fedrec.federated.cia.state import CIAState, combine, dense_upload
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.spec import FamilySpec
from fedrec.rounds.upload import UploadPath


class CIAAlgorithm(FederatedAlgorithm):
    """A `CIAState` as the round driver's federated algorithm: every client trains, then the
    round's aggregation (similarities, averaging, GF-CF filters) runs. Training draws are keyed
    by client id; the round's generator (`RoundPlan.rng`) draws the uploads' LDP noise."""

    #: each client's kept upload is what it sent, its LDP noise in it (`fedrec.security.inference`)
    keeps_noisy_uploads = True
    #: the run's attack and defence (`fedrec.security.adversary.attach`); None: plain rounds
    security: Any = None
    takes_security = True

    def __init__(self, state: CIAState, cfg: Any, seed: int) -> None:
        self.state, self.cfg, self.seed = state, cfg, seed
        self.n_clients = state.n_clients
        self.max_rounds = 1 if state.gfcf else None
        #: the last averaged similarity, kept when a round is attacked or defended (the
        #: uploads' rows are read against it)
        self.global_similarity: torch.Tensor | None = None
        #: the attacker's cover client under ``--attacker-norm own`` (`fedrec.federated.cia.cover`)
        self.cover: Any = None

    @property
    def security_clients(self) -> int:
        """The benign clients an attacker's share is counted against: the partition's."""
        return self.n_clients

    @property
    def lr_item(self) -> float:
        return float(self.cfg.lr)

    @property
    def _guarded(self) -> bool:
        sec = self.security
        return sec is not None and (sec.attack is not None or sec.rule is not None)

    def scale_rates(self, factor: float) -> bool:
        """Scale the clients' Adam rate and the fine-tune's (the driver's back-off); GF-CF has
        none."""
        if self.state.gfcf:
            return False
        self.cfg = dataclasses.replace(self.cfg, lr=self.cfg.lr * factor)
        spec = self.state.spec
        self.state.spec = dataclasses.replace(spec, finetune_lr=spec.finetune_lr * factor)
        if self.cover is not None:  # the attacker's cover client fine-tunes as the clients do
            self.cover.state.spec = self.state.spec
        self.divergence_hint = (f"lower --lr (the clients use {self.cfg.lr:g}) or --set finetune_lr= "
                                f"(the fine-tune uses {self.state.spec.finetune_lr:g})")
        return True

    def local_update(self, plan: RoundPlan) -> Uploads:
        """Every client trains, then computes what it uploads (`CIAState.client_sums`; each
        client's own upload too when `keep_uploads` is set)."""
        if self._guarded and self.global_similarity is None:
            self.global_similarity = self.state.start_similarity()
        loss, batches = self.state.train(self.cfg, plan.round)
        trained = time.perf_counter()
        keep: list[ClientUpload] | None = [] if self.keep_uploads or self._guarded else None
        sums = self.state.client_sums(UploadPath(ldp=self.cfg.ldp), plan.rng, keep)
        return Uploads(payload=sums, per_client=keep, loss_sum=loss, client_batches=batches,
                       bytes_up=int(sums["bytes_up"]), bytes_down=int(sums["bytes_down"]),
                       extra={"upload_seconds": time.perf_counter() - trained})

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        """The server's step on the summed uploads, then every client takes it."""
        payload = uploads.payload
        if self._guarded:
            assert uploads.per_client is not None
            payload, n_bytes, norm = self._defended(uploads.per_client, plan.round)
            uploads.bytes_up, uploads.bytes_down = uploads.bytes_up + n_bytes, uploads.bytes_down + n_bytes
            if norm is not None:  # the attackers' row budget before the boost
                uploads.extra["attacker_row_norm"] = norm
        sync, extra = combine(self.state.spec, payload)
        self.state.apply(sync)
        if self.cover is not None:
            self.cover.take(sync, plan.round)
        uploads.extra = {**extra, **uploads.extra}

    def _defended(self, kept: list[ClientUpload], r: int) -> tuple[dict[str, Any], int, float | None]:
        """Round ``r``'s average with the attack's uploads and by the defence's rule; the bytes
        the malicious clients send (and as many they download); their row budget (None: no
        attack).

        The security layer reads a similarity matrix as an item table whose row j is item j's
        similarities: each client's upload is its rows less the last average's, the attacker
        crafts rows against that average (matrix factorisation's dot product on them: a user's
        score for item t read as Σ_j x_u[j] S̄[j, t]), and the rule aggregates row by row.
        An honest row's change has no gradient step to size it, so the attacker's row budget is
        the round's median honest row change (``--attacker-norm honest``: the attacker is given
        it, a strong attacker) or its cover client's (``own``: `_cover`).
        Under ``upload_rank`` L a malicious client sends what an honest one sends, an
        eigen-upload of rank L (`_factored`), and the server reads the matrix it rebuilds."""
        sec, prev = self.security, self.global_similarity
        assert prev is not None
        m = self.state.n_items
        benign = [ClientUpload(u.client, u.items, {ITEMS: dense_upload(u) - prev}) for u in kept]
        norm = None
        if sec.attack is not None and self.cfg.attacker_norm == "own":
            norm = self._cover().budget(self.cfg, prev, r)
        elif sec.attack is not None:
            norm = float(torch.cat([u.tensors[ITEMS].norm(dim=1) for u in benign]).median())
        bad = attacker_uploads(sec, self.state.spec, prev, r, None, norm) if norm is not None else []
        item_sum, _, n = sec.sums(benign + bad, m, m, {}, prev, r)
        if n:
            self.global_similarity = prev + item_sum / n
        sent = {"n": 1, "similarity": self.global_similarity.double(), "bytes_up": 0, "bytes_down": 0}
        return sent, len(bad) * attacker_floats(self.state.spec, m) * 4, norm

    def _cover(self) -> Any:
        """The attacker's cover client (`fedrec.federated.cia.cover.CoverClient`), made at its
        first use: the first id after the honest clients, the attack's cover items."""
        if self.cover is None:
            sec = self.security
            self.cover = CoverClient(self.state.spec, self.state.n_items, sec.attack.cover_items(), sec.n_benign,
                                     self.seed)
        return self.cover

    def round_extra(self) -> dict[str, float]:
        return self.security.figures(self.scores) if self.security is not None else {}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        return self.state.run_extra()

    def server_state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"global_filter": self.state._global_filter}
        if self.global_similarity is not None:
            out["global_similarity"] = self.global_similarity
        return out

    def client_state_dict(self) -> dict[str, Any]:
        out = self.state.client_state()
        return out if self.cover is None else {**out, "cover": self.cover.state_dict()}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.state._global_filter = blob["global_filter"]
        self.global_similarity = blob.get("global_similarity")

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        cover = blob.pop("cover", None)
        if cover is None:  # a state from before the cover's first use: it starts afresh then
            self.cover = None
        else:
            self._cover().load_state_dict(cover)
        self.state.load_client_state(blob)


def attacker_uploads(sec: Any, spec: Any, prev: torch.Tensor, r: int, clients: np.ndarray | None,
                     norm: float) -> list[ClientUpload]:
    """Round ``r``'s uploads of the sampled malicious ``clients`` (0-based among them; None: the
    security layer's draw) against the last average ``prev``, at the row budget ``norm``: rows
    crafted as an item table's (the dot product on the similarity rows), as each row's change;
    under ``upload_rank`` L, the rank-L upload nearest them (`_factored`). The simulator's
    attackers and a malicious Flower node's (`fedrec.flower.malicious.CIAMaliciousNode`)."""
    m, rank = len(prev), spec.upload_rank
    attacker_model = FamilySpec(score="dot", private_score=False, dual=False, dim=m)
    bad, _ = sec.malicious_uploads(attacker_model, prev, {}, r, clients, norm=norm)
    return [_factored(u, prev, rank) for u in bad] if rank else bad


def attacker_floats(spec: Any, m: int) -> int:
    """The floats a malicious client sends (and as many it downloads): whatever rows it crafted,
    a dense M x M matrix, or L factors of M and L eigenvalues under ``upload_rank`` L."""
    rank = spec.upload_rank
    return m * min(rank, m) + min(rank, m) if rank else m * m


def _factored(upload: ClientUpload, prev: torch.Tensor, rank: int) -> ClientUpload:
    """A malicious upload of crafted rows (``upload``: steps of some rows of the last average
    ``prev``) as a rank-``rank`` eigen-upload can carry it: the matrix it means, prev plus the
    steps, made symmetric (a similarity is), and its best approximation a rank-L upload can
    send (the top L eigenpairs with their eigenvalues kept non-negative: P diag(λ) Pᵀ, as an
    honest client's E_k E_kᵀ is); read back, as the server reads every upload, as every row's
    change from ``prev``."""
    meant = prev.double().clone()
    meant[torch.as_tensor(upload.items)] += upload.tensors[ITEMS].double()
    lam, p = torch.linalg.eigh((meant + meant.T) / 2)
    top = torch.argsort(lam, descending=True)[:rank]
    sent = reconstruct_sum(p[:, top][None], lam[top].clamp_min(0)[None])
    m = len(prev)
    return ClientUpload(upload.client, np.arange(m), {ITEMS: (sent - prev.double()).float()})
