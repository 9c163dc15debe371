#!/usr/bin/env python3
"""Can an offline score predict the answer? (docs/results.md, "Can attention error predict the answer?")

Usage: .venv/bin/python plots/predict.py --answers DIR [DIR ...] --open-loop DIR [DIR ...]
                                          [--replace DIR ...] [--out-dir OUT] [--new DIR ... [--score NAME]]

--answers: `kvsim task` runs (trials.csv, or an unfinished run's checkpoints): whether each cache answered.
--open-loop: `kvsim task --open-loop` runs of the same configs (open_loop.csv): the offline scores of the
    same (kind, length, depth, trial, cache), computed from the recording and the replay alone. Their
    columns replace the answers' open-loop columns (runs made before the offline scores have none). The
    runs must share one `[task] link_steps` (the question's or the answer's steps; predict.csv's column).
--replace: later runs whose rows replace the answers' rows of the same (kind, length, depth, trial, cache)
    (e.g. a policy re-measured after a fix).
--new: `kvsim task --open-loop` runs of policies to screen without a closed loop: `--score`'s fit on every
    answered trial predicts their accuracy per (policy, kind, length, memory), with a 95% prediction
    interval (OUT/screened.csv).

Only policy rows of counting cells (the exact cache answers >= 80%) enter. For each candidate score
(log10 rel_err, log10 eps, kept_mass, topk_kept, each over the retrieval heads and at the worst layer) and
the needle's kept share (an upper reference: it needs the needle's position), a logistic fit of the answer
on the score gives:
  in sample       McFadden R^2 and ROC AUC;
  out of sample   leave one policy out (and, where the runs hold more than one, one task kind, one length,
                  one model): each group's trials predicted by the fit on every other group's;
                  the pooled AUC and Brier score of those predictions, and the ranking test: per (kind,
                  length, memory) cell the Spearman correlation between the policies' mean predicted
                  probability and their actual accuracy (the question a screening run asks: which policy
                  answers more?), its mean over cells and the share of cells with rho >= 0.8; and the
                  coverage: the share of (policy, kind, length, memory) cells whose actual accuracy falls
                  in the 95% prediction interval of the held-out predictions (prediction_cells).
Writes OUT/predict.csv (one row per score and split), OUT/ranking.csv (one row per score, split and cell),
OUT/reliability.csv (per score and split, the held-out predictions in ten bins against the observed rate),
OUT/cells.csv (per score, split and (policy, kind, length, memory): actual and predicted accuracy with the
95% prediction interval) and OUT/predict.png (figure()), and prints predict.csv as a markdown table.
"""
import argparse
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvsim_results import parse_params  # noqa: E402
from retrieval import auc, load, load_unfinished  # noqa: E402

KEYS = ["kind", "length", "depth", "trial", "cache"]
OPEN_LOOP = ["rel_err", "eps", "kept_mass", "needle_kept_share", "topk_kept", "rel_err_rheads", "kept_mass_rheads",
             "topk_kept_rheads", "rel_err_worst_layer", "kept_mass_worst_layer", "topk_kept_worst_layer"]
# (name, column, log10?): the candidates (no needle position), then the upper reference.
SCORES = (("log10 rel_err", "rel_err", True), ("log10 eps", "eps", True), ("kept_mass", "kept_mass", False),
          ("topk_kept", "topk_kept", False), ("log10 rel_err, retrieval heads", "rel_err_rheads", True),
          ("kept_mass, retrieval heads", "kept_mass_rheads", False), ("topk_kept, retrieval heads", "topk_kept_rheads", False),
          ("log10 rel_err, worst layer", "rel_err_worst_layer", True), ("kept_mass, worst layer", "kept_mass_worst_layer", False),
          ("topk_kept, worst layer", "topk_kept_worst_layer", False), ("needle_kept_share (reference)", "needle_kept_share", False))


def load_open_loop(dirs, what="--open-loop"):
    """Every folder's open_loop.csv (or its checkpoints so far) as one DataFrame; folders of other
    link_steps than the first are refused (link_mode)."""
    frames = []
    for d in dirs:
        path = os.path.join(d, "open_loop.csv")
        if os.path.exists(path):
            frames.append(pd.read_csv(path, keep_default_na=False, na_values=["nan"]))
            continue
        part = load_unfinished(d)
        if part is None:
            sys.exit(f"error: {path} not found (run `kvsim task CONFIG --open-loop --out {d}` first)")
        frames.append(part)
    o = pd.concat(frames, ignore_index=True)
    link_mode(o, what)
    return o.drop_duplicates(KEYS, keep="last")[KEYS + [c for c in ["policy", "link_steps"] + OPEN_LOOP if c in o.columns]]


