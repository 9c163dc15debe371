"""`.venv/bin/python -m kvsim.compare_torch`: kvsim's exact pass and cache replays beside the same work written
in PyTorch the way a researcher would, on the same machine, stream, precision and thread count, with raw
ratios (PyTorch seconds / kvsim seconds: above 1, kvsim is faster).

The stream: the seeded `heavy_hitter` synthetic stream, n tokens (default 8192), head_dim 128, 4 query heads
over 2 KV heads (GQA groups of 2), float32 on both sides. Each row times the answers of all n steps of all 4
query heads, at each thread count of --threads (default 1 and 2; torch.set_num_threads and kvsim's threads):

- exact: causal attention. kvsim: its float32 reference pass (`exact_attention_f32`, the blocks of 128
  steps the engine uses; it also keeps each row's probabilities, log τ and ‖a_t‖₂ for the metrics), the
  (head, block) units shared by the threads. PyTorch:
  `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`.
- window, sink (StreamingLLM's caches, budget B = 25% of n; sink: 4 sink tokens + B − 4 recent): PyTorch
  answers all steps at once as a banded masked attention — blocks of 128 queries against the keys their
  caches can hold, masked to each step's cache, softmax, the values — all heads batched. kvsim: the blocked
  closed-form replay (`[eval] closed_form = "blocked"`).
- h2o (H2O §4.1 Algorithm 1, heavy_ratio 0.5) and tova (TOVA §4 Eq. 6): a step loop over preallocated slot
  tensors, both KV heads batched, as in H2O's reference code: when full, evict per KV head the lowest score
  (h2o: accumulated, outside the recent window; tova: the last step's weight), write the new key and value
  into the freed slot, attend, update the scores with the group-mean attention. kvsim: its policies in
  float32 policy precision, stepped in blocks (`[eval] stepping = "blocked"`, the default; every step answered).
- h2o (blocked): the same h2o written as blocked stepping in PyTorch (torch_blocked_h2o: per block of 128
  steps one GEMM for the logits over the slots and one over the block's own keys, the step loop's walk with the
  logits looked up, the block's answers as one GEMM), so the comparison is against the best a researcher would
  write; its answers must equal the step loop's at ≥ 99% of (head, step) pairs within 1e-4 (a float32 score
  tie may evict the other token), else exit 1.

kvsim's policy seconds come from its policy_ns metric (wall time of each cell's policy work per step, one
cell per KV head): Σ over cells ÷ min(threads, cells), since the engine runs cells on separate threads.
The exact row is timed around the pass itself (no copies). PyTorch rows are wall times of the loops above
(best of 3; the step loops once). GEMM rates (1024³ float32) of kvsim's reference GEMM (oneMKL, else
OpenBLAS, else Eigen, whichever the build links first; its name is printed), Eigen's SGEMM (the
policies' GEMM) and torch.mm are printed for context only.

Correctness: both answer the same queries. The exact outputs must agree within 1e-4 relative (max over
rows), and PyTorch's window and sink answers must match kvsim's rel_err rows at 64 sampled steps within
1e-4 (the exact attention recomputed here in float64), else exit 1. h2o's and tova's mean rel_err are
printed for both (float32 score ties may evict differently, so they are not asserted).

Usage: .venv/bin/python -m kvsim.compare_torch [--n 8192] [--d 128] [--budget 0.25] [--threads 1,2] [--quick]
       [--json FILE]
       .venv/bin/python -m kvsim.compare_torch --hf-forward MODEL.gguf --ids FILE --threads 1,2
         (what `kvsim bench`'s model section runs: transformers' float32 CPU forward over the token ids of
         FILE, logits of every position, best of 2 after a warm-up; prints `hf_forward_seconds THREADS S`
         per thread count)
Exit codes: 0 done, 1 the answers disagree, 2 bad arguments, 77 PyTorch is not importable (nothing measured).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from . import _kvsim, run, synth

HEADS, KV_HEADS, SINK = 4, 2, 4


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


def torch_banded(torch, q, k, v, scale, budget, sink=0, block=128):
    """Window (sink = 0) or sink cache answers of every step as a banded masked attention.
    q [H_kv, G, n, d], k and v [H_kv, n, d]; step t (1-based) attends keys j < min(sink, t) and
    max(sink, t − (budget − sink)) ≤ j < t. Returns [H_kv, G, n, d]."""
    Hkv, G, n, d = q.shape
    window = budget - sink
    out = torch.empty(Hkv, G, n, d)
    rows = torch.arange(block).unsqueeze(1)
    for s in range(0, n, block):
        e = min(n, s + block)
        lo = max(sink, s + 1 - window)
        idx = torch.cat([torch.arange(min(sink, e)), torch.arange(min(lo, e), e)])
        kb, vb = k[:, idx], v[:, idx]  # [H_kv, band, d]
        scores = torch.matmul(q[:, :, s:e] * scale, kb.transpose(1, 2).unsqueeze(1))  # [H_kv, G, rows, band]
        step = rows[: e - s] + s + 1
        key = idx.unsqueeze(0)
        mask = (key >= step) | ((key >= sink) & (key < step - window))
        scores.masked_fill_(mask, float("-inf"))
        out[:, :, s:e] = torch.matmul(torch.softmax(scores, dim=-1), vb.unsqueeze(1))
    return out


class _Slots:
    """Preallocated cache slots of every KV head, as H2O's reference code keeps them: keys, values, positions
    and scores [H_kv, budget, …]; `size` slots are filled."""

    def __init__(self, torch, Hkv, budget, d):
        self.torch, self.budget, self.size = torch, budget, 0
        self.K, self.V = torch.zeros(Hkv, budget, d), torch.zeros(Hkv, budget, d)
        self.pos = torch.full((Hkv, budget), -1, dtype=torch.long)
        self.score = torch.zeros(Hkv, budget)
        self.heads = torch.arange(Hkv)
        self.inf = torch.tensor(float("inf"))

    def take(self, t, k, v, recent):
        """Token t joins (evicting before it does, as kvsim): the next free slot, else per KV head the lowest
        score among positions ≤ t − recent; its key, value, position and a zero score are written there.
        Returns the slot per KV head [H_kv]."""
        torch = self.torch
        if self.size < self.budget:
            slot = torch.full((len(self.heads),), self.size, dtype=torch.long)
            self.size += 1
        else:
            slot = torch.argmin(torch.where(self.pos <= t - recent, self.score, self.inf), dim=1)
        h = self.heads
        self.K[h, slot], self.V[h, slot], self.pos[h, slot], self.score[h, slot] = k[:, t], v[:, t], t, 0.0
        return slot


def _h2o_recent(budget, heavy_ratio):
    """H2O's recent window: the budget less its heavy hitters (at least 1 of each)."""
    return budget - min(budget - 1, max(1, round(heavy_ratio * budget)))


