#!/usr/bin/env python3
"""`kvsim closed-loop` on a real LLM against transformers running the same cache as an attention mask.

  closed_loop_hf_test.py KVSIM MODELS_DIR DATA_DIR [smollm2|gemma3]

smollm2 (the default): SmolLM2-135M-Instruct, 256 tokens, a 128-token prompt. gemma3: Gemma 3 270M,
640 tokens, a 128-token prompt — decoding runs past its local layers' 512-token window, so kvsim's
local layers (exact over their last 512 tokens, a ring in PolicyKVAttention; policies on the global
layers 5, 11, 17 only) are checked too: transformers gets a mask per layer type, the policy's mask on
its full_attention layers and the plain sliding-window mask (keys j with i − 512 < j ≤ i) on its
sliding_attention layers.

kvsim's closed loop decodes every policy and the exact cache as one batch (LlamaModel::decode_step)
after a batched prefill of the prompt. For the window and sink policies the tokens a cache holds at
each decoded position are known in closed form, so the same closed loop is one teacher-forced forward
pass of transformers (loading the same GGUF, float32, CPU) with a 4D attention mask: prompt positions
i < P attend causally (a prefill is exact), decoded positions i ≥ P attend to
  window(budget = B):          keys j with i − B < j ≤ i
  sink(budget = B, sink = 4):  keys j < 4 or i − (B − 4) < j ≤ i.
Checked, on N TinyStories tokens with a P-token prompt:
  1. the exact cache's cross-entropy over the decoded positions equals transformers' causal one;
  2. window and sink (B = 48) equal transformers' masked ones, to ≤ 5e-5 nats/token (kvsim writes 6 significant digits);
     negative controls: each mask moves transformers' cross-entropy by > 0.05 nats/token from the
     exact one (the comparison is not vacuous), and a window one token too wide is farther from
     kvsim's window than the tolerance;
  3. batching does not couple sequences: h2o's cross-entropy is the same decoded alone or beside the
     others.
Exit 0 passed, 1 failed, 77 SKIPPED (torch/transformers or the model file absent).
"""
import csv
import os
import subprocess
import sys
import tempfile

SKIP = 77
# model → (GGUF file, N tokens, P prompt tokens, tolerance in nats/token)
MODELS = {"smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 256, 128, 5e-5),
          "gemma3": ("gemma-3-270m-q4_k_m.gguf", 640, 128, 5e-5)}
GGUF, N, P, TOL = MODELS["smollm2"]
B, SINK = 48, 4
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)
from hf_checks import hf_setup  # noqa: E402


def run_closed_loop(kvsim_bin, tmp, name, gguf_path, text_path, policies):
    cfg = os.path.join(tmp, name + ".toml")
    with open(cfg, "w") as f:
        f.write(f'name = "{name}"\nseed = 1\n[model]\ncheckpoint = "{gguf_path}"\ntext = "{text_path}"\n'
                f"tokens = {N}\nwindows = 1\nprefill = {P}\n[eval]\nevery = 16\n{policies}")
    out = os.path.join(tmp, name)
    subprocess.run([kvsim_bin, "closed-loop", cfg, "--threads", "2", "--out", out], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "closed_loop.csv"), newline="") as f:
        return {r["label"]: r for r in csv.DictReader(f)}


def masked_ce(hf, ids, allow, torch, np, local=None):
    """Teacher-forced mean cross-entropy over positions P..N−2 with a [N, N] boolean attention mask
    (with `local`, that mask on the full-attention layers and `local` on the sliding-window ones)."""
    mask = allow[None, None] if local is None else {"full_attention": allow[None, None],
                                                     "sliding_attention": local[None, None]}
    with torch.no_grad():
        L = hf(torch.tensor([ids]), attention_mask=mask).logits[0].double().numpy()
    return float(np.mean([np.logaddexp.reduce(L[t]) - L[t, ids[t + 1]] for t in range(P, N - 1)]))