def link_mode(frame, what):
    """The one `[task] link_steps` of a set of runs (runs written before the column are "question");
    runs that mix the question's and the answer's steps are refused."""
    steps = frame["link_steps"].replace("", np.nan).fillna("question") if "link_steps" in frame.columns else pd.Series(["question"])
    modes = sorted(set(steps))
    if len(modes) > 1:
        sys.exit(f"error: the {what} runs mix link_steps ({', '.join(modes)}); give runs of one")
    return modes[0]


def combine(answers, replace, open_loop):
    """The answers' policy rows (with --replace's rows instead of theirs) of counting cells, their open-loop
    columns taken from `open_loop` where it has the row."""
    t = answers
    if replace is not None:
        r = replace[~replace.cache.isin(["exact", "evict_needle"])]
        t = pd.concat([t.merge(r[KEYS], on=KEYS, how="left", indicator=True).query("_merge == 'left_only'").drop(columns="_merge"),
                       r.drop(columns="exact_acc", errors="ignore").merge(t[["kind", "length", "exact_acc"]].drop_duplicates(),
                                                                          on=["kind", "length"])], ignore_index=True)
    t = t[~t.cache.isin(["exact", "evict_needle"]) & (t.exact_acc >= 0.8)].copy()
    if open_loop is not None:
        o = open_loop.drop(columns=["policy", "link_steps"], errors="ignore").set_index(KEYS)
        idx = pd.MultiIndex.from_frame(t[KEYS])
        have = idx.isin(o.index)
        for c in o.columns:
            vals = t[c].to_numpy(float) if c in t.columns else np.full(len(t), np.nan)
            vals[have] = o.loc[idx[have], c].to_numpy(float)
            t[c] = vals
    return t.reset_index(drop=True)


def logit_fit(x, y):
    import statsmodels.api as sm
    return sm.Logit(y, sm.add_constant(x)).fit(disp=0, warn_convergence=False)


def spearman(a, b):
    from scipy.stats import spearmanr
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return np.nan
    return float(spearmanr(a, b).statistic)


SPLITS = ("policy", "kind", "length", "model")


def prediction_cells(c):
    """Per policy of one (kind, length, memory) cell: its trials, actual accuracy, the held-out predicted
    accuracy (the mean of the trials' predicted probabilities) and a 95% prediction interval for the
    accuracy of those n trials if the predictions are right (the trials as independent Bernoulli draws
    with their predicted probabilities: mean ± 1.96 sd of a Poisson-binomial count over n, widened by
    half a trial, the count's step), and whether the actual accuracy falls inside it."""
    rows = []
    for pol, d in c.groupby("policy"):
        p, n = d.held.to_numpy(float), len(d)
        half = 1.96 * np.sqrt(np.sum(p * (1 - p))) / n + 0.5 / n
        lo, hi = max(0.0, p.mean() - half), min(1.0, p.mean() + half)
        actual = d.correct.mean()
        rows.append({"kind": d.kind.iloc[0], "length": d.length.iloc[0], "memory": d.memory.iloc[0], "policy": pol, "trials": n,
                     "actual": actual, "predicted": p.mean(), "low": lo, "high": hi, "covered": bool(lo <= actual <= hi)})
    return pd.DataFrame(rows)


