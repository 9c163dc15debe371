#!/usr/bin/env python3
"""BUZZ T/w sweep figure (BUZZ Fig. 4 style): rel_err against T/w with Theorem 3.1's prediction.

Usage: .venv/bin/python plots/buzz_tw_sweep.py RESULTS_DIR [--out FIG.png]

Reads every `buzz` policy of the run, x = threshold / window, y = mean rel_err and mean
eps_spectral over all evaluated rows (a multi-sequence run: the mean over sequences with its 95%
bootstrap interval, from sequences.csv); the vertical line is Theorem 3.1's T/w for the run's stride.
Writes PNG and PDF.
"""
import argparse
import csv
import os
import sys

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import column, data_set, open_results, params, policies, save, text


def predicted(s):
    return (s * s + 1) / (s + 1) if s % 2 else s - 1


def finish(ax, strides, best_x, best_y, ylabel, data):
    """Theorem 3.1's T/w per stride, the best measured T/w, axes, title and legend."""
    for s in sorted(strides):
        ax.axvline(predicted(s), color="k", ls="--", lw=1, label=f"Theorem 3.1: T/w = {predicted(s):.2f} (s = {s})")
    ax.plot([best_x], [best_y], "r*", ms=14, label=f"best measured T/w = {best_x:.2f}")
    ax.set_xlabel("T / w (eviction threshold / sliding window)")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.set_title(f"BUZZ at fixed stride and cache size: {data}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))


def draw_sequences(results_dir, seq_csv, out):
    """A multi-sequence run: mean over sequences with its 95% bootstrap interval (sequences.csv)."""
    rows, strides = {}, set()
    with open(seq_csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["policy"] != "buzz" or not r.get("threshold") or not r.get("window"):
                continue
            strides.add(int(float(r.get("stride") or 5)))
            x = float(r["threshold"]) / float(r["window"])
            if r["metric"] in ("rel_err", "eps_spectral"):
                rows.setdefault(x, {})[r["metric"]] = (float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]))
            n_seq = r["sequences"]
    xs = sorted(x for x in rows if len(rows[x]) == 2)
    if len(xs) < 2:
        sys.exit(f"error: {seq_csv}: buzz runs at fewer than 2 T/w values with threshold and window")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for metric, marker in (("rel_err", "o-"), ("eps_spectral", "s-")):
        m, lo, hi = (np.array([rows[x][metric][i] for x in xs]) for i in range(3))
        ax.errorbar(xs, m, yerr=[m - lo, hi - m], fmt=marker, capsize=3, label=f"{metric} (mean, 95% interval)")
    best = min(xs, key=lambda x: rows[x]["rel_err"][0])
    finish(ax, strides, best, rows[best]["rel_err"][0], "error (mean over sequences)", f"{n_seq} sequences")
    print(f"best measured T/w = {best:.2f}; Theorem 3.1: " + ", ".join(f"{predicted(s):.2f} (s = {s})" for s in sorted(strides)))
    return save(fig, results_dir, out, "buzz_tw_sweep.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    seq_csv = os.path.join(a.results_dir, "sequences.csv")
    if not os.path.exists(os.path.join(a.results_dir, "results.h5")) and os.path.exists(seq_csv):
        return draw_sequences(a.results_dir, seq_csv, a.out)
    rows, strides = [], set()
    with open_results(a.results_dir) as f:
        data = data_set(f)
        for _, grp in policies(f):
            if text(grp.attrs["name"]) != "buzz":
                continue
            p = params(grp)
            if "threshold" not in p or "window" not in p:
                continue  # equal-memory runs (memory = ...) belong to metric_vs_budget
            strides.add(int(p.get("stride", 5)))
            rows.append((float(p["threshold"]) / float(p["window"]), np.mean(column(grp, "rel_err")),
                         np.mean(column(grp, "eps_spectral"))))
    if not rows:
        sys.exit(f"error: {a.results_dir}/results.h5: no buzz policies with threshold and window")
    rows.sort()
    if len({r[0] for r in rows}) < 2:
        sys.exit(f"error: {a.results_dir}/results.h5: buzz runs at one T/w only ({rows[0][0]:.3g}); a T/w sweep needs 2 or more")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = [r[0] for r in rows]
    ax.plot(x, [r[1] for r in rows], "o-", label="rel_err (mean)")
    ax.plot(x, [r[2] for r in rows], "s-", label="eps_spectral (mean)")
    best = min(rows, key=lambda r: r[1])
    finish(ax, strides, best[0], best[1], "error (mean over layers, heads, steps)", data)
    return save(fig, a.results_dir, a.out, "buzz_tw_sweep.png")


if __name__ == "__main__":
    main()
