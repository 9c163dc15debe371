"""plots/ruler.py (docs/tasks.md, "The RULER suite"): the suite table and the leaderboard from
synthetic `kvsim task` folders whose scores are known. A kind whose exact cache scores below 0.8 does
not count and never enters the leaderboard's mean (the negative control: with it counted, the mean
would differ); the interval is a seeded stratified bootstrap around the mean."""
import csv
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("kind,length,depth,trial,needle_depth,needle_begin,needle_end,question_begin,cache,policy,answer,generated,"
          "correct,score,evidence,rel_err,kept_mass,needle_mass,needle_kept_mass,needle_kept,needle_kept_share,"
          "cache_tokens,seconds,model").split(",")


def write_run(folder, kind, scores, metrics=None):
    """trials.csv of one run: per cache label, one row per trial with the given scores (and, per cache
    label, a column -> values dict of open-loop metrics)."""
    folder.mkdir(parents=True)
    with open(folder / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for cache, values in scores.items():
            policy = cache.split("(")[0]
            for i, s in enumerate(values):
                w.writerow({"kind": kind, "length": 1024, "depth": 0.5, "trial": i, "needle_depth": 0.5, "needle_begin": 10,
                            "needle_end": 20, "question_begin": 1000, "cache": cache, "policy": policy, "answer": "x",
                            "generated": f"g{cache}{i}", "correct": int(s == 1), "score": s, "evidence": "10-20",
                            "rel_err": "nan", "kept_mass": "nan", "needle_mass": "nan", "needle_kept_mass": "nan",
                            "needle_kept": "nan", "needle_kept_share": "nan", "cache_tokens": 100, "seconds": 1,
                            "model": "m", **{k: v[i] for k, v in (metrics or {}).get(cache, {}).items()}})


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ruler")
    write_run(tmp / "a", "niah_single", {"exact": [1] * 8, "h2o(memory=0.5)": [1, 1, 1, 1, 0, 0, 0, 0]})
    write_run(tmp / "b", "niah_multivalue", {"exact": [1, 1, 1, 1, 1, 1, 1, 0.5], "h2o(memory=0.5)": [0.5] * 8})
    write_run(tmp / "c", "common_words", {"exact": [0.1] * 8, "h2o(memory=0.5)": [1.0] * 8})  # does not count
    out = tmp / "out"
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "ruler.py"), str(tmp / "a"), str(tmp / "b"), str(tmp / "c"),
                        "--out-dir", str(out), "--resamples", "500"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return pd.read_csv(out / "suite.csv"), pd.read_csv(out / "leaderboard.csv"), r.stdout


def test_suite_table_counts_cells_by_the_exact_score(tables):
    suite, _, _ = tables
    exact = suite[suite.cache == "exact"].set_index("kind")
    assert exact.loc["niah_multivalue", "score"] == pytest.approx(7.5 / 8)
    assert exact.loc["niah_multivalue", "correct"] == 7  # all-of accuracy beside the partial-credit score
    assert list(exact.counts) == [1, 1, 0]
    h2o = suite[suite.cache == "h2o(memory=0.5)"].set_index("kind")
    assert h2o.loc["niah_single", "accuracy"] == 0.5 and h2o.loc["niah_single", "memory"] == 0.5
    assert 0.2 < h2o.loc["niah_single", "wilson_low"] < 0.5 < h2o.loc["niah_single", "wilson_high"] < 0.8


def test_leaderboard_averages_only_counting_kinds(tables):
    _, board, _ = tables
    h2o = board[board.cache == "h2o(memory=0.5)"].iloc[0]
    assert h2o.kinds == 2 and h2o.kind_names == "niah_multivalue niah_single"
    assert h2o.score == pytest.approx((0.5 + 0.5) / 2)
    assert h2o.score != pytest.approx((0.5 + 0.5 + 1.0) / 3)  # what counting common_words would give
    assert h2o.low < h2o.score < h2o.high and h2o.high - h2o.low < 0.5
    exact = board[board.cache == "exact"].iloc[0]
    assert exact.score == pytest.approx((1 + 7.5 / 8) / 2)


