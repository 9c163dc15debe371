#!/usr/bin/env python3
"""The metric rows of two kvsim runs that differ beyond a tolerance, with their layer, head and step.

compare_results.py says whether two runs agree; this says where they do not, for one policy and
metric (e.g. a GPU run against the CPU run of the same config, to tell a few rows where a policy
made another choice from rounding spread over every row).

Usage: python3 scripts/diff_rows.py BEFORE_DIR AFTER_DIR POLICY_GROUP METRIC [--atol A] [--rtol R] [--show N]
  POLICY_GROUP: results.h5's group (policy_03); METRIC: a dataset of it (rel_err).
Prints the count of rows beyond A + R·|before| (defaults 1e-4, 1e-4), the first N of them, and per
(layer, head) the first step where they start and how many of its rows differ, with kept_mass and
cache_tokens beside: a kept set that differs shows in kept_mass.
"""
import argparse
import sys

import h5py
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("group")
    ap.add_argument("metric")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--show", type=int, default=10)
    a = ap.parse_args()
    try:
        fa, fb = h5py.File(f"{a.before}/results.h5", "r"), h5py.File(f"{a.after}/results.h5", "r")
        ga, gb = fa[a.group], fb[a.group]
        x, y = ga[a.metric][()], gb[a.metric][()]
        cols = {k: (ga[k][()], gb[k][()]) for k in ("layer", "head", "step", "kept_mass", "cache_tokens") if k in ga}
    except (OSError, KeyError) as e:
        sys.exit(f"diff_rows: {e}")
    if x.shape != y.shape:
        sys.exit(f"diff_rows: {a.group}/{a.metric} has {x.shape} rows before and {y.shape} after")
    bad = np.where(~(np.abs(x - y) <= a.atol + a.rtol * np.abs(x)) & ~(np.isnan(x) & np.isnan(y)))[0]
    print(f"{a.group}/{a.metric} ({ga.attrs.get('name', '')}): {len(bad)} of {len(x)} rows beyond {a.atol:g} + {a.rtol:g}·|before|")
    for i in bad[: a.show]:
        extra = " ".join(f"{k} {v[0][i]:.6g}/{v[1][i]:.6g}" for k, v in cols.items())
        print(f"  row {i}: {x[i]:.6g} -> {y[i]:.6g}  {extra}")
    if "layer" in cols and len(bad):
        keys = {}
        for i in bad:
            k = (int(cols["layer"][0][i]), int(cols["head"][0][i]))
            keys.setdefault(k, []).append(int(cols["step"][0][i]))
        for (layer, head), steps in sorted(keys.items()):
            print(f"  layer {layer} head {head}: {len(steps)} rows from step {min(steps)} to {max(steps)}")
    if "kept_mass" in cols:
        km = np.abs(cols["kept_mass"][0] - cols["kept_mass"][1])
        print(f"kept_mass: largest |Δ| {km.max():.3g}; rows with |Δ| > 1e-6: {int(np.sum(km > 1e-6))}")


if __name__ == "__main__":
    main()
