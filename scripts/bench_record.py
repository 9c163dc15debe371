#!/usr/bin/env python3
"""Recording a real LLM at length: `kvsim record` (batched prefill, written layer by layer) beside
transformers' CPU forward pass of the same tokens, in one run.

  .venv/bin/python scripts/bench_record.py [--tokens 8192] [--threads 2] [--model GGUF] [--text FILE]
                                           [--kvsim build/kvsim] [--keep OUT.h5]

1. `/usr/bin/time -v kvsim record --checkpoint GGUF --text FILE --tokens N --threads T --out TMP.h5`:
   kvsim's forward tokens/s (its own timer: forward passes, not loading or writing), wall time, and peak
   resident memory (time's "Maximum resident set size") against the limit of 1.5 GB.
2. transformers loads the same GGUF (float32, CPU, T threads, SDPA attention) and runs one forward pass
   over the recording's tokens: its tokens/s, and the held-out NLL (nats/token) of both against
   |Δ| ≤ 1e-3.
Exit 0 when both limits hold, 1 otherwise, 77 when transformers or the model file is absent.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RSS_LIMIT_GB = 1.5
NLL_TOL = 1e-3


def run_kvsim(a, out):
    cmd = ["/usr/bin/time", "-v", a.kvsim, "record", "--checkpoint", a.model, "--text", a.text, "--tokens",
           str(a.tokens), "--threads", str(a.threads), "--out", out]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"bench_record: kvsim record failed: {r.stderr.strip().splitlines()[-1]}")
    fwd = re.search(r"forward \(([^)]*)\): ([0-9.]+) s, ([0-9.]+) tokens/s", r.stdout)
    nll = re.search(r"mean cross-entropy: ([0-9.]+)", r.stdout)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    return dict(path=fwd.group(1), seconds=float(fwd.group(2)), tps=float(fwd.group(3)), nll=float(nll.group(1)),
                rss_gb=int(rss.group(1)) / 1e6, wall=wall)


def run_transformers(a, tokens):
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(a.threads)
    folder, name = os.path.split(os.path.abspath(a.model))
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, attn_implementation="sdpa")
    hf.eval()
    ids = torch.tensor([[int(t) for t in tokens]], dtype=torch.long)
    with torch.no_grad():
        t0 = time.time()
        logits = hf(ids).logits[0]
        seconds = time.time() - t0
        nll = torch.nn.functional.cross_entropy(logits[:-1].double(), ids[0, 1:]).item()
    return dict(seconds=seconds, tps=len(tokens) / seconds, nll=nll, version=transformers.__version__,
                torch=torch.__version__, np=np)


def main():
    ap = argparse.ArgumentParser(prog=".venv/bin/python scripts/bench_record.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--model", default=os.path.join(os.environ.get("KVSIM_MODELS", os.path.join(ROOT, "models")),
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "tinystories-sample", "tinystories.txt"))
    ap.add_argument("--kvsim", default=os.path.join(ROOT, "build", "kvsim"))
    ap.add_argument("--keep", default=None, help="keep the recording here instead of a temporary file")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"SKIPPED: {a.model} absent (bash scripts/setup.sh fetches it)")
        return 77
    try:
        import h5py
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep or os.path.join(tmp, "bench.h5")
        k = run_kvsim(a, out)
        with h5py.File(out) as f:
            tokens = f["tokens"][:]
            size_gb = os.path.getsize(out) / 1e9
        t = run_transformers(a, tokens)
    name = os.path.basename(a.model)
    print(f"{name}: {len(tokens)} tokens of {os.path.basename(a.text)}, {a.threads} thread(s); "
          f"transformers {t['version']}, torch {t['torch']}")
    print(f"{'':34s}{'forward s':>10s}{'tokens/s':>10s}{'NLL nats/token':>16s}")
    print(f"{'kvsim record (' + k['path'] + ')':34s}{k['seconds']:10.1f}{k['tps']:10.1f}{k['nll']:16.5f}")
    print(f"{'transformers forward (sdpa)':34s}{t['seconds']:10.1f}{t['tps']:10.1f}{t['nll']:16.5f}")
    ratio = k["tps"] / t["tps"]
    print(f"kvsim / transformers tokens/s: {ratio:.2f}x; kvsim wall {k['wall']:.1f} s with loading and writing "
          f"{size_gb:.2f} GB of q/k/v/attn")
    ok_rss = k["rss_gb"] <= RSS_LIMIT_GB
    ok_nll = abs(k["nll"] - t["nll"]) <= NLL_TOL
    print(f"peak resident memory {k['rss_gb']:.2f} GB (limit {RSS_LIMIT_GB} GB): {'ok' if ok_rss else 'OVER'}")
    print(f"|NLL(kvsim) - NLL(transformers)| = {abs(k['nll'] - t['nll']):.2e} (limit {NLL_TOL}): {'ok' if ok_nll else 'OVER'}")
    return 0 if ok_rss and ok_nll else 1


if __name__ == "__main__":
    sys.exit(main())
