#!/usr/bin/env python3
"""Plot a metric against memory (or budget) over several sequences, with 95% intervals.

Usage: .venv/bin/python plots/sequences.py RESULTS_DIR [--metric rel_err] [--out FIG.png]

Reads RESULTS_DIR/sequences.csv (a multi-sequence `kvsim run`: the mean over sequences and its
bootstrap interval per policy and metric, with one column per policy parameter) and draws one series
per policy variant (name plus the non-swept parameters that differ, e.g. BUZZ's log n scaling):
x = the swept `memory` or `budget`, y = the mean with its interval as error bars (log scale).
Series whose means leave the plotted range (SubGen's exploding estimates) go to a separate panel so
they do not squash the others. The title names the data set (the first sequence's recording or
preset) and the number of sequences. Writes PNG and PDF.
"""
import argparse
import csv
import math
import os
import sys
from collections import defaultdict

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt

from kvsim_results import color, save, text

MARKERS = "osD^v<>phX*"


def read_sequences(results_dir, metric):
    path = os.path.join(results_dir, "sequences.csv")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (a multi-sequence kvsim run writes it)")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == metric]
    if not rows:
        sys.exit(f"error: {path} has no rows for metric '{metric}'")
    return rows


def series_of(rows):
    """{variant: [(x, mean, low, high)]}, the swept key, and the number of sequences."""
    key = "memory" if any(r.get("memory") for r in rows) else "budget" if any(r.get("budget") for r in rows) else None
    if key is None:
        sys.exit("error: sequences.csv has no policy swept over 'memory' or 'budget'")
    params = [k for k in rows[0].keys() if k not in
              ("policy", "label", "metric", "sequences", "mean", "ci_low", "ci_high", "interval", key)]
    out = defaultdict(list)
    for r in rows:
        if not r.get(key):
            continue
        extra = [f"{k}={r[k]}" for k in params if r.get(k) and r[k] not in ("false", "0")]
        name = r["policy"] + (f" ({', '.join(extra)})" if extra else "")
        out[name].append((float(r[key]), float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])))
    return out, key, max(int(r["sequences"]) for r in rows)


def data_name(results_dir):
    """The first sequence's recording file name (or synthetic source) for the title."""
    h5 = os.path.join(results_dir, "seq_00", "results.h5")
    try:
        import h5py
        with h5py.File(h5, "r") as f:
            if "recording_path" in f.attrs:
                model = os.path.splitext(os.path.basename(text(f.attrs["model"])))[0] or "model"
                return f"{model} on {os.path.basename(text(f.attrs['recording_path']))}, …"
            return text(f.attrs["source"])
    except (OSError, KeyError):
        return os.path.basename(os.path.normpath(results_dir))


def draw(ax, series, names, key):
    for i, name in enumerate(names):
        pts = sorted(series[name])
        x = [p[0] for p in pts]
        y = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(x, y, yerr=err, marker=MARKERS[i % len(MARKERS)], linestyle="-" if i % 2 == 0 else "--",
                    color=color(name), label=name, capsize=3, markersize=5)
    ax.set_yscale("log")
    ax.set_xlabel(f"{key} (fraction of n)")
    ax.grid(True, which="both", alpha=0.3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--metric", default="rel_err")
    ap.add_argument("--ymax", type=float, default=1e2, help="series with a mean above this go to a separate panel")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    series, key, n_seq = series_of(read_sequences(a.results_dir, a.metric))
    finite = lambda v: math.isfinite(v) and v <= a.ymax  # noqa: E731
    main_names = sorted(n for n, pts in series.items() if all(finite(p[1]) for p in pts))
    off_names = sorted(n for n in series if n not in main_names)
    fig, axes = plt.subplots(1, 2 if off_names else 1, figsize=(13 if off_names else 9, 5),
                             gridspec_kw={"width_ratios": [3, 1]} if off_names else None, squeeze=False)
    draw(axes[0][0], series, main_names, key)
    axes[0][0].set_ylabel(f"{a.metric}: mean over sequences, 95% interval")
    if off_names:
        draw(axes[0][1], series, off_names, key)
        axes[0][1].set_title("off scale (separate axis)", fontsize=9)
        axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.15))
    axes[0][0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0 if not off_names else 0, 1.0 if not off_names else -0.15),
                      ncol=1 if not off_names else 3)
    fig.suptitle(f"{a.metric} vs {key}: {data_name(a.results_dir)} ({n_seq} sequences)", fontsize=10)
    return save(fig, a.results_dir, a.out, f"{a.metric}_vs_{key}_sequences.png")


if __name__ == "__main__":
    main()
