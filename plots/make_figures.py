#!/usr/bin/env python3
"""Regenerate every figure of every experiment from results alone, and write report.md.

Usage: .venv/bin/python plots/make_figures.py RESULTS_DIR [RESULTS_DIR ...] [--report report.md]

Each RESULTS_DIR is the output folder of `kvsim run` (results.h5, summary.csv), `kvsim clusters`
(clusters.csv) or `kvsim closed-loop` (closed_loop.csv). The figures that apply to it are written
into it as PNG and PDF (the same scripts as `plots/*.py`, one colour per policy across figures);
report.md gets, per folder, the summary table (means over every evaluated row) and the figures.
"""
import argparse
import csv
import os
import sys

import buzz_tw_sweep
import closed_loop
import clusterability
import error_vs_step
import metric_vs_budget
import retrieval
import sequences
import subgen_theorem1
from kvsim_results import bootstrap_ci

TABLE_METRICS = ["rel_err", "eps_spectral", "kept_mass", "mass_ratio", "tau_rel_err", "cache_tokens"]


def try_figure(module, argv):
    """Run one figure script; None when it does not apply to this folder (it exits with a message)."""
    try:
        return module.main(argv)
    except SystemExit as e:
        print(f"  skipped {module.__name__}: {e}", file=sys.stderr)
        return None


def summary_table(results_dir):
    path = os.path.join(results_dir, "summary.csv")
    if not os.path.exists(path):
        return ""
    rows = {}
    order = []
    with open(path) as f:
        for r in csv.DictReader(f):
            aggregate = r.get("all_layers") == "1" or r["layer"] == "all"  # "all": files before the all_layers column
            if not aggregate or r["metric"] not in TABLE_METRICS:
                continue
            if r["label"] not in rows:
                rows[r["label"]] = {}
                order.append(r["label"])
            rows[r["label"]][r["metric"]] = r["mean"]
    lines = ["| policy | " + " | ".join(TABLE_METRICS) + " |", "|---" * (len(TABLE_METRICS) + 1) + "|"]
    for label in order:
        cells = []
        for m in TABLE_METRICS:
            v = rows[label].get(m)
            cells.append("-" if v in (None, "nan") else f"{float(v):.4g}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sequences_table(results_dir):
    """rel_err and kept_mass means over sequences with their intervals, one row per policy."""
    rows, order = {}, []
    with open(os.path.join(results_dir, "sequences.csv"), newline="") as f:
        for r in csv.DictReader(f):
            if r["metric"] not in ("rel_err", "kept_mass"):
                continue
            if r["label"] not in rows:
                rows[r["label"]] = {}
                order.append(r["label"])
            rows[r["label"]][r["metric"]] = f"{float(r['mean']):.4g} [{float(r['ci_low']):.4g}, {float(r['ci_high']):.4g}]"
    lines = ["| policy (mean over sequences [95% interval]) | rel_err | kept_mass |", "|---|---|---|"]
    for label in order:
        lines.append(f"| {label} | {rows[label].get('rel_err', '-')} | {rows[label].get('kept_mass', '-')} |")
    return "\n".join(lines) + "\n"


def closed_loop_table(results_dir):
    """Per policy entry: mean over windows [95% bootstrap interval over windows] of the cross-entropy
    increase and the open-loop rel_err (windows where the model broke down, ce = nan, left out)."""
    path = os.path.join(results_dir, "closed_loop.csv")
    acc = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            a = acc.setdefault(r["label"], ([], []))
            a[0].append(float(r["ce_increase"]))
            a[1].append(float(r["open_rel_err"]))

    def cell(v):
        m, lo, hi = bootstrap_ci(v)
        n = sum(1 for x in v if x == x)
        return "-" if n == 0 else f"{m:.4g} [{lo:.4g}, {hi:.4g}]" + ("" if n == len(v) else f" ({n} of {len(v)} windows)")
    lines = ["| policy (mean over windows [95% interval]) | CE increase (nats/token) | open-loop rel_err |", "|---|---|---|"]
    for label, (ce, re) in acc.items():
        lines.append(f"| {label} | {cell(ce)} | {cell(re)} |")
    with open(path, newline="") as f:
        rho, lo, hi, entries = closed_loop.rank_correlation(list(csv.DictReader(f)))
    lines += ["", f"Spearman rank correlation of open-loop rel_err and CE increase over the {entries} policy entries' "
              f"means: ρ = {rho:.2f} [{lo:.2f}, {hi:.2f}] (95% bootstrap interval over windows)."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dirs", nargs="+")
    ap.add_argument("--report", default=None, help="report path (default: report.md beside the first folder)")
    a = ap.parse_args()
    report = a.report or os.path.join(os.path.dirname(os.path.abspath(a.results_dirs[0])), "report.md")
    base = os.path.dirname(os.path.abspath(report))
    out = ["# kvsim report", ""]
    made = 0
    for d in a.results_dirs:
        if not os.path.isdir(d):
            sys.exit(f"error: {d} is not a folder")
        print(f"{d}:")
        figs, table = [], ""
        if os.path.exists(os.path.join(d, "results.h5")):
            figs.append(try_figure(error_vs_step, [d]))
            figs.append(try_figure(error_vs_step, [d, "--metric", "eps_spectral"]))
            figs.append(try_figure(subgen_theorem1, [d]))
            figs.append(try_figure(metric_vs_budget, [d]))
            figs.append(try_figure(buzz_tw_sweep, [d]))
            table = summary_table(d)
        if os.path.exists(os.path.join(d, "sequences.csv")):  # a multi-sequence run: intervals over sequences
            figs.append(try_figure(sequences, [d]))
            if not os.path.exists(os.path.join(d, "results.h5")):
                figs.append(try_figure(buzz_tw_sweep, [d]))
            table = sequences_table(d)
        if os.path.exists(os.path.join(d, "clusters.csv")):
            figs.append(try_figure(clusterability, [d]))
        if os.path.exists(os.path.join(d, "closed_loop.csv")):
            figs.append(try_figure(closed_loop, [d]))
            table += closed_loop_table(d)
        if os.path.exists(os.path.join(d, "trials.csv")):  # kvsim task
            figs += try_figure(retrieval, [d]) or []
            with open(os.path.join(d, "accuracy.csv")) as f:
                table += "```text\n" + f.read() + "```\n"
        figs = [f for f in figs if f]
        if not figs and not table:
            sys.exit(f"error: {d} holds no kvsim results (results.h5, sequences.csv, clusters.csv, closed_loop.csv or trials.csv)")
        made += len(figs)
        out += [f"## {os.path.basename(os.path.normpath(d))}", ""]
        if table:
            out += [table]
        for f in figs:
            out += [f"![{os.path.basename(f)}]({os.path.relpath(f, base)})", ""]
    tmp = report + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out))
    os.replace(tmp, report)
    print(f"wrote {made} figures and {report}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
