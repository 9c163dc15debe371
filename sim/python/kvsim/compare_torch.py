"""`.venv/bin/python -m kvsim.compare_torch`: kvsim's window and H2O replays beside the same replays written in
PyTorch the way a researcher would, on the same machine, stream and thread count.

- window (StreamingLLM's local cache, budget B): PyTorch answers all steps at once as a banded masked
  attention — blocks of 128 queries against their (B + 127) keys, masked to each step's cache
  [t − B, t), softmax, then the values — float32, both query heads of the KV group batched. kvsim: the
  blocked closed-form replay (`[eval] closed_form = "blocked"`, float32 policy precision) and, for
  reference, the per-step one.
- h2o (H2O §4.1 Algorithm 1, heavy_ratio 0.5): a step loop over preallocated slot tensors, as in H2O's
  reference code: evict the lowest accumulated score outside the recent window when full, write the
  new key and value into the freed slot, attend, add the group-mean attention to the scores. kvsim:
  its per-step h2o in float32 policy precision.

kvsim's figure is its policy_ns metric (mean wall time of a policy's own work per decoded step); the
PyTorch figure is the loop's wall time over the same steps. Both also time their GEMM: Eigen's SGEMM
(what kvsim uses) and torch.mm, n = 1024, float32, one thread unless --threads. GEMM rates differ
between PyTorch builds (Debian's python3-torch 1.13 used a generic reference BLAS at 3% of Eigen's
rate; the pinned PyPI torch 2.13 CPU wheel runs at 113–140% of it), so the script prints the raw ratio
(PyTorch time / kvsim time) and the ratio normalized to equal GEMM rates (PyTorch time × torch GFLOP/s / Eigen GFLOP/s:
what a PyTorch with Eigen's GEMM would take if all its time were GEMM-bound; for the H2O step loop,
whose time is mostly per-call overhead, the normalized figure is a lower bound on PyTorch's time).

Correctness: both answer the same queries. The script checks PyTorch's window outputs against kvsim's
rel_err rows at 64 sampled steps (the exact reference computed here in float64): they must agree
within 1e-4 (float32 rounding), else it exits 1. H2O's mean rel_err is printed for both (float32
score ties may evict differently, so it is not asserted).

Usage: .venv/bin/python -m kvsim.compare_torch [--n 8192] [--d 128] [--budget 0.25] [--threads 1] [--quick]
Exit codes: 0 done, 1 the window answers disagree, 77 PyTorch is not importable (nothing measured).
"""
import argparse
import sys
import time

import numpy as np

from . import _kvsim, run, synth


def torch_or_none():
    try:
        import torch  # noqa: F401
        return torch
    except Exception as e:  # ImportError, or a broken install
        print(f"compare_torch: SKIPPED: PyTorch is not importable ({type(e).__name__}: {e})")
        return None


def torch_gemm_gflops(torch, n=1024, reps=7):
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2.0 * n ** 3 / best / 1e9


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def torch_window(torch, q, k, v, scale, budget, block=128):
    """Banded masked attention: z[h, t-1] = softmax over keys [max(0, t − B), t) of query t, head h."""
    G, n, d = q.shape
    out = torch.empty(G, n, d)
    rows = torch.arange(block).unsqueeze(1)
    for s in range(0, n, block):
        e = min(n, s + block)
        lo = max(0, s + 1 - budget)
        scores = torch.matmul(q[:, s:e] * scale, k[lo:e].T)  # [G, rows, band]
        key = torch.arange(lo, e).unsqueeze(0)
        step = rows[: e - s] + s + 1  # 1-based step of each row
        mask = (key >= step) | (key < step - budget)
        scores.masked_fill_(mask, float("-inf"))
        out[:, s:e] = torch.matmul(torch.softmax(scores, dim=-1), v[lo:e])
    return out


def torch_h2o(torch, q, k, v, scale, budget, heavy_ratio=0.5):
    """H2O's step loop over preallocated slots (evict before the new token joins, as kvsim's h2o)."""
    G, n, d = q.shape
    recent = budget - min(budget - 1, max(1, round(heavy_ratio * budget)))
    K, V = torch.zeros(budget, d), torch.zeros(budget, d)
    pos = torch.full((budget,), -1, dtype=torch.long)
    score = torch.zeros(budget)
    out = torch.empty(G, n, d)
    inf = torch.tensor(float("inf"))
    size = 0
    for t in range(n):
        if size < budget:
            slot = size
            size += 1
        else:
            evictable = pos <= t - recent
            slot = int(torch.argmin(torch.where(evictable, score, inf)))
        K[slot], V[slot], pos[slot], score[slot] = k[t], v[t], t, 0.0
        a = torch.softmax(torch.matmul(q[:, t] * scale, K[:size].T), dim=-1)  # [G, size]
        score[:size] += a.mean(0)
        out[:, t] = torch.matmul(a, V[:size])
    return out


def rel_err_at(q, k, v, scale, z, steps):
    """‖z_t − Attn_t‖ / ‖Attn_t‖ per (head, step) with the exact attention in float64."""
    res = np.empty((q.shape[0], len(steps)))
    for j, t in enumerate(steps):
        for h in range(q.shape[0]):
            logits = (k[:t].astype(np.float64) @ (q[h, t - 1].astype(np.float64) * scale))
            a = np.exp(logits - logits.max())
            a /= a.sum()
            exact = a @ v[:t].astype(np.float64)
            res[h, j] = np.linalg.norm(z[h, t - 1] - exact) / np.linalg.norm(exact)
    return res


