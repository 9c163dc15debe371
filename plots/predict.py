#!/usr/bin/env python3
"""Can an offline score predict the answer? (docs/results.md, "Can attention error predict the answer?")

Usage: .venv/bin/python plots/predict.py --answers DIR [DIR ...] --open-loop DIR [DIR ...]
                                          [--replace DIR ...] [--out-dir OUT] [--new DIR ... [--score NAME] [--check DIR ...]]

--answers: `kvsim task` runs (trials.csv, or an unfinished run's checkpoints): whether each cache answered.
--open-loop: `kvsim task --open-loop` runs of the same configs (open_loop.csv): the offline scores of the
    same (kind, length, depth, trial, cache), computed from the recording and the replay alone. Their
    columns replace the answers' open-loop columns (runs made before the offline scores have none). The
    runs must share one `[task] link_steps` (the question's or the answer's steps; predict.csv's column).
--replace: later runs whose rows replace the answers' rows of the same (kind, length, depth, trial, cache)
    (e.g. a policy re-measured after a fix).
--check: closed-loop runs of the --new policies (made afterwards): each screened cell's actual accuracy and
    whether it falls inside the interval (screened.csv's `actual` and `covered`).
--new: `kvsim task --open-loop` runs of policies to screen without a closed loop: `--score`'s fit on every
    answered trial predicts their accuracy per (policy, model, kind, length, memory), with a 95% prediction
    interval (OUT/screened.csv).

The fits and the screen are kvsim.tasks' (score_table, predict_accuracy); this script writes their tables
and draws the figure. Only policy rows of counting cells (the exact cache answers >= 80%) enter. For each candidate score
(log10 rel_err, log10 eps, kept_mass, topk_kept, each over the retrieval heads and at the worst layer) and
the needle's kept share (an upper reference: it needs the needle's position), a logistic fit of the answer
on the score gives:
  in sample       McFadden R^2 and ROC AUC;
  out of sample   leave one policy out (and, where the runs hold more than one, one task kind, one length,
                  one model): each group's trials predicted by the fit on every other group's;
                  the pooled AUC and Brier score of those predictions, and the ranking test: per (model, kind,
                  length, memory) cell the Spearman correlation between the policies' mean predicted
                  probability and their actual accuracy (the question a screening run asks: which policy
                  answers more?), its mean over cells and the share of cells with rho >= 0.8; and the
                  coverage: the share of (policy, model, kind, length, memory) cells whose actual accuracy falls
                  in the 95% prediction interval of the held-out predictions (prediction_cells).
Writes OUT/predict.csv (one row per score and split), OUT/ranking.csv (one row per score, split and cell),
OUT/reliability.csv (per score and split, the held-out predictions in ten bins against the observed rate),
OUT/cells.csv (per score, split and (policy, model, kind, length, memory): actual and predicted accuracy with the
95% prediction interval) and OUT/predict.png (figure()), and prints predict.csv as a markdown table.
"""
import argparse
import os
import sys

import numpy as np
import pandas as pd

import kvsim
from kvsim import tasks


