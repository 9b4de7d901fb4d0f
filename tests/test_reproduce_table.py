"""Published PFedRec figures load as transcribed, and ours-beside-the-paper tables are right."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from rich.console import Console

from fedrec.errors import FedrecError, UnknownNameError
from fedrec.reproduce import figure, load_figures, papers, render, summarise, to_markdown

DATASETS = {"ml-100k", "ml-1m", "lastfm-2k", "amazon-video"}


def _result(
    algorithm: str = "pfedrec", seed: int = 0, hr: float = 0.7, ndcg: float = 0.4,
    negatives: str = "exclude-candidates", setting: str | None = None, dataset: str = "ml-100k",
) -> dict[str, Any]:
    """A results-JSON dict as `fedrec run` writes it, with only the keys the table reads."""
    config: dict[str, Any] = {"negatives": "leak-free" if negatives != "legacy-exclude-heldout"
                              else negatives}
    if setting is not None:
        config["setting"] = setting
    return {"algorithm": algorithm, "dataset": dataset, "seed": seed, "config": config,
            "test": {"hr@10": hr, "ndcg@10": ndcg}, "data": {"negatives": negatives}}


def test_pfedrec_figures_load_with_every_table_complete():
    figs = load_figures("pfedrec")
    assert "pfedrec" in papers()
    assert Counter(f.table for f in figs) == {"1": 48, "2": 48, "7": 48, "8": 48}
    assert {f.dataset for f in figs} == DATASETS
    assert {f.metric for f in figs} == {"hr@10", "ndcg@10"}
    assert {f.method for f in figs if f.table == "2"} == {
        "fedncf", "fedrecon", "fedmf", "fedncf+dual", "fedrecon+dual", "fedmf+dual"}
    assert {f.setting for f in figs if f.table == "7"} == {
        "ldp=0", "ldp=0.1", "ldp=0.2", "ldp=0.3", "ldp=0.4", "ldp=0.5"}
    assert all(f.setting == "" for f in figs if f.table != "7")
    assert all(0 < f.mean < 1 and f.std is not None and 0 <= f.std < 0.1 for f in figs)
    assert all(f.source == f"PFedRec (Zhang et al., IJCAI 2023) Table {f.table}" for f in figs)


def test_every_figure_key_is_unique():
    keys = [f.key for f in load_figures("pfedrec")]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("table", "method", "dataset", "metric", "setting", "mean", "std"), [
    ("1", "pfedrec", "ml-100k", "hr@10", "", 0.7162, 0.0083),
    ("1", "fedncf", "ml-1m", "ndcg@10", "", 0.3417, 0.0040),
    ("1", "mf", "amazon-video", "hr@10", "", 0.4669, 0.0065),
    ("1", "ncf", "lastfm-2k", "ndcg@10", "", 0.6743, 0.0089),
    ("2", "fedncf+dual", "ml-100k", "hr@10", "", 0.6882, 0.0135),
    ("2", "fedrecon+dual", "lastfm-2k", "ndcg@10", "", 0.7483, 0.0044),
    ("7", "pfedrec", "amazon-video", "ndcg@10", "ldp=0.5", 0.3734, 0.0011),
    ("7", "pfedrec", "ml-100k", "hr@10", "ldp=0.3", 0.7113, 0.0116),
    ("8", "pfedrec", "ml-100k", "hr@10", "", 0.1919, 0.0032),
    ("8", "fedmf", "lastfm-2k", "ndcg@10", "", 0.1966, 0.0307),
])
def test_spot_checked_figures(table, method, dataset, metric, setting, mean, std):
    f = figure("pfedrec", table, method, dataset, metric, setting)
    assert f is not None
    assert (f.mean, f.std) == pytest.approx((mean, std), abs=1e-9)


def test_tables_agree_where_the_paper_repeats_a_figure():
    """Table 2 repeats Table 1's baselines; its FedMF w/ DualPer and Table 7's λ=0 are PFedRec."""
    for d in DATASETS:
        for m in ("hr@10", "ndcg@10"):
            base = figure("pfedrec", 1, "pfedrec", d, m)
            assert base is not None
            for other in (figure("pfedrec", 7, "pfedrec", d, m, "ldp=0"),
                          figure("pfedrec", 2, "fedmf+dual", d, m)):
                assert other is not None and (other.mean, other.std) == (base.mean, base.std)
            for method in ("fedncf", "fedrecon", "fedmf"):
                t1, t2 = (figure("pfedrec", t, method, d, m) for t in (1, 2))
                assert t1 is not None and t2 is not None and (t1.mean, t1.std) == (t2.mean, t2.std)


def test_table2_improvements_match_the_printed_percentages():
    printed = {"fedncf": (13.53, 18.29), "fedrecon": (8.92, 10.72), "fedmf": (9.93, 10.31)}
    for method, (hr, ndcg) in printed.items():
        for metric, pct in (("hr@10", hr), ("ndcg@10", ndcg)):
            base = figure("pfedrec", 2, method, "ml-100k", metric)
            dual = figure("pfedrec", 2, f"{method}+dual", "ml-100k", metric)
            assert base is not None and dual is not None
            assert round((dual.mean / base.mean - 1) * 100, 2) == pct


def test_unknown_paper_and_missing_figure():
    with pytest.raises(UnknownNameError, match="pfedrec"):
        load_figures("no-such-paper")
    assert figure("pfedrec", 1, "pfedrec", "ml-100k", "mrr@10") is None
    assert figure("pfedrec", 1, "pfedrec", "ml-100k", "HR@10") is not None


def test_summarise_mean_and_sample_std_over_seeds():
    results = [_result(seed=s, hr=h, ndcg=n) for s, h, n in [(0, 0.6, 0.3), (1, 0.7, 0.4),
                                                              (2, 0.8, 0.5)]]
    results.append(_result(seed=0, hr=0.9, negatives="legacy-exclude-heldout"))
    results.append(_result(seed=0, hr=0.5, setting="ldp=0.3"))
    s = summarise(results)
    mean, std, n = s[("pfedrec", "ml-100k", "", "exclude-candidates")]["hr@10"]
    assert n == 3 and mean == pytest.approx(0.7) and std == pytest.approx(0.1)  # ddof=1, as fedrec bench
    assert s[("pfedrec", "ml-100k", "", "legacy-exclude-heldout")]["hr@10"] == (0.9, 0.0, 1)
    assert s[("pfedrec", "ml-100k", "ldp=0.3", "exclude-candidates")]["hr@10"] == (0.5, 0.0, 1)
    assert set(summarise(results, metrics=["hr@10"])[
        ("pfedrec", "ml-100k", "", "exclude-candidates")]) == {"hr@10"}


def test_summarise_takes_the_asked_policy_when_none_was_recorded_and_refuses_repeated_seeds():
    r = _result()
    del r["data"]
    assert list(summarise([r])) == [("pfedrec", "ml-100k", "", "leak-free")]
    with pytest.raises(FedrecError, match="seed 0"):
        summarise([_result(), _result()])


def _summary() -> dict:
    return summarise([
        _result(seed=0, hr=0.70, ndcg=0.42), _result(seed=1, hr=0.72, ndcg=0.44),
        _result(seed=0, hr=0.75, ndcg=0.45, negatives="legacy-exclude-heldout"),
        _result(algorithm="fedavg", seed=0, hr=0.5, ndcg=0.3),
    ])


def test_render_prints_ours_beside_the_paper():
    console = Console(record=True, width=200)
    render(_summary(), "pfedrec", "1", console)
    text = console.export_text()
    for col in ("ours (leak-free) HR@10", "ours (legacy) HR@10", "paper HR@10", "paper NDCG@10"):
        assert col in text
    pfedrec = next(line for line in text.splitlines() if "│ pfedrec" in line)
    cells = [c.strip() for c in pfedrec.split("│")[1:-1]]
    # a cell over fewer seeds than the table's most (two here) says how many
    assert cells == ["pfedrec", "ml-100k", "0.7100 ± 0.0141", "0.7500 (1 seed)", "0.7162 ± 0.0083",
                     "0.4300 ± 0.0141", "0.4500 (1 seed)", "0.4344 ± 0.0089"]
    fedavg = next(line for line in text.splitlines() if "│ fedavg " in line)
    assert "0.5000" in fedavg and fedavg.count("—") == 4
    fedncf = next(line for line in text.splitlines() if "│ fedncf" in line)
    assert "0.6062 ± 0.0059" in fedncf
    assert "ml-1m" not in text  # paper rows only for the data sets we ran


def test_to_markdown_rows():
    md = to_markdown(_summary(), "pfedrec", 1, paper_rows=False)
    lines = md.splitlines()
    assert lines[0] == ("| method | dataset | ours (leak-free) HR@10 | ours (legacy) HR@10 | "
                        "paper HR@10 | ours (leak-free) NDCG@10 | ours (legacy) NDCG@10 | "
                        "paper NDCG@10 |")
    assert lines[1] == "| :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: |"
    assert lines[2] == ("| pfedrec | ml-100k | 0.7100 ± 0.0141 | 0.7500 (1 seed) | 0.7162 ± 0.0083 | "
                        "0.4300 ± 0.0141 | 0.4500 (1 seed) | 0.4344 ± 0.0089 |")
    assert lines[3] == "| fedavg | ml-100k | 0.5000 (1 seed) | — | — | 0.3000 (1 seed) | — | — |"
    assert len([ln for ln in lines if ln.startswith("|")]) == 4
    assert "sample std (ddof=1)" in md


def test_a_table_whose_runs_all_failed_says_so():
    # every run diverged (FedRAP on Lastfm-2K at its ML-100K rates): no figure, and no "over 0 seeds"
    md = to_markdown({}, "fedrap", 1)
    assert "no run completed" in md and "over 0 seed" not in md


def test_settings_get_their_own_column_and_paper_cells():
    s = summarise([_result(seed=k, hr=0.7 + k / 100, setting="ldp=0.3") for k in range(2)])
    md = to_markdown(s, "pfedrec", 7, metrics=["hr@10"])
    row = next(ln for ln in md.splitlines() if "ldp=0.3" in ln)
    assert row == "| pfedrec | ml-100k | ldp=0.3 | 0.7050 ± 0.0071 | 0.7113 ± 0.0116 |"
    assert sum("| pfedrec | ml-100k | ldp=" in ln for ln in md.splitlines()) == 6
    with pytest.raises(FedrecError, match="Table 3"):
        to_markdown(s, "pfedrec", 3)