def test_wide_board_puts_memories_side_by_side(tmp_path):
    """board_wide.csv: one row per policy entry (its memory setting dropped from the label), one column
    per memory, sorted by the mean over memories; a second setting of a policy stays its own row."""
    scores = {"exact": [1] * 4, "h2o(memory=0.25)": [0, 0, 0, 1], "h2o(memory=0.5)": [1, 1, 0, 0],
              "kivi(bits=4,memory=0.5)": [1] * 4, "kivi(bits=2,memory=0.5)": [0] * 4}
    write_run(tmp_path / "a", "niah_single", scores)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "ruler.py"), str(tmp_path / "a"), "--out-dir", str(out),
                        "--resamples", "200"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wide = pd.read_csv(out / "board_wide.csv")
    assert list(wide.entry) == ["kivi(bits=4)", "h2o", "kivi(bits=2)"]  # by mean score, exact apart
    h2o = wide.set_index("entry").loc["h2o"]
    assert h2o.mean_score == pytest.approx((0.25 + 0.5) / 2)
    assert h2o["memory_0.25"].startswith("0.25 [") and h2o["memory_0.5"].startswith("0.50 [")
    assert wide.set_index("entry").loc["kivi(bits=4)", "memory_0.25"] != wide.set_index("entry").loc["kivi(bits=4)", "memory_0.25"]  # NaN: no 0.25 run


def test_link_table_ranks_a_predictive_metric_above_noise(tmp_path):
    """needle_kept_share separates right from wrong answers (AUC 1, also leaving a policy out); rel_err
    is noise drawn independently of the answer (AUC near 0.5: the negative control)."""
    import numpy as np
    rng = np.random.default_rng(3)
    n = 60
    right = rng.integers(0, 2, size=(2, n))
    metrics = {}
    for p, label in enumerate(["h2o(memory=0.5)", "sink(memory=0.5)"]):
        share = np.where(right[p] == 1, rng.uniform(0.7, 1.0, n), rng.uniform(0.0, 0.6, n))
        metrics[label] = {"needle_kept_share": share, "rel_err": 10 ** rng.uniform(-2, 0, n), "kept_mass": rng.uniform(0, 1, n)}
    write_run(tmp_path / "a", "niah_single", {"exact": [1] * n, "h2o(memory=0.5)": right[0].astype(float),
                                              "sink(memory=0.5)": right[1].astype(float)}, metrics)
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "ruler.py"), str(tmp_path / "a"), "--out-dir", str(tmp_path / "o"),
                        "--resamples", "200"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    link = pd.read_csv(tmp_path / "o" / "link.csv").set_index("predictor")
    assert link.loc["needle_kept_share", "trials"] == 2 * n and link.loc["needle_kept_share", "policies"] == 2
    assert link.loc["needle_kept_share", "auc"] == 1 and link.loc["needle_kept_share", "auc_leave_one_policy_out"] == 1
    assert link.loc["needle_kept_share", "mcfadden_r2"] > 0.5
    assert abs(link.loc["log10 rel_err", "auc"] - 0.5) < 0.15
    assert link.loc["log10 rel_err", "mcfadden_r2"] < 0.05


def test_link_table_with_one_policy_has_no_held_out_fit(tmp_path):
    """One policy's run (e.g. a re-measured entry alone): the leave-one-policy-out fit has nothing to train
    on, so its AUC is left empty instead of failing (it crashed on an empty training set before)."""
    import numpy as np
    rng = np.random.default_rng(5)
    n = 40
    right = rng.integers(0, 2, n)
    share = np.where(right == 1, rng.uniform(0.7, 1.0, n), rng.uniform(0.0, 0.6, n))
    write_run(tmp_path / "a", "niah_single", {"exact": [1] * n, "h2o(memory=0.5)": list(right)},
              {"h2o(memory=0.5)": {"needle_kept_share": share}})
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "ruler.py"), str(tmp_path / "a"), "--out-dir", str(out),
                        "--resamples", "200"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    link = pd.read_csv(out / "link.csv").set_index("predictor")
    row = link.loc["needle_kept_share"]
    assert row.auc > 0.9 and np.isnan(row.auc_leave_one_policy_out)
