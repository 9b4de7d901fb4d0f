"""Shared small data for tests: synthetic interactions and their protocol splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.data.interactions import Interactions
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic

# Test tensors are tiny: a second intra-op thread only adds synchronisation (and thrashes when
# anything else runs on the machine), so the suite runs single-threaded.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_data() -> Interactions:
    """300 users x 400 items, about 20 interactions each, implicit."""
    return to_implicit(synthetic(300, 400, mean_interactions=20, min_interactions=5, seed=7))


@pytest.fixture(scope="session")
def tied_data() -> Interactions:
    """Hand-made rows where users' latest timestamps tie, to pin down tie breaking."""
    users = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    items = np.array([0, 1, 2, 3, 3, 2, 1, 0])
    ts = np.array([1, 2, 5, 5, 9, 9, 9, 1])
    return Interactions.from_raw(users, items, None, ts, implicit=True)


@pytest.fixture(autouse=True)
def own_catalogue(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets an empty catalogue of user data sets (`fedrec data add`), never the
    machine's own."""
    monkeypatch.setenv("FEDREC_HOME", str(tmp_path_factory.mktemp("fedrec-home")))
