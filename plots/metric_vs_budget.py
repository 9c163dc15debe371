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
import sys
from collections import defaultdict

import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import color, open_results, params, policies, save, text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    series = defaultdict(list)
    with open_results(a.results_dir) as f:
        for _, grp in policies(f):
            p = params(grp)
            key = "budget" if "budget" in p else "memory" if "memory" in p else None
            if key is None:
                continue
            mr = grp["mass_ratio"][:]
            re = grp["rel_err"][:]
            name = text(grp.attrs["name"])
            if "score" in p:
                name += f" ({p['score']})"
            series[name].append(
                (float(p[key]), np.nanmean(mr) if np.isfinite(mr).any() else np.nan, np.mean(re)))
    if not any(len(v) >= 2 for v in series.values()):
        sys.exit(f"error: {a.results_dir}/results.h5: no policy is swept over 'budget' (need 2+ values of 'budget' or 'memory')")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in sorted(series.items()):
        rows.sort()
        x = [r[0] for r in rows]
        style = "s--" if "oracle)" in name else "o-"  # the non-causal variant of a policy
        ax1.plot(x, [r[1] for r in rows], style, color=color(name), label=name)
        ax2.plot(x, [r[2] for r in rows], style, color=color(name), label=name)
    ax1.axhline(1 - 1 / math.e, color="k", ls="--", lw=1, label="1 − 1/e")
    ax1.set_xlabel("cache budget or matched memory (fraction of n)")
    ax1.set_ylabel("mass_ratio = kept mass / best mass of same size")
    ax1.set_title("Attention mass kept vs the best set")
    ax2.set_xlabel("cache budget or matched memory (fraction of n)")
    ax2.set_ylabel("rel_err = ‖z − Attn‖ / ‖Attn‖")
    ax2.set_yscale("log")
    ax2.set_title("Output error")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return save(fig, a.results_dir, a.out, "metric_vs_budget.png")


if __name__ == "__main__":
    main()