def evaluate(t, name, col, log, split="policy"):
    """One score's row of predict.csv for one out-of-sample split (each value of `split` held out in
    turn and predicted by the fit on the others), its ranking rows and its reliability bins."""
    g = t[np.isfinite(t[col].astype(float)) & ((t[col] > 0) if log else True)] if col in t.columns else t.iloc[:0]
    y = g.correct.to_numpy(int)
    row = {"score": name, "held_out": split, "trials": len(g), "policies": g.policy.nunique(),
           "groups": g[split].nunique() if split in g.columns else 0}
    if len(g) < 10 or y.min() == y.max():
        return row, [], []
    x = np.log10(g[col].to_numpy(float)) if log else g[col].to_numpy(float)
    fit = logit_fit(x, y)
    sign = np.sign(fit.params[1]) or 1.0
    row.update({"mcfadden_r2": float(fit.prsquared), "auc": auc(sign * x, y)})
    if row["groups"] < 2:
        return row, [], []
    held = np.full(len(g), np.nan)
    grp = g[split].to_numpy()
    for q in pd.unique(grp):
        train = grp != q
        if y[train].min() == y[train].max():
            continue
        f = logit_fit(x[train], y[train])
        held[~train] = 1 / (1 + np.exp(-(f.params[0] + f.params[1] * x[~train])))
    ok = np.isfinite(held)
    if not ok.any():
        return row, [], []
    row.update({"auc_out": auc(held[ok], y[ok]), "brier_out": float(np.mean((held[ok] - y[ok]) ** 2))})
    g = g.assign(held=held)
    ranking = []
    for (kind, length, memory), c in g[ok].groupby(["kind", "length", "memory"]):
        per = c.groupby("policy").agg(actual=("correct", "mean"), predicted=("held", "mean"))
        ranking.append({"score": name, "held_out": split, "kind": kind, "length": length, "memory": memory,
                        "policies": len(per), "rho": spearman(per.predicted.to_numpy(), per.actual.to_numpy()),
                        "cells": prediction_cells(c)})
    rho = np.array([r["rho"] for r in ranking], float)
    rho = rho[np.isfinite(rho)]
    cells = pd.concat([r["cells"] for r in ranking], ignore_index=True)
    row.update({"cells": len(rho), "rho_mean": float(rho.mean()) if len(rho) else np.nan,
                "rho_ge_0.8": float((rho >= 0.8).mean()) if len(rho) else np.nan,
                "coverage": float(cells.covered.mean()), "policy_cells": len(cells)})
    for r in ranking:
        r["covered"] = float(cells[(cells.kind == r["kind"]) & (cells.length == r["length"]) & (cells.memory == r["memory"])].covered.mean())
    bins = np.minimum((held[ok] * 10).astype(int), 9)
    reliability = [{"score": name, "held_out": split, "bin": b, "predicted": float(held[ok][bins == b].mean()),
                    "observed": float(y[ok][bins == b].mean()), "trials": int((bins == b).sum())}
                   for b in range(10) if (bins == b).any()]
    return row, ranking, reliability