def main():
    global GGUF, N, P, TOL
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] not in MODELS):
        print(__doc__)
        return 2
    kvsim_bin, models, data_dir = sys.argv[1:4]
    GGUF, N, P, TOL = MODELS[sys.argv[4] if len(sys.argv) == 5 else "smollm2"]
    path = os.path.join(models, GGUF)
    mods = hf_setup(path)
    if mods is None:
        return SKIP
    np, torch, _ = mods
    from transformers import AutoModelForCausalLM
    from kvsim.model import Model

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(data_dir, "tinystories-sample", "tinystories.txt"), encoding="utf-8") as f:
            story = f.read()[20000:40000]
        text_path = os.path.join(tmp, "story.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(story)
        policies = (f'[[policy]]\nname = "window"\nbudget = {B}\n'
                    f'[[policy]]\nname = "sink"\nbudget = {B}\nsink = {SINK}\n'
                    f'[[policy]]\nname = "h2o"\nbudget = {B}\n')
        rows = run_closed_loop(kvsim_bin, tmp, "all", path, text_path, policies)
        alone = run_closed_loop(kvsim_bin, tmp, "alone", path, text_path, f'[[policy]]\nname = "h2o"\nbudget = {B}\n')
        ids = Model(path).encode_document(story)[:N]
        hf = AutoModelForCausalLM.from_pretrained(models, gguf_file=GGUF, dtype=torch.float32).eval()

    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    causal = j <= i
    prompt = i < P
    w = getattr(hf.config, "sliding_window", None) if "sliding_attention" in (getattr(hf.config, "layer_types", None) or []) else None
    local = None if w is None else causal & (j > i - w)
    if local is not None:
        print(f"transformers' sliding_attention layers get the {w}-token window mask, its full_attention layers the policy's")
    ce_exact = masked_ce(hf, ids, causal, torch, np, local)
    ce_window = masked_ce(hf, ids, causal & (prompt | (j > i - B)), torch, np, local)
    ce_sink = masked_ce(hf, ids, causal & (prompt | (j < SINK) | (j > i - (B - SINK))), torch, np, local)
    ce_wide = masked_ce(hf, ids, causal & (prompt | (j > i - (B + 1))), torch, np, local)
    if local is not None:  # negative control: the local layers' window matters past 512 tokens
        ce_all_global = masked_ce(hf, ids, causal, torch, np, causal)
        check(abs(ce_all_global - ce_exact) > TOL,
              f"negative control: every layer global ({ce_all_global:.5f}) is farther than {TOL:g} from the "
              f"windowed model ({ce_exact:.5f})")

    win, snk = rows[f"window(budget={B})"], rows[f"sink(budget={B},sink={SINK})"]
    kv_exact, kv_window, kv_sink = float(win["ce_exact"]), float(win["ce_policy"]), float(snk["ce_policy"])
    check(abs(kv_exact - ce_exact) <= TOL,
          f"exact cache: kvsim {kv_exact:.5f} vs transformers {ce_exact:.5f} nats/token (|Δ| ≤ {TOL:g})")
    check(abs(kv_window - ce_window) <= TOL,
          f"window({B}) closed loop: kvsim {kv_window:.5f} vs transformers' banded mask {ce_window:.5f} (|Δ| {abs(kv_window - ce_window):.1e})")
    check(abs(kv_sink - ce_sink) <= TOL,
          f"sink({B}, {SINK}) closed loop: kvsim {kv_sink:.5f} vs transformers' sink+band mask {ce_sink:.5f} (|Δ| {abs(kv_sink - ce_sink):.1e})")
    check(min(abs(ce_window - ce_exact), abs(ce_sink - ce_exact)) > 0.05,
          f"negative control: the masks move the cross-entropy (window +{ce_window - ce_exact:.3f}, "
          f"sink +{ce_sink - ce_exact:.3f} nats/token)")
    check(abs(kv_window - ce_wide) > TOL,
          f"negative control: a window one token wider ({ce_wide:.5f}) is farther than {TOL:g} from kvsim's window")
    h_all, h_alone = rows[f"h2o(budget={B})"]["ce_policy"], alone[f"h2o(budget={B})"]["ce_policy"]
    check(h_all == h_alone, f"h2o decoded beside the others ({h_all}) = decoded alone ({h_alone})")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
