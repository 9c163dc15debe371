#!/usr/bin/env python3
"""kvsim's policies beside kvpress's presses of the same name, token by token, on SmolLM2-135M.

Usage: kvpress_conformance_test.py REPO MODELS_DIR SHARED_DATA [--tokens P] [--json FILE]

One prompt of P = 512 tokens of Tiny Shakespeare. transformers loads the SmolLM2 GGUF (float32, CPU);
datasets/export_hf.py records P + 1 tokens of it in float32 (the same tensors kvpress's cache holds),
and kvpress runs each press on the first P. For compression ratios r in {0.25, 0.5, 0.75} (kvpress
keeps n_kept = int(P·(1 − r)) tokens per layer and KV head), the kvsim policy mapped to the press
(docs/kvpress.md) replays the recording with `[data] prefill = P`, and kvsim.kept_tokens gives its
cache at the first decoded step P + 1 (the compressed prompt plus token P, which kvpress appends
when decoding starts). Per layer and KV head the two prompt sets are compared:

  StreamingLLMPress(n_sink=4)          sink(budget = n_kept + 1, sink = 4)          identical
  SnapKVPress(window 64, kernel 5)     snapkv(budget = n_kept, window = 64,         identical but near-ties
                                         kernel = 5, pooling = "avg")
  KnormPress                           knorm(budget = n_kept + 1)                   identical but near-ties
  KeyDiffPress                         keydiff(budget = n_kept), read at step P     identical but near-ties
  LagKVPress(n_sink 4, lag_size 128)   lagkv(budget = n_kept, sink = 4, lag = 128), identical but near-ties
                                         read at step P
  ExpectedAttentionPress (defaults:    expected_attention(budget = n_kept)          identical but near-ties
    512 future positions, 4 sinks,
    covariance, ‖v‖ rescaling)
  PyramidKVPress(window 64, kernel 5)  pyramidkv(as snapkv, budgets = "kvpress")    identical but near-ties
                                       pyramidkv(budgets = "paper", kvsim's default) differs by design: counted
  TOVAPress                            tova(budget = n_kept + 1)                    differs by design: counted

  BudgetsPress(SnapKVPress) with a     snapkv(memory = 200, budgets_file, as        identical but near-ties
    file of uneven budgets               snapkv above)
    (kvsim.kvpress_budgets)

A near-tie is a token on which the sets differ whose kvpress score lies within 1e-5 (relative to the
score range) of kvpress's cut-off. Negative controls: snapkv with max pooling (kvsim's default, not
kvpress's), knorm one token short, lagkv with lag = 32 and expected_attention without the ‖v‖ factor
must show differences that are not ties.
(LagKV's scores are ranks within a partition, so ties are exact and many: at r = 0.75 kvpress keeps
128 of the 256 tokens scored 1, its choice among them torch.topk's.) TOVA: kvpress averages
the last query's attention over all the layer's query heads and keeps one set for every KV head (the
same set: checked); kvsim's tova, following the paper's stream, evicts one token per step by the
group's weights; the differing share is printed.

Exit 0 when every check holds, 1 otherwise, 77 (SKIPPED) when torch/transformers/kvpress or the
model file is missing (tests/cli/setup_check.py fails the suite in that case after setup).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RATIOS = (0.25, 0.5, 0.75)
DECODE = 32  # decoded tokens after the prompt in the recording (the replay check decodes them)


def run_ratio(c, ratio):
    """The five presses (and the two controls) at one compression ratio."""
    kvpress, bridge, model, ids, P, L, H = c["kvpress"], c["bridge"], c["model"], c["ids"], c["P"], c["L"], c["H"]
    compare, check, np = c["compare"], c["check"], c["np"]
    n_kept = max(1, int(P * (1 - ratio)))
    streaming = bridge.capture(kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4), model, ids)
    r = compare("StreamingLLMPress", streaming, {"name": "sink", "budget": n_kept + 1, "sink": 4}, ratio, "identical")
    check(r["differing_tokens"] == 0, f"StreamingLLMPress r={ratio}: sink keeps other tokens")

    snap = bridge.capture(kvpress.SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), model, ids)
    snap_policy = {"name": "snapkv", "budget": n_kept, "window": 64, "kernel": 5, "pooling": "avg"}
    r = compare("SnapKVPress", snap, snap_policy, ratio, "identical but near-ties")
    check(r["differing_tokens"] == r["near_ties"], f"SnapKVPress r={ratio}: differences beyond near-ties")
    r = compare("SnapKVPress", snap, dict(snap_policy, pooling="max"), ratio, "differs (control)", control=True)
    check(r["differing_tokens"] > r["near_ties"], f"SnapKVPress r={ratio}: the max-pooling control shows no difference")

    pyramid = bridge.capture(kvpress.PyramidKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
                             model, ids)
    pyramid_policy = dict(snap_policy, name="pyramidkv", budgets="kvpress")
    r = compare("PyramidKVPress", pyramid, pyramid_policy, ratio, "identical but near-ties")
    check(r["differing_tokens"] == r["near_ties"], f"PyramidKVPress r={ratio}: differences beyond near-ties")
    compare("PyramidKVPress", pyramid, dict(pyramid_policy, budgets="paper"), ratio, "differs by design (paper budgets)",
            control=True)

    knorm = bridge.capture(kvpress.KnormPress(compression_ratio=ratio), model, ids)
    r = compare("KnormPress", knorm, {"name": "knorm", "budget": n_kept + 1}, ratio, "identical but near-ties")
    check(r["differing_tokens"] == r["near_ties"], f"KnormPress r={ratio}: differences beyond near-ties")
    r = compare("KnormPress", knorm, {"name": "knorm", "budget": n_kept}, ratio, "differs (control)", control=True)
    check(r["differing_tokens"] > r["near_ties"], f"KnormPress r={ratio}: the one-token-short control shows no difference")

    keydiff = bridge.capture(kvpress.KeyDiffPress(compression_ratio=ratio), model, ids)
    r = compare("KeyDiffPress", keydiff, {"name": "keydiff", "budget": n_kept}, ratio, "identical but near-ties", step=P)
    check(r["differing_tokens"] == r["near_ties"], f"KeyDiffPress r={ratio}: differences beyond near-ties")

    lag = bridge.capture(kvpress.LagKVPress(compression_ratio=ratio, n_sink=4, lag_size=128), model, ids)
    lag_policy = {"name": "lagkv", "budget": n_kept, "sink": 4, "lag": 128}
    r = compare("LagKVPress", lag, lag_policy, ratio, "identical but near-ties", step=P)
    check(r["differing_tokens"] == r["near_ties"], f"LagKVPress r={ratio}: differences beyond near-ties")
    r = compare("LagKVPress", lag, dict(lag_policy, lag=32), ratio, "differs (control)", control=True, step=P)
    check(r["differing_tokens"] > r["near_ties"], f"LagKVPress r={ratio}: the lag-32 control shows no difference")

    expected = bridge.capture(kvpress.ExpectedAttentionPress(compression_ratio=ratio), model, ids)
    r = compare("ExpectedAttentionPress", expected, {"name": "expected_attention", "budget": n_kept}, ratio,
                "identical but near-ties")
    check(r["differing_tokens"] == r["near_ties"], f"ExpectedAttentionPress r={ratio}: differences beyond near-ties")
    if ratio == 0.5:  # one ratio is enough for this control
        r = compare("ExpectedAttentionPress", expected, {"name": "expected_attention", "budget": n_kept, "vnorm": False},
                    ratio, "differs (control)", control=True)
        check(r["differing_tokens"] > r["near_ties"], f"ExpectedAttentionPress r={ratio}: the no-vnorm control shows no difference")

    tova = bridge.capture(kvpress.TOVAPress(compression_ratio=ratio), model, ids)
    check(all(np.array_equal(tova.kept[l][0], tova.kept[l][h]) for l in range(L) for h in range(H)),
          f"TOVAPress r={ratio}: kvpress's sets differ across KV heads (expected one set per layer)")
    compare("TOVAPress", tova, {"name": "tova", "budget": n_kept + 1}, ratio, "differs by design")



def check_adakv(c, ratio=0.5, alpha=0.2):
    """AdaKVPress(ExpectedAttentionPress) masks entries per head instead of removing them; the capture
    reads each head's kept set from kvpress's masked_key_indices. Against kvpress's own scores: every
    layer keeps H·n_kept entries in all, each head at least its n_safe best, and outside those the masked
    entries are the layer's lowest scores (up to near-ties); the heads' budgets differ (else AdaKV would
    be a plain press)."""
    kvpress, bridge, P, L, H, check, np = c["kvpress"], c["bridge"], c["P"], c["L"], c["H"], c["check"], c["np"]
    cap = bridge.capture(kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(compression_ratio=ratio),
                                            alpha_safeguard=alpha), c["model"], c["ids"])
    n_kept = int(P * (1 - ratio))
    n_safe = max(1, int(n_kept * alpha))
    uneven = worst = 0
    for l in range(L):
        sizes = [len(cap.kept[l][h]) for h in range(H)]
        check(sum(sizes) == H * n_kept, f"AdaKV layer {l}: {sum(sizes)} entries kept, expected {H * n_kept}")
        uneven += len(set(sizes)) > 1
        s = cap.scores[l]
        free = np.ones_like(s, dtype=bool)
        for h in range(H):
            safe = np.argsort(-s[h], kind="stable")[:n_safe]
            check(np.isin(safe, cap.kept[l][h]).all(), f"AdaKV layer {l} head {h}: its n_safe best not all kept")
            free[h, safe] = False
        kept = np.zeros_like(s, dtype=bool)
        for h in range(H):
            kept[h, cap.kept[l][h]] = True
        lo, hi = s[kept & free].min(), s[~kept & free].max() if (~kept & free).any() else -np.inf
        worst = max(worst, (hi - lo) / np.abs(s).max())
    print(f"AdaKVPress(ExpectedAttentionPress) r={ratio}: {uneven}/{L} layers with unequal head budgets; "
          f"masked above kept by at most {max(worst, 0):.1e} of the score range")
    check(worst <= 1e-5, "AdaKV: a masked entry outscores a kept one beyond near-ties")
    check(uneven > 0, "AdaKV: every layer's heads kept equally many tokens")


def check_budgets(c, tmp):
    """kvsim's budgets_file beside kvsim.kvpress_budgets.BudgetsPress around SnapKVPress: a file of uneven
    per-(layer, KV head) budgets, written for this prompt's length, keeps the same tokens per cache in both
    (near-ties aside), with the budgets each cache was given; the uniform SnapKVPress at the same mean is the
    negative control (its sets differ wherever a budget is not the mean)."""
    kvpress, bridge, P, L, H, check, compare, np = (c[k] for k in ("kvpress", "bridge", "P", "L", "H", "check", "compare", "np"))
    from kvsim import kvpress_budgets

    n, M = P + 1, 200  # the replay's stream: the prompt and token P (kvsim_sets' data.tokens)
    shares = [[0.5 + 0.5 * ((3 * l + h) % 4) for h in range(H)] for l in range(L)]  # 0.5, 1, 1.5, 2 × M, uneven
    budgets = kvpress_budgets.scale(shares, sum(map(sum, shares)) / (L * H), M)  # integers averaging M exactly
    path = os.path.join(tmp, "budgets.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"kvsim_budgets": 1, "n_layers": L, "n_kv_heads": H, "n": n, "layers": list(range(L)),
                   "granularity": "head", "allocations": [{"memory": M, "memory_tokens": M, "budgets": budgets}]}, f)
    counts = kvpress_budgets.counts_for(path, M, P)
    check(counts == budgets, "counts_for: a file written for this length did not give its own budgets back")
    inner = kvpress.SnapKVPress(compression_ratio=1 - M / P, window_size=64, kernel_size=5)
    press = bridge.capture(kvpress_budgets.budgets_press(inner, counts), c["model"], c["ids"])
    sizes = [[len(press.kept[l][h]) for h in range(H)] for l in range(L)]
    check(sizes == budgets, "BudgetsPress kept other counts than the file's budgets")
    policy = {"name": "snapkv", "memory": M, "budgets_file": path, "window": 64, "kernel": 5, "pooling": "avg",
              "decode_window": -1}
    r = compare("BudgetsPress(SnapKVPress)", press, policy, "file", "identical but near-ties")
    check(r["differing_tokens"] == r["near_ties"], "BudgetsPress(SnapKVPress) vs snapkv + budgets_file: differences beyond near-ties")
    uniform = bridge.capture(kvpress.SnapKVPress(compression_ratio=1 - M / P, window_size=64, kernel_size=5), c["model"], c["ids"])
    r = compare("SnapKVPress (uniform)", uniform, policy, "file", "differs (control)", control=True)
    check(r["differing_tokens"] > r["near_ties"], "control: the uniform SnapKVPress keeps what the budgets keep")


def check_replay(c, kvsim, rec, tmp):
    """A press file replayed by kvsim's press_replay: SnapKVPress's kept sets, decoded with every new token
    appended, answer exactly as kvsim's snapkv with the mapped parameters (decode_window = -1 appends too)
    at every decoded step; TOVAPress's set (negative control) does not; a wrong prompt length is refused."""
    kvpress, bridge, P, check = c["kvpress"], c["bridge"], c["P"], c["check"]
    n_kept = int(P * 0.5)
    snap = bridge.save(bridge.capture(kvpress.SnapKVPress(compression_ratio=0.5, window_size=64, kernel_size=5),
                                      c["model"], c["ids"]), os.path.join(tmp, "snapkv.h5"))
    tova = bridge.save(bridge.capture(kvpress.TOVAPress(compression_ratio=0.5), c["model"], c["ids"]),
                       os.path.join(tmp, "tova.h5"))
    cfg = {"name": "press_replay", "data": {"path": rec, "prefill": P}, "eval": {"every": 8, "from": P + 1},
           "policy": [{"name": "press_replay", "file": snap, "label": "snapkv_press"},
                      {"name": "snapkv", "budget": n_kept, "window": 64, "kernel": 5, "pooling": "avg", "label": "snapkv_mapped"},
                      {"name": "press_replay", "file": tova, "label": "tova_press"}]}
    rows = kvsim.run(cfg).rows()
    a, b, t = (rows[rows["label"] == name].reset_index(drop=True) for name in ("snapkv_press", "snapkv_mapped", "tova_press"))
    worst = float((a["rel_err"] - b["rel_err"]).abs().max())
    print(f"press_replay(SnapKVPress) vs snapkv over {len(a)} rows: worst rel_err difference {worst:.2e}; "
          f"cache_tokens equal: {bool((a['cache_tokens'] == b['cache_tokens']).all())}")
    check(len(a) == len(b) > 0 and worst <= 1e-12, "press_replay of SnapKVPress does not answer as snapkv")
    check((a["cache_tokens"] == b["cache_tokens"]).all(), "press_replay's cache size differs from snapkv's")
    check(float((t["rel_err"] - b["rel_err"]).abs().max()) > 1e-6, "control: the TOVA press file answers as snapkv")
    try:
        kvsim.run(cfg | {"data": {"path": rec, "prefill": P - 1}, "policy": cfg["policy"][:1]})
        check(False, "a press file of another prompt length was accepted")
    except kvsim.Error as e:
        check("compressed a prompt of" in str(e), f"unexpected refusal: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("models")
    ap.add_argument("data")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    gguf = os.path.join(a.models, GGUF)
    if not os.path.isfile(gguf):
        print(f"SKIPPED: {gguf} missing (bash scripts/setup.sh fetches it)")
        return 77
    try:
        import numpy as np
        import kvpress
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    import kvsim
    from kvsim import kvpress as bridge

    P = a.tokens
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(a.data, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
            text = f.read()[:20000]
        text_path = os.path.join(tmp, "text.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(text)
        rec = os.path.join(tmp, "prompt.h5")
        subprocess.run([sys.executable, os.path.join(a.repo, "datasets", "export_hf.py"), "--model", a.models,
                        "--gguf-file", GGUF, "--text", text_path, "--tokens", str(P + DECODE), "--dtype", "float32",
                        "--model-dtype", "float32", "--device", "cpu", "--no-attn", "--out", rec],
                       check=True, stdout=subprocess.DEVNULL)
        recording = kvsim.Recording(rec)
        ids = recording.tokens()[:P]
        meta = recording.meta
        L, H = meta["n_layers"], meta["n_kv_heads"]
        model, _ = bridge.load_model(gguf)

        def kvsim_sets(policy, ratio_label, step=0):
            cfg = {"name": "kvpress_conformance", "data": {"path": rec, "prefill": P, "tokens": P + 1},
                   "policy": [policy]}
            out = {}
            for (l, h), (k,) in kvsim.kept_tokens(cfg, step=step).items():
                check(step == P or k[-1] == P, f"{ratio_label} {policy['name']} layer {l} KV head {h}: token P not in the cache")
                out[l, h] = k[k < P]
            return out

        rows = []

        def compare(press_name, capture, policy, ratio, expect, control=False, step=0):
            label = f"{press_name} r={ratio} vs {policy}"
            mine = kvsim_sets(policy, label, step)
            total = ties = heads_differ = 0
            for l in range(L):
                for h in range(H):
                    theirs = capture.kept[l][h]
                    scores = capture.scores[l][h] if capture.scores[l] is not None else np.zeros(P)
                    d, t = bridge.near_ties(scores, theirs, mine[l, h])
                    total += d
                    ties += t
                    heads_differ += d > 0
            row = {"press": press_name, "ratio": ratio, "policy": policy, "differing_tokens": total,
                   "near_ties": ties, "heads_differing": heads_differ, "heads": L * H,
                   "kept_per_head": int(np.mean([len(capture.kept[l][h]) for l in range(L) for h in range(H)])),
                   "expect": expect, "control": control}
            rows.append(row)
            print(f"{label}: {total} differing tokens ({ties} near-ties) over {heads_differ}/{L * H} heads")
            return row

        ctx = dict(kvpress=kvpress, bridge=bridge, model=model, ids=ids, P=P, L=L, H=H, compare=compare, check=check, np=np)
        for ratio in RATIOS:
            run_ratio(ctx, ratio)
        check_adakv(ctx)
        check_budgets(ctx, tmp)
        check_replay(ctx, kvsim, rec, tmp)

        if a.json:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"tokens": P, "model": GGUF, "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "",
                           "rows": rows}, f, indent=1)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("kvpress conformance: all checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
