#!/usr/bin/env python3
"""H2O's observations (H2O §3, Fig. 2) measured: attention sparsity and accumulated-attention
power laws, from `kvsim run experiments/h2o_observations.toml` output.

Usage: .venv/bin/python plots/h2o_observations.py RESULTS_DIR [RESULTS_DIR ...] [--out FIG.png]

Left: per data set and layer, the fraction of each attention row's entries below 1% of its maximum
(`attn_sparsity`): median over evaluated (head, step) rows with the 5-95% range; H2O reports > 95%.
Middle: per data set and layer, the fitted power-law exponent of accumulated attention ranked by
size (`accum_slope`, median over heads and objective steps), marker size = fit quality R².
Right (first data set whose recording is on disk): the rank-size curves of accumulated attention at
the last step, one per layer (query head 0), recomputed here from the recording's q and k with numpy
— an independent computation; the script prints numpy's slope next to kvsim's for each layer and
exits 1 if they differ by more than 1e-6. Writes PNG and PDF.
--table prints, per layer and data set, the means over evaluated (head, step) rows of attn_sparsity,
sink_mass (share of the row on the first 4 positions), accum_slope and its R², and accum_top10 (share
of accumulated attention on the top 10% of tokens), as a markdown table, then the same over all layers.
--by-length CSV writes, per data set, layer and range of steps (1–1024, then each doubling up to the last
step), the mean attn_sparsity and sink_mass over the evaluated (head, step) rows in that range: how the two
change as the context grows (docs/results.md, "32k tokens").
"""
import argparse
import os
import sys

import kvsim_deps  # noqa: F401,E402
import h5py
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import column, data_set, open_results, policies, save, text


def powerlaw(values):
    """(slope, R²) of log value vs log rank over the positive values sorted descending."""
    v = np.sort(np.asarray([x for x in values if x > 0], dtype=float))[::-1]
    x, y = np.log(np.arange(1, v.size + 1)), np.log(v)
    cx, cy = x - x.mean(), y - y.mean()
    slope = (cx * cy).sum() / (cx * cx).sum()
    return slope, (cx * cy).sum() ** 2 / ((cx * cx).sum() * (cy * cy).sum())


