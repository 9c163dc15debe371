#!/usr/bin/env python3
"""Compares two trees of kvsim results (e.g. `scripts/reproduce.sh` output before and after a refactor)
bit for bit, timings aside. A metric dataset that was all NaN before (a metric that does not apply)
may be left out after.

Usage: .venv/bin/python scripts/compare_results.py [--allow-new-rows] [--atol A] [--rtol R] BEFORE_DIR AFTER_DIR

--allow-new-rows: AFTER's CSVs may hold rows BEFORE's do not (policies added to a config); every row
of BEFORE must still appear, in order. CSV columns are matched by name (added columns are ignored).

For every results.h5 under BEFORE_DIR: every dataset of every /policy_* group (metric datasets and
layer/head/step) must exist in AFTER_DIR's file with identical bytes (NaN = NaN), except `policy_ns`
(wall-clock time per step); the groups' name/label/params attributes must match. For every CSV
(summary.csv, cells.csv, closed_loop.csv, clusters.csv, ...) the rows must match, except the
policy_ns rows of summary/cells. Prints one line per difference and exits 1 if there is any, 0
(printing a one-line count) otherwise; exits 2 when a directory is missing or a file unreadable.

--atol A: for a change that is meant to move numbers by rounding only (e.g. a GEMM in place of
matrix-vector products): float datasets may differ by at most A in absolute value (NaN where NaN), and
CSV numbers by A + 2e-5 relative (the CSVs print 6 significant digits, so the last one may flip); the
report then lists, per (policy, metric), how many entries moved and the largest |Δ|.

--rtol R: as --atol, with the bound A + R·|before| per entry (A = 0 unless given), and CSV numbers
within A + max(R, 2e-5) relative: for two computations that agree to a relative precision, e.g. the
CPU and GPU paths on one recording (scripts/gpu_check.sh), whose metrics span many magnitudes.
"""
import csv
import os
import sys

TIMING = {"policy_ns", "wall_seconds", "threads", "seconds"}  # seconds: a task trial's wall time (trials.csv)


def die(msg):
    print(f"compare_results: {msg}", file=sys.stderr)
    sys.exit(2)


def as_text(x):
    """An HDF5 string attribute as str (fixed-length ones come back as bytes)."""
    return x.decode() if isinstance(x, bytes) else x


def files(root, suffix):
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(suffix):
                out.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(out)


def compare_h5(a_path, b_path, diffs, omitted, atol=None, moved=None, rtol=0.0):
    import h5py
    import numpy as np
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        for g in sorted(k for k in a.keys() if k.startswith("policy_")):
            if g not in b:
                diffs.append(f"{b_path}: group {g} missing")
                continue
            for attr in ("name", "label", "params"):
                if as_text(a[g].attrs.get(attr)) != as_text(b[g].attrs.get(attr)):
                    diffs.append(f"{b_path}: /{g} attribute {attr}: {a[g].attrs.get(attr)!r} vs {b[g].attrs.get(attr)!r}")
            for ds in sorted(a[g].keys()):
                if ds in TIMING:
                    continue
                if ds not in b[g]:
                    # Left out because it does not apply (all NaN before): the same information.
                    if np.all(np.isnan(a[g][ds][()])):
                        omitted.append(f"/{g}/{ds}")
                    else:
                        diffs.append(f"{b_path}: /{g}/{ds} missing")
                    continue
                x, y = a[g][ds][()], b[g][ds][()]
                if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                    n = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y))))) if x.shape == y.shape else -1
                    if atol is not None and n > 0 and x.dtype.kind == "f" and np.array_equal(np.isnan(x), np.isnan(y)):
                        ok = ~np.isnan(x)
                        delta = np.abs(x[ok] - y[ok])
                        worst = float(np.max(delta))
                        if np.all(delta <= atol + rtol * np.abs(x[ok])):
                            key = (as_text(a[g].attrs.get("name")), ds)
                            c, w = moved.get(key, (0, 0.0))
                            moved[key] = (c + n, max(w, worst))
                            continue
                    detail = ""
                    if x.shape == y.shape and x.dtype.kind == "f":
                        ok = ~(np.isnan(x) | np.isnan(y))
                        if ok.any():
                            dx = np.abs(x[ok] - y[ok])
                            rel = dx / np.maximum(np.abs(x[ok]), 1e-300)
                            detail = f"; largest |Δ| {float(dx.max()):.3g}, largest |Δ|/|before| {float(rel.max()):.3g}"
                    diffs.append(f"{b_path}: /{g}/{ds} differs ({n} entries{detail})")