def torch_step_loop(torch, q, k, v, scale, budget, policy, heavy_ratio=0.5):
    """h2o or tova as a step loop over preallocated slots (evict before the new token joins, as kvsim).
    q [H_kv, G, n, d], k and v [H_kv, n, d]; returns [H_kv, G, n, d]."""
    Hkv, G, n, d = q.shape
    recent = _h2o_recent(budget, heavy_ratio) if policy == "h2o" else 0
    c = _Slots(torch, Hkv, budget, d)
    out = torch.empty(Hkv, G, n, d)
    for t in range(n):
        c.take(t, k, v, recent)
        a = torch.softmax(torch.matmul(q[:, :, t] * scale, c.K[:, :c.size].transpose(1, 2)), dim=-1)  # [H_kv, G, size]
        if policy == "h2o":
            c.score[:, :c.size] += a.mean(1)
        else:
            c.score[:, :c.size] = a.mean(1)
        out[:, :, t] = torch.matmul(a, c.V[:, :c.size])
    return out


def torch_blocked_h2o(torch, q, k, v, scale, budget, heavy_ratio=0.5, block=128, masking=True):
    """h2o as blocked stepping in PyTorch (the best a researcher would write, as kvsim's `stepping = "blocked"`):
    per block of b steps one GEMM of the block's queries against the slots' keys at its start and one against
    its own keys, then the same walk as torch_step_loop with each step's logits looked up (a slot a block token
    took reads that token's column), and the block's answers as one GEMM of its steps' probabilities, scattered
    onto [slots at the start | the block's own tokens], against those values.
    q [H_kv, G, n, d], k and v [H_kv, n, d]; returns [H_kv, G, n, d]. masking=False (the tests' negative
    control): a slot a block token took over keeps reading the evicted token's logit."""
    Hkv, G, n, d = q.shape
    recent = _h2o_recent(budget, heavy_ratio)
    c = _Slots(torch, Hkv, budget, d)
    out = torch.empty(Hkv, G, n, d)
    slots = torch.arange(budget)
    for t0 in range(0, n, block):
        b = min(block, n - t0)
        qb = q[:, :, t0:t0 + b] * scale                                        # [H_kv, G, b, d]
        Ls = torch.matmul(qb, c.K.transpose(1, 2).unsqueeze(1))                # [H_kv, G, b, budget]
        Lb = torch.matmul(qb, k[:, t0:t0 + b].transpose(1, 2).unsqueeze(1))    # [H_kv, G, b, b]
        Vc = torch.cat([c.V, v[:, t0:t0 + b]], dim=1)                           # [H_kv, budget + b, d]
        tok = torch.full((Hkv, budget), -1, dtype=torch.long)                   # block token in each slot
        P = torch.zeros(Hkv, G, b, budget + b)
        size_at_start = c.size
        for i in range(b):
            slot = c.take(t0 + i, k, v, recent)
            if masking:
                tok[c.heads, slot] = i
            else:  # only slots never filled before this block get the block token's logits
                tok[c.heads, slot] = torch.where(slot >= size_at_start, i, tok[c.heads, slot])
            size = c.size
            taken = tok[:, :size] >= 0                                          # [H_kv, size]
            col = torch.where(taken, tok[:, :size].clamp(min=0), 0).unsqueeze(1).expand(Hkv, G, size)
            logits = torch.where(taken.unsqueeze(1), torch.gather(Lb[:, :, i], 2, col), Ls[:, :, i, :size])
            a = torch.softmax(logits, dim=-1)                                   # [H_kv, G, size]
            c.score[:, :size] += a.mean(1)
            dest = torch.where(taken, budget + tok[:, :size], slots[:size]).unsqueeze(1).expand(Hkv, G, size)
            P[:, :, i].scatter_(2, dest, a)
        out[:, :, t0:t0 + b] = torch.matmul(P, Vc.unsqueeze(1))
    return out


