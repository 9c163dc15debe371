#!/usr/bin/env python3
"""How each policy's error and rank change with the context length n (experiments/smollm2_length_sweep.toml).

Usage: .venv/bin/python plots/length_sweep.py RESULTS_DIR [RESULTS_DIR ...] [--out FIG.png] [--metric rel_err]

Each RESULTS_DIR is one `kvsim run` of the same experiment over several windows at one length (its
sequences.csv holds per policy and memory the mean over windows with a 95% bootstrap interval; n is read
from seq_00/results.h5's n_tokens). The figure has one panel per memory share of n, and one per fixed
token budget (`budget = B` entries, e.g. gemma3_length_long.toml): metric vs n per policy, with the
intervals as error bars; a cell whose budget holds every token (error below 1e-9) is printed "all kept",
neither drawn nor ranked. Printed: a markdown table of the mean metric per policy and n at each memory, with
the policy's rank among the policies at that n (1 = lowest error) in parentheses.
"""
import argparse
import csv
import os
import sys

import kvsim_deps  # noqa: F401  (exits with one line if numpy/h5py/matplotlib are missing)
import h5py
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kvsim_results import color


def tokens_of(results_dir):
    path = os.path.join(results_dir, "seq_00", "results.h5")
    try:
        with h5py.File(path, "r") as f:
            return int(f.attrs["n_tokens"])
    except (OSError, KeyError) as e:
        sys.exit(f"length_sweep.py: {path}: cannot read n_tokens ({e})")


def rows_of(results_dir, metric):
    path = os.path.join(results_dir, "sequences.csv")
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["metric"] == metric]
    except OSError as e:
        sys.exit(f"length_sweep.py: {path}: {e.strerror}")
    if not rows:
        sys.exit(f"length_sweep.py: {path}: no rows for metric '{metric}'")
    return rows


def policy_name(row):
    """policy plus its non-memory parameters, e.g. 'kivi bits=4'."""
    extra = [f"{k}={row[k]}" for k in ("bits", "sink", "t") if row.get(k)]
    return " ".join([row["policy"]] + extra)


def setting(row):
    """The panel a row belongs to: ("memory", share of n) or, for a fixed token count, ("budget", tokens)."""
    if row.get("memory"):
        return ("memory", float(row["memory"]))
    if row.get("budget"):
        return ("budget", float(row["budget"]))
    sys.exit(f"length_sweep.py: row {row['label']} has neither memory nor budget")


def title(s):
    return f"memory {s[1]:g} of n" if s[0] == "memory" else f"{s[1]:g} tokens at every n"


EXACT = 1e-9  # below this the cache kept every token (a fixed budget of n or more): not a point on a log axis


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dirs", nargs="+")
    ap.add_argument("--out", default=None, help="figure path (default: length_sweep.png beside the first folder)")
    ap.add_argument("--metric", default="rel_err")
    a = ap.parse_args(argv)
    table = {}  # (memory, policy) -> {n: (mean, lo, hi)}
    lengths = []
    for d in a.results_dirs:
        n = tokens_of(d)
        lengths.append(n)
        for r in rows_of(d, a.metric):
            table.setdefault((setting(r), policy_name(r)), {})[n] = (
                float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]))
    lengths = sorted(set(lengths))
    memories = sorted({m for m, _ in table})
    fig, axes = plt.subplots(1, len(memories), figsize=(4.2 * len(memories), 3.8), squeeze=False)
    for ax, mem in zip(axes[0], memories):
        print(f"\n{a.metric} at {title(mem)} (mean over windows; rank among policies at that n; "
              f"'all kept': the budget holds every token)\n")
        print("| policy | " + " | ".join(f"n = {n}" for n in lengths) + " |")
        print("|---|" + "---|" * len(lengths))
        pols = sorted(p for m, p in table if m == mem)
        ranks = {}
        for n in lengths:
            order = sorted((table[(mem, p)][n][0], p) for p in pols
                           if n in table[(mem, p)] and table[(mem, p)][n][0] >= EXACT)
            ranks[n] = {p: i + 1 for i, (_, p) in enumerate(order)}
        for p in pols:
            pts = table[(mem, p)]
            cells = [("all kept" if p not in ranks[n] else f"{pts[n][0]:.3g} ({ranks[n][p]})") if n in pts else "—"
                     for n in lengths]
            print(f"| {p} | " + " | ".join(cells) + " |")
            xs = [n for n in lengths if n in pts and pts[n][0] >= EXACT]
            ys = [pts[n][0] for n in xs]
            err = [[pts[n][0] - pts[n][1] for n in xs], [pts[n][2] - pts[n][0] for n in xs]]
            dashed = p.startswith("oracle") or " bits=" in p  # the bound, and kivi's second variant
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, label=p, color=color(p),
                        ls="--" if dashed else "-")
        ax.set(xscale="log", yscale="log", xlabel="context length n (tokens)", ylabel=a.metric,
               title=title(mem))
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_formatter(NullFormatter())
    seen = {}  # every policy once, whichever panels it is in (a fixed-budget or one-memory entry may be in one)
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    axes[0][-1].legend(list(seen.values()), list(seen.keys()), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    out = a.out or os.path.join(a.results_dirs[0], "length_sweep.png")
    fig.savefig(out, dpi=120)
    fig.savefig(os.path.splitext(out)[0] + ".pdf")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
