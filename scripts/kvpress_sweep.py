#!/usr/bin/env python3
"""kvpress's presses measured by kvsim's metrics on SmolLM2-135M, beside kvsim's own policies.

Usage: .venv/bin/python scripts/kvpress_sweep.py [--models models] [--data ../shared/data]
           [--prompt 1024] [--decode 256] [--every 16] [--presses A,B,...] [--out results/kvpress_sweep]

1. datasets/export_hf.py records prompt + decode tokens of Tiny Shakespeare from transformers (float32;
   the tensors kvpress's cache holds) into OUT/prompt.h5.
2. Every press of kvsim.kvpress_catalog that runs at prefill (kinds direct and wrapped: 28 of kvpress
   0.5.5's 47 exports; --presses picks some) runs on the prompt at compression ratios 0.25, 0.5 and
   0.75, built as the catalogue builds it (wrappers around SnapKVPress); kvsim.kvpress_catalog.capture
   reads back the kept positions and kvsim.kvpress.save writes OUT/presses/NAME_R.h5. A press kvpress
   refuses is listed with its one-line reason; OUT/catalog.csv lists every export with its kind and
   how it was built or why it is not run.
3. One kvsim run replays the recording with [data] prefill = prompt: every press file through
   `press_replay` (prefill keeps the press's tokens, every decoded token joins), and kvsim's own
   policies at the same prompt budget (snapkv, pyramidkv with kvpress's budgets: the same memory at
   every step) and at the press caches' mean size over the decode, M = n_kept + decode/2 (sink, window,
   h2o, tova, knorm: min(M, t) tokens at every step).
4. OUT/table.csv and a Markdown table on stdout: per entry the mean rel_err, kept_mass and cache tokens
   over every (layer, query head, evaluated step), with a 95% bootstrap interval of rel_err over the 9
   query heads × 30 layers (cells resampled, seed 0).

Exit 0; 2 on bad input (missing model or text, unknown press), 3 when torch/transformers/kvpress are
missing.
"""
import argparse
import csv
import os
import subprocess
import sys

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RATIOS = (0.25, 0.5, 0.75)


def capture_all(a, cat, bridge, model, ids, folder):
    """Every press × ratio captured and saved; returns [(press, ratio, file, mean kept)] and refusals."""
    import numpy as np

    done, refused = [], []
    os.makedirs(folder, exist_ok=True)
    for name in a.presses:
        for ratio in RATIOS:
            path = os.path.join(folder, f"{name}_{ratio}.h5")
            try:
                cap = cat.capture(name, ratio, model, ids)
            except Exception as e:  # kvsim.Error: a press kvpress refuses here
                refused.append((name, ratio, str(e)))
                print(f"kvpress_sweep: {name} r={ratio}: {e}", file=sys.stderr)
                continue
            bridge.save(cap, path, compression_ratio=ratio)
            kept = float(np.mean([len(k) for heads in cap.kept for k in heads]))
            done.append((name, ratio, path, kept))
            print(f"kvpress_sweep: {name} r={ratio}: {kept:.0f} tokens kept per head", file=sys.stderr)
    return done, refused


def policies(a, done):
    pol = [{"name": "press_replay", "file": path, "label": f"{name} r={ratio}"} for name, ratio, path, _ in done]
    for ratio in RATIOS:
        n_kept = int(a.prompt * (1 - ratio))
        M = n_kept + a.decode // 2
        snap = {"budget": n_kept, "window": 64, "kernel": 5, "pooling": "avg"}
        pol.append({"name": "snapkv", **snap, "label": f"kvsim snapkv r={ratio}"})
        pol.append({"name": "pyramidkv", **snap, "budgets": "kvpress", "label": f"kvsim pyramidkv(kvpress) r={ratio}"})
        for name in ("sink", "window", "h2o", "tova", "knorm"):
            pol.append({"name": name, "memory": M, "label": f"kvsim {name} r={ratio}"})
    return pol


