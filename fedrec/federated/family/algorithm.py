"""The item-embedding family (and FedRAP, GPFedRec, GFed-PP, MetaMF) as a `FederatedAlgorithm`.

Their states (`FamilyState` and its subclasses) are batched kernels: they train one chunk of a
cohort at once and fold its uploads into running sums. `CohortAlgorithm` gives them the round
the driver runs: the sampled cohort, ordered by activity, is trained in memory-sized chunks
(`fedrec.federated.engine.train_cohort`), the chunks' uploads are folded (or also kept per
client when `keep_uploads` is set), and the state aggregates them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrec.core.contract import FederatedAlgorithm, RoundPlan, Uploads
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.state import use_aggregation
from fedrec.protocols.protocol import Split
from fedrec.rounds.cohort import order_by_activity


class CohortAlgorithm(FederatedAlgorithm):
    """A cohort-vectorised state driven round by round (see the module docstring)."""

    #: the run's attack and defence, plugged into the upload stage by the security layer
    #: (`fedrec.security.adversary.attach`); None: plain uploads, plain aggregation
    security: Any = None
    #: it has that slot (an algorithm without it refuses an attack or a defence)
    takes_security = True

    def __init__(self, spec: Any, split: Split, cfg: Any, seed: int) -> None:
        self.spec, self.split, self.cfg, self.seed = spec, split, cfg, seed
        self.n_clients, self.clients_per_round = split.n_users, cfg.clients_per_round
        self.lr_item = cfg.item_lr(split.n_items)
        self.state = spec.create_state(split.n_users, split.n_items, lr=cfg.lr, lr_item=self.lr_item,
                                       item_std=cfg.item_std, seed=seed, train=split.train)
        self.path = cfg.upload_path(self.lr_item)
        use_aggregation(self.state, cfg.aggregation)
        self.divergence_hint = f"lower --lr or --lr-item (item rows use {self.lr_item:g})"
        self.rounds_done = 0
        #: noised aggregates the server has formed, the back-offs' discarded rounds included:
        #: what the privacy accountant counts (a back-off's reload does not take it back)
        self.releases = 0

    def begin_round(self, plan: RoundPlan) -> None:
        self._acc = self.state.begin_round(plan.round)

    def scale_rates(self, factor: float) -> bool:
        """Scale the state's rates (every kernel of the family reads them at each step). The
        upload path keeps the rate it was made with: DP noise calibrated to the larger step
        only overstates the sensitivity."""
        self.state.lr *= factor
        self.state.lr_item *= factor
        self.lr_item *= factor
        self.divergence_hint = f"lower --lr or --lr-item (item rows use {self.lr_item:g})"
        return True

    def local_update(self, plan: RoundPlan) -> Uploads:
        from fedrec.federated.engine import train_cohort

        cohort = order_by_activity(self.split.train, plan.clients)
        sec = self.security
        own = hasattr(self.state, "admit_uploads")  # GPFedRec, GFed-PP: the state keeps each client's rows
        keep = self.keep_uploads or (sec is not None and sec.keeps_uploads and not own)
        kept: list[Any] | None = [] if keep else None
        acc = self._acc
        train_cohort(self.state, self.spec, self.cfg, self.split.train, self.split.sampler, cohort,
                     cohort, self.seed, plan.round, self.path, acc, keep=kept)
        per_client = [u for chunk in kept for u in chunk.per_client()] if kept is not None else None
        if sec is not None and sec.attack is not None:
            bad, n_bytes = sec.malicious_uploads(self.state.spec, self.state.items, self.state.shared, plan.round,
                                                 wire=self.state)
            if per_client is not None:
                per_client.extend(bad)
            join = getattr(self.state, "join_attackers", None)  # PerFedRec: they send user vectors too
            if join is not None and bad:
                ids, users = sec.forged_users(self.state.spec, self.state.items, self.state.shared, plan.round)
                acc.bytes_up += join(ids, users, bad)
            acc.bytes_up += n_bytes
            acc.bytes_down += n_bytes
            if own:  # their tables join the graph
                self.state.receive_malicious(bad)
            elif sec.rule is None:  # plain FedAvg: the malicious rows join the running sums
                for u in bad:
                    acc.item_sum.index_add_(0, torch.as_tensor(u.items), u.tensors[ITEMS])
                    acc.contributed(torch.as_tensor(u.items))
                    for k in acc.shared_sum:
                        acc.shared_sum[k] += u.tensors[k]
                acc.n += len(bad)
        return Uploads(payload=acc, per_client=per_client, rejected=acc.rejected,
                       bytes_up=acc.bytes_up, bytes_down=acc.bytes_down, loss_sum=acc.loss_sum,
                       client_batches=acc.client_batches)

    def aggregate(self, uploads: Uploads, plan: RoundPlan) -> None:
        acc, sec = uploads.payload, self.security
        if sec is not None and sec.rule is not None and hasattr(self.state, "admit_uploads"):
            self.state.admit_uploads(sec, plan.round)
        elif sec is not None and sec.rule is not None and uploads.per_client is not None:
            acc.item_sum, acc.shared_sum, acc.n = sec.sums(uploads.per_client, *self.state.items.shape,
                                                           self.state.shared, self.state.items, plan.round,
                                                           self.state.server_optimizer.row_step(ITEMS),
                                                           senders=acc.item_count)
            guard = getattr(self.state, "guard_clusters", None)  # PerFedRec: its cluster tables too
            if guard is not None:
                guard(uploads.per_client, sec.rule, (self.seed, plan.round))
        self.state.aggregate(acc, self.path, plan.server_gen)
        self.rounds_done = plan.round
        self.releases += 1

    def round_extra(self) -> dict[str, float]:
        extra = self.state.round_extra()
        if self.security is not None:
            extra = {**extra, **self.security.figures(self.scores)}
        return extra

    def scores(self, users: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        return self.state.scores(users, items)

    def user_groups(self) -> dict[str, np.ndarray]:
        return self.state.user_groups()

    def run_extra(self) -> dict[str, Any]:
        out = dict(self.state.run_extra())
        if self.cfg.dp_noise > 0:
            from fedrec.federated.engine import privacy_spent

            out["privacy"] = privacy_spent(self.cfg, self.n_clients, self.releases)
        return out

    def server_state_dict(self) -> dict[str, Any]:
        releases = {"releases": self.releases} if self.cfg.dp_noise > 0 else {}
        return {**self.state.server_state_dict(), "rounds_done": self.rounds_done, **releases}

    def client_state_dict(self) -> dict[str, Any]:
        return self.state.client_state_dict()

    def load_server_state_dict(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        self.rounds_done = blob.pop("rounds_done")
        # a back-off reloads an earlier state, whose count is below the live one; a resumed run
        # starts from the saved count (a save from before the count: its rounds)
        self.releases = max(self.releases, int(blob.pop("releases", self.rounds_done)))
        legacy = blob.pop("attack", None)  # a checkpoint that kept the attack's state with the server's
        if legacy is not None and self.security is not None and self.security.attack is not None:
            self.security.attack.load_state(legacy)
        self.state.load_server_state_dict(blob)

    def load_client_state_dict(self, blob: dict[str, Any]) -> None:
        self.state.load_client_state_dict(blob)