def hf_forward(torch, model_path, ids_path, threads):
    """Seconds of one transformers forward (float32, CPU, no KV cache kept) over the ids in ids_path, at
    each thread count of `threads` (one model load): {threads: seconds}."""
    from .kvpress import load_model
    model, _ = load_model(model_path)
    with open(ids_path) as f:
        ids = torch.tensor([[int(x) for x in f.read().split()]])
    out = {}
    with torch.inference_mode():
        for th in threads:
            torch.set_num_threads(th)
            model(ids[:, :16], use_cache=False)
            out[th] = min(_timed(lambda: model(ids, use_cache=False)) for _ in range(2))
    return out


def rel_err_at(q, k, v, scale, z, steps):
    """‖z_t − Attn_t‖ / ‖Attn_t‖ per (query head, step), the exact attention in float64.
    q, z [H, n, d]; k, v [H_kv, n, d]."""
    H, G = q.shape[0], q.shape[0] // k.shape[0]
    res = np.empty((H, len(steps)))
    for j, t in enumerate(steps):
        for h in range(H):
            kh, vh = k[h // G, :t].astype(np.float64), v[h // G, :t].astype(np.float64)
            logits = kh @ (q[h, t - 1].astype(np.float64) * scale)
            a = np.exp(logits - logits.max())
            exact = (a / a.sum()) @ vh
            res[h, j] = np.linalg.norm(z[h, t - 1] - exact) / np.linalg.norm(exact)
    return res


def rel_err_row_diff(q, k, v, scale, z, rows, name, steps):
    """max |rel_err(z) − kvsim's rel_err row| over query heads and `steps`, for policy `name` of kvsim's
    rows (policy, head, step): whether the answers z [H, n, d] are the ones kvsim's cache gave."""
    w = rows[rows.policy == name].set_index(["head", "step"])["rel_err"]
    theirs = np.array([[w.loc[(h, t)] for t in steps] for h in range(q.shape[0])])
    return float(np.max(np.abs(rel_err_at(q, k, v, scale, z, steps) - theirs)))


def kvsim_policies(n, d, budget, threads):
    """kvsim's seconds for all n steps of all query heads per policy, and its rows (policy, head, step)."""
    cfg = {"name": "compare_torch", "seed": 1,
           "data": {"synthetic": "heavy_hitter", "n": n, "d": d, "n_layers": 1, "n_heads": HEADS,
                    "n_kv_heads": KV_HEADS},
           "eval": {"every": 1, "policy_precision": "float32", "reference_precision": "float32"},
           "policy": [{"name": "window", "budget": budget}, {"name": "sink", "sink": SINK, "budget": budget},
                      {"name": "h2o", "budget": budget}, {"name": "tova", "budget": budget}]}
    rows = run(cfg, threads=threads).rows()
    seconds = {}
    for name in ("window", "sink", "h2o", "tova"):
        # policy_ns is per cell (KV head) and step; each query head's row of the group repeats it.
        per_head = rows[rows.policy == name].groupby("head").policy_ns.mean()
        per_step = float(per_head.sum()) / (HEADS // KV_HEADS) / min(threads, KV_HEADS)
        seconds[name] = per_step * n / 1e9
    return seconds, rows


def measure(torch, a, n, budget, threads):
    """One thread count: the rows [(name, kvsim s, PyTorch s)] and the agreement checks."""
    torch.set_num_threads(threads)
    rec = synth("heavy_hitter", n=n, d=a.d, layers=1, heads=HEADS, kv_heads=KV_HEADS, seed=1)
    scale = rec.meta["softmax_scale"]
    q = np.stack([rec.q(0, h) for h in range(HEADS)])
    k = np.stack([rec.k(0, h) for h in range(KV_HEADS)])
    v = np.stack([rec.v(0, h) for h in range(KV_HEADS)])
    G = HEADS // KV_HEADS
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v))
    tq4 = tq.view(KV_HEADS, G, n, a.d)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    # exact causal attention (each side's answers from its untimed warm-up or first call)
    passes = [_kvsim._exact_causal(q, k, v, scale, threads) for _ in range(3)]
    z_kvsim, ks_exact = passes[0][0], min(sec for _, sec in passes)
    exact = lambda: sdpa(tq.unsqueeze(0), tk.unsqueeze(0), tv.unsqueeze(0), is_causal=True, scale=scale,  # noqa: E731
                         enable_gqa=True)
    z_torch = exact()[0].numpy()
    t_exact = min(_timed(exact) for _ in range(3))
    exact_diff = float(np.max(np.linalg.norm(z_torch - z_kvsim, axis=-1) / np.linalg.norm(z_kvsim, axis=-1)))

    ks, krows = kvsim_policies(n, a.d, budget, threads)
    rows = [("exact causal attention", ks_exact, t_exact)]
    steps = sorted(set(np.linspace(1, n, 64).astype(int).tolist()))
    checks = {"exact_max_rel_diff": exact_diff}
    for name, sink in (("window", 0), ("sink", SINK)):
        banded = lambda: torch_banded(torch, tq4, tk, tv, scale, budget, sink)  # noqa: E731
        z = banded().reshape(HEADS, n, a.d).numpy()  # also the warm-up
        rows.append((f"{name} (banded)", ks[name], min(_timed(banded) for _ in range(3))))
        checks[f"{name}_max_rel_err_diff"] = rel_err_row_diff(q, k, v, scale, z, krows, name, steps)
    loops = {}
    for name in ("h2o", "tova"):
        t0 = time.perf_counter()
        z = torch_step_loop(torch, tq4, tk, tv, scale, budget, name).reshape(HEADS, n, a.d).numpy()
        rows.append((f"{name} (step loop)", ks[name], time.perf_counter() - t0))
        loops[name] = z
        checks[f"{name}_rel_err_torch"] = float(rel_err_at(q, k, v, scale, z, steps).mean())
        checks[f"{name}_rel_err_kvsim"] = float(krows[krows.policy == name].rel_err.mean())
    t0 = time.perf_counter()
    z = torch_blocked_h2o(torch, tq4, tk, tv, scale, budget).reshape(HEADS, n, a.d).numpy()
    rows.append(("h2o (blocked)", ks["h2o"], time.perf_counter() - t0))
    # The blocked walk is the step loop's, its logits and answers from GEMMs: the same answers up to float32
    # rounding (and, rarely, a score tie broken the other way), at every step.
    rel = np.linalg.norm(z - loops["h2o"], axis=-1) / np.linalg.norm(loops["h2o"], axis=-1)
    checks["h2o_blocked_vs_loop_median_rel_diff"] = float(np.median(rel))
    checks["h2o_blocked_steps_off"] = float(np.mean(rel > 1e-4))
    gemm = {"eigen_gflops": _kvsim._gemm_gflops(1024, True),
            "reference_gemm_gflops": _kvsim._reference_gemm_gflops(1024),
            "torch_mm_gflops": torch_gemm_gflops(torch)}
    return rows, checks, gemm


