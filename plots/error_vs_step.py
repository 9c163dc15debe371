#!/usr/bin/env python3
"""Plot a metric against the decoding step for every policy of a kvsim run.

Usage: python3 plots/error_vs_step.py results/stories260k [--metric rel_err] [--out FIG.png]

Reads RESULTS_DIR/results.h5 (written by `kvsim run`), averages the metric over layers and heads at
each evaluated step, and writes a PNG and a PDF (log-scaled y axis when the data spans decades).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--metric", default="rel_err")
    ap.add_argument("--out", default=None, help="output .png (default RESULTS_DIR/<metric>_vs_step.png)")
    a = ap.parse_args()
    path = os.path.join(a.results_dir, "results.h5")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (run `kvsim run CONFIG --out {a.results_dir}` first)")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    spans = []
    with h5py.File(path, "r") as f:
        groups = sorted(k for k in f.keys() if k.startswith("policy_"))
        for g in groups:
            if a.metric not in f[g]:
                sys.exit(f"error: {path}: no metric '{a.metric}' in /{g}")
            step = f[g]["step"][:]
            y = f[g][a.metric][:]
            ok = np.isfinite(y)
            if not ok.any():
                continue
            steps = np.unique(step[ok])
            mean = np.array([y[ok & (step == s)].mean() for s in steps])
            label = f[g].attrs["label"]
            label = label.decode() if isinstance(label, bytes) else label
            ax.plot(steps, mean, label=label, lw=1.2)
            pos = mean[mean > 0]
            if pos.size:
                spans.append((pos.min(), pos.max()))
        title = f.attrs.get("experiment", "")
    if spans:
        lo = min(s[0] for s in spans)
        hi = max(s[1] for s in spans)
        if lo > 0 and hi / lo > 100:
            ax.set_yscale("log")
    ax.set_xlabel("decoding step t (tokens in the stream)")
    ax.set_ylabel(f"{a.metric} (mean over layers and heads)")
    ax.set_title(title.decode() if isinstance(title, bytes) else str(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = a.out or os.path.join(a.results_dir, f"{a.metric}_vs_step.png")
    fig.savefig(out, dpi=130)
    fig.savefig(os.path.splitext(out)[0] + ".pdf")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.pdf")


if __name__ == "__main__":
    main()
