"""A FedCIA attacker's own estimate of its row budget (``--attacker-norm own``).

Every other method's attacker sizes its crafted rows by the honest step of a *cover* client
it runs itself (`fedrec.security.attacks.Attack.budget`). A similarity row's change has no
gradient step, so FedCIA's attacker runs a whole cover client of the method instead: one more
FedCIA client, holding one user whose positives are the attack's cover items
(`Attack.cover_items`), with the model its id gives it. It takes every server step, trains as an
honest client trains, and its upload's change from the last average, row by row, is the
estimate: the median row norm. Everything it needs is what a client holds (the start draws, the
server's steps, the last average), so a malicious Flower node
(`fedrec.flower.malicious.CIAMaliciousNode`) computes the figure the simulator does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fedrec.core.contract import ClientUpload
from fedrec.federated.cia.state import CIAState, dense_upload
from fedrec.partition import Partition
from fedrec.protocols.negatives import ComplementSampler
from fedrec.rounds.upload import UploadPath

#: the key of the cover client's LDP noise (its own: the round's generator is the honest clients')
COVER_NOISE = 0xC07E


class CoverClient:
    """The attacker's cover client of a FedCIA run (see the module docstring): client
    ``client_id`` (an id after the honest clients') over one user with the ``items`` positives
    (the first half of the catalogue's worth of them, where there are more)."""

    def __init__(self, spec: Any, n_items: int, items: np.ndarray, client_id: int, seed: int) -> None:
        # at most half the items (as drawn), so that it has negatives left to draw on tiny data
        items = np.sort(np.asarray(items, np.int64)[: max(1, n_items // 2)])
        train = sp.csr_matrix((np.ones(len(items), np.float32), items, np.array([0, len(items)])),
                              shape=(1, n_items))
        self.state = CIAState(spec, train, ComplementSampler(train), Partition(np.zeros(1, np.int64), 1), seed,
                              client_ids=np.array([client_id], np.int64))
        self.seed = seed
        self.applied = 0  # the last round whose server step the cover client took

    def take(self, sync: dict[str, Any], r: int) -> None:
        """Round ``r``'s server step (`fedrec.federated.cia.state.combine`), unless taken."""
        if r > self.applied:
            self.state.apply(sync)
            self.applied = r

    def budget(self, cfg: Any, prev: torch.Tensor, r: int) -> float:
        """Round ``r``: the cover client trains, uploads as an honest client does (its LDP noise
        included, keyed by the round), and the median row norm of its upload less ``prev``, the
        last average, is the budget."""
        self.state.train(cfg, r)
        keep: list[ClientUpload] = []
        self.state.client_sums(UploadPath(ldp=cfg.ldp), np.random.default_rng([self.seed, r, COVER_NOISE]), keep)
        return float((dense_upload(keep[0]) - prev).norm(dim=1).median())

    def state_dict(self) -> dict[str, Any]:
        return {**self.state.client_state(), "applied": self.applied}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        blob = dict(blob)
        self.applied = int(blob.pop("applied"))
        self.state.load_client_state(blob)
