#!/usr/bin/env python3
"""The RULER suite's tables (docs/tasks.md, "The RULER suite") from `kvsim task` runs.

Usage: .venv/bin/python plots/ruler.py DIR [DIR ...] [--out-dir OUT] [--resamples 2000]

Each DIR is one `kvsim task` run (finished, or unfinished: its checkpointed trials), e.g. the folders
scripts/ruler_suite.sh writes (OUT/KIND_L). Writes into OUT (default results/ruler):
  suite.csv        per (model, kind, L, cache): trials, correct, accuracy with its 95% Wilson interval,
                   score (RULER's mean share of the expected strings found, Hsieh et al. 2024, App. B),
                   the exact cache's score, and counts = 1 where the exact cache scores >= 0.8 (only
                   such cells enter the leaderboard; the others are reported, never averaged);
  leaderboard.csv  per (model, L, policy, memory): the mean score over the kinds that count (as kvpress's
                   leaderboard averages RULER's tasks), with a 95% stratified bootstrap interval (trials
                   resampled within each kind, seeded), the number of kinds averaged, and their names;
  board_wide.csv   the leaderboard as the field prints it: one row per (model, L, policy entry), one
                   column per memory ("0.80 [0.60, 1.00]"), and their mean, sorted by it;
  link.csv         how well each offline metric the open loop records at the question's steps predicts
                   the answer across kinds, policies and lengths (counting cells, policy rows): per
                   predictor (log10 rel_err, log10 eps, kept_mass, needle_kept_share) the trials, the
                   logistic fit's McFadden R^2 and in-sample ROC AUC, and the leave-one-policy-out AUC
                   (each policy's trials predicted by the fit on every other policy's; pooled);
and prints them as markdown tables.
"""
import argparse
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsim  # noqa: E402
from retrieval import auc, load, wilson  # noqa: E402  (the same reader, interval and AUC as the retrieval figures)

COUNTS_AT = 0.8


def suite_table(t):
    """Per (model, kind, length, cache): accuracy with its Wilson interval, mean score, and whether the cell counts."""
    rows = []
    for (model, kind, length, cache), g in t.groupby(["model", "kind", "length", "cache"], sort=False):
        n, k = len(g), int(g.correct.sum())
        lo, hi = wilson(k, n)
        rows.append({"model": model, "kind": kind, "length": length, "cache": cache, "policy": g.policy.iloc[0],
                     "memory": g.memory.iloc[0], "trials": n, "correct": k, "accuracy": k / n, "wilson_low": lo,
                     "wilson_high": hi, "score": g.score.mean()})
    s = pd.DataFrame(rows)
    exact = s[s.cache == "exact"].set_index(["model", "kind", "length"]).score.rename("exact_score")
    s = s.join(exact, on=["model", "kind", "length"])
    s["counts"] = (s.exact_score >= COUNTS_AT).astype(int)
    return s


def leaderboard(t, suite, resamples, seed=0):
    """Per (model, length, cache): the mean over counting kinds of the mean score, with a stratified
    bootstrap 95% interval."""
    counting = suite[suite.counts == 1][["model", "kind", "length"]].drop_duplicates()
    t = t.merge(counting, on=["model", "kind", "length"])
    rng = np.random.default_rng(seed)
    rows = []
    for (model, length, cache), g in t.groupby(["model", "length", "cache"], sort=False):
        per_kind = [k.score.to_numpy(float) for _, k in g.groupby("kind", sort=True)]
        kinds = sorted(g.kind.unique())
        boot = np.zeros(resamples)
        for s in per_kind:
            boot += s[rng.integers(0, len(s), size=(resamples, len(s)))].mean(axis=1)
        boot /= len(per_kind)
        rows.append({"model": model, "length": length, "cache": cache, "policy": g.policy.iloc[0],
                     "memory": g.memory.iloc[0], "kinds": len(kinds), "score": float(np.mean([s.mean() for s in per_kind])),
                     "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975)),
                     "kind_names": " ".join(kinds)})
    return pd.DataFrame(rows)


def entry_of(cache):
    """A cache label without its memory setting: "kivi(bits=4,memory=0.25)" -> "kivi(bits=4)"."""
    if "(" not in cache:
        return cache
    name, args = cache[:-1].split("(", 1)
    rest = [a for a in args.split(",") if not a.startswith("memory=")]
    return f"{name}({','.join(rest)})" if rest else name


def board_wide(board):
    """The leaderboard pivoted: per (model, length, entry), the score [interval] at each memory and the
    mean of the scores over the memories the entry has (the controls, at no memory, apart)."""
    b = board[np.isfinite(board.memory.astype(float))].copy()
    if b.empty:
        return pd.DataFrame()
    b["entry"] = b.cache.map(entry_of)
    rows = []
    for (model, length, entry), g in b.groupby(["model", "length", "entry"], sort=False):
        row = {"model": model, "length": length, "entry": entry, "mean_score": g.score.mean()}
        for _, r in g.iterrows():
            row[f"memory_{r.memory:g}"] = f"{r.score:.2f} [{r.low:.2f}, {r.high:.2f}]"
        rows.append(row)
    w = pd.DataFrame(rows).sort_values(["model", "length", "mean_score"], ascending=[True, True, False], kind="stable")
    return w[["model", "length", "entry"] + sorted(c for c in w.columns if c.startswith("memory_")) + ["mean_score"]]


