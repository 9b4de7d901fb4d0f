"""The negative-frequency oracle: chance under leak-free policies, near-perfect under the legacy one."""

from __future__ import annotations

import pytest

from fedrec.eval.audit import negative_frequency_oracle
from fedrec.protocols import make_split


@pytest.fixture(scope="module")
def base(small_data):
    return small_data


def test_oracle_is_at_chance_under_default_policy(base):
    s = make_split(base, "loo-sampled", seed=0)
    res = negative_frequency_oracle(s, rounds=100, seed=0)
    m = res.metrics[-1]
    assert m["hr@10"] == pytest.approx(0.10, abs=1e-9)  # every candidate untouched: exact chance


def test_oracle_is_near_chance_under_train_only(base):
    s = make_split(base, "loo-sampled", seed=0, negatives="train-only")
    m = negative_frequency_oracle(s, rounds=100, seed=0).metrics[-1]
    assert 0.04 < m["hr@10"] < 0.17


def test_oracle_reads_the_legacy_leak(base):
    s = make_split(base, "loo-sampled", seed=0, negatives="legacy-exclude-heldout")
    res = negative_frequency_oracle(s, rounds=100, seed=0, checkpoints=(1,))
    first, last = res.metrics
    assert last["hr@10"] > 0.95 and last["ndcg@10"] > 0.8
    assert first["hr@10"] < last["hr@10"]


def test_oracle_at_chance_under_full_ranking(base):
    s = make_split(base, "loo-full", seed=0)
    m = negative_frequency_oracle(s, rounds=50, seed=0).metrics[-1]
    chance = 10 / (base.n_items - 18)  # about 10 / (items a user did not train on)
    assert m["hr@10"] < 3 * chance
    leaky = make_split(base, "loo-full", seed=0, negatives="legacy-exclude-heldout")
    assert negative_frequency_oracle(leaky, rounds=50, seed=0).metrics[-1]["hr@10"] > 0.7  # vs ~0.03 chance
