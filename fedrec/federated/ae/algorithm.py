"""The autoencoders (PersonalFR, FedAvg-AE, Joint) as the round driver's federated algorithm:
an `AEState` (`fedrec.federated.ae.state`) whose round is spelled out as download, local
update, upload and Equation 5.

**Attacks and defences on PersonalFR** (`fedrec.security.adversary`). PersonalFR's server
averages the decoder, whose output layer is an item table: item j's score for a user whose last
decoder layer is h is (h, 1) · (W_out[j], b_j), a dot product. The security layer reads that
table (`AEState.out_table`) as it reads the item family's:

* a malicious client is a client of the partition's kind (ids after the K benign ones; the
  ``--malicious`` share is of clients, not users). It downloads the decoder and crafts row
  steps of the output table against matrix factorisation's dot product on those rows (the
  users' last layers, which pass through private encoders, are what it approximates); it sends
  the dense decoder layers back as they came;
* the honest row norm it matches is an Adam client's: each coordinate moves by about the rate
  a local step (`fedrec.security.attacks.Knowledge.step_bound`; on ML-100K, 5 steps at 1e-3 over
  257 numbers bound a row at 0.080, where honest rows move 0.060 at the median);
* a defence's robust rule aggregates the output rows client by client, and the dense decoder
  layers as one row every client sends (as FedNCF's shared weights); Equation 5 then divides
  by the accepted uploads.

**FedAvg of the whole autoencoder** shares the encoder too. Its first layer is a second item
table whose rows a client sends for the same items, so the security layer reads both as one
table (`AEState.row_table`: the output row and bias of item j, then its encoder row). The
attacker crafts the scoring columns and sends its encoder rows and every dense layer back as
they came; a rule judges item j's whole row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.federated.ae.state import AEState
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.spec import FamilySpec
from fedrec.models.autoencoder import ROW_TABLES
from fedrec.rounds.upload import FLOAT_BYTES


class AEAlgorithm(FederatedAlgorithm):
    """An `AEState` as the round driver's federated algorithm: the sampled clients download
    their rows, train, upload; the server applies Equation 5 (module docstring for attacks and
    defences)."""

    #: the run's attack and defence (`fedrec.security.adversary.attach`); None: plain rounds
    security: Any = None
    takes_security = True

    def __init__(self, state: AEState, cfg: Any) -> None:
        self.state, self.cfg = state, cfg
        self.n_clients, self.seed, self.clients_per_round = state.K, state.seed, cfg.clients_per_round

    @property
    def security_clients(self) -> int:
        """The benign clients an attacker's share is counted against: the partition's."""
        return self.state.K

    @property
    def lr_item(self) -> float:
        """The rate of a row step (an SGD client's; an Adam client's bound is `step_bound`)."""
        return float(self.cfg.lr)

    @property
    def step_bound(self) -> float | None:
        """How far an Adam client's round moves a coordinate at most: the rate x the local steps
        of a client of the partition's mean size; None under SGD."""
        if self.state.spec.optimizer != "adam":
            return None
        users = self.state.n_users / self.state.K
        return float(self.cfg.lr * self.cfg.local_epochs * np.ceil(users / self.cfg.batch_size))

    def scale_rates(self, factor: float) -> bool:
        """Scale the rate every local step and the server's Equation 5 read (the driver's
        back-off)."""
        self.cfg = dataclasses.replace(self.cfg, lr=self.cfg.lr * factor)
        self.divergence_hint = f"lower --lr (now {self.cfg.lr:g})"
        return True

    def local_update(self, plan: RoundPlan) -> Uploads:
        cohort, steps = self.state.training_order(plan.clients, self.cfg)
        payload, rows = self.state.download(cohort)
        upload, stats = self.state.local_update(cohort, payload, self.cfg, plan.round)
        loss_sum = stats.pop("loss_sum")
        extra = {**stats, "clients": float(len(cohort))}
        kept = self._per_client(cohort, rows, upload) if self.keep_uploads else None
        return Uploads(payload=(cohort, rows, upload, steps), per_client=kept,
                       loss_sum=loss_sum, client_batches=int(stats["client_batches"]), extra=extra)

    def _per_client(self, cohort: np.ndarray, rows: np.ndarray, upload: dict[str, torch.Tensor]
                    ) -> list[ClientUpload]:
        """Each client's own upload: the rows of its items in the row tables (only those travel
        under partial compression) and its copy of every shared dense layer."""
        _, offsets = self.state.cohort_rows(cohort)
        out = []
        for k, client in enumerate(cohort.tolist()):
            part = slice(int(offsets[k]), int(offsets[k + 1]))
            out.append(ClientUpload(client, rows[part], {
                name: v[part] if name in ROW_TABLES else v[k] for name, v in upload.items()}))
        return out

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        cohort, rows, upload, steps = uploads.payload
        sec = self.security
        extra = 0
        if sec is not None and (sec.attack is not None or sec.rule is not None):
            extra = self._guarded(cohort, rows, upload, steps, plan.round)
        else:
            self.state.aggregate(cohort, rows, upload, steps, self.cfg.lr)
        up, down = self.state.round_bytes(cohort, first_round=plan.round == 1)
        uploads.bytes_up, uploads.bytes_down = up + extra, down + extra

    def _guarded(self, cohort: np.ndarray, rows: np.ndarray, upload: dict[str, torch.Tensor],
                 steps: np.ndarray, r: int) -> int:
        """Round ``r``'s aggregate with the attack's uploads and by the defence's rule (module
        docstring); the bytes the malicious clients send (and as many they download)."""
        st, sec = self.state, self.security
        benign, scale = st.client_uploads(cohort, rows, upload, steps, self.cfg.lr)
        scoring, table = st.out_table(), st.row_table()
        dense = {k: v for k, v in st.glob.items() if k not in ROW_TABLES}
        attacker_model = FamilySpec(score="dot", private_score=False, dual=False, dim=scoring.shape[1])
        bad, n_bytes = sec.malicious_uploads(attacker_model, scoring, {}, r)
        rest = table.shape[1] - scoring.shape[1]  # FedAvg's encoder rows go back as they came
        for u in bad:  # and the dense layers
            crafted = u.tensors[ITEMS]
            u.tensors[ITEMS] = torch.cat([crafted, crafted.new_zeros((len(crafted), rest))], 1)
            u.tensors.update({k: v.clone() for k, v in dense.items()})
        n_bytes += len(bad) * sum(v.numel() for v in dense.values()) * FLOAT_BYTES
        item_sum, dense_sum, n = sec.sums(benign + bad, *table.shape, dense, table, r)
        if n:
            st.apply_uploads(item_sum, dense_sum, n, scale)
        return n_bytes

    def round_extra(self) -> dict[str, float]:
        return self.security.figures(self.scores) if self.security is not None else {}

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def run_extra(self) -> dict[str, Any]:
        return self.state.run_extra()

    def server_state_dict(self) -> dict[str, Any]:
        return {"glob": self.state.glob}

    def client_state_dict(self) -> dict[str, Any]:
        """Private layers; the Joint model's optimiser belongs to its one client."""
        return {"priv": self.state.priv, "opt": self.state.opt}

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.glob = blob["glob"]

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.priv, self.state.opt = blob["priv"], blob["opt"]
