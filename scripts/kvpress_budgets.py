#!/usr/bin/env python3
"""A budgets file's gain reproduced by kvpress's own press code (issue "Where to put the memory", point 4).

Usage: .venv/bin/python scripts/kvpress_budgets.py [--budgets experiments/budgets/smollm2_snapkv_head.json]
           [--memory 0.2 0.4] [--windows 4] [--models models] [--data ../shared/data] [--out results/kvpress_budgets]

For each of --windows held-out windows of TinyStories (from the text's last 25%, beyond every window the
budgets were fitted on), datasets/export_hf.py records 2048 + 256 tokens from transformers (float32). On
the 2048-token prompt, kvpress runs SnapKVPress(window 64, kernel 5) at the uniform mean M = memory × 2048
tokens per cache, and kvsim.kvpress_budgets.BudgetsPress around the same SnapKVPress with the file's
per-(layer, KV head) budgets; kvsim.kvpress.capture reads back what each kept and kvsim replays both
(`press_replay`: the kept prompt, every decoded token appended, as kvpress decodes) beside its own snapkv
with and without the file (at equal memory: it evicts while decoding, where kvpress appends). kvpress's own head-wise allocators around the
same scorer at the same mean, AdaKVPress and CriticalAdaKVPress (alpha_safeguard 0.2), are replayed too.
Prints a Markdown table: per memory and entry the mean over windows of the all-layers mean rel_err over the
256 decoded steps (every 8th), and each split's paired change against the uniform split (± 95% t).
OUT/windows.csv holds the per-window values. Exit 2 on bad input, 3 without torch/transformers/kvpress.
"""
import argparse
import csv
import os
import subprocess
import sys

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
P, DECODE = 2048, 256


def window_rows(a, w, tail, model, libs):
    """One held-out window: recorded from transformers, every press captured, all replayed by kvsim; its rows."""
    np, kvpress, kvsim, bridge, kvpress_budgets = libs
    span = len(tail) // a.windows
    rows = []
    folder = os.path.join(a.out, f"w{w:02d}")
    os.makedirs(folder, exist_ok=True)
    piece = os.path.join(folder, "text.txt")
    with open(piece, "w", encoding="utf-8") as f:
        f.write(tail[w * span:(w + 1) * span])
    rec = os.path.join(folder, "prompt.h5")
    if not os.path.exists(rec):
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets",
                                                     "export_hf.py"),
                        "--model", a.models, "--gguf-file", GGUF, "--text", piece, "--tokens", str(P + DECODE),
                        "--dtype", "float32", "--model-dtype", "float32", "--device", "cpu", "--no-attn", "--out", rec],
                       check=True, stdout=subprocess.DEVNULL)
    ids = kvsim.Recording(rec).tokens()[:P]
    policies = []
    for m in a.memory:
        M = round(P * m)  # tokens per cache, as kvsim rounds a fraction of n
        snap = dict(window_size=64, kernel_size=5)
        uniform = bridge.capture(kvpress.SnapKVPress(compression_ratio=1 - (M + 0.5) / P, **snap), model, ids)
        counts = kvpress_budgets.counts_for(a.budgets, M, P)
        alloc = bridge.capture(kvpress_budgets.budgets_press(kvpress.SnapKVPress(compression_ratio=1 - M / P, **snap),
                                                             counts), model, ids)
        # kvpress's own head-wise allocators around the same scorer, at the same mean: AdaKV and CriticalAdaKV.
        ada = bridge.capture(kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=1 - (M + 0.5) / P, **snap)),
                             model, ids)
        critical = bridge.capture(kvpress.CriticalAdaKVPress(
            kvpress.SnapKVPress(compression_ratio=1 - (M + 0.5) / P, **snap)), model, ids)
        for name, cap in (("uniform", uniform), ("budgets", alloc), ("adakv", ada), ("criticaladakv", critical)):
            path = bridge.save(cap, os.path.join(folder, f"{name}_{m}.h5"))
            policies.append({"name": "press_replay", "file": path, "label": f"kvpress {name} {m}"})
        # kvsim's snapkv at equal memory: the prompt kept as kvpress keeps it, then min(M, t) tokens while decoding
        # (decode_window = M/2; appending every token would outgrow M, which `memory` refuses).
        mine = {"name": "snapkv", "memory": M, "window": 64, "kernel": 5, "pooling": "avg"}
        policies.append(dict(mine, label=f"kvsim uniform {m}"))
        policies.append(dict(mine, budgets_file=os.path.abspath(a.budgets), label=f"kvsim budgets {m}"))
    res = kvsim.run({"name": "kvpress_budgets", "data": {"path": rec, "prefill": P}, "eval": {"every": 8},
                     "policy": policies}, threads=1)
    table = res.rows()
    for label in table["label"].unique():
        impl, split, m = label.split()
        rows.append({"window": w, "impl": impl, "split": split, "memory": float(m),
                     "rel_err": float(table[table["label"] == label]["rel_err"].mean())})
    print(f"kvpress_budgets: window {w} done", file=sys.stderr)
    return rows


