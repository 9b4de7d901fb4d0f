"""Full-ranking scores (``items=None``) take a shortcut: the table is copied whole and each
client's own rows written straight to their columns. They must equal scoring every item by id."""

from __future__ import annotations

import numpy as np
import pytest

from fedrec.experiment import RunConfig, federated_config, train


@pytest.mark.parametrize(("algorithm", "model"), [
    ("pfedrec", {}), ("fedmf", {"dual": True}), ("fedmf", {}), ("gfedpp", {}), ("gpfedrec", {}), ("fedrap", {}),
])
def test_every_item_scores_equal_scores_by_id(algorithm: str, model: dict[str, bool]) -> None:
    cfg = RunConfig(algorithm, dataset="synthetic:90x150", protocol="loo-full", model=model,
                    federated=federated_config(algorithm, rounds=2))
    trained = train(cfg)
    scorer = trained.model
    users = np.arange(trained.split.n_users)
    every = scorer.scores(users, None)
    by_id = scorer.scores(users, np.broadcast_to(np.arange(trained.split.n_items), every.shape).copy())
    np.testing.assert_array_equal(every, by_id)
    # a personalised method's scores differ between clients beyond their private parameters,
    # so the test would see rows written to the wrong client or item
    assert np.isfinite(every).all() and every.std() > 0