def main(argv=None):
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m kvsim.compare_torch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8192, help="tokens")
    ap.add_argument("--d", type=int, default=128, help="head_dim")
    ap.add_argument("--budget", type=float, default=0.25, help="cache size: tokens, or a fraction of n")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--quick", action="store_true", help="n = 1024, one thread (seconds; the test uses it)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows, checks and versions as JSON")
    ap.add_argument("--hf-forward", metavar="MODEL", help="time transformers' forward of MODEL over --ids instead")
    ap.add_argument("--ids", metavar="FILE", help="token ids (whitespace-separated) for --hf-forward")
    a = ap.parse_args(argv)
    if a.hf_forward:
        torch = torch_or_none()
        if torch is None:
            return 77
        for th, sec in hf_forward(torch, a.hf_forward, a.ids, [int(x) for x in a.threads.split(",")]).items():
            print(f"hf_forward_seconds {th} {sec:.6f}")
        return 0
    try:
        threads = [1] if a.quick else [int(x) for x in a.threads.split(",")]
        if not threads or min(threads) < 1:
            raise ValueError
    except ValueError:
        print(f"compare_torch: error: --threads {a.threads!r}: expected thread counts ≥ 1 such as 1,2")
        return 2
    torch = torch_or_none()
    if torch is None:
        return 77
    n = 1024 if a.quick else a.n
    budget = int(round(a.budget * n)) if a.budget < 1 else int(a.budget)
    if not (SINK < budget <= n) or a.d < 1:
        print(f"compare_torch: error: budget {budget} tokens: must lie in ({SINK}, n = {n}]; head_dim ≥ 1")
        return 2
    print(f"kvsim {_kvsim._version()} vs PyTorch {torch.__version__}: heavy_hitter n={n} head_dim={a.d}, "
          f"{HEADS} query heads over {KV_HEADS} KV heads, budget {budget} tokens, float32")
    print(f"kvsim's float32 reference GEMM: {_kvsim._gemm_backend()}")
    print(f"{'row':<26} {'threads':>7} {'kvsim s':>10} {'PyTorch s':>10} {'ratio':>8}")
    report = {"kvsim_version": _kvsim._version(), "torch_version": torch.__version__,
              "gemm_backend": _kvsim._gemm_backend(),
              "shape": {"n": n, "head_dim": a.d, "heads": HEADS, "kv_heads": KV_HEADS, "budget": budget,
                        "sink": SINK, "dtype": "float32"}, "rows": [], "checks": [], "gemm": []}
    ok = True
    for th in threads:
        rows, checks, gemm = measure(torch, a, n, budget, th)
        for name, mine, theirs in rows:
            print(f"{name:<26} {th:>7} {mine:>10.4f} {theirs:>10.4f} {theirs / mine:>7.2f}x")
            report["rows"].append({"name": name, "threads": th, "kvsim_s": mine, "torch_s": theirs,
                                   "ratio": theirs / mine})
        report["checks"].append({"threads": th, **checks})
        report["gemm"].append({"threads": th, **gemm})
        ok &= max(v for key, v in checks.items() if "diff" in key) <= 1e-4
        ok &= checks["h2o_blocked_steps_off"] <= 0.01
        print(f"  {th} thread(s): exact outputs within {checks['exact_max_rel_diff']:.1e}; window/sink rel_err "
              f"within {max(checks['window_max_rel_err_diff'], checks['sink_max_rel_err_diff']):.1e}; mean "
              f"rel_err PyTorch/kvsim h2o {checks['h2o_rel_err_torch']:.4f}/{checks['h2o_rel_err_kvsim']:.4f}, "
              f"tova {checks['tova_rel_err_torch']:.4f}/{checks['tova_rel_err_kvsim']:.4f}; PyTorch's blocked h2o "
              f"against its step loop: median {checks['h2o_blocked_vs_loop_median_rel_diff']:.1e}, "
              f"{100 * checks['h2o_blocked_steps_off']:.2f}% of answers beyond 1e-4; GEMM 1024³ "
              f"kvsim's reference {gemm['reference_gemm_gflops']:.1f}, Eigen {gemm['eigen_gflops']:.1f}, "
              f"torch.mm {gemm['torch_mm_gflops']:.1f} GFLOP/s")
    print("ratio = PyTorch seconds / kvsim seconds (above 1: kvsim is faster); all n steps of all query heads")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