def print_table(a, rows, np):
    """The Markdown table: per memory and implementation, each split's mean and its paired change against uniform."""
    print(f"rel_err, mean over {a.windows} windows (2048-token prompt, 256 decoded); budgets: {a.budgets}\n")
    splits = ["uniform", "budgets", "adakv", "criticaladakv"]
    print("| memory | implementation | " + " | ".join(splits) + " | " + " | ".join(f"{s} vs uniform" for s in splits[1:]) + " |")
    print("|---:|---|" + "---:|" * len(splits) + "---|" * (len(splits) - 1))
    from scipy import stats
    for m in a.memory:
        for impl in ("kvpress", "kvsim"):
            get = {s: np.array([r["rel_err"] for r in rows if r["impl"] == impl and r["split"] == s and r["memory"] == m])
                   for s in splits}
            cells = [f"{get[s].mean():.4f}" if len(get[s]) else "—" for s in splits]
            for s in splits[1:]:
                if not len(get[s]):
                    cells.append("—")
                    continue
                ratio = get[s] / get["uniform"] - 1
                h = stats.t.ppf(0.975, len(ratio) - 1) * ratio.std(ddof=1) / np.sqrt(len(ratio)) if len(ratio) > 1 else float("nan")
                cells.append(f"{100 * ratio.mean():+.1f}% ± {100 * h:.1f}")
            print(f"| {m:g} | {impl} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="experiments/budgets/smollm2_snapkv_head.json")
    ap.add_argument("--memory", type=float, nargs="+", default=[0.2, 0.4])
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--models", default="models")
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="results/kvpress_budgets")
    a = ap.parse_args()
    gguf = os.path.join(a.models, GGUF)
    text_path = os.path.join(a.data, "tinystories-sample", "tinystories.txt")
    for path in (gguf, text_path, a.budgets):
        if not os.path.isfile(path):
            print(f"kvpress_budgets: {path}: no such file", file=sys.stderr)
            return 2
    try:
        import numpy as np
        import kvpress
        import kvsim
        from kvsim import kvpress as bridge, kvpress_budgets
    except ImportError as e:
        print(f"kvpress_budgets: {e} (bash scripts/setup.sh installs torch, transformers and kvpress)", file=sys.stderr)
        return 3
    os.makedirs(a.out, exist_ok=True)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    tail = text[int(len(text) * 0.75):]
    model, _ = bridge.load_model(gguf)
    libs = (np, kvpress, kvsim, bridge, kvpress_budgets)
    rows = [r for w in range(a.windows) for r in window_rows(a, w, tail, model, libs)]
    with open(os.path.join(a.out, "windows.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    print_table(a, rows, np)
    return 0


if __name__ == "__main__":
    sys.exit(main())
