#!/usr/bin/env python3
"""Plot a metric against the decoding step for every policy of a kvsim run.

Usage: .venv/bin/python plots/error_vs_step.py results/stories260k [--metric rel_err] [--out FIG.png]

Reads RESULTS_DIR/results.h5 (written by `kvsim run`), averages the metric over layers and heads at
each evaluated step, and writes a PNG and a PDF (log-scaled y axis when the data spans decades).
A run with more than --max-policies policy entries (a sweep) is refused with a one-line message —
its curves would be unreadable; plot it with metric_vs_budget.py instead.
"""
import argparse
import sys

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib.pyplot as plt
import numpy as np

from kvsim_results import column, color, data_set, open_results, policies, save, text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--metric", default="rel_err")
    ap.add_argument("--out", default=None, help="output .png (default RESULTS_DIR/<metric>_vs_step.png)")
    ap.add_argument("--max-policies", type=int, default=12, help="most curves in one figure (default 12)")
    a = ap.parse_args(argv)
    with open_results(a.results_dir) as f:
        count = sum(1 for _ in policies(f))
    if count > a.max_policies:
        sys.exit(f"error: {a.results_dir}/results.h5: {count} policy entries, too many curves for one error-vs-step figure "
                 f"(--max-policies {a.max_policies}); a sweep is drawn by metric_vs_budget.py")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    spans = []
    seen = {}  # policies sharing a name share a colour and differ in line style
    with open_results(a.results_dir) as f:
        for g, grp in policies(f):
            if a.metric not in grp:
                sys.exit(f"error: {a.results_dir}/results.h5: no metric '{a.metric}' in /{g}")
            step = column(grp, "step")
            y = column(grp, a.metric)
            ok = np.isfinite(y)
            if not ok.any():
                continue
            steps = np.unique(step[ok])
            mean = np.array([y[ok & (step == s)].mean() for s in steps])
            label = text(grp.attrs["label"])
            name = text(grp.attrs["name"])
            seen[name] = seen.get(name, -1) + 1
            ax.plot(steps, mean, label=label, lw=1.2, color=color(name), ls=["-", "--", ":", "-."][seen[name] % 4])
            pos = mean[mean > 0]
            if pos.size:
                spans.append((pos.min(), pos.max()))
        title = f"{text(f.attrs.get('experiment', ''))}: {data_set(f)}"
    if spans:
        lo = min(s[0] for s in spans)
        hi = max(s[1] for s in spans)
        if lo > 0 and hi / lo > 100:
            ax.set_yscale("log")
    ax.set_xlabel("decoding step t (tokens in the stream)")
    ax.set_ylabel(f"{a.metric} (mean over layers and heads)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save(fig, a.results_dir, a.out, f"{a.metric}_vs_step.png")


if __name__ == "__main__":
    main()
