#!/usr/bin/env python3
"""Plot mass_ratio and rel_err against the cache budget for every policy name in a kvsim run.

Usage: .venv/bin/python plots/metric_vs_budget.py RESULTS_DIR [--out FIG.png]

Groups the run's policies by name and variant (H2O score, BUZZ log n scaling, weighted k-center)
and reads each one's `budget` or `memory` parameter (a fraction of n, or tokens); y = mean over all
evaluated (layer, head, step) rows. Left: mass_ratio (kept attention mass / best mass of the same
size) with the (1 − 1/e) greedy guarantee marked; middle: rel_err; right: eps_spectral (both log
scale, means above --ymax — an output that has lost the exact one — drawn as ▲ on the top edge and
listed with their true maxima under the figure, so they never stretch the axis). One legend, outside
the data, on the right. Writes PNG and PDF.
"""
import argparse
import math
import sys
from collections import defaultdict

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import column, color, data_set, open_results, params, policies, save, text


def variant_name(grp, p):
    """Series label: the policy name plus the variants swept beside the budget."""
    name = text(grp.attrs["name"])
    if "score" in p:
        name += f" ({p['score']})"
    if str(p.get("log_scale", "false")).lower() in ("true", "1"):
        name += " (log n)"
    if str(p.get("weighted", "false")).lower() in ("true", "1"):
        name += " (weighted)"
    if "mode" in p and name.startswith("subgen_kcenter"):
        name += f" ({p['mode']})"
    return name


def finite_mean(a):
    a = np.asarray(a, dtype=float)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ymax", type=float, default=10.0,
                    help="top of the error axes; means above it are drawn as ▲ on the edge (default 10)")
    a = ap.parse_args(argv)
    series = defaultdict(list)
    with open_results(a.results_dir) as f:
        data = f"{text(f.attrs.get('experiment', ''))}: {data_set(f)}"
        for _, grp in policies(f):
            p = params(grp)
            key = "budget" if "budget" in p else "memory" if "memory" in p else None
            if key is None:
                continue
            series[variant_name(grp, p)].append(
                (float(p[key]), finite_mean(column(grp, "mass_ratio")), finite_mean(column(grp, "rel_err")),
                 finite_mean(column(grp, "eps_spectral"))))
    if not any(len(v) >= 2 for v in series.values()):
        sys.exit(f"error: {a.results_dir}/results.h5: no policy is swept over 'budget' (need 2+ values of 'budget' or 'memory')")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax1, ax2, ax3 = axes
    off_scale = []
    for i, (name, rows) in enumerate(sorted(series.items())):
        rows.sort()
        x = [r[0] for r in rows]
        # A distinct marker per series, so curves that coincide (window and sink) stay distinguishable.
        style = "osD^v<>phX*"[i % 10] + ("--" if ("oracle)" in name or "(log n)" in name or "(weighted)" in name) else "-")
        if any(np.isfinite(r[1]) for r in rows):
            ax1.plot(x, [r[1] for r in rows], style, color=color(name), label=name)
        for ax, col, metric in ((ax2, 2, "rel_err"), (ax3, 3, "ε")):
            y = np.array([r[col] for r in rows])
            shown = np.minimum(y, a.ymax)
            ax.plot(x, shown, style, color=color(name), label=name)
            hi = y > a.ymax
            if hi.any():
                ax.plot(np.array(x)[hi], shown[hi], "^", color=color(name), ms=9)
                off_scale.append(f"{name} {metric} up to {y.max():.2g}")
    ax1.axhline(1 - 1 / math.e, color="k", ls="--", lw=1, label="1 − 1/e")
    ax1.set_ylabel("mass_ratio = kept mass / best mass of same size")
    ax1.set_title("Attention mass kept vs the best set")
    ax2.set_ylabel("rel_err = ‖z − Attn‖ / ‖Attn‖ (mean)")
    ax2.set_title("Output error")
    ax3.set_ylabel("ε = ‖z − Attn‖ / (‖softmax(Kq)‖·‖V‖_op) (mean)")
    ax3.set_title("Spectral error (SubGen Eq. 3)")
    for ax in (ax2, ax3):
        ax.set_yscale("log")
    if off_scale:
        fig.text(0.5, 0.005, "▲ = mean above the axis: " + "; ".join(sorted(set(off_scale))), ha="center", fontsize=8)
    for ax in axes:
        ax.set_xlabel("cache budget or matched memory (fraction of n)")
        ax.grid(alpha=0.3, which="both")
    handles, labels = ax3.get_legend_handles_labels()
    h1, l1 = ax1.get_legend_handles_labels()
    handles, labels = handles + [h for h, l in zip(h1, l1) if l not in labels], labels + [l for l in l1 if l not in labels]
    ax3.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(data, fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return save(fig, a.results_dir, a.out, "metric_vs_budget.png")


if __name__ == "__main__":
    main()
