"""The privacy and robustness options take effect, or are refused in one line where the run
would not read them: no privacy reported for noise that protects nothing, no option dropped
silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_outcome import said as cli

DATA = ("-d", "synthetic:100x200", "-p", "loo-full")




@pytest.mark.parametrize(("argv", "says"), [
    # noise on a run that uploads nothing would be reported as a privacy it does not give
    (["run", "centrap", "--dp-clip", "0.1", "--dp-noise", "10"], "'centrap' does not use --dp-clip, --dp-noise"),
    (["run", "fedrap-d", "--ldp", "0.1"], "'fedrap-d' does not use --ldp"),
    (["run", "lightgcn", "--ldp", "0.1"], "--ldp noises uploads, and this run uploads nothing"),
    (["run", "stacked", "--set", "aggregation=none", "--ldp", "0.5"], "this run uploads nothing (aggregation none)"),
    (["run", "lightgcn", "--attack", "boost"], "--attack and --defence need a server that mixes"),
    # an option its run would not read
    (["run", "fedmf", "--dp-delta", "0.001"], "--dp-delta is the delta of --dp-noise's"),
    (["run", "fedmf", "--defence", "median", "--trim", "0.3"], "--trim is read by --defence trimmed-mean, not by"),
    (["run", "fedmf", "--defence", "median", "--byzantine", "0.3"], "--byzantine is read by --defence krum and"),
    (["run", "fedmf", "--defence", "krum", "--norm-bound", "1"], "--norm-bound is read by --defence norm-bound"),
    (["run", "fedmf", "--defence", "median", "--union-step", "server"], "--union-step is read by --defence union, not"),
    (["run", "fedmf", "--defence", "union", "--union-step", "adam"], "--union-step must be one of share, server"),
    (["run", "fedmf", "--ldp", "0.1", "--encoding", "sparse"], "a noised upload sends every row (dense)"),
    (["run", "mf", "--malicious", "0.1"], "'mf' is centralised: --malicious does not apply"),
    (["run", "mf", "--trim", "0.2", "--attacker-norm", "own"], "--attacker-norm, --trim do not apply"),
    # FedMF's attackers always make their own estimate: the run would record a norm it did not use
    (["run", "fedmf", "--attack", "boost", "--attacker-norm", "own"], "'fedmf' does not use --attacker-norm"),
    (["run", "fedca", "--attacker-norm", "own"], "--attacker-norm describe an --attack; none is given"),
    # sizes the data cannot hold: a traceback mid-run before
    (["run", "fedmf", "--targets", "500"], "--targets 500 is more than the data's 194 items"),
    (["run", "fedmf", "--attack", "boost", "--attack-items", "1000"], "fake users rate 500 items"),
    # an audit of nothing, and a group of one
    (["audit-privacy", "centrap"], "clients send their server nothing"),
    (["audit-privacy", "fedmf", "--secagg", "1"], "--secagg is a group size >= 2"),
    # a secure sum its server could not train with: the audit would be of a view that cannot exist
    (["audit-privacy", "fedca", "--secagg", "10"], "'fedca' cannot run on secure sums: its server weighs"),
    (["audit-privacy", "gpfedrec", "--secagg", "10"], "'gpfedrec' cannot run on secure sums: the graph step"),
    (["audit-privacy", "perfedrec", "--secagg", "10"], "'perfedrec' cannot run on secure sums: its server clusters"),
    (["audit-privacy", "fedpergnn", "--secagg", "10"], "'fedpergnn' cannot run on secure sums: its server relays"),
])
def test_an_option_the_run_would_not_read_is_refused(argv: list[str], says: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    quiet = ["-q"] if argv[0] == "run" else []
    code, said = cli(*argv, *DATA, *quiet, "--rounds", "1", "-o", str(out))
    assert code == 2 and says in said, said
    assert not out.exists()


def test_the_privacy_spent_counts_the_rounds_a_back_off_discarded(tmp_path: Path) -> None:
    """Noise this heavy under the papers' rates diverges in round 2; the back-off reloads round
    1 and trains round 2 again, so the server formed three noised aggregates, not two."""
    out = tmp_path / "dp.json"
    code, said = cli("run", "fedmf", *DATA, "-q", "--dp-clip", "0.1", "--dp-noise", "1000", "--rounds", "2", "-o", str(out))
    assert code == 0, said
    run = json.loads(out.read_text())
    assert run["extra"]["backoffs"] == [2] and len(run["history"]) == 2
    assert run["extra"]["privacy"]["rounds"] == 3


def test_laplace_noise_is_said_to_carry_no_epsilon(tmp_path: Path) -> None:
    """--ldp is PFedRec's Laplace noise, with no sensitivity bound: the run says it accounts no
    epsilon for it, and its file holds none, where --dp-noise reports one."""
    out = tmp_path / "ldp.json"
    code, said = cli("run", "fedmf", *DATA, "--ldp", "0.1", "--rounds", "1", "-o", str(out))
    assert code == 0, said
    assert "Laplace of scale 0.1 on every uploaded entry; no ε is accounted" in said, said
    assert "epsilon" not in json.loads(out.read_text())["extra"].get("privacy", {})


def test_a_flagging_defence_without_an_attack_has_no_recall_to_print(tmp_path: Path) -> None:
    """Krum flags uploads every round; with no malicious client its recall is undefined (NaN in
    the file), and the run says so rather than printing 'recall nan'."""
    out = tmp_path / "krum.json"
    code, said = cli("run", "fedmf", *DATA, "--defence", "krum", "--rounds", "1", "-o", str(out))
    assert code == 0, said
    assert "uploads in the last round: none malicious (no attack)" in said and "nan" not in said, said


def test_a_targeted_attack_records_how_many_targets_it_ran(tmp_path: Path) -> None:
    """--targets 0 (the default) under a targeted attack means one target: the run says so."""
    out = tmp_path / "a.json"
    code, said = cli("run", "fedmf", *DATA, "-q", "--attack", "boost", "--rounds", "1", "-o", str(out))
    assert code == 0, said
    run = json.loads(out.read_text())
    assert run["config"]["federated"]["targets"] == 0 and run["history"][-1]["extra"]["targets"] == 1.0