def close_rows(x, y, atol, rtol=0.0):
    """CSV rows equal up to atol + max(rtol, 2e-5) relative on numbers (text cells exactly)."""
    if len(x) != len(y):
        return False
    for u, v in zip(x, y):
        if u == v:
            continue
        try:
            fu, fv = float(u), float(v)
        except ValueError:
            return False
        if not abs(fu - fv) <= atol + max(rtol, 2e-5) * max(abs(fu), abs(fv)):
            return False
    return True


def compare_csv(a_path, b_path, diffs, allow_new_rows=False, atol=None, rtol=0.0):
    with open(a_path, newline="") as fa, open(b_path, newline="") as fb:
        ra, rb = list(csv.reader(fa)), list(csv.reader(fb))
    if not ra or not rb or not set(ra[0]) <= set(rb[0]):
        diffs.append(f"{b_path}: header differs")
        return
    head = ra[0]
    # Columns are matched by name: columns added after (e.g. parameter columns of new policies) are new
    # information.
    where = [rb[0].index(h) for h in head]
    rb = [rb[0]] + [[r[i] if i < len(r) else "" for i in where] for r in rb[1:]]
    if "layer" in head and "all_layers" not in head:  # the all-layer aggregate used to be written as layer "all"
        li = head.index("layer")
        rb = [r[:li] + ["all" if r[li] == "-1" else r[li]] + r[li + 1:] for r in rb]
    timing_cols = [i for i, h in enumerate(head) if h in TIMING]
    metric_col = head.index("metric") if "metric" in head else -1

    def keep(r):
        return metric_col < 0 or r[metric_col] not in TIMING

    ra = [[c for i, c in enumerate(r) if i not in timing_cols] for r in ra[1:] if keep(r)]
    rb = [[c for i, c in enumerate(r) if i not in timing_cols] for r in rb[1:] if keep(r)]
    if allow_new_rows:  # every earlier row, in order, among the new ones (added policies add rows)
        it = iter(rb)
        for i, x in enumerate(ra):
            if not any(x == y for y in it):
                diffs.append(f"{b_path}: row {i + 2} of the earlier file is missing or changed: {','.join(x)}")
                return
        return
    if len(ra) != len(rb):
        diffs.append(f"{b_path}: {len(rb)} rows vs {len(ra)}")
        return
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y and not (atol is not None and close_rows(x, y, atol, rtol)):
            diffs.append(f"{b_path}: row {i + 2}: {','.join(y)} (before: {','.join(x)})")


def pop_number(args, flag):
    """The number after `flag` in args (both removed), or None when the flag is absent."""
    if flag not in args:
        return None
    i = args.index(flag)
    try:
        x = float(args[i + 1])
    except (IndexError, ValueError):
        die(f"{flag} needs a number")
    del args[i:i + 2]
    return x


def main():
    args = sys.argv[1:]
    allow_new_rows = "--allow-new-rows" in args
    args = [a for a in args if a != "--allow-new-rows"]
    atol = pop_number(args, "--atol")
    rtol = pop_number(args, "--rtol")
    if rtol is None:
        rtol = 0.0
    else:
        atol = atol or 0.0
    if len(args) != 2:
        die("usage: compare_results.py [--allow-new-rows] [--atol A] [--rtol R] BEFORE_DIR AFTER_DIR")
    a_root, b_root = args
    for r in (a_root, b_root):
        if not os.path.isdir(r):
            die(f"{r}: not a directory")
    diffs, omitted, n, moved = [], [], 0, {}
    for rel in files(a_root, "results.h5"):
        b = os.path.join(b_root, rel)
        if not os.path.exists(b):
            diffs.append(f"{b}: missing")
            continue
        compare_h5(os.path.join(a_root, rel), b, diffs, omitted, atol, moved, rtol)
        n += 1
    for rel in files(a_root, ".csv"):
        b = os.path.join(b_root, rel)
        if not os.path.exists(b):
            diffs.append(f"{b}: missing")
            continue
        compare_csv(os.path.join(a_root, rel), b, diffs, allow_new_rows, atol, rtol)
        n += 1
    for d in diffs:
        print(d)
    if diffs:
        sys.exit(1)
    for (name, ds), (c, w) in sorted(moved.items()):
        print(f"  within tolerance: policy {name}, {ds}: {c} entries moved, largest |Δ| {w:.3g}")
    print(f"compare_results: {n} files identical (timings aside{'; ' + str(len(moved)) + ' (policy, metric) pairs within tolerance' if moved else ''}); "
          f"{len(omitted)} all-NaN datasets left out (metrics that do not apply)")


if __name__ == "__main__":
    main()
