#!/usr/bin/env python3
"""How fast SubGen's cluster count m' grows with n at long n (SubGen §3, Assumption 1: m' = o(n) for
clusterable keys), from one or more `kvsim clusters` runs (e.g. one per 32k window).

Usage: .venv/bin/python plots/cluster_growth.py RESULTS_DIR [RESULTS_DIR ...] [--from N] [--csv OUT.csv]
                                                [--plot FIG.png]

For every (layer, tensor) and every run and KV head: γ, the least-squares slope of log m' against log n
over the prefix lengths n ≥ --from (default 1024; the smallest n hold m' ≈ n whatever the data, which pulls
a fit over all n towards 1), and the local slopes log2(m'(2n) / m'(n)) per doubling. Printed: a markdown
table of the mean γ with a 95% t-interval over the (run, KV head) fits (none with a single fit), the mean
local slope of the first and the last doubling (whether growth slows as n grows), and m'(n) at the largest
n. γ < 1 with the interval below 1 is sublinear growth over that range; γ ≈ 1 means the vectors do not
cluster at that δ. Each run's δ (clusters_fit.csv: delta_rel × the median norm) is printed with it.
--plot draws m'(n) against n on log-log axes, one panel per (tensor, layer), one line per run and KV head
(labelled by the run directory's name, so runs at several δ can share a figure), with m' = n dashed (no
clustering at all); writes PNG and PDF.
"""
import argparse
import csv
import math
import os
import sys
from collections import defaultdict

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def read_counts(results_dir):
    """{(layer, tensor, kv_head): {n: m'}} from RESULTS_DIR/clusters.csv, and the run's delta_rel."""
    path = os.path.join(results_dir, "clusters.csv")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"cluster_growth.py: {path}: {e.strerror} (run `kvsim clusters CONFIG --out {results_dir}` first)")
    out = defaultdict(dict)
    try:
        for r in rows:
            out[(int(r["layer"]), r["tensor"], int(r["kv_head"]))][int(r["n"])] = float(r["clusters"])
    except (KeyError, ValueError) as e:
        sys.exit(f"cluster_growth.py: {path}: not a kvsim clusters table ({e})")
    delta = "?"
    try:
        with open(os.path.join(results_dir, "clusters_fit.csv"), newline="") as f:
            delta = next(csv.DictReader(f)).get("delta_rel", "?")
    except (OSError, StopIteration):
        pass
    return out, delta


def slope(ns, ms):
    """Least-squares slope of log m against log n."""
    x = [math.log(n) for n in ns]
    y = [math.log(m) for m in ms]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx


def fits(series, n_from):
    """(γ over n ≥ n_from, local slopes per doubling, m' at the largest n) of one {n: m'} series, or None
    when fewer than two prefix lengths reach n_from."""
    ns = sorted(n for n in series if n >= n_from and series[n] > 0)
    if len(ns) < 2:
        return None
    local = [math.log2(series[b] / series[a]) for a, b in zip(ns, ns[1:]) if b == 2 * a]
    return slope(ns, [series[n] for n in ns]), local, series[ns[-1]], ns[-1]


def mean_interval(xs):
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    half = T95.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))
    return m, (m - half, m + half)


def plot(series_by_run, out):
    """m'(n) per (tensor, layer) panel, one line per (run, KV head); series_by_run: {run name: counts}."""
    import kvsim_deps  # noqa: F401
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvsim_results import save

    keys = sorted({(tensor, layer) for counts in series_by_run.values() for (layer, tensor, _) in counts},
                  key=lambda k: (k[0] != "key", k[1]))
    layers = sorted({layer for _, layer in keys})
    tensors = sorted({tensor for tensor, _ in keys}, key=lambda t: t != "key")
    fig, axes = plt.subplots(len(tensors), len(layers), figsize=(3.4 * len(layers), 3.0 * len(tensors)),
                             squeeze=False, sharex=True, sharey=True)
    for i, tensor in enumerate(tensors):
        for j, layer in enumerate(layers):
            ax = axes[i][j]
            top = 1
            for run_name, counts in series_by_run.items():
                for (lay, ten, head), series in sorted(counts.items()):
                    if (lay, ten) != (layer, tensor):
                        continue
                    ns = sorted(series)
                    ax.loglog(ns, [series[n] for n in ns], marker=".", lw=1,
                              label=run_name + (f" h{head}" if head else ""))
                    top = max(top, ns[-1])
            ax.loglog([1, top], [1, top], "k--", lw=0.8, label="m' = n")
            ax.set_title(f"layer {layer}, {tensor}s", fontsize=9)
            if i == len(tensors) - 1:
                ax.set_xlabel("n (tokens)")
            if j == 0:
                ax.set_ylabel("clusters m'")
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    save(fig, os.path.dirname(out) or ".", out, os.path.basename(out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dirs", nargs="+")
    ap.add_argument("--from", dest="n_from", type=int, default=1024, help="smallest n of the fit (default 1024)")
    ap.add_argument("--csv", default=None, help="also write the table as CSV")
    ap.add_argument("--plot", default=None, help="also draw m'(n) per run on log-log axes (PNG and PDF)")
    a = ap.parse_args(argv)
    per = defaultdict(list)  # (layer, tensor) -> [(γ, local slopes, m', n)]
    deltas = []
    by_run = {}
    for d in a.results_dirs:
        counts, delta = read_counts(d)
        deltas.append(delta)
        by_run[os.path.basename(os.path.normpath(d))] = counts
        for (layer, tensor, _), series in counts.items():
            f = fits(series, a.n_from)
            if f:
                per[(layer, tensor)].append(f)
    if not per:
        sys.exit(f"cluster_growth.py: no series reaches two prefix lengths ≥ {a.n_from} (lower --from)")
    print(f"δ = {', '.join(sorted(set(deltas)))} × median norm; γ fitted over n ≥ {a.n_from}; "
          f"{len(a.results_dirs)} run(s)\n")
    print("| layer | tensor | fits | γ [95% t-interval] | first doubling | last doubling | m'(n) at n |")
    print("|---:|---|---:|---|---:|---:|---|")
    rows = []
    for (layer, tensor), fs in sorted(per.items()):
        g, ci = mean_interval([f[0] for f in fs])
        first = sum(f[1][0] for f in fs if f[1]) / max(1, sum(1 for f in fs if f[1]))
        last = sum(f[1][-1] for f in fs if f[1]) / max(1, sum(1 for f in fs if f[1]))
        m_end = sum(f[2] for f in fs) / len(fs)
        n_end = min(f[3] for f in fs)
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "(one fit)"
        print(f"| {layer} | {tensor} | {len(fs)} | {g:.3f} {ci_s} | {first:.2f} | {last:.2f} | {m_end:.0f} at {n_end} |")
        rows.append([layer, tensor, len(fs), g, ci[0] if ci else "", ci[1] if ci else "", first, last, m_end, n_end])
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["layer", "tensor", "fits", "gamma", "gamma_low", "gamma_high", "first_doubling",
                        "last_doubling", "clusters_at_n", "n"])
            w.writerows(rows)
    if a.plot:
        plot(by_run, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