def table(res, a):
    import numpy as np

    rows = res.rows()
    out = []
    rng = np.random.default_rng(0)
    for label, g in rows.groupby("label", sort=False):
        cells = g.groupby(["layer", "head"])["rel_err"].mean().to_numpy()
        boot = [rng.choice(cells, cells.size).mean() for _ in range(1000)]
        out.append({"entry": label, "rel_err": g["rel_err"].mean(), "lo": np.percentile(boot, 2.5),
                    "hi": np.percentile(boot, 97.5), "kept_mass": g["kept_mass"].mean(),
                    "cache_tokens": g["cache_tokens"].mean()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models")
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--every", type=int, default=16)
    ap.add_argument("--presses", default="", help="comma-separated catalogue names (default: every press that runs "
                                                   "at prefill)")
    ap.add_argument("--out", default="results/kvpress_sweep")
    a = ap.parse_args()
    gguf = os.path.join(a.models, GGUF)
    text = os.path.join(a.data, "tinyshakespeare", "input.txt")
    for f in (gguf, text):
        if not os.path.isfile(f):
            print(f"kvpress_sweep: {f}: no such file (bash scripts/setup.sh)", file=sys.stderr)
            return 2
    try:
        import kvpress  # noqa: F401
    except ImportError as e:
        print(f"kvpress_sweep: {e}", file=sys.stderr)
        return 3
    import kvsim
    from kvsim import kvpress as bridge
    from kvsim import kvpress_catalog as cat

    runnable = cat.runnable()
    a.presses = [p for p in a.presses.split(",") if p] or runnable
    for p in a.presses:
        if p not in runnable:
            why = cat.CATALOG[p].how if p in cat.CATALOG else "not a kvpress export"
            print(f"kvpress_sweep: --presses {p}: not a press kvsim runs at prefill ({why})", file=sys.stderr)
            return 2

    os.makedirs(a.out, exist_ok=True)
    rec = os.path.join(a.out, "prompt.h5")
    if not os.path.exists(rec):
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "datasets", "export_hf.py"),
                        "--model", a.models, "--gguf-file", GGUF, "--text", text, "--tokens", str(a.prompt + a.decode),
                        "--dtype", "float32", "--model-dtype", "float32", "--device", "cpu", "--no-attn", "--out", rec],
                       check=True)
    ids = kvsim.Recording(rec).tokens()[: a.prompt]
    model, _ = bridge.load_model(gguf)
    with open(os.path.join(a.out, "catalog.csv"), "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["press", "kind", "how"])
        for name in cat.exported():
            w.writerow([name, cat.CATALOG[name].kind, cat.CATALOG[name].how])
    done, refused = capture_all(a, cat, bridge, model, ids, os.path.join(a.out, "presses"))
    cfg = {"name": "kvpress_sweep", "data": {"path": rec, "prefill": a.prompt},
           "eval": {"every": a.every, "from": a.prompt + 1}, "policy": policies(a, done)}
    res = kvsim.run(cfg, out=os.path.join(a.out, "run"))
    rows = table(res, a)
    with open(os.path.join(a.out, "table.csv"), "w", encoding="utf-8") as f:
        f.write("entry,rel_err,rel_err_lo,rel_err_hi,kept_mass,cache_tokens\n")
        for r in rows:
            f.write(f"{r['entry']},{r['rel_err']:.6g},{r['lo']:.6g},{r['hi']:.6g},{r['kept_mass']:.6g},{r['cache_tokens']:.1f}\n")
    print("| entry | rel_err [95% CI] | kept_mass | cache tokens |\n|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["entry"].split("r=")[-1], r["rel_err"])):
        print(f"| {r['entry']} | {r['rel_err']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}] | {r['kept_mass']:.4f} | {r['cache_tokens']:.0f} |")
    for name, ratio, why in refused:
        print(f"refused: {name} r={ratio}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
