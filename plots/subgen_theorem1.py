#!/usr/bin/env python3
"""SubGen Theorem 1 figure: achieved ε vs target ε, and τ relative error vs t.

Usage: .venv/bin/python plots/subgen_theorem1.py RESULTS_DIR [--out FIG.png]

RESULTS_DIR is the output of `kvsim run experiments/subgen_theorem1.toml`. Left: median and 99th
percentile of eps_spectral (SubGen Eq. 3) for the policies run in Theorem 1 mode (param `eps`),
against the target (dashed: achieved = target). Right: median and 99th percentile of tau_rel_err
for the policies with an explicit `t`, against t (log-log), with the 1/sqrt(t) slope for reference.
Writes PNG and PDF.
"""
import argparse
import sys

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import column, data_set, open_results, params, policies, save, text


def quantile_panel(ax, rows, reference, xlabel, ylabel, title):
    """Median and 99th percentile of rows (x, median, p99) on log-log axes, plus a reference curve."""
    x = np.array([r[0] for r in rows], dtype=float)
    ax.plot(x, [r[1] for r in rows], "o-", label="median")
    ax.plot(x, [r[2] for r in rows], "s-", label="99th percentile")
    ref_y, style, label = reference
    ax.plot(x, ref_y, style, lw=1, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.19), ncol=3)
    ax.grid(alpha=0.3, which="both")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    eps_rows, t_rows, s_rows = [], [], []
    with open_results(a.results_dir) as f:
        d = int(f.attrs["head_dim"])
        data = data_set(f)
        by_s, by_t = {}, {}
        for _, grp in policies(f):
            p = params(grp)
            if text(grp.attrs["name"]) != "subgen":
                continue
            e = column(grp, "eps_spectral")
            tau = column(grp, "tau_rel_err")
            if "memory" in p or not ("eps" in p or ("s" in p and "t" in p)):
                continue  # equal-memory runs belong to metric_vs_budget
            if "eps" in p:
                eps_rows.append((float(p["eps"]), np.median(e), np.percentile(e, 99)))
            else:
                base = text(grp.attrs["label"]).split("(")[0]  # one sweep per [[policy]] entry
                by_s.setdefault((base, p["t"]), []).append((int(p["s"]), np.median(e), np.percentile(e, 99)))
                by_t.setdefault((base, p["s"]), []).append((int(p["t"]), np.median(tau), np.percentile(tau, 99)))
        # The longest sweep of each kind (s at fixed t, t at fixed s).
        if by_t:
            t_rows = max(by_t.values(), key=len)
        if by_s:
            s_rows = max(by_s.values(), key=len)
            if len(s_rows) < 2:
                s_rows = []
    if not eps_rows and not t_rows and not s_rows:
        sys.exit(f"error: {a.results_dir}/results.h5 has no subgen policies with 'eps' or 't'")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    eps_label = "achieved ε = ‖z − Attn‖ / (‖a‖‖V‖_op)"
    if eps_rows:
        x = np.array([r[0] for r in sorted(eps_rows)])
        quantile_panel(ax1, sorted(eps_rows), (x, "k--", "achieved = target"),
                       "target ε (Theorem 1 mode: s, t from ε)", eps_label, "SubGen Eq. (3): achieved vs target ε")
    elif s_rows:
        x = np.array([r[0] for r in sorted(s_rows)], dtype=float)
        quantile_panel(ax1, sorted(s_rows), (np.sqrt(d / x), "k--", "√(d/s) (Theorem 1: s = ε⁻²d)"),
                       "matrix-product samples s", eps_label, "SubGen Eq. (3): achieved ε vs s")
    if t_rows:
        rows = sorted(t_rows)
        x = np.array([r[0] for r in rows], dtype=float)
        quantile_panel(ax2, rows, (rows[0][1] * np.sqrt(x[0] / x), "k:", "∝ 1/√t"),
                       "samples per cluster t", "|τ̂ − τ| / τ", "Partition function (Eq. 5) vs t")
    fig.suptitle(f"SubGen Theorem 1 — {data}", fontsize=10)
    return save(fig, a.results_dir, a.out, "subgen_theorem1.png")


if __name__ == "__main__":
    main()
