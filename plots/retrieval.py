#!/usr/bin/env python3
"""Retrieval-task figures and the link between open-loop error and answers, from `kvsim task` output.

Usage: .venv/bin/python plots/retrieval.py RESULTS_DIR [RESULTS_DIR ...] [--out-dir DIR]

Folders of the same task and seed run with different policies merge: their shared rows (the exact cache,
the evict_needle control) must agree trial by trial and are counted once.

Reads each folder's trials.csv (one row per trial and cache; docs/tasks.md), or an unfinished run's
checkpointed trials (DIR/trials/), and writes into the first folder (or --out-dir):
  retrieval_heatmaps.png   accuracy per (needle depth, prompt length) for every cache, the
                           needle-in-a-haystack layout (Kamradt 2023), one panel per cache and task;
  retrieval_memory.png     accuracy against memory (a fraction of the prompt) per policy, with 95%
                           Wilson intervals; the exact cache and the evict_needle control as lines;
  retrieval_link.png       success against the needle's kept share (the exact attention mass on the
                           needle that the cache kept, over all of it) and against the open-loop
                           rel_err, with the fitted logistic curves;
  link.csv                 per task and predictor: the logistic fit (statsmodels Logit), McFadden's
                           pseudo-R², the likelihood-ratio p-value, the ROC AUC, and the predictor's
                           value where the fitted accuracy is 50% with a 95% bootstrap interval;
  link_table.csv           the threshold table: accuracy with its Wilson interval per bin of the
                           needle's kept share;
  depth.csv                accuracy per (task, prompt length, policy, needle depth) over all its
                           memory levels, with 95% Wilson intervals: the heatmaps' numbers by policy;
  link_by_policy.csv       per policy: accuracy, the open-loop means (rel_err, kept_mass,
                           needle_kept_share), and the accuracy of its trials with the needle's kept
                           share below and at or above 0.8 (does the same share serve every policy?).
Only (task, L) cells where the exact cache reaches ≥ 80% enter the link (accuracy.csv's `counts`).
PNG and PDF for each figure.
"""
import argparse
import os
import sys

import kvsim_deps  # noqa: F401  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import kvsim
from kvsim.tasks import auc, load, load_unfinished, merge_runs  # noqa: F401  (the readers of `kvsim task` runs)
from kvsim_results import color, save

CONTROLS = ("exact", "evict_needle")
BINS = [0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0001]
BIN_NAMES = ["[0, 0.2)", "[0.2, 0.4)", "[0.4, 0.6)", "[0.6, 0.8)", "[0.8, 0.9)", "[0.9, 1]"]


