#!/usr/bin/env python3
"""SubGen Fig. 1-style clusterability figure from `kvsim clusters` output.

Usage: .venv/bin/python plots/clusterability.py RESULTS_DIR [--layer L] [--out FIG.png]

Left: m' (clusters found by SubGen's online δ-clustering, mean over KV heads) against n for keys
(solid) and values (dashed) of every layer, log-log, with the fitted exponent γ in the legend.
Right: 2-D PCA of layer L's keys and values (KV head 0; default L: the first layer studied) with the
greedy k-center centers marked.
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

from kvsim_results import save


def read_csv(path):
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (run `kvsim clusters CONFIG --out {os.path.dirname(path)}` first)")
    with open(path) as f:
        return list(csv.DictReader(f))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--layer", type=int, default=None, help="layer of the PCA panels (default: the first studied)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    counts = read_csv(os.path.join(a.results_dir, "clusters.csv"))
    fit = {(int(r["layer"]), r["tensor"]): r for r in read_csv(os.path.join(a.results_dir, "clusters_fit.csv"))}
    pca = read_csv(os.path.join(a.results_dir, "pca.csv"))
    if a.layer is None:  # the first layer the study covered (a hybrid model's first global layer)
        a.layer = min((int(r["layer"]) for r in pca), default=0)

    mean = defaultdict(lambda: defaultdict(list))
    for r in counts:
        mean[(int(r["layer"]), r["tensor"])][int(r["n"])].append(float(r["clusters"]))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.4))
    layers = sorted({k[0] for k in mean})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, layer in enumerate(layers):
        for tensor, style in (("key", "-"), ("value", "--")):
            series = mean.get((layer, tensor))
            if not series:
                continue
            n = np.array(sorted(series))
            m = np.array([np.mean(series[x]) for x in n])
            g = float(fit[(layer, tensor)]["gamma"])
            ax1.plot(n, m, style, color=colors[i % len(colors)], marker="o", ms=3,
                     label=f"L{layer} {tensor}s  γ={g:.2f}")
    nmax = max(int(r["n"]) for r in counts)
    ax1.plot([1, nmax], [1, nmax], "k:", lw=1, label="m' = n")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("tokens n")
    ax1.set_ylabel("clusters m' (mean over KV heads)")
    ax1.set_title("Online δ-clustering, δ = same multiple of median norm")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0, -0.2))
    for ax, tensor in ((ax2, "key"), (ax3, "value")):
        pts = [r for r in pca if int(r["layer"]) == a.layer and r["tensor"] == tensor]
        if not pts:
            sys.exit(f"error: no PCA points for layer {a.layer}")
        x = np.array([float(r["pc1"]) for r in pts])
        y = np.array([float(r["pc2"]) for r in pts])
        c = np.array([r["center"] == "1" for r in pts])
        idx = np.arange(len(pts))
        sc = ax.scatter(x, y, c=idx, cmap="viridis", s=8, alpha=0.7)
        ax.scatter(x[c], y[c], marker="x", s=60, color="red", label=f"greedy k-center ({c.sum()} centers)")
        ax.set_xlabel("principal component 1")
        ax.set_ylabel("principal component 2")
        ax.set_title(f"Layer {a.layer} {tensor}s (KV head 0), colour = token index")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.2))
        ax.grid(alpha=0.3)
    fig.colorbar(sc, ax=ax3, label="token index")
    f0 = next(iter(fit.values()))
    if "model" in f0:
        fig.suptitle(f"Clusterability — {f0['model']} on {f0['recording']}, n = {f0['n_tokens']}, "
                     f"δ = {f0['delta_rel']} × median norm", fontsize=10)
    return save(fig, a.results_dir, a.out, "clusterability.png")


if __name__ == "__main__":
    main()