def kvsim_side(n, d, budget, threads):
    """policy_ns means (window blocked, window per-step, h2o) and the window's rel_err rows."""
    cfg = {"name": "compare_torch", "seed": 1,
           "data": {"synthetic": "heavy_hitter", "n": n, "d": d, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1},
           "eval": {"every": 1, "policy_precision": "float32", "reference_precision": "float32"},
           "policy": [{"name": "window", "budget": budget}, {"name": "h2o", "budget": budget}]}
    res = run(cfg, threads=threads)
    per_step = run(cfg, threads=threads, overrides={"eval.closed_form": "per_step"})
    rows, rows_ps = res.rows(), per_step.rows()

    def mean(r, name, metric="policy_ns"):
        return float(r[r.policy == name][metric].mean())

    return {"window": mean(rows, "window"), "window_per_step": mean(rows_ps, "window"), "h2o": mean(rows, "h2o"),
            "h2o_rel_err": mean(rows, "h2o", "rel_err"), "window_rows": rows[rows.policy == "window"]}


def main(argv=None):
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m kvsim.compare_torch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8192, help="tokens")
    ap.add_argument("--d", type=int, default=128, help="head_dim")
    ap.add_argument("--budget", type=float, default=0.25, help="cache size: tokens, or a fraction of n")
    ap.add_argument("--threads", type=int, default=1, help="threads for both (torch.set_num_threads)")
    ap.add_argument("--quick", action="store_true", help="n = 1024 (seconds; the test uses it)")
    a = ap.parse_args(argv)
    torch = torch_or_none()
    if torch is None:
        return 77
    n = 1024 if a.quick else a.n
    budget = int(round(a.budget * n)) if a.budget < 1 else int(a.budget)
    torch.set_num_threads(a.threads)
    rec = synth("heavy_hitter", n=n, d=a.d, layers=1, heads=2, kv_heads=1, seed=1)
    scale = rec.meta["softmax_scale"]
    q = np.stack([rec.q(0, 0), rec.q(0, 1)])
    k, v = rec.k(0, 0), rec.v(0, 0)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v))
    ks = kvsim_side(n, a.d, budget, a.threads)
    torch_window(torch, tq, tk, tv, scale, budget)  # warm-up
    t_win = min(_timed(lambda: torch_window(torch, tq, tk, tv, scale, budget)) for _ in range(3)) * 1e9 / n
    z_win = torch_window(torch, tq, tk, tv, scale, budget).numpy()
    t0 = time.perf_counter()
    z_h2o = torch_h2o(torch, tq, tk, tv, scale, budget).numpy()
    t_h2o = (time.perf_counter() - t0) * 1e9 / n
    g_torch, g_eigen = torch_gemm_gflops(torch), _kvsim._gemm_gflops(1024, True)

    # The same answers: PyTorch's window rel_err against kvsim's rows at sampled steps.
    steps = sorted(set(np.linspace(1, n, 64).astype(int).tolist()))
    mine = rel_err_at(q, k, v, scale, z_win, steps)
    w = ks["window_rows"].set_index(["head", "step"])["rel_err"]
    theirs = np.array([[w.loc[(h, t)] for t in steps] for h in range(2)])
    agree = float(np.max(np.abs(mine - theirs)))
    h2o_err = float(rel_err_at(q, k, v, scale, z_h2o, steps).mean())

    norm = g_torch / g_eigen
    print(f"kvsim vs PyTorch {torch.__version__}: heavy_hitter n={n} head_dim={a.d}, GQA group of 2, budget {budget} "
          f"tokens, float32, {a.threads} thread(s)")
    print(f"GEMM 1024^3 float32: Eigen (kvsim) {g_eigen:.1f} GFLOP/s, torch.mm {g_torch:.1f} GFLOP/s "
          f"(torch at {100 * norm:.1f}% of Eigen)")
    print(f"{'replay':<34} {'kvsim µs/step':>14} {'PyTorch µs/step':>16} {'ratio':>8} {'normalized':>11}")
    for label, mine_ns, torch_ns in (("window (kvsim blocked)", ks["window"], t_win),
                                     ("window (kvsim per step)", ks["window_per_step"], t_win),
                                     ("h2o (step loop both)", ks["h2o"], t_h2o)):
        print(f"{label:<34} {mine_ns / 1e3:>14.2f} {torch_ns / 1e3:>16.2f} {torch_ns / mine_ns:>7.2f}x "
              f"{torch_ns * norm / mine_ns:>10.2f}x")
    print("ratio = PyTorch time / kvsim time; normalized = the same with PyTorch's time scaled to Eigen's GEMM rate")
    print(f"window answers: |rel_err(PyTorch) − rel_err(kvsim)| ≤ {agree:.2e} over {len(steps)} steps x 2 heads; "
          f"h2o mean rel_err at those steps: PyTorch {h2o_err:.4f}, kvsim (all steps) {ks['h2o_rel_err']:.4f}")
    return 0 if agree <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