def accumulated(rec, layer, head, t):
    """Σ_{i<t} softmax(scale·K q_i)(j) over the first t queries of one query head (numpy, float64)."""
    lay = rec[f"layer_{layer:03d}"]
    group = rec.attrs["n_heads"] // rec.attrs["n_kv_heads"]
    q = np.asarray(lay["q"][head, :t], dtype=float)
    k = np.asarray(lay["k"][head // group, :t], dtype=float)
    logits = float(rec.attrs["softmax_scale"]) * q @ k.T
    logits[np.triu_indices(t, 1)] = -np.inf
    a = np.exp(logits - logits.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    return a.sum(axis=0)


def print_table(results):
    """Markdown table of per-layer means (finite values only), one column group per data set."""
    names = ("attn_sparsity", "sink_mass", "accum_slope", "accum_r2", "accum_top10")
    cols = []
    for res in results:
        _, g = policies(open_results(res))[0]
        cols.append((os.path.basename(os.path.normpath(res)), column(g, "layer").astype(int),
                     {n: column(g, n) for n in names}))
    layers = sorted(set().union(*(set(c[1]) for c in cols)))
    print("| layer | " + " | ".join(f"{n} ({d})" for d, _, _ in cols for n in names) + " |")
    print("|---" * (1 + len(cols) * len(names)) + "|")
    for l in layers + [None]:
        cells = []
        for _, layer, v in cols:
            pick = np.ones(layer.size, bool) if l is None else layer == l
            for n in names:
                x = v[n][pick]
                x = x[np.isfinite(x)]
                cells.append(f"{x.mean():.3g}" if x.size else "—")
        print(f"| {'all' if l is None else l} | " + " | ".join(cells) + " |")


def by_length(results, out):
    """CSV of mean attn_sparsity and sink_mass per (data set, layer, step range), ranges 1–1024 then doublings."""
    import csv

    with open(out + ".tmp", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["data_set", "layer", "metric", "step_from", "step_to", "rows", "mean"])
        for res in results:
            _, g = policies(open_results(res))[0]
            layer, step = column(g, "layer").astype(int), column(g, "step")
            edges = [1, 1025]
            while edges[-1] <= step.max():
                edges.append(2 * edges[-1] - 1)
            for name in ("attn_sparsity", "sink_mass"):
                x = column(g, name)
                for l in sorted(set(layer)):
                    for a, b in zip(edges, edges[1:]):
                        pick = (layer == l) & (step >= a) & (step < b) & np.isfinite(x)
                        if pick.any():
                            w.writerow([os.path.basename(os.path.normpath(res)), l, name, a, b - 1, int(pick.sum()),
                                        f"{x[pick].mean():.6g}"])
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--table", action="store_true", help="print per-layer means as a markdown table")
    ap.add_argument("--by-length", metavar="CSV", help="write per-layer means by range of steps as CSV")
    args = ap.parse_args()
    if args.table:
        print_table(args.results)
    if args.by_length:
        by_length(args.results, args.by_length)
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    curves_done, bad = False, False
    for d, res in enumerate(args.results):
        f = open_results(res)
        _, g = policies(f)[0]
        layer, step = column(g, "layer"), column(g, "step")
        sp, sl, r2 = column(g, "attn_sparsity"), column(g, "accum_slope"), column(g, "accum_r2")
        label = data_set(f)
        layers = sorted(set(layer.astype(int)))
        off = (d - (len(args.results) - 1) / 2) * 0.8 / max(1, len(args.results))
        med = [np.nanmedian(sp[layer == l]) for l in layers]
        lo = [np.nanpercentile(sp[layer == l], 5) for l in layers]
        hi = [np.nanpercentile(sp[layer == l], 95) for l in layers]
        xs = np.array(layers) + off
        ax[0].errorbar(xs, med, yerr=[np.subtract(med, lo), np.subtract(hi, med)], fmt="o", capsize=3, label=label)
        sl_med = [np.nanmedian(sl[layer == l]) for l in layers]
        r2_med = [np.nanmedian(r2[layer == l]) for l in layers]
        ax[1].scatter(xs, sl_med, s=[200 * max(r, 0.05) for r in r2_med], label=label, alpha=0.7)
        rec_path = text(f.attrs.get("recording_path", ""))
        if not curves_done and rec_path and os.path.exists(rec_path):
            with h5py.File(rec_path, "r") as rec:
                # the last step with a kvsim fit (objectives stop at eval.objectives_max_t)
                fitted = np.isfinite(sl)
                t = int(step[fitted].max()) if fitted.any() else int(step.max())
                for l in layers:
                    acc = accumulated(rec, l, 0, t)
                    s_np, r_np = powerlaw(acc)
                    mine = (layer == l) & (column(g, "head") == 0) & (step == t)
                    s_kv = float(sl[mine][0]) if mine.any() else float("nan")
                    ok = abs(s_np - s_kv) <= 1e-6 * max(1.0, abs(s_np))
                    bad |= not ok
                    print(f"{os.path.basename(rec_path)} layer {l} head 0 t={t}: numpy slope {s_np:.6f} "
                          f"(R² {r_np:.3f}), kvsim {s_kv:.6f} {'ok' if ok else 'MISMATCH'}")
                    v = np.sort(acc)[::-1]
                    ax[2].loglog(np.arange(1, v.size + 1), v, label=f"layer {l}: slope {s_np:.2f}, R² {r_np:.2f}")
                ax[2].set_title(f"accumulated attention at t = {t}, head 0\n{os.path.basename(rec_path)}", fontsize=9)
            curves_done = True
    ax[0].axhline(0.95, color="grey", ls=":", lw=1)
    ax[0].text(0.02, 0.955, "H2O: > 95% sparse", transform=ax[0].get_yaxis_transform(), fontsize=8, color="grey")
    ax[0].set(xlabel="layer", ylabel="attn_sparsity (median, 5-95%)", title="entries below 1% of the row max")
    ax[1].set(xlabel="layer", ylabel="accum_slope (median)", title="power-law exponent (marker area ∝ R²)")
    ax[2].set(xlabel="rank", ylabel="accumulated attention")
    for a in ax:
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    if curves_done:
        ax[2].legend(fontsize=7)
    fig.suptitle("H2O's observations measured (H2O §3, Fig. 2)", fontsize=10)
    save(fig, args.results[0], args.out, "h2o_observations.png")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
