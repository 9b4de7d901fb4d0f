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


def test_the_audits_read_a_users_own_file_and_each_protocols_figures(tmp_path, capsys):
    """`audit-protocol` and `audit-privacy` take --columns as `run` does; the oracle's table shows
    the protocol's own figures (F1 under a ratio split) and refuses a rating protocol."""
    import numpy as np

    from fedrec.cli import main

    rng = np.random.default_rng(0)
    rows = ["user,item,ts"] + [f"u{u},i{i},{t}" for u in range(60)
                               for t, i in enumerate(rng.choice(300, 10, replace=False))]
    own = tmp_path / "own.csv"
    own.write_text("\n".join(rows) + "\n")

    def cli(*argv):
        with pytest.raises(SystemExit) as done:
            main(list(argv))
        captured = capsys.readouterr()
        return int(done.value.code or 0), captured.out + captured.err

    code, out = cli("audit-protocol", "-d", str(own), "--columns", "user,item,,ts", "-p", "ratio-full", "--rounds", "2")
    assert code == 0 and "f1@10" in out and "ndcg@10" in out, out
    code, out = cli("audit-protocol", "-d", str(own), "--columns", "user,item,,ts", "-p", "ratio-rating")
    assert code == 2 and "predicts ratings and draws no training negatives" in out
    report = tmp_path / "audit.json"
    code, out = cli("audit-privacy", "fedmf", "-d", str(own), "--columns", "user,item,,ts", "-p", "loo-full",
                    "--rounds", "1", "-o", str(report))
    assert code == 0 and report.exists(), out
    code, out = cli("audit-privacy", "fedmf", "-d", str(own), "--columns", "user,item,,ts", "--rounds", "1",
                    "-o", str(report))
    assert code == 2 and "exists" in out and "--overwrite" in out and "utility:" not in out  # before training