def figure(p, cells, reliability, path, chosen=None):
    """predict.png: (left) reliability of the held-out predictions (policy held out) for the baseline
    (log10 rel_err), the `chosen` score (None: the best candidate by held-out AUC) and the needle-share
    reference; (right) every (policy, model, kind, length, memory) cell's actual accuracy against the
    chosen score's predicted one, with its 95% prediction interval. Returns the best candidate's name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pol = p[(p.held_out == "policy") & np.isfinite(p.get("auc_out", pd.Series(np.nan, index=p.index)))]
    cand = pol[~pol.score.str.contains("reference")]
    if cand.empty:
        return None
    best = cand.sort_values("auc_out", ascending=False).score.iloc[0]
    shown = chosen if chosen in set(cand.score) else best
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, style in (("log10 rel_err", "o:"), (shown, "s-"), ("needle_kept_share (reference)", "^--")):
        r = reliability[(reliability.score == name) & (reliability.held_out == "policy")]
        if len(r):
            a.plot(r.predicted, r.observed, style, label=name)
    a.plot([0, 1], [0, 1], color="grey", lw=0.8)
    a.set(xlabel="predicted P(answer), policy held out", ylabel="observed rate", title="reliability", xlim=(0, 1), ylim=(0, 1))
    a.legend(fontsize=7)
    c = cells[(cells.score == shown) & (cells.held_out == "policy")]
    b.errorbar(c.predicted, c.actual, xerr=[c.predicted - c.low, c.high - c.predicted], fmt="o", ms=3, lw=0.6, alpha=0.7)
    b.plot([0, 1], [0, 1], color="grey", lw=0.8)
    b.set(xlabel=f"predicted accuracy ({shown}), policy held out", ylabel="actual accuracy",
          title=f"{len(c)} cells, {c.covered.mean():.0%} inside the 95% interval", xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", nargs="+", required=True)
    ap.add_argument("--open-loop", nargs="*", default=[])
    ap.add_argument("--replace", nargs="*", default=[])
    ap.add_argument("--out-dir", default="results/predict")
    ap.add_argument("--new", nargs="*", default=[], help="open-loop runs of policies to screen: their accuracy predicted")
    ap.add_argument("--check", nargs="*", default=[], help="closed-loop runs of the --new policies: their actual accuracy per cell")
    ap.add_argument("--score", default="log10 rel_err, retrieval heads", help="the score --new predicts with (and the figure draws)")
    a = ap.parse_args(argv)
    if a.score not in [x[0] for x in tasks.SCORES]:
        sys.exit(f"error: --score {a.score!r} is not one of: " + ", ".join(x[0] for x in tasks.SCORES))
    try:
        answers = tasks.load(a.answers)
        replace = tasks.load(a.replace) if a.replace else None
        open_loop = tasks.load_open_loop(a.open_loop) if a.open_loop else None
        p, ranking, reliability, cells = tasks.score_table(answers, open_loop, replace)
        screened = tasks.predict_accuracy(answers, open_loop, a.new, a.score, replace, a.check or None) if a.new else None
    except kvsim.Error as e:
        sys.exit(f"error: {e}")
    os.makedirs(a.out_dir, exist_ok=True)
    p.to_csv(os.path.join(a.out_dir, "predict.csv"), index=False, na_rep="nan")
    ranking.to_csv(os.path.join(a.out_dir, "ranking.csv"), index=False, na_rep="nan")
    reliability.to_csv(os.path.join(a.out_dir, "reliability.csv"), index=False, na_rep="nan")
    cells.to_csv(os.path.join(a.out_dir, "cells.csv"), index=False, na_rep="nan")
    best = figure(p, cells, reliability, os.path.join(a.out_dir, "predict.png"), a.score) if len(cells) else None
    cols = ["trials", "policies", "groups", "mcfadden_r2", "auc", "auc_out", "brier_out", "cells", "rho_mean", "rho_ge_0.8",
            "coverage"]
    mode = p.link_steps.iloc[0]
    print(f"open-loop scores at the {mode}'s steps (link_steps = {mode})")
    print("| score | held out | " + " | ".join(cols) + " |\n|---|---|" + "---:|" * len(cols))
    for _, r in p.iterrows():
        vals = [f"{r.get(c, np.nan):.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        print(f"| {r['score']} | {r['held_out']} | " + " | ".join(vals) + " |")
    if best:
        print(f"best candidate by held-out AUC (policy held out): {best}")
    if screened is not None:
        screened.to_csv(os.path.join(a.out_dir, "screened.csv"), index=False, na_rep="nan")
        chk = "actual" in screened.columns
        print(f"\n| policy | model | kind | L | memory | trials | predicted accuracy [95% prediction interval] ({a.score}) |"
              + (" actual | inside |" if chk else "") + "\n|---|---|---|---:|---:|---:|---|" + ("---:|:-:|" if chk else ""))
        for _, r in screened.iterrows():
            print(f"| {r.policy} | {r.model} | {r.kind} | {r.length} | {r.memory:g} | {r.trials} | {r.predicted:.2f} [{r.low:.2f}, {r.high:.2f}] |"
                  + (f" {r.actual:.2f} | {'yes' if r.covered else 'no'} |" if chk else ""))
        if chk:
            print(f"{int(screened.covered.sum())} of {int(screened.actual.notna().sum())} checked cells inside their interval")
        print(f"wrote {a.out_dir}/screened.csv")
    print(f"wrote {a.out_dir}/predict.csv, ranking.csv, reliability.csv, cells.csv" + (" and predict.png" if best else ""))


if __name__ == "__main__":
    main()