def figure(p, cells, reliability, path):
    """predict.png: (left) reliability of the held-out predictions (policy held out) for the baseline
    (log10 rel_err), the best candidate score by held-out AUC and the needle-share reference; (right)
    every (policy, kind, length, memory) cell's actual accuracy against the best candidate's predicted
    one, with its 95% prediction interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pol = p[(p.held_out == "policy") & np.isfinite(p.get("auc_out", pd.Series(np.nan, index=p.index)))]
    cand = pol[~pol.score.str.contains("reference")]
    if cand.empty:
        return None
    best = cand.sort_values("auc_out", ascending=False).score.iloc[0]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, style in (("log10 rel_err", "o:"), (best, "s-"), ("needle_kept_share (reference)", "^--")):
        r = reliability[(reliability.score == name) & (reliability.held_out == "policy")]
        if len(r):
            a.plot(r.predicted, r.observed, style, label=name)
    a.plot([0, 1], [0, 1], color="grey", lw=0.8)
    a.set(xlabel="predicted P(answer), policy held out", ylabel="observed rate", title="reliability", xlim=(0, 1), ylim=(0, 1))
    a.legend(fontsize=7)
    c = cells[(cells.score == best) & (cells.held_out == "policy")]
    b.errorbar(c.predicted, c.actual, xerr=[c.predicted - c.low, c.high - c.predicted], fmt="o", ms=3, lw=0.6, alpha=0.7)
    b.plot([0, 1], [0, 1], color="grey", lw=0.8)
    b.set(xlabel=f"predicted accuracy ({best}), policy held out", ylabel="actual accuracy",
          title=f"{len(c)} cells, {c.covered.mean():.0%} inside the 95% interval", xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return best


def predict_new(t, new, score):
    """The `--new` screening: `score`'s logistic fit on every answered trial in `t`, applied to the
    open-loop rows `new` of policies that need not have run in the closed loop; per (policy, kind,
    length, memory) the predicted accuracy and its 95% prediction interval (prediction_cells)."""
    name, col, log = next(x for x in SCORES if x[0] == score)
    g = t[np.isfinite(t[col].astype(float)) & ((t[col] > 0) if log else True)]
    f = logit_fit(np.log10(g[col].to_numpy(float)) if log else g[col].to_numpy(float), g.correct.to_numpy(int))
    n = new[np.isfinite(new[col].astype(float)) & ((new[col] > 0) if log else True)].copy()
    x = np.log10(n[col].to_numpy(float)) if log else n[col].to_numpy(float)
    n["held"] = 1 / (1 + np.exp(-(f.params[0] + f.params[1] * x)))
    n["correct"] = np.nan
    out = pd.concat([prediction_cells(c) for _, c in n.groupby(["kind", "length", "memory"])], ignore_index=True)
    return out.drop(columns=["actual", "covered"]).assign(score=name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", nargs="+", required=True)
    ap.add_argument("--open-loop", nargs="*", default=[])
    ap.add_argument("--replace", nargs="*", default=[])
    ap.add_argument("--out-dir", default="results/predict")
    ap.add_argument("--new", nargs="*", default=[], help="open-loop runs of policies to screen: their accuracy predicted")
    ap.add_argument("--score", default="topk_kept, retrieval heads", help="the score --new predicts with")
    a = ap.parse_args(argv)
    if a.score not in [x[0] for x in SCORES]:
        sys.exit(f"error: --score {a.score!r} is not one of: " + ", ".join(x[0] for x in SCORES))
    answers = load(a.answers)
    replace = load(a.replace) if a.replace else None
    open_loop = load_open_loop(a.open_loop) if a.open_loop else None
    mode = link_mode(open_loop if open_loop is not None else answers, "--open-loop" if a.open_loop else "--answers")
    t = combine(answers, replace, open_loop)
    if t.empty:
        sys.exit("error: no policy trials in counting cells (the exact cache answers < 80% everywhere?)")
    rows, ranking, reliability, cells = [], [], [], []
    for split in SPLITS:
        for name, col, log in SCORES:
            r, k, b = evaluate(t, name, col, log, split)
            if split != "policy" and r.get("groups", 0) < 2:
                continue  # one task, length or model only: nothing to hold out
            rows.append(r)
            for x in k:
                cells.append(x.pop("cells").assign(score=name, held_out=split))
            ranking += k
            reliability += b
    os.makedirs(a.out_dir, exist_ok=True)
    p = pd.DataFrame(rows)
    p["link_steps"] = mode
    p.to_csv(os.path.join(a.out_dir, "predict.csv"), index=False, na_rep="nan")
    pd.DataFrame(ranking).to_csv(os.path.join(a.out_dir, "ranking.csv"), index=False, na_rep="nan")
    pd.DataFrame(reliability).to_csv(os.path.join(a.out_dir, "reliability.csv"), index=False, na_rep="nan")
    cells = pd.concat(cells, ignore_index=True) if cells else pd.DataFrame()
    cells.to_csv(os.path.join(a.out_dir, "cells.csv"), index=False, na_rep="nan")
    best = figure(p, cells, pd.DataFrame(reliability), os.path.join(a.out_dir, "predict.png")) if len(cells) else None
    cols = ["trials", "policies", "groups", "mcfadden_r2", "auc", "auc_out", "brier_out", "cells", "rho_mean", "rho_ge_0.8",
            "coverage"]
    print(f"open-loop scores at the {mode}'s steps (link_steps = {mode})")
    print("| score | held out | " + " | ".join(cols) + " |\n|---|---|" + "---:|" * len(cols))
    for _, r in p.iterrows():
        cells = [f"{r.get(c, np.nan):.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        print(f"| {r['score']} | {r['held_out']} | " + " | ".join(cells) + " |")
    if best:
        print(f"best candidate by held-out AUC (policy held out): {best}")
    if a.new:
        new = load_open_loop(a.new, "--new")
        if link_mode(new, "--new") != mode:
            sys.exit(f"error: the --new runs' link_steps ({link_mode(new, '--new')}) differ from the fit's ({mode}); screen at the same steps")
        inner = new["cache"].str.extract(r"\((.*)\)$")[0].fillna("")
        new["memory"] = [float(parse_params(s).get("memory", "nan")) for s in inner]
        screened = predict_new(t, new, a.score)
        screened.to_csv(os.path.join(a.out_dir, "screened.csv"), index=False, na_rep="nan")
        print(f"\n| policy | kind | L | memory | trials | predicted accuracy [95% prediction interval] ({a.score}) |\n|---|---|---:|---:|---:|---|")
        for _, r in screened.iterrows():
            print(f"| {r.policy} | {r.kind} | {r.length} | {r.memory:g} | {r.trials} | {r.predicted:.2f} [{r.low:.2f}, {r.high:.2f}] |")
        print(f"wrote {a.out_dir}/screened.csv")
    print(f"wrote {a.out_dir}/predict.csv, ranking.csv, reliability.csv, cells.csv" + (" and predict.png" if best else ""))


if __name__ == "__main__":
    main()
