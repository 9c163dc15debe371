#!/usr/bin/env python3
"""BUZZ T/w sweep figure (BUZZ Fig. 4 style): rel_err against T/w with Theorem 3.1's prediction.

Usage: python3 plots/buzz_tw_sweep.py RESULTS_DIR [--out FIG.png]

Reads every `buzz` policy of the run, x = threshold / window, y = mean rel_err and mean
eps_spectral over all evaluated rows; the vertical line is Theorem 3.1's T/w for the run's stride.
Writes PNG and PDF.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def predicted(s):
    return (s * s + 1) / (s + 1) if s % 2 else s - 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    path = os.path.join(a.results_dir, "results.h5")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found")
    rows, strides = [], set()
    with h5py.File(path, "r") as f:
        for g in sorted(k for k in f if k.startswith("policy_")):
            if text(f[g].attrs["name"]) != "buzz":
                continue
            p = dict(kv.split("=", 1) for kv in text(f[g].attrs["params"]).split(",") if kv)
            strides.add(int(p.get("stride", 5)))
            rows.append((float(p["threshold"]) / float(p["window"]), np.mean(f[g]["rel_err"][:]),
                         np.mean(f[g]["eps_spectral"][:])))
    if not rows:
        sys.exit(f"error: {path}: no buzz policies")
    rows.sort()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = [r[0] for r in rows]
    ax.plot(x, [r[1] for r in rows], "o-", label="rel_err (mean)")
    ax.plot(x, [r[2] for r in rows], "s-", label="eps_spectral (mean)")
    for s in sorted(strides):
        ax.axvline(predicted(s), color="k", ls="--", lw=1, label=f"Theorem 3.1: T/w = {predicted(s):.2f} (s = {s})")
    best = min(rows, key=lambda r: r[1])
    ax.plot([best[0]], [best[1]], "r*", ms=14, label=f"best measured T/w = {best[0]:.2f}")
    ax.set_xlabel("T / w (eviction threshold / sliding window)")
    ax.set_ylabel("error (mean over layers, heads, steps)")
    ax.set_yscale("log")
    ax.set_title("BUZZ at fixed stride and cache size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = a.out or os.path.join(a.results_dir, "buzz_tw_sweep.png")
    fig.savefig(out, dpi=130)
    fig.savefig(os.path.splitext(out)[0] + ".pdf")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.pdf")


if __name__ == "__main__":
    main()