def wilson(k, n, z=1.959963984540054):
    """95% Wilson score interval of k successes in n (Wilson 1927), as kvsim's accuracy.csv."""
    if n == 0:
        return np.nan, np.nan
    p, z2n = k / n, z * z / n
    centre, half = (p + z2n / 2) / (1 + z2n), z / (1 + z2n) * np.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def heatmaps(t, out_dir):
    caches = list(dict.fromkeys(t.cache))
    kinds = list(dict.fromkeys(t.kind))
    cols = 4
    rows = -(-len(caches) * len(kinds) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    depths, lengths = sorted(t.depth.unique()), sorted(t.length.unique())
    i = 0
    for kind in kinds:
        for cache in caches:
            ax = axes[i // cols][i % cols]
            i += 1
            g = t[(t.kind == kind) & (t.cache == cache)].groupby(["depth", "length"]).correct.mean()
            grid = np.array([[g.get((d, L), np.nan) for L in lengths] for d in depths])
            ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
            for (r, c), v in np.ndenumerate(grid):
                if np.isfinite(v):
                    ax.text(c, r, f"{v:.1f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            ax.set_title(f"{kind}: {cache}", fontsize=7)
            ax.set_xlabel("prompt length L (tokens)", fontsize=7)
            ax.set_ylabel("needle depth", fontsize=7)
    for j in range(i, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("Accuracy per needle depth and prompt length (share of trials answered exactly)", fontsize=9, y=1.01)
    return save(fig, out_dir, None, "retrieval_heatmaps.png")


def accuracy_row(g):
    """A group of trial rows' trials, correct answers, accuracy and 95% Wilson interval, as table columns."""
    k, n = int(g.correct.sum()), len(g)
    lo, hi = wilson(k, n)
    return {"trials": n, "correct": k, "accuracy": k / n, "wilson_low": lo, "wilson_high": hi}


def depth_table(t, out_dir):
    """Accuracy per (kind, length, policy, depth), pooling the policy's memory levels; the exact cache
    and the evict_needle control appear as their own policies. Writes depth.csv and returns it."""
    rows = []
    for (kind, length, policy, depth), g in t.groupby(["kind", "length", "policy", "depth"], sort=False):
        rows.append({"kind": kind, "length": length, "policy": policy, "depth": depth, **accuracy_row(g)})
    d = pd.DataFrame(rows).sort_values(["kind", "length", "policy", "depth"], kind="stable")
    d.to_csv(os.path.join(out_dir, "depth.csv"), index=False, float_format="%.4g")
    return d


def memory_figure(t, out_dir):
    cells = list(t.groupby(["kind", "length"]).groups)
    fig, axes = plt.subplots(1, len(cells), figsize=(5.2 * len(cells), 3.6), squeeze=False)
    for ax, (kind, L) in zip(axes[0], cells):
        s = t[(t.kind == kind) & (t.length == L)]
        seen = {}
        for name in dict.fromkeys(s.policy):
            if name in CONTROLS:
                continue
            base = name.split("(")[0]
            seen[base] = seen.get(base, 0) + 1  # a second setting of one policy shares its colour, dashed
            g = s[s.policy == name].groupby("memory").correct.agg(["sum", "count"]).sort_index()
            lo_hi = np.array([wilson(k, n) for k, n in zip(g["sum"], g["count"])])
            acc = (g["sum"] / g["count"]).to_numpy()
            # Wilson's bounds at 0/n and n/n equal the accuracy up to rounding: clip so matplotlib gets no -1e-17.
            yerr = np.maximum(0, [acc - lo_hi[:, 0], lo_hi[:, 1] - acc])
            ax.errorbar(g.index, acc, yerr=yerr, marker="o", capsize=3, label=name,
                        color=color(name), ls="-" if seen[base] == 1 else "--")
        for name, style in (("exact", "-"), ("evict_needle", ":")):
            if (s.cache == name).any():
                # grey, not black: Quest's registry colour is black
                ax.axhline(s[s.cache == name].correct.mean(), color="0.5", ls=style, lw=1.2, label=name)
        n = int(s[s.cache == "exact"].shape[0])
        ax.set_title(f"{kind}, L = {L} ({n} trials per point)", fontsize=9)
        ax.set_xlabel("memory (fraction of the prompt)")
        ax.set_ylabel("accuracy (95% Wilson)")
        ax.set_ylim(-0.03, 1.03)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save(fig, out_dir, None, "retrieval_memory.png")


def fit_logit(x, y, seed=1, resamples=1000):
    """statsmodels Logit of y on x: (fit, x50, x50 interval); the interval is a percentile bootstrap
    over trials (seeded); NaN where a resample separates perfectly or has one class."""
    import statsmodels.api as sm
    X = sm.add_constant(x)
    fit = sm.Logit(y, X).fit(disp=0)
    b0, b1 = fit.params
    x50 = -b0 / b1
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(resamples):
        idx = rng.integers(0, len(y), len(y))
        if y[idx].min() == y[idx].max():
            continue
        try:
            p = sm.Logit(y[idx], X[idx]).fit(disp=0, warn_convergence=False).params
            boots.append(-p[0] / p[1])
        except Exception:  # perfect separation in a resample
            continue
    lo, hi = np.percentile(boots, [2.5, 97.5]) if len(boots) > 50 else (np.nan, np.nan)
    return fit, x50, (lo, hi)


def link(t, out_dir):
    """The fits, the threshold table and the figure; returns the fit rows."""
    p = t[~t.cache.isin(CONTROLS) & (t.exact_acc >= 0.8)].dropna(subset=["needle_kept_share", "rel_err"])
    rows, table = [], []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for kind in dict.fromkeys(p.kind):
        s = p[p.kind == kind]
        y = s.correct.to_numpy(dtype=float)
        if len(y) < 10 or y.min() == y.max():
            print(f"{kind}: {len(y)} policy trials, {int(y.sum())} answered: too few, or one outcome only, for a logistic fit")
            continue
        for ax, col, xs in ((axes[0], "needle_kept_share", s.needle_kept_share.to_numpy()),
                            (axes[1], "log10(rel_err)", np.log10(s.rel_err.to_numpy()))):
            fit, x50, (lo, hi) = fit_logit(xs, y)
            rows.append({"kind": kind, "predictor": col, "trials": len(y), "correct": int(y.sum()),
                         "intercept": fit.params[0], "slope": fit.params[1], "mcfadden_r2": fit.prsquared,
                         "llr_pvalue": fit.llr_pvalue, "auc": auc(np.sign(fit.params[1]) * xs, y), "x50": x50, "x50_low": lo, "x50_high": hi})
            jitter = np.random.default_rng(2).uniform(-0.04, 0.04, len(y))
            ax.scatter(xs, y + jitter, s=6, alpha=0.35, label=f"{kind} trials")
            grid = np.linspace(np.nanmin(xs), np.nanmax(xs), 200)
            ax.plot(grid, 1 / (1 + np.exp(-(fit.params[0] + fit.params[1] * grid))),
                    label=f"{kind}: logistic fit, 50% at {x50:.3g} [{lo:.3g}, {hi:.3g}], R²_McF {fit.prsquared:.2f}")
            ax.set_xlabel(col if col != "needle_kept_share" else "needle kept share (exact needle mass kept / needle mass)")
            ax.set_ylabel("answered (1) or not (0)")
        bins = pd.cut(s.needle_kept_share, BINS, right=False, labels=BIN_NAMES)
        for b, g in s.groupby(bins, observed=True):
            table.append({"kind": kind, "needle_kept_share": b, **accuracy_row(g)})
    if rows:
        for ax in axes:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.2))
        fig.suptitle("Does the open-loop error predict the answer? (policy trials where the exact cache answers ≥ 80%)",
                     fontsize=9)
        save(fig, out_dir, None, "retrieval_link.png")
    else:
        plt.close(fig)
    pd.DataFrame(rows).to_csv(os.path.join(out_dir, "link.csv"), index=False, float_format="%.6g")
    pd.DataFrame(table).to_csv(os.path.join(out_dir, "link_table.csv"), index=False, float_format="%.4g")
    by_policy(p).to_csv(os.path.join(out_dir, "link_by_policy.csv"), index=False, float_format="%.4g")
    return rows, table


def by_policy(p):
    """Per (task, policy): accuracy, open-loop means, and accuracy split at a needle kept share of 0.8."""
    out = []
    for (kind, name), g in p.groupby(["kind", "policy"], sort=False):
        row = {"kind": kind, "policy": name, "trials": len(g), "accuracy": g.correct.mean(), "rel_err": g.rel_err.mean(),
               "kept_mass": g.kept_mass.mean(), "needle_kept_share": g.needle_kept_share.mean()}
        for tag, part in (("below_0.8", g[g.needle_kept_share < 0.8]), ("from_0.8", g[g.needle_kept_share >= 0.8])):
            row[f"trials_{tag}"], row[f"accuracy_{tag}"] = len(part), part.correct.mean() if len(part) else np.nan
        out.append(row)
    return pd.DataFrame(out)


def main(argv=None):
    """Draws the figures; returns their PNG paths (for plots/make_figures.py)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="kvsim task output folders (trials.csv)")
    ap.add_argument("--out-dir", help="where figures and link.csv go (default: the first folder)")
    a = ap.parse_args(argv)
    out_dir = a.out_dir or a.dirs[0]
    os.makedirs(out_dir, exist_ok=True)
    t = load(a.dirs)
    figs = [heatmaps(t, out_dir), memory_figure(t, out_dir)]
    depth_table(t, out_dir)
    rows, table = link(t, out_dir)
    if rows:
        figs.append(os.path.join(out_dir, "retrieval_link.png"))
    for r in rows:
        print(f"{r['kind']:8s} {r['predictor']:18s} n={r['trials']:4d} McFadden R² {r['mcfadden_r2']:.3f}  AUC {r['auc']:.3f}  "
              f"50% at {r['x50']:.3g} [{r['x50_low']:.3g}, {r['x50_high']:.3g}]  LR p {r['llr_pvalue']:.2g}")
    for r in table:
        print(f"{r['kind']:8s} share {r['needle_kept_share']:12s} {r['correct']:4d}/{r['trials']:<4d} = {r['accuracy']:.3f} "
              f"[{r['wilson_low']:.3f}, {r['wilson_high']:.3f}]")
    return figs


if __name__ == "__main__":
    try:
        main()
    except kvsim.Error as e:
        sys.exit(f"error: {e}")
