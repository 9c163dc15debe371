#!/usr/bin/env python3
"""Closed-loop quality figure from `kvsim closed-loop` output.

Usage: .venv/bin/python plots/closed_loop.py RESULTS_DIR [--out FIG.png]

Left: cross-entropy increase over the exact cache (nats/token) against the cache budget (fraction of
the window: `budget`, `memory`, or for subgen_kcenter recent + centers), the mean over text windows
with a 95% percentile-bootstrap interval over windows; one curve per policy variant (parameters other
than the size), variants of one policy told apart by line style.
Right: each (policy, size, window)'s open-loop mean rel_err against its closed-loop cross-entropy
increase — does attention error predict model quality? (Spearman rank correlation over all points and
over the policy entries' means, with a 95% bootstrap interval over windows, in the title.) Points with rel_err > 10 (an output that has lost the exact one, e.g. SubGen's unbounded
estimator) go to a narrow off-scale panel on their own log axis instead of squashing the rest.
Legends sit outside the data. Writes PNG and PDF.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter
import numpy as np

from kvsim_results import bootstrap_ci, color, parse_params, save

SIZE_KEYS = ("budget", "memory", "recent", "centers")
OFF_SCALE = 10.0  # open-loop rel_err above this is drawn in the off-scale panel
STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]


def label_params(label):
    """A label's parameters: `h2o(budget=0.1,sink=4)` → {"budget": "0.1", "sink": "4"}."""
    return parse_params(label[label.find("(") + 1:label.rfind(")")] if "(" in label else "")


def budget_of(label):
    """The cache size as a fraction of the window, from the label's parameters (NaN if none)."""
    p = label_params(label)
    for k in ("budget", "memory"):
        if k in p:
            return float(p[k])
    if "recent" in p and "centers" in p:
        return float(p["recent"]) + float(p["centers"])
    return np.nan


def variant_of(name, label):
    """The curve a row belongs to: policy name plus its parameters other than the size."""
    rest = [f"{k}={v}" for k, v in sorted(label_params(label).items()) if k not in SIZE_KEYS]
    return f"{name}({','.join(rest)})" if rest else name


def spearman(x, y):
    """Spearman rank correlation: Pearson's r of the average ranks (pandas' rank; ties share a rank)."""
    import pandas as pd
    return float(pd.Series(x).rank().corr(pd.Series(y).rank()))


def rank_correlation(rows, resamples=2000, seed=1):
    """Spearman ρ between open-loop rel_err and closed-loop CE increase over the policy entries (each
    entry's mean over windows), with a 95% percentile-bootstrap interval over windows (windows drawn
    with replacement, seeded; the entries' means and ρ recomputed). Entries with a NaN in any window
    (a broken model, an open-loop-only oracle) are left out. Returns (rho, low, high, entries)."""
    import pandas as pd
    df = pd.DataFrame({"label": [r["label"] for r in rows], "window": [int(r["window"]) for r in rows],
                       "x": [float(r["open_rel_err"]) for r in rows], "y": [float(r["ce_increase"]) for r in rows]})
    x = df.pivot(index="window", columns="label", values="x")
    y = df.pivot(index="window", columns="label", values="y")
    keep = [c for c in x.columns if np.isfinite(x[c]).all() and np.isfinite(y[c]).all()]
    x, y = x[keep].to_numpy(), y[keep].to_numpy()
    if len(keep) < 3:
        return np.nan, np.nan, np.nan, len(keep)
    rho = spearman(x.mean(axis=0), y.mean(axis=0))
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, x.shape[0], x.shape[0]) for _ in range(resamples if x.shape[0] > 1 else 0)]
    boot = [spearman(x[d].mean(axis=0), y[d].mean(axis=0)) for d in draws]
    boot = [b for b in boot if np.isfinite(b)]
    lo, hi = (np.percentile(boot, 2.5), np.percentile(boot, 97.5)) if boot else (np.nan, np.nan)
    return rho, float(lo), float(hi), len(keep)


def read_rows(results_dir):
    path = os.path.join(results_dir, "closed_loop.csv")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (run `kvsim closed-loop CONFIG --out {results_dir}` first)")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"error: {path} has no rows")
    return rows


