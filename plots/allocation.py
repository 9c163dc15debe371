#!/usr/bin/env python3
"""Budgets per layer and head, checked out of sample (docs/results.md, "Where to put the memory").

Usage: .venv/bin/python plots/allocation.py EVAL_DIR [--metric rel_err] [--budgets FILE ...] [--memory 0.2]
           [--out FIG.png] [--closed-loop closed_loop.csv]

EVAL_DIR is a multi-sequence `kvsim run` whose entries are a policy at some memories with the uniform split,
with `budgets_file` (a file named …_head.json or …_layer.json has its own column, any other name the column
"file") and pyramidkv. Prints a markdown
table: per policy and memory, the mean over windows of each window's all-layers mean (95% t interval), and
the paired change of each split against the same policy's uniform split (mean over windows of
split/uniform − 1, 95% t interval). --closed-loop CSV adds the same for a `kvsim closed-loop` run's
cross-entropy increase (per head − uniform, paired over windows). --budgets draws the allocations of those files at --memory as layer ×
KV head heat maps of budget / M into --out. Exit 2 with one line naming the file on bad input.
"""
import argparse
import csv
import glob
import json
import os
import sys

import numpy as np
from scipy import stats


def fail(msg):
    print(f"allocation.py: {msg}", file=sys.stderr)
    sys.exit(2)


def split_of(row):
    label = row["label"]
    if "budgets_file=" in label:
        return "per head" if "_head.json" in label else "per layer" if "_layer.json" in label else "file"
    return "pyramid" if row["policy"] == "pyramidkv" else "uniform"


def read_windows(eval_dir, metric):
    """{(policy, memory, split): [per-window all-layers mean, …]} in seq order."""
    seqs = sorted(glob.glob(os.path.join(eval_dir, "seq_*", "summary.csv")))
    if not seqs:
        fail(f"{eval_dir}: no seq_NN/summary.csv (a multi-sequence kvsim run)")
    out = {}
    for s in seqs:
        with open(s, newline="") as f:
            for r in csv.DictReader(f):
                if r["metric"] != metric or r.get("all_layers") != "1":
                    continue
                policy = "snapkv" if r["policy"] == "pyramidkv" else r["policy"]
                out.setdefault((policy, float(r["memory"]), split_of(r)), []).append(float(r["mean"]))
    if not out:
        fail(f"{eval_dir}: no all-layers rows of metric '{metric}'")
    return out


def t_interval(x):
    x = np.asarray(x, float)
    if len(x) < 2:
        return float(x.mean()), float("nan"), float("nan")
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean()), float(x.mean() - h), float(x.mean() + h)


def table(data, metric):
    splits = ["uniform", "per layer", "per head", "pyramid"] + (["file"] if any(k[2] == "file" for k in data) else [])
    lines = [f"| policy | memory | {' | '.join(splits)} | per layer vs uniform | per head vs uniform |",
             "|---|---:|" + "---|" * len(splits) + "---|---|"]
    for policy, memory in sorted({(p, m) for p, m, _ in data}, key=lambda k: (k[0] != "h2o", k[0], k[1])):
        cells, base = [], data.get((policy, memory, "uniform"))
        for s in splits:
            v = data.get((policy, memory, s))
            cells.append("—" if v is None else "{:.4f} [{:.4f}, {:.4f}]".format(*t_interval(v)))
        for s in ("per layer", "per head"):
            v = data.get((policy, memory, s))
            if v is None or base is None or len(v) != len(base):
                cells.append("—")
                continue
            m, lo, hi = t_interval(np.asarray(v) / np.asarray(base) - 1)
            cells.append(f"{100 * m:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]")
        lines.append(f"| {policy} | {memory:g} | " + " | ".join(cells) + " |")
    return f"{metric}, mean over {len(next(iter(data.values())))} held-out windows [95% t interval]\n\n" + "\n".join(lines)


def closed_loop_table(path):
    """closed_loop.csv of a `kvsim closed-loop` run with the same entries: ce_increase (nats/token) per policy,
    memory and split, mean over windows, and per head − uniform paired over windows (95% t interval)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    data = {}
    for r in rows:
        policy = "snapkv" if r["policy"] == "pyramidkv" else r["policy"]
        memory = float(r["label"].split("memory=")[1].split(",")[0].rstrip(")"))
        data.setdefault((policy, memory, split_of(r)), {})[int(r["window"])] = float(r["ce_increase"])
    splits = ["uniform", "per layer", "per head", "pyramid"]
    lines = ["| policy | memory | " + " | ".join(splits) + " | per head − uniform | windows better |",
             "|---|---:|" + "---:|" * len(splits) + "---|---:|"]
    for policy, memory in sorted({(p, m) for p, m, _ in data}, key=lambda k: (k[0] != "h2o", k[0], k[1])):
        cells = ["—" if (policy, memory, s) not in data else f"{np.mean(list(data[policy, memory, s].values())):.4f}"
                 for s in splits]
        u, h = data.get((policy, memory, "uniform")), data.get((policy, memory, "per head"))
        if u and h and u.keys() == h.keys():
            diff = np.array([h[w] - u[w] for w in sorted(u)])
            m, lo, hi = t_interval(diff)
            cells += [f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]", f"{int((diff < 0).sum())}/{len(diff)}"]
        else:
            cells += ["—", "—"]
        lines.append(f"| {policy} | {memory:g} | " + " | ".join(cells) + " |")
    n = len({r["window"] for r in rows})
    return f"ce_increase (nats/token) in the closed loop, mean over {n} windows\n\n" + "\n".join(lines)


def heat_maps(files, memory, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(files), figsize=(2.2 * len(files) + 1, 5), squeeze=False)
    for ax, path in zip(axes[0], files):
        try:
            f = json.load(open(path))
        except (OSError, ValueError) as e:
            fail(f"{path}: {e}")
        alloc = [a for a in f["allocations"] if abs(a["memory"] - memory) < 1e-9]
        if not alloc:
            fail(f"{path}: no allocation for memory {memory}")
        b = np.asarray(alloc[0]["budgets"], float) / alloc[0]["memory_tokens"]
        im = ax.imshow(b, aspect="auto", cmap="viridis", vmin=0, vmax=max(3.0, b.max()))
        ax.set_title(f"{f['policy']}\nper {f['granularity']}", fontsize=9)
        ax.set_xlabel("KV head")
        ax.set_xticks(range(b.shape[1]))
        ax.set_yticks(range(0, len(f["layers"]), 5), [f["layers"][i] for i in range(0, len(f["layers"]), 5)])
    axes[0][0].set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), label=f"budget / M (M = {memory:g} of n)")
    fig.savefig(out, dpi=120, bbox_inches="tight")
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("eval_dir")
    ap.add_argument("--metric", default="rel_err")
    ap.add_argument("--budgets", nargs="*", default=[])
    ap.add_argument("--memory", type=float, default=0.2)
    ap.add_argument("--out", default="allocation.png")
    ap.add_argument("--closed-loop", default=None, help="also this closed_loop.csv's table")
    a = ap.parse_args()
    print(table(read_windows(a.eval_dir, a.metric), a.metric))
    if a.closed_loop:
        print("\n" + closed_loop_table(a.closed_loop))
    if a.budgets:
        heat_maps(a.budgets, a.memory, a.out)


if __name__ == "__main__":
    main()
