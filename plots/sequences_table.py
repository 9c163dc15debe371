#!/usr/bin/env python3
"""Markdown tables of a multi-sequence `kvsim run` (the tables of docs/results.md).

Usage: .venv/bin/python plots/sequences_table.py RESULTS_DIR [--metric rel_err] [--memory 0.05 0.2 0.6]
           [--headroom] [--groups prose=0-7 code=8-15]

Default: one row per policy variant, one column per memory: the mean over sequences with its 95%
bootstrap interval from RESULTS_DIR/sequences.csv. --headroom adds, per memory, the policy's mean divided by
oracle_topk's (the non-causal best-M-tokens bound: how far a causal rule is from it; 1 = no head-room left).
--groups NAME=A-B ...: instead, per group of sequences (seq_A..seq_B), the plain mean of each sequence's
all-layers mean (seq_NN/summary.csv), one column per (group, memory); no interval.
Exit 2 with one line naming the file on bad input.
"""
import argparse
import csv
import os
import sys


def read_csv(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        print(f"sequences_table.py: {path}: {e.strerror}", file=sys.stderr)
        sys.exit(2)


def variant(row):
    extra = [f"{k}={row[k]}" for k in ("bits", "sink", "t", "log_scale", "weighted", "mode") if row.get(k)]
    return " ".join([row["policy"]] + extra)


def fmt(x):
    return f"{x:.3g}"


def interval_table(a):
    rows = [r for r in read_csv(os.path.join(a.results_dir, "sequences.csv")) if r["metric"] == a.metric]
    if not rows:
        print(f"sequences_table.py: {a.results_dir}/sequences.csv: no rows for metric '{a.metric}'", file=sys.stderr)
        sys.exit(2)
    cell = {(variant(r), float(r["memory"])): r for r in rows}
    names = list(dict.fromkeys(variant(r) for r in rows))
    oracle = {m: float(r["mean"]) for (p, m), r in cell.items() if p == "oracle_topk"}
    head = [f"memory {m:g}" for m in a.memory] + ([f"÷ oracle at {m:g}" for m in a.memory] if a.headroom else [])
    print(f"| policy | {' | '.join(head)} |\n|---|" + "---|" * len(head))
    for p in names:
        cols = []
        for m in a.memory:
            r = cell.get((p, m))
            cols.append(f"{fmt(float(r['mean']))} [{fmt(float(r['ci_low']))}, {fmt(float(r['ci_high']))}]" if r else "—")
        if a.headroom:
            for m in a.memory:
                r = cell.get((p, m))
                cols.append(fmt(float(r["mean"]) / oracle[m]) if r and oracle.get(m) else "—")
        print(f"| {p} | {' | '.join(cols)} |")


def group_table(a):
    groups = []
    for g in a.groups:
        try:
            name, span = g.split("=")
            lo, hi = (int(x) for x in span.split("-"))
        except ValueError:
            print(f"sequences_table.py: --groups wants NAME=A-B, not '{g}'", file=sys.stderr)
            sys.exit(2)
        groups.append((name, range(lo, hi + 1)))
    means = {}  # (group, policy, memory) -> list of per-sequence means
    names = []
    for gname, seqs in groups:
        for s in seqs:
            for r in read_csv(os.path.join(a.results_dir, f"seq_{s:02d}", "summary.csv")):
                if r["metric"] != a.metric or r["all_layers"] != "1" or not r.get("memory"):
                    continue
                p = variant(r)
                names.append(p)
                means.setdefault((gname, p, float(r["memory"])), []).append(float(r["mean"]))
    names = list(dict.fromkeys(names))
    head = [f"{g} {m:g}" for g, _ in groups for m in a.memory]
    print(f"| policy | {' | '.join(head)} |\n|---|" + "---|" * len(head))
    for p in names:
        cols = []
        for g, _ in groups:
            for m in a.memory:
                v = means.get((g, p, m))
                cols.append(fmt(sum(v) / len(v)) if v else "—")
        print(f"| {p} | {' | '.join(cols)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--metric", default="rel_err")
    ap.add_argument("--memory", type=float, nargs="+", default=[0.05, 0.2, 0.6])
    ap.add_argument("--headroom", action="store_true")
    ap.add_argument("--groups", nargs="+", default=None)
    a = ap.parse_args()
    if a.groups:
        group_table(a)
    else:
        interval_table(a)


if __name__ == "__main__":
    main()
