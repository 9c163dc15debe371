#!/usr/bin/env python3
"""`kvsim allocate` and `budgets_file` end to end on a synthetic stream: a budget sweep → an allocation →
a replay whose caches hold their own budgets, averaging the declared memory exactly (tokens and bytes),
at the sweep's n and scaled to another n; bad input refused in one line, exit status 2, no result left.

Usage: allocate_test.py KVSIM_BINARY
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

D = 16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = '[data]\nsynthetic = "heavy_hitter"\nn = {n}\nd = 16\nn_layers = 3\nn_heads = 4\nn_kv_heads = 2\n'


def config(path, n, policies):
    with open(path, "w") as f:
        f.write(f'name = "alloc"\nseed = 3\n{DATA.format(n=n)}[eval]\nevery = 8\n{policies}')


def run(kvsim, *args, ok=True):
    r = subprocess.run([kvsim, *args], capture_output=True, text=True)
    if ok:
        assert r.returncode == 0, (args, r.stderr)
    return r


def refused(kvsim, needle, *args, out=None):
    r = run(kvsim, *args, ok=False)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("kvsim: error")]  # (a run's progress line may precede)
    assert len(errors) == 1 and needle in errors[0], (needle, r.stderr)
    assert out is None or not os.path.exists(out), f"a refused run left {out}"


def peak_cache(path, group):
    """Per (layer, KV head): the largest cache_tokens and cache_bytes over evaluated steps (2 query heads per KV head)."""
    with h5py.File(path) as f:
        g = f[group]
        layer, head = g["layer"][()], g["head"][()] // 2
        tok, byt = g["cache_tokens"][()], g["cache_bytes"][()]
    return {(int(l), int(h)): (tok[(layer == l) & (head == h)].max(), byt[(layer == l) & (head == h)].max())
            for l, h in set(zip(layer.tolist(), head.tolist()))}


def main():
    kvsim = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        sweep, alloc = os.path.join(tmp, "sweep.toml"), os.path.join(tmp, "alloc.json")
        config(sweep, 512, '[[policy]]\nname = "h2o"\nmemory = [0.05, 0.1, 0.2, 0.4]\n')
        run(kvsim, "run", sweep, "--out", os.path.join(tmp, "sweep"), "--threads", "1", "--quiet")
        r = run(kvsim, "allocate", os.path.join(tmp, "sweep"), "--policy", "h2o", "--memory", "0.1,0.15", "--out", alloc)
        assert "wrote" in r.stdout, r.stdout
        a = json.load(open(alloc))
        assert a["n_layers"] == 3 and a["n_kv_heads"] == 2 and a["layers"] == [0, 1, 2] and a["n"] == 512
        b20 = np.array(a["allocations"][1]["budgets"])  # memory 0.15: 77 tokens, between two measured points
        assert b20.shape == (3, 2) and b20.sum() == 6 * 77, b20
        assert len(set(b20.ravel().tolist())) > 1, "the allocation is uniform: the checks below would be vacuous"
        # The objective the allocation predicts is no worse than the uniform split's (the report's two columns).
        for line in r.stdout.splitlines():
            if line.startswith(("0.1 ", "0.15 ")):
                allocated, uniform = (float(x) for x in line.split()[2::2][:2])
                assert allocated <= uniform + 1e-12, line

        # A replay with the file: every cache holds its own budget; their mean is M, bytes included.
        both = (f'[[policy]]\nname = "h2o"\nmemory = 0.15\n[[policy]]\nname = "h2o"\nlabel = "h2o_alloc"\nmemory = 0.15\n'
                f'budgets_file = "{alloc}"\n')
        use = os.path.join(tmp, "use.toml")
        config(use, 512, both)
        run(kvsim, "run", use, "--out", os.path.join(tmp, "use"), "--threads", "1", "--quiet")
        res = os.path.join(tmp, "use", "results.h5")
        plain, alloc_peak = peak_cache(res, "policy_00"), peak_cache(res, "policy_01")
        for (l, h), (tok, byt) in alloc_peak.items():
            assert tok == b20[l, h] and byt == b20[l, h] * 2 * D * 4, ((l, h), tok, byt, b20[l, h])
        assert np.mean([t for t, _ in alloc_peak.values()]) == 77
        assert all(t == 77 for t, _ in plain.values())  # negative control: without the file every cache holds M

        # The same file at n = 256: budgets scaled by largest remainder, their mean is M(256) = 38 exactly.
        config(use, 256, both)
        run(kvsim, "run", use, "--out", os.path.join(tmp, "use256"), "--threads", "1", "--quiet")
        scaled = peak_cache(os.path.join(tmp, "use256", "results.h5"), "policy_01")
        assert sum(t for t, _ in scaled.values()) == 6 * 38, scaled
        assert all(abs(scaled[k][0] - b20[k] * 38 / 77) <= 1 for k in scaled), (scaled, b20)
        # kvsim.kvpress_budgets.scale (the Python side that sizes kvpress's presses) scales to the same budgets.
        spec = importlib.util.spec_from_file_location("kvpress_budgets", os.path.join(ROOT, "sim", "python", "kvsim", "kvpress_budgets.py"))
        kb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kb)
        py = kb.scale(b20.tolist(), 77, 38)
        assert all(scaled[l, h][0] == py[l][h] for l, h in scaled), (scaled, py)

        # Refusals: one line naming the key or file, status 2, no result folder.
        bad = os.path.join(tmp, "bad.toml")
        out = os.path.join(tmp, "bad_out")
        for policies, needle in [
            (f'[[policy]]\nname = "h2o"\nbudget = 50\nbudgets_file = "{alloc}"\n', "'budgets_file' needs 'memory'"),
            (f'[[policy]]\nname = "pyramidkv"\nmemory = 0.15\nbudgets_file = "{alloc}"\n', "replaces pyramidkv's layer budgets"),
            (f'[[policy]]\nname = "h2o"\nmemory = 0.3\nbudgets_file = "{alloc}"\n', "no allocation for memory"),
            (f'[[policy]]\nname = "h2o"\nmemory = 0.15\nbudgets_file = "{tmp}/none.json"\n', "none.json: cannot open"),
        ]:
            config(bad, 512, policies)
            refused(kvsim, needle, "run", bad, "--out", out)
        with open(bad, "w") as f:  # another model's shape: one KV head
            f.write(f'name = "x"\n{DATA.format(n=512).replace("n_kv_heads = 2", "n_kv_heads = 1")}'
                    f'[[policy]]\nname = "h2o"\nmemory = 0.15\nbudgets_file = "{alloc}"\n')
        refused(kvsim, "budgets for a model of 3 layers × 2 KV heads, but this model has 3 × 1", "run", bad, "--out", out)
        corrupt = os.path.join(tmp, "corrupt.json")
        with open(corrupt, "w") as f:
            json.dump({**a, "allocations": [{**a["allocations"][1], "budgets": (b20 + np.eye(3, 2, dtype=int)).tolist()}]}, f)
        config(bad, 512, f'[[policy]]\nname = "h2o"\nmemory = 0.15\nbudgets_file = "{corrupt}"\n')
        refused(kvsim, "budgets sum to", "run", bad, "--out", out)
        refused(kvsim, "no entry of policy 'tova'", "allocate", os.path.join(tmp, "sweep"), "--policy", "tova",
                "--memory", "0.2", "--out", os.path.join(tmp, "x.json"), out=os.path.join(tmp, "x.json"))
        refused(kvsim, "outside what the measured curves hold", "allocate", os.path.join(tmp, "sweep"), "--policy", "h2o",
                "--memory", "0.5", "--out", os.path.join(tmp, "x.json"), out=os.path.join(tmp, "x.json"))
        refused(kvsim, "--objective must be", "allocate", os.path.join(tmp, "sweep"), "--policy", "h2o", "--memory", "0.2",
                "--objective", "loss", "--out", os.path.join(tmp, "x.json"))
    print("allocate: all checks passed")


if __name__ == "__main__":
    main()
