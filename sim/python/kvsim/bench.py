"""`.venv/bin/python -m kvsim.bench`: the per-step cost of a policy written in Python over the same policy in
C++ (the engine's policy_ns metric: mean wall time of a policy's observe + attend per decoded step).

The Python twins (kvsim.examples) answer bit for bit like the built-in window and h2o (window in its
per-step replay, `[eval] closed_form = "per_step"`, which this bench sets), so the two columns time
the same work; the difference is the price of Python: the GIL, numpy array creation
for every key, value and query, and numpy's per-call overhead on small arrays. One thread, so no
policy waits for the GIL. Prints one row per policy and cache size, and the overhead in µs/step.

Usage: .venv/bin/python -m kvsim.bench [--n 2048] [--d 64] [--heads 4] [--kv-heads 2] [--budgets 64,512]
"""
import argparse
import sys
import time

from . import _policy, examples, run


def measure(n, d, heads, kv_heads, budgets, gqa="kv_head"):
    """Rows (policy, budget, C++ ns/step, Python ns/step, ratio) on a seeded heavy_hitter stream."""
    _policy.register_policy("py_window", examples.PyWindow)
    _policy.register_policy("py_h2o", examples.PyH2O)
    pols = [{"name": name, "budget": b} for b in budgets for name in ("window", "py_window", "h2o", "py_h2o")]
    cfg = {"name": "python_policy_bench", "seed": 1,
           "data": {"synthetic": "heavy_hitter", "n": n, "d": d, "n_layers": 1, "n_heads": heads, "n_kv_heads": kv_heads},
           "eval": {"gqa": gqa, "every": 1, "closed_form": "per_step"}, "policy": pols}
    res = run(cfg, threads=1)
    s = res.summary
    ns = s[(s.metric == "policy_ns") & (s.layer == -1)].set_index("label")["mean"]
    rel = s[(s.metric == "rel_err") & (s.layer == -1)].set_index("label")["mean"]
    rows = []
    for b in budgets:
        for name in ("window", "h2o"):
            c, p = f"{name}(budget={b})", f"py_{name}(budget={b})"
            rows.append((name, b, ns[c], ns[p], ns[p] / ns[c], rel[c] == rel[p]))
    return rows, res.wall_seconds


def main(argv=None):
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m kvsim.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2048, help="tokens")
    ap.add_argument("--d", type=int, default=64, help="head_dim")
    ap.add_argument("--heads", type=int, default=4, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads (the group shares one cache)")
    ap.add_argument("--budgets", default="64,512", help="cache sizes in tokens, comma-separated")
    a = ap.parse_args(argv)
    budgets = [int(b) for b in a.budgets.split(",")]
    t0 = time.perf_counter()
    rows, wall = measure(a.n, a.d, a.heads, a.kv_heads, budgets)
    print(f"Python policy overhead: heavy_hitter n={a.n} d={a.d} heads={a.heads} kv_heads={a.kv_heads}, "
          f"kv_head mode, 1 thread ({wall:.1f} s replay, {time.perf_counter() - t0:.1f} s total)")
    print(f"{'policy':<8} {'budget':>6} {'C++ µs/step':>12} {'Python µs/step':>15} {'ratio':>7} "
          f"{'overhead µs':>12}  same rel_err")
    for name, b, c, p, ratio, same in rows:
        print(f"{name:<8} {b:>6} {c / 1e3:>12.2f} {p / 1e3:>15.2f} {ratio:>6.1f}x {(p - c) / 1e3:>12.2f}  {'yes' if same else 'NO'}")
    return 0 if all(r[5] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
