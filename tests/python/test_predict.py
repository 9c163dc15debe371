"""plots/predict.py (docs/results.md, "Can attention error predict the answer?") on synthetic `kvsim task`
folders whose law is known: each (policy, memory) has a quality q, a trial answers with probability
1/(1 + exp(-10 (q - 0.5))), and the open-loop run's topk_kept over the retrieval heads is q plus noise.
That score must rank the policies as their accuracy ranks them, out of sample; rel_err, drawn
independently of the answers, must not (the negative control). The answers' trials.csv has no offline
columns: they come from open_loop.csv by (kind, length, depth, trial, cache), and --replace swaps a
policy's rows."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
import kvsim  # noqa: E402
from kvsim import tasks  # noqa: E402

QUALITY = {"h2o": [0.2, 0.45, 0.7], "snapkv": [0.3, 0.55, 0.8], "window": [0.1, 0.35, 0.6], "quest": [0.5, 0.75, 0.95]}
MEMORY = [0.25, 0.5, 0.75]
NEW_QUALITY = [0.4, 0.6, 0.9]
SCORE = "topk_kept, retrieval heads"  # the synthetic law's informative score (the default is rel_err's)


def write(tmp):
    rng = np.random.default_rng(11)
    ans, ol = [], []
    for kind, trial in [(k, i) for k in ("niah_single", "niah_multikey") for i in range(30)]:
        base = dict(kind=kind, length=1024, depth=0.5, trial=trial, needle_depth=0.5, needle_begin=10, needle_end=20,
                    question_begin=1000, answer="x", evidence="10-20", model="m", seconds=1, cache_tokens=100)
        ans.append({**base, "cache": "exact", "policy": "exact", "correct": 1, "score": 1, "generated": "x"})
        for pol, qs in QUALITY.items():
            for m, q in zip(MEMORY, qs):
                cache = f"{pol}(memory={m})"
                ok = int(rng.uniform() < 1 / (1 + np.exp(-10 * (q - 0.5))))
                ans.append({**base, "cache": cache, "policy": pol, "correct": ok, "score": ok, "generated": "x" if ok else "y",
                            "rel_err": np.nan, "topk_kept_rheads": np.nan})
                ol.append({**base, "cache": cache, "policy": pol, "correct": -1, "score": np.nan, "generated": "",
                           "rel_err": rng.uniform(0.05, 0.5), "topk_kept_rheads": float(np.clip(q + rng.normal(0, 0.05), 0, 1)),
                           "needle_kept_share": float(np.clip(q + rng.normal(0, 0.02), 0, 1))})
    (tmp / "answers").mkdir()
    (tmp / "open").mkdir()
    pd.DataFrame(ans).to_csv(tmp / "answers" / "trials.csv", index=False, na_rep="nan")
    pd.DataFrame(ol).to_csv(tmp / "open" / "open_loop.csv", index=False, na_rep="nan")
    # --new: a policy that never ran in the closed loop, open loop only.
    new = []
    for kind, trial in [(k, i) for k in ("niah_single", "niah_multikey") for i in range(30)]:
        for m, q in zip(MEMORY, NEW_QUALITY):
            new.append(dict(kind=kind, length=1024, depth=0.5, trial=trial, cache=f"tova(memory={m})", policy="tova", correct=-1, model="m",
                            rel_err=rng.uniform(0.05, 0.5), topk_kept_rheads=float(np.clip(q + rng.normal(0, 0.05), 0, 1))))
    (tmp / "new").mkdir()
    pd.DataFrame(new).to_csv(tmp / "new" / "open_loop.csv", index=False, na_rep="nan")
    # --replace: window re-measured, now answering every trial.
    rep = [r for r in ans if r["policy"] in ("exact", "window")]
    (tmp / "replace").mkdir()
    pd.DataFrame([{**r, "correct": 1, "score": 1, "generated": "x"} for r in rep]).to_csv(
        tmp / "replace" / "trials.csv", index=False, na_rep="nan")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict")
    write(tmp)
    subprocess.run([sys.executable, str(ROOT / "plots" / "predict.py"), "--answers", str(tmp / "answers"), "--open-loop",
                    str(tmp / "open"), "--out-dir", str(tmp / "out"), "--new", str(tmp / "new"), "--score", SCORE], check=True, capture_output=True)
    p = pd.read_csv(tmp / "out" / "predict.csv")
    assert set(p.held_out) == {"policy", "kind"}  # two kinds, one length, one model: nothing else to hold out
    return tmp, p.set_index("score")


def test_an_informative_score_ranks_policies_out_of_sample(run):
    _, p = run
    s = p[p.held_out == "policy"].loc["topk_kept, retrieval heads"]
    assert s.trials == 60 * 12 and s.policies == 4  # joined from open_loop.csv: the answers have no such column
    assert s.auc_out > 0.75 and s.cells == 6 and s.rho_mean > 0.8, s
    assert s.brier_out < 0.2
    assert s.coverage >= 0.7 and s.policy_cells == 24  # 4 policies x 3 memories x 2 kinds; the law is the fit's form
    k = p[p.held_out == "kind"].loc["topk_kept, retrieval heads"]  # the other kind's fit predicts this one
    assert k.groups == 2 and k.auc_out > 0.75 and k.rho_mean > 0.8, k


def test_an_uninformative_score_does_not(run):
    _, p = run
    s = p[p.held_out == "policy"].loc["log10 rel_err"]  # drawn independently of the answers
    # Held out, a score that carries nothing predicts each policy the other policies' base rate, so a
    # better policy is predicted worse: the ranking inverts (rho -> -1) and the pooled AUC drops below
    # 0.5. Either way it must not pass for a predictor.
    assert s.auc_out < 0.6 and s.rho_mean < 0.5, s
    assert s.coverage < 0.7  # nor do its intervals hold the actual accuracies
    # a score no row has is reported with its trial count only
    assert p[p.held_out == "policy"].loc["kept_mass"].trials == 0


def test_reliability_bins_cover_every_held_out_prediction(run):
    tmp, _ = run
    assert (tmp / "out" / "predict.png").stat().st_size > 10000
    c = pd.read_csv(tmp / "out" / "cells.csv")
    c = c[(c.score == "topk_kept, retrieval heads") & (c.held_out == "policy")]
    assert len(c) == 24 and (c.low <= c.predicted).all() and (c.predicted <= c.high).all() and c.trials.sum() == 720
    r = pd.read_csv(tmp / "out" / "reliability.csv")
    s = r[(r.score == "topk_kept, retrieval heads") & (r.held_out == "policy")]
    assert s.trials.sum() == 60 * 12 and ((s.predicted >= 0) & (s.predicted <= 1)).all()
    # well-specified law: the observed rate rises with the predicted one
    assert np.corrcoef(s.predicted, s.observed)[0, 1] > 0.8


def test_replace_swaps_a_policys_rows(run):
    tmp, _ = run
    answers = tasks.load([str(tmp / "answers")])
    t = tasks.combine(answers, tasks.load([str(tmp / "replace")]), tasks.load_open_loop([str(tmp / "open")]))
    assert len(t) == 60 * 12
    assert t[t.policy == "window"].correct.mean() == 1 and t[t.policy == "h2o"].correct.mean() < 1
    assert np.isfinite(t.topk_kept_rheads).all()


def test_a_new_policy_is_screened_from_its_open_loop_alone(run):
    tmp, _ = run
    s = pd.read_csv(tmp / "out" / "screened.csv")
    assert set(s.policy) == {"tova"} and len(s) == 6 and (s.trials == 30).all()
    for _, r in s.iterrows():  # the law's accuracy at the new policy's quality lies in the interval
        q = NEW_QUALITY[MEMORY.index(r.memory)]
        truth = 1 / (1 + np.exp(-10 * (q - 0.5)))
        assert r.low - 0.05 <= truth <= r.high + 0.05, (r, truth)
    by_memory = s.groupby("memory").predicted.mean()
    assert by_memory.is_monotonic_increasing


def test_link_steps_are_reported_and_runs_of_both_are_refused(run, tmp_path):
    tmp, p = run
    assert set(p.link_steps) == {"question"}  # runs without the column are the question's steps
    ol = pd.read_csv(tmp / "open" / "open_loop.csv")
    (tmp_path / "ans").mkdir()
    (tmp_path / "q").mkdir()
    ol.assign(link_steps="answer").to_csv(tmp_path / "ans" / "open_loop.csv", index=False, na_rep="nan")
    ol.assign(link_steps="question").to_csv(tmp_path / "q" / "open_loop.csv", index=False, na_rep="nan")
    out = subprocess.run([sys.executable, str(ROOT / "plots" / "predict.py"), "--answers", str(tmp / "answers"), "--open-loop",
                          str(tmp_path / "ans"), "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert out.returncode == 0 and set(pd.read_csv(tmp_path / "out" / "predict.csv").link_steps) == {"answer"}
    # negative controls: the question's and the answer's steps mixed in one fit, or a screen at other steps
    mixed = subprocess.run([sys.executable, str(ROOT / "plots" / "predict.py"), "--answers", str(tmp / "answers"), "--open-loop",
                            str(tmp_path / "ans"), str(tmp_path / "q"), "--out-dir", str(tmp_path / "out2")], capture_output=True, text=True)
    assert mixed.returncode != 0 and "mix link_steps (answer, question)" in mixed.stderr
    other = subprocess.run([sys.executable, str(ROOT / "plots" / "predict.py"), "--answers", str(tmp / "answers"), "--open-loop",
                            str(tmp_path / "ans"), "--new", str(tmp / "new"), "--out-dir", str(tmp_path / "out3")], capture_output=True, text=True)
    assert other.returncode != 0 and "screen at the same steps" in other.stderr


def test_predict_accuracy_is_the_scripts_screen(run):
    tmp, _ = run
    s = kvsim.predict_accuracy([str(tmp / "answers")], [str(tmp / "open")], [str(tmp / "new")], score=SCORE)
    cli = pd.read_csv(tmp / "out" / "screened.csv")
    assert len(s) == len(cli) == 6
    assert np.allclose(s.predicted.to_numpy(), cli.predicted.to_numpy()) and np.allclose(s.high.to_numpy(), cli.high.to_numpy())
    # frames work as folders do; an unknown score and a screen without answered trials are kvsim.Error
    frames = kvsim.predict_accuracy(tasks.load([str(tmp / "answers")]), tasks.load_open_loop([str(tmp / "open")]),
                                    tasks.load_open_loop([str(tmp / "new")]), score=SCORE)
    assert np.allclose(frames.predicted.to_numpy(), s.predicted.to_numpy())
    with pytest.raises(kvsim.Error, match="is not one of"):
        kvsim.predict_accuracy([str(tmp / "answers")], [str(tmp / "open")], [str(tmp / "new")], score="attention")
    with pytest.raises(kvsim.Error, match="not found"):
        kvsim.predict_accuracy([str(tmp / "nowhere")], None, [str(tmp / "new")])


def test_a_partial_open_loop_scores_only_its_trials(run):
    tmp, _ = run
    answers = tasks.load([str(tmp / "answers")])
    answers["rel_err"] = 0.1  # the answers' own open-loop values (e.g. of the question's steps) must not leak in
    ol = tasks.load_open_loop([str(tmp / "open")])
    part = ol[ol.trial < 10]
    t = tasks.combine(answers, None, part)
    assert np.isfinite(t.rel_err).sum() == 2 * 10 * 12 and (t[t.trial >= 10].rel_err.isna()).all()
    assert not (t.rel_err == 0.1).any()
    # negative control: without an open loop the answers' own columns are the scores
    assert (tasks.combine(answers, None, None).rel_err == 0.1).all()


def test_two_models_with_the_same_prompts_stay_apart(run, tmp_path):
    tmp, _ = run
    # A second model on the same trials and cache labels (the same seed poses the same prompts), run as a
    # full run: its trials.csv serves as its own open loop. Its rows must neither replace the first
    # model's nor pool with them in a ranking cell.
    ans = pd.read_csv(tmp / "answers" / "trials.csv")
    ol = pd.read_csv(tmp / "open" / "open_loop.csv")
    full = ans.drop(columns=["rel_err", "topk_kept_rheads"]).merge(
        ol[["kind", "length", "depth", "trial", "cache", "rel_err", "topk_kept_rheads", "needle_kept_share"]], how="left")
    (tmp_path / "m2").mkdir()
    full.assign(model="m2").to_csv(tmp_path / "m2" / "trials.csv", index=False, na_rep="nan")
    answers = tasks.load([str(tmp / "answers"), str(tmp_path / "m2")])
    o = tasks.load_open_loop([str(tmp / "open"), str(tmp_path / "m2")])
    t = tasks.combine(answers, None, o)
    assert len(t) == 2 * 60 * 12 and set(t.model) == {"m", "m2"} and np.isfinite(t.topk_kept_rheads).all()
    p, ranking, _, cells = tasks.score_table(answers, o)
    assert set(ranking.model) == {"m", "m2"} and len(cells[(cells.score == "topk_kept, retrieval heads")
                                                         & (cells.held_out == "policy")]) == 2 * 24
    assert (p[p.held_out == "model"].groups == 2).all()  # and the model split now holds one out


def test_check_compares_a_screen_with_the_closed_loop_run_afterwards(run, tmp_path):
    tmp, _ = run
    rng = np.random.default_rng(5)
    new = pd.read_csv(tmp / "new" / "open_loop.csv")
    rows = []
    for _, r in new.iterrows():
        q = NEW_QUALITY[MEMORY.index(float(r.cache.split("=")[1].rstrip(")")))]
        ok = int(rng.uniform() < 1 / (1 + np.exp(-10 * (q - 0.5))))
        rows.append(dict(kind=r.kind, length=1024, depth=0.5, trial=r.trial, cache=r.cache, policy="tova", correct=ok, model="m"))
    exact = [dict(kind=k, length=1024, depth=0.5, trial=i, cache="exact", policy="exact", correct=1, model="m")
             for k in ("niah_single", "niah_multikey") for i in range(30)]
    (tmp_path / "check").mkdir()
    pd.DataFrame(exact + rows).to_csv(tmp_path / "check" / "trials.csv", index=False)
    s = kvsim.predict_accuracy([str(tmp / "answers")], [str(tmp / "open")], [str(tmp / "new")], score=SCORE,
                               check=[str(tmp_path / "check")])
    assert s.actual.notna().all() and s.covered.sum() >= 5, s
    # negative control: a closed loop that never answers lies outside the high-quality cells' intervals
    (tmp_path / "wrong").mkdir()
    pd.DataFrame(exact + [{**r, "correct": 0} for r in rows]).to_csv(tmp_path / "wrong" / "trials.csv", index=False)
    w = kvsim.predict_accuracy([str(tmp / "answers")], [str(tmp / "open")], [str(tmp / "new")], score=SCORE,
                               check=[str(tmp_path / "wrong")])
    assert not w[w.memory == 0.75].covered.any() and (w.actual == 0).all()
