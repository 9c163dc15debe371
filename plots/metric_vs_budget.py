#!/usr/bin/env python3
"""Plot mass_ratio and rel_err against the cache budget for every policy name in a kvsim run.

Usage: python3 plots/metric_vs_budget.py RESULTS_DIR [--out FIG.png]

Groups the run's policies by name and reads each one's `budget` parameter (a fraction of n, or
tokens); y = mean over all evaluated (layer, head, step) rows. Left: mass_ratio (kept attention
mass / best mass of the same size) with the (1 − 1/e) greedy guarantee marked; right: rel_err (log
scale). Writes PNG and PDF.
"""
import argparse
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    path = os.path.join(a.results_dir, "results.h5")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found")
    series = defaultdict(list)
    with h5py.File(path, "r") as f:
        for g in sorted(k for k in f if k.startswith("policy_")):
            params = dict(kv.split("=", 1) for kv in text(f[g].attrs["params"]).split(",") if kv)
            if "budget" not in params:
                continue
            mr = f[g]["mass_ratio"][:]
            re = f[g]["rel_err"][:]
            series[text(f[g].attrs["name"])].append(
                (float(params["budget"]), np.nanmean(mr) if np.isfinite(mr).any() else np.nan, np.mean(re)))
    if not series:
        sys.exit(f"error: {path}: no policy has a 'budget' parameter")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in sorted(series.items()):
        rows.sort()
        x = [r[0] for r in rows]
        ax1.plot(x, [r[1] for r in rows], "o-", label=name)
        ax2.plot(x, [r[2] for r in rows], "o-", label=name)
    ax1.axhline(1 - 1 / math.e, color="k", ls="--", lw=1, label="1 − 1/e")
    ax1.set_xlabel("cache budget (fraction of n)")
    ax1.set_ylabel("mass_ratio = kept mass / best mass of same size")
    ax1.set_title("Attention mass kept vs the best set")
    ax2.set_xlabel("cache budget (fraction of n)")
    ax2.set_ylabel("rel_err = ‖z − Attn‖ / ‖Attn‖")
    ax2.set_yscale("log")
    ax2.set_title("Output error")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = a.out or os.path.join(a.results_dir, "metric_vs_budget.png")
    fig.savefig(out, dpi=130)
    fig.savefig(os.path.splitext(out)[0] + ".pdf")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.pdf")


if __name__ == "__main__":
    main()
