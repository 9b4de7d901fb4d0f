"""The autoencoders (PersonalFR, FedAvg-AE, Joint) as the round driver's federated algorithm:
an `AEState` (`fedrec.federated.ae.state`) whose round is spelled out as download, local
update, upload and Equation 5."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from fedrec.core.contract import ClientUpload, FederatedAlgorithm, RoundPlan, Uploads
from fedrec.federated.ae.state import AEState
from fedrec.models.autoencoder import ROW_TABLES


class AEAlgorithm(FederatedAlgorithm):
    """An `AEState` as the round driver's federated algorithm: the sampled clients download
    their rows, train, upload; the server applies Equation 5."""

    def __init__(self, state: AEState, cfg: Any) -> None:
        self.state, self.cfg = state, cfg
        self.n_clients, self.seed, self.clients_per_round = state.K, state.seed, cfg.clients_per_round

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
        self.state.aggregate(cohort, rows, upload, steps, self.cfg.lr)
        uploads.bytes_up, uploads.bytes_down = self.state.round_bytes(cohort, first_round=plan.round == 1)

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
