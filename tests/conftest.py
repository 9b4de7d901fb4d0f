"""Shared small data for tests: synthetic interactions and their protocol splits; the order the
test files run in."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fedrec.data.interactions import Interactions
from fedrec.data.preprocess import to_implicit
from fedrec.data.synthetic import synthetic

# Test tensors are tiny: a second intra-op thread only adds synchronisation (and thrashes when
# anything else runs on the machine), so the suite runs single-threaded.
torch.set_num_threads(1)

# Ray starts its workers (the simulation engine's nodes) at niceness 15, so that its own daemons
# stay responsive; beside the suite's other workers on a small machine they then wait for a
# core while their test waits for them. The suite's Ray workers run at the others' priority.
os.environ.setdefault("RAY_worker_niceness", "0")

#: the test files that take longest (deployments, Ray, whole runs; measured on two cores), in
#: that order. `make test` hands each worker whole files (pytest-xdist's ``--dist loadfile``) in
#: the order they are collected, so these go first and a long one never starts last, leaving
#: the other workers idle at the end. The rest follow in their usual order.
LONGEST_FIRST = (
    "test_flower_loopback.py", "test_flower_simulation.py", "test_flower_user_data.py", "test_contract.py",
    "test_docs.py", "test_flower.py", "test_bench.py", "test_security.py", "test_ray_cluster.py",
    "test_tune.py", "test_trust.py", "test_user_data.py", "test_wheel.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of `LONGEST_FIRST` first, each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


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
