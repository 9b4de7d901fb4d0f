"""Full-ranking scores (``items=None``) take a shortcut: the table is copied whole (or read as a
view) and each client's own rows written straight to their columns. They must equal scoring
every item by id, and leave the model as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.experiment import RunConfig, federated_config, train


@pytest.mark.parametrize(("algorithm", "model"), [
    ("pfedrec", {}), ("fedmf", {"dual": True}), ("fedmf", {}), ("fedncf", {}), ("fedrecon", {}), ("metamf", {}),
    ("gfedpp", {}), ("gfedpp", {"public_ratio": 0.5}), ("gpfedrec", {}), ("fedrap", {}),
])
def test_every_item_scores_equal_scores_by_id(algorithm: str, model: dict[str, bool]) -> None:
    # half the clients a round, where the method allows it: some were never trained, so they
    # have no rows of their own
    # the graph methods train every client every round, and their server step (the users'
    # own tables) runs at the start of the next round: two rounds, so that it has run
    graph = algorithm in ("gfedpp", "gpfedrec")
    share = 1.0 if graph else 0.5
    cfg = RunConfig(algorithm, dataset="synthetic:90x150", protocol="loo-full", model=model,
                    federated=federated_config(algorithm, rounds=2 if graph else 1, clients_per_round=share))
    trained = train(cfg)
    scorer, state = trained.model, trained.model.state
    tables = {name: getattr(state, name).clone() for name in ("items", "round_start_items")
              if getattr(state, name, None) is not None}
    users = np.arange(trained.split.n_users)
    users = np.r_[users, users[:7], users[3:4], users[3:4]]  # clients repeated in one chunk
    every = scorer.scores(users, None)
    by_id = scorer.scores(users, np.broadcast_to(np.arange(trained.split.n_items), every.shape).copy())
    np.testing.assert_array_equal(every, by_id)
    for name, before in tables.items():  # own rows were written into a copy, never the table
        torch.testing.assert_close(getattr(state, name), before, rtol=0, atol=0)