def draw_budget_panel(ax, rows):
    """Left panel: mean ce_increase ± bootstrap interval over windows against budget, per variant."""
    curves = defaultdict(lambda: defaultdict(list))
    for r in rows:
        inc = float(r["ce_increase"])
        if np.isfinite(inc):
            curves[(r["policy"], variant_of(r["policy"], r["label"]))][budget_of(r["label"])].append(inc)
    per_policy = defaultdict(int)
    for (name, variant), pts in sorted(curves.items()):
        stats = sorted((b, *bootstrap_ci(v, seed=1)) for b, v in pts.items() if np.isfinite(b))
        if not stats:
            continue
        k = per_policy[name]
        per_policy[name] += 1
        b, m, lo, hi = (np.array(c) for c in zip(*stats))
        ax.errorbar(b, m, yerr=[m - lo, hi - m], color=color(name), ls=STYLES[k % 4], marker=MARKERS[k % 4], ms=4,
                    capsize=2, label=variant)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-3)
    top = max((max(v) for pts in curves.values() for v in pts.values() if v), default=0.0)
    if top > 0:  # headroom above the highest window (symlog's autoscale can put it on the frame)
        ax.set_ylim(top=max(ax.get_ylim()[1], 2.0 * top))
    ax.set_xlabel("cache size (fraction of the window)")
    ax.set_ylabel("cross-entropy increase (nats/token)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16), ncol=2)


def draw_scatter(ax, ax_off, rows):
    """Right panels: open-loop rel_err vs closed-loop ce_increase; off-scale points beside."""
    xs, ys, cs = [], [], []
    for r in rows:
        x, y = float(r["open_rel_err"]), float(r["ce_increase"])
        if np.isfinite(x) and np.isfinite(y):
            xs.append(x)
            ys.append(y)
            cs.append(color(r["policy"]))
    xs, ys, cs = np.array(xs), np.array(ys), np.array(cs)
    on = xs <= OFF_SCALE
    ax.scatter(xs[on], ys[on], c=cs[on], s=14, alpha=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap over a decade or less
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("open-loop rel_err (mean over layers, heads, steps)")
    ax.set_ylabel("closed-loop cross-entropy increase (nats/token)")
    ax.grid(alpha=0.3, which="both")
    rho = spearman(xs, ys) if len(xs) > 2 else np.nan
    r_m, r_lo, r_hi, entries = rank_correlation(rows)
    ax.set_title(f"Does attention error predict quality? Spearman ρ = {rho:.2f} over all {len(xs)} points;\n"
                 f"over the {entries} policy entries' means ρ = {r_m:.2f} [{r_lo:.2f}, {r_hi:.2f}] (windows resampled)",
                 fontsize=8)
    lo, hi = ax.get_ylim()
    if ax_off is not None:
        ax_off.scatter(xs[~on], ys[~on], c=cs[~on], s=14, alpha=0.8)
        ax_off.set_xscale("log")
        ax_off.set_yscale("symlog", linthresh=1e-3)
        lo, hi = min(lo, ax_off.get_ylim()[0]), max(hi, ax_off.get_ylim()[1])
    # headroom above the largest point: symlog's autoscale can put it on the frame's edge
    hi = max(hi, 2.0 * float(ys.max())) if len(ys) and ys.max() > 0 else hi
    ax.set_ylim(lo, hi)  # one y scale for both panels, so off-scale points are comparable
    if ax_off is not None:
        ax_off.set_ylim(lo, hi)
        ax_off.tick_params(labelleft=False)
        ax_off.set_title(f"off scale\n(rel_err > {OFF_SCALE:g})", fontsize=8)
        ax_off.grid(alpha=0.3, which="both")
        for name in sorted({r["policy"] for r in rows if float(r["open_rel_err"]) > OFF_SCALE}):
            ax_off.scatter([], [], color=color(name), label=name, s=14)
        ax_off.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.05, 1.0))
        print(f"off-scale panel: {int((~on).sum())} points with rel_err > {OFF_SCALE:g}")
    return rho


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = read_rows(a.results_dir)
    has_off = any(float(r["open_rel_err"]) > OFF_SCALE and np.isfinite(float(r["ce_increase"])) for r in rows)
    if has_off:
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(12, 5.4), gridspec_kw={"width_ratios": [1.0, 0.9, 0.18]})
    else:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.4))
        ax3 = None
    draw_budget_panel(ax1, rows)
    draw_scatter(ax2, ax3, rows)
    r0 = rows[0]
    windows = len({r["window"] for r in rows})
    data = (f"{r0['model']} on {r0['text']}, {windows} windows × {r0['tokens']} tokens" if "model" in r0
            else f"{windows} windows")
    ax1.set_title("Closed loop: quality vs cache size\n(mean, 95% bootstrap interval over windows)", fontsize=9)
    fig.suptitle(f"Closed loop — {data}", fontsize=10)
    return save(fig, a.results_dir, a.out, "closed_loop.png")


if __name__ == "__main__":
    main()