PREDICTORS = (("log10 rel_err", "rel_err", True), ("log10 eps", "eps", True), ("kept_mass", "kept_mass", False),
              ("needle_kept_share", "needle_kept_share", False))


def link_table(t, suite):
    """Per predictor: McFadden R^2, in-sample AUC and leave-one-policy-out AUC of `correct`, over the
    policy rows of counting cells with the predictor finite."""
    import statsmodels.api as sm
    counting = suite[suite.counts == 1][["model", "kind", "length"]].drop_duplicates()
    p = t.merge(counting, on=["model", "kind", "length"])
    p = p[~p.cache.isin(["exact", "evict_needle"])]
    rows = []
    for name, col, log in PREDICTORS:
        if col not in p.columns:
            continue
        g = p[np.isfinite(p[col].astype(float)) & ((p[col] > 0) if log else True)]
        y = g.correct.to_numpy(int)
        if len(g) < 10 or y.min() == y.max():
            rows.append({"predictor": name, "trials": len(g), "policies": g.policy.nunique()})
            continue
        x = np.log10(g[col].to_numpy(float)) if log else g[col].to_numpy(float)
        fit = sm.Logit(y, sm.add_constant(x)).fit(disp=0, warn_convergence=False)
        sign = np.sign(fit.params[1]) or 1.0
        held = np.full(len(g), np.nan)
        pol = g.policy.to_numpy()
        for q in np.unique(pol):
            train = pol != q
            if not train.any() or y[train].min() == y[train].max():  # one policy only: nothing to fit on
                continue
            f = sm.Logit(y[train], sm.add_constant(x[train])).fit(disp=0, warn_convergence=False)
            held[~train] = f.params[0] + f.params[1] * x[~train]
        ok = np.isfinite(held)
        rows.append({"predictor": name, "trials": len(g), "policies": len(np.unique(pol)),
                     "mcfadden_r2": float(fit.prsquared), "auc": auc(sign * x, y),
                     "auc_leave_one_policy_out": auc(held[ok], y[ok]) if ok.any() else np.nan})
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out-dir", default=os.path.join("results", "ruler"))
    ap.add_argument("--resamples", type=int, default=2000)
    a = ap.parse_args(argv)
    if a.resamples < 100:
        sys.exit("error: --resamples must be >= 100")
    t = load(a.dirs)
    if "score" not in t.columns:  # runs from before the suite: one expected string, so score = correct
        t["score"] = t.correct.astype(float)
    t["score"] = t.score.fillna(t.correct.astype(float))
    os.makedirs(a.out_dir, exist_ok=True)
    suite = suite_table(t)
    suite.to_csv(os.path.join(a.out_dir, "suite.csv"), index=False, float_format="%.6g")
    board = leaderboard(t, suite, a.resamples)
    board.to_csv(os.path.join(a.out_dir, "leaderboard.csv"), index=False, float_format="%.6g")
    print("| model | kind | L | exact: accuracy [95% Wilson] | exact score | counts |\n|---|---|---:|---|---:|:-:|")
    for _, r in suite[suite.cache == "exact"].iterrows():
        print(f"| {r.model} | {r.kind} | {r.length} | {r.correct}/{r.trials} = {r.accuracy:.2f} "
              f"[{r.wilson_low:.2f}, {r.wilson_high:.2f}] | {r.score:.3f} | {'yes' if r.counts else 'no'} |")
    if len(board):
        print("\n| model | L | cache | kinds | mean score [95% bootstrap] |\n|---|---:|---|---:|---|")
        for _, r in board.iterrows():
            print(f"| {r.model} | {r.length} | {r.cache} | {r.kinds} | {r.score:.3f} [{r.low:.3f}, {r.high:.3f}] |")
        wide = board_wide(board)
        wide.to_csv(os.path.join(a.out_dir, "board_wide.csv"), index=False, float_format="%.4g")
        if len(wide):
            mems = [c for c in wide.columns if c.startswith("memory_")]
            print("\n| model | L | policy | " + " | ".join(m.replace("memory_", "memory ") for m in mems) + " | mean |")
            print("|---|---:|---|" + "---|" * len(mems) + "---:|")
            for _, r in wide.iterrows():
                cells = " | ".join(r[m] if isinstance(r[m], str) else "—" for m in mems)
                print(f"| {r.model} | {r.length} | {r.entry} | {cells} | {r.mean_score:.3f} |")
    else:
        print("\nno (kind, L) cell counts: the exact cache scores below 0.8 everywhere")
    link = link_table(t, suite)
    link.to_csv(os.path.join(a.out_dir, "link.csv"), index=False, float_format="%.6g")
    if "auc" in link.columns:
        print("\n| predictor | trials | policies | McFadden R² | AUC | AUC, leave one policy out |\n|---|---:|---:|---:|---:|---:|")
        for _, r in link.iterrows():
            print(f"| {r.predictor} | {r.trials} | {r.policies} | {r.mcfadden_r2:.3f} | {r.auc:.3f} | {r.auc_leave_one_policy_out:.3f} |")
    print(f"wrote {a.out_dir}/suite.csv, leaderboard.csv, board_wide.csv and link.csv")


if __name__ == "__main__":
    try:
        main()
    except kvsim.Error as e:
        sys.exit(f"error: {e}")
