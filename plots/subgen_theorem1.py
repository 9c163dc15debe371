#!/usr/bin/env python3
"""SubGen Theorem 1 figure: achieved ε vs target ε, and τ relative error vs t.

Usage: python3 plots/subgen_theorem1.py RESULTS_DIR [--out FIG.png]

RESULTS_DIR is the output of `kvsim run experiments/subgen_theorem1.toml`. Left: median and 99th
percentile of eps_spectral (SubGen Eq. 3) for the policies run in Theorem 1 mode (param `eps`),
against the target (dashed: achieved = target). Right: median and 99th percentile of tau_rel_err
for the policies with an explicit `t`, against t (log-log), with the 1/sqrt(t) slope for reference.
Writes PNG and PDF.
"""
import argparse
import sys

import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import open_results, params, policies, save, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    eps_rows, t_rows, s_rows = [], [], []
    with open_results(a.results_dir) as f:
        d = int(f.attrs["head_dim"])
        by_s, by_t = {}, {}
        for _, grp in policies(f):
            p = params(grp)
            if text(grp.attrs["name"]) != "subgen":
                continue
            e = grp["eps_spectral"][:]
            tau = grp["tau_rel_err"][:]
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
    if eps_rows:
        eps_rows.sort()
        x = [r[0] for r in eps_rows]
        ax1.plot(x, [r[1] for r in eps_rows], "o-", label="median")
        ax1.plot(x, [r[2] for r in eps_rows], "s-", label="99th percentile")
        ax1.plot(x, x, "k--", lw=1, label="achieved = target")
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.set_xlabel("target ε (Theorem 1 mode: s, t from ε)")
        ax1.set_ylabel("achieved ε = ‖z − Attn‖ / (‖a‖‖V‖_op)")
        ax1.set_title("SubGen Eq. (3): achieved vs target ε")
        ax1.legend(fontsize=8)
        ax1.grid(alpha=0.3, which="both")
    elif s_rows:
        s_rows.sort()
        x = np.array([r[0] for r in s_rows], dtype=float)
        med = np.array([r[1] for r in s_rows])
        ax1.plot(x, med, "o-", label="median")
        ax1.plot(x, [r[2] for r in s_rows], "s-", label="99th percentile")
        ax1.plot(x, np.sqrt(d / x), "k--", lw=1, label="√(d/s) (Theorem 1: s = ε⁻²d)")
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.set_xlabel("matrix-product samples s")
        ax1.set_ylabel("achieved ε = ‖z − Attn‖ / (‖a‖‖V‖_op)")
        ax1.set_title("SubGen Eq. (3): achieved ε vs s")
        ax1.legend(fontsize=8)
        ax1.grid(alpha=0.3, which="both")
    if t_rows:
        t_rows.sort()
        x = np.array([r[0] for r in t_rows], dtype=float)
        med = np.array([r[1] for r in t_rows])
        ax2.plot(x, med, "o-", label="median")
        ax2.plot(x, [r[2] for r in t_rows], "s-", label="99th percentile")
        ax2.plot(x, med[0] * np.sqrt(x[0] / x), "k:", lw=1, label="∝ 1/√t")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("samples per cluster t")
        ax2.set_ylabel("|τ̂ − τ| / τ")
        ax2.set_title("Partition function (Eq. 5) vs t")
        ax2.legend(fontsize=8)
        ax2.grid(alpha=0.3, which="both")
    save(fig, a.results_dir, a.out, "subgen_theorem1.png")


if __name__ == "__main__":
    main()
