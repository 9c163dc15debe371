#!/usr/bin/env python3
"""Closed-loop quality figure from `kvsim closed-loop` output.

Usage: python3 plots/closed_loop.py RESULTS_DIR [--out FIG.png]

Left: cross-entropy increase over the exact cache (nats/token, mean over text windows) against the
cache budget (fraction of the window; for subgen_kcenter recent + centers) for every policy.
Right: each (policy, budget, window)'s open-loop mean rel_err against its closed-loop cross-entropy
increase — does attention error predict model quality? (Spearman rank correlation in the title.)
Writes PNG and PDF.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import color, save


def budget_of(label):
    inside = label[label.find("(") + 1:label.rfind(")")] if "(" in label else ""
    p = dict(kv.split("=", 1) for kv in inside.split(",") if "=" in kv)
    if "budget" in p:
        return float(p["budget"])
    if "recent" in p and "centers" in p:
        return float(p["recent"]) + float(p["centers"])
    return np.nan


def spearman(x, y):
    rx = np.argsort(np.argsort(x))
    ry = np.argsort(np.argsort(y))
    return np.corrcoef(rx, ry)[0, 1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    path = os.path.join(a.results_dir, "closed_loop.csv")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (run `kvsim closed-loop CONFIG --out {a.results_dir}` first)")
    with open(path) as f:
        rows = [r for r in csv.DictReader(f)]
    if not rows:
        sys.exit(f"error: {path} has no rows")
    by_policy = defaultdict(lambda: defaultdict(list))
    xs, ys, cs = [], [], []
    names = sorted({r["policy"] for r in rows})
    colors = {n: color(n) for n in names}
    for r in rows:
        inc = float(r["ce_increase"])
        if not np.isfinite(inc):
            continue
        by_policy[r["policy"]][budget_of(r["label"])].append(inc)
        xs.append(float(r["open_rel_err"]))
        ys.append(inc)
        cs.append(colors[r["policy"]])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in names:
        pts = sorted((b, np.mean(v)) for b, v in by_policy[name].items() if np.isfinite(b))
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[name], label=name)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_yscale("symlog", linthresh=1e-3)
    ax1.set_xlabel("cache budget (fraction of the 512-token window)")
    ax1.set_ylabel("cross-entropy increase (nats/token)")
    ax1.set_title("Closed loop: model quality vs budget")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    ax2.scatter(xs, ys, c=cs, s=14, alpha=0.8)
    for name in names:
        ax2.scatter([], [], color=colors[name], label=name)
    ax2.set_xscale("log")
    ax2.set_yscale("symlog", linthresh=1e-3)
    ax2.set_xlabel("open-loop rel_err (mean over layers, heads, steps)")
    ax2.set_ylabel("closed-loop cross-entropy increase (nats/token)")
    rho = spearman(np.array(xs), np.array(ys)) if len(xs) > 2 else np.nan
    ax2.set_title(f"Does attention error predict quality? Spearman ρ = {rho:.2f}")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=8)
    return save(fig, a.results_dir, a.out, "closed_loop.png")


if __name__ == "__main__":
    main()
