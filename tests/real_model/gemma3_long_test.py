#!/usr/bin/env python3
"""Gemma 3 270M at length: `kvsim record --layers global` over 4096 tokens against transformers.

  gemma3_long_test.py KVSIM MODELS_DIR DATA_DIR

The path a 32,768-token recording takes (the batched prefill, the three global layers stored alone) at
4096 tokens, where transformers (float32, CPU, the same GGUF dequantized by the `gguf` package: an
implementation written by others) still fits in memory. Checked:
  1. the post-RoPE q, k, v of the global layers 5, 11, 17 over all 4096 positions equal transformers'
     (captured inside its attention) to max |Δ| / max |x| ≤ 1e-4 per tensor, with transformers' rotary
     angles computed in float64 as kvsim's are (`exact_angles`): transformers forms position × inv_freq in
     float32 even in a float64 model, and that angle error (about position · 2^-24 rad) alone puts its q
     1.3e-4 away from kvsim's at 4096 tokens, while kvsim is within 1.2e-5 of a float64 transformers with
     float64 angles (docs/recordings.md, "Long recordings");
  2. the prefill's logits of the last 256 positions (kvsim.model.Model.prefill_logits, the recorder's
     code path) equal transformers' to max |Δ| / max |logit| ≤ 1e-3, and the recording's per-token
     cross-entropy over all 4095 predictions equals transformers' (mean |Δ| ≤ 1e-3 nats, max ≤ 2e-2);
     negative control: the logits one position off disagree;
  3. the long path is the short path: the 4096-token recording's first 2048 positions equal a
     2048-token recording of the same text (≤ 1e-5 relative); negative control: one position off differs.
Exit 0 passed, 1 failed, 77 SKIPPED (torch/transformers/gguf or the model file absent).
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)
from hf_checks import hf_setup, rel  # noqa: E402

GGUF = "gemma-3-270m-q4_k_m.gguf"
GLOBAL = (5, 11, 17)
N, TAIL = 4096, 256



def record(kvsim_bin, path, text, tokens, out):
    r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", text, "--tokens", str(tokens), "--layers",
                        "global", "--no-attn", "--threads", "2", "--out", out], capture_output=True, text=True)
    check(r.returncode == 0, f"kvsim record --layers global --tokens {tokens}: " + (r.stdout + r.stderr).strip()[-160:])
    return r.returncode == 0


def exact_angles(self, x, position_ids, layer_type=None):
    """Gemma3RotaryEmbedding.forward with inv_freq and position × inv_freq in float64 (transformers
    computes both in float32), cast to the model's dtype at the end, as kvsim's rope_angles."""
    import torch
    base = self.config.rope_parameters[layer_type]["rope_theta"]
    dim = self.config.head_dim
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = position_ids.double()[:, :, None] * inv[None, None, :]
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def transformers_run(hf, ids, np, torch, transformers):
    """transformers' global-layer q/k/v {layer: (q, k, v)}, the last TAIL positions' logits and the
    cross-entropy of every prediction (nats), the classifier applied in chunks (all 4096 rows of a
    262,144-token vocabulary would be 4.3 GB)."""
    captured = {}

    def capture(module, query, key, value, attention_mask, **kw):
        if module.layer_idx in GLOBAL:
            captured[module.layer_idx] = tuple(x[0].detach().numpy().copy() for x in (query, key, value))
        return transformers.integrations.sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    from transformers.models.gemma3 import modeling_gemma3
    rotary = modeling_gemma3.Gemma3RotaryEmbedding.forward
    modeling_gemma3.Gemma3RotaryEmbedding.forward = exact_angles
    transformers.AttentionInterface.register("kvsim_capture_global", capture)
    # Without a mask function of its own name, transformers builds no mask for a custom attention
    # function (masking_utils: "custom attention without equivalent mask creation"), and sdpa then
    # runs plain causal attention: every local layer would attend globally past 512 tokens.
    transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.register("kvsim_capture_global", transformers.masking_utils.sdpa_mask)
    hf.set_attn_implementation("kvsim_capture_global")
    cap = getattr(hf.config, "final_logit_softcapping", None)
    ce, tail = [], None
    try:
        with torch.no_grad():
            h = hf.model(torch.tensor([ids])).last_hidden_state
            for a in range(0, len(ids), 512):
                lg = hf.lm_head(h[:, a:a + 512]).float()
                if cap:
                    lg = torch.tanh(lg / cap) * cap
                lg = lg[0]
                nxt = torch.tensor(ids[a + 1:a + 1 + lg.shape[0]])
                ce.append((torch.logsumexp(lg[:len(nxt)].double(), -1) - lg[torch.arange(len(nxt)), nxt].double()).numpy())
                if a + 512 >= len(ids):
                    tail = lg.numpy()[-TAIL:]
    finally:
        hf.set_attn_implementation("sdpa")
        modeling_gemma3.Gemma3RotaryEmbedding.forward = rotary
    return captured, tail, np.concatenate(ce)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    kvsim_bin, models, data_dir = sys.argv[1:4]
    path = os.path.join(models, GGUF)
    mods = hf_setup(path)
    if mods is None:
        return SKIP
    np, torch, transformers = mods
    from transformers import AutoModelForCausalLM
    import kvsim
    from kvsim.model import Model

    text = os.path.join(data_dir, "tinystories-sample", "tinystories.txt")
    with tempfile.TemporaryDirectory() as tmp:
        long_path, short_path = os.path.join(tmp, "g4096.h5"), os.path.join(tmp, "g2048.h5")
        if not (record(kvsim_bin, path, text, N, long_path) and record(kvsim_bin, path, text, N // 2, short_path)):
            return 1
        rec, short = kvsim.Recording(long_path), kvsim.Recording(short_path)
        ids = [int(t) for t in rec.tokens()]
        hf = AutoModelForCausalLM.from_pretrained(models, gguf_file=GGUF, dtype=torch.float32)
        hf.eval()
        captured, tail_hf, ce_hf = transformers_run(hf, ids, np, torch, transformers)
        del hf
        worst = {t: max(rel(np, getattr(rec, t)(i, h), captured[l]["qkv".index(t)][h])
                        for i, l in enumerate(GLOBAL) for h in range(4 if t == "q" else 1)) for t in "qkv"}
        for t in "qkv":
            check(worst[t] <= 1e-4, f"{N} tokens: post-RoPE {t} of layers 5, 11, 17 within {worst[t]:.2e} <= 1e-4 of transformers'")
        tail_kv = Model(path).prefill_logits(ids, last=TAIL, threads=2)
        dev, off = rel(np, tail_kv, tail_hf), rel(np, tail_kv[1:], tail_hf[:-1])
        check(dev <= 1e-3, f"logits of the last {TAIL} positions: max relative deviation {dev:.2e} <= 1e-3")
        check(off > 1e-1, f"negative control: one position off, {off:.2e} > 1e-1")
        import h5py
        with h5py.File(long_path, "r") as f:
            ce_kv = f["cross_entropy"][()].astype(np.float64)
        d_ce = np.abs(ce_kv - ce_hf)
        check(len(d_ce) == N - 1 and d_ce.mean() <= 1e-3 and d_ce.max() <= 2e-2,
              f"cross-entropy of {len(d_ce)} predictions: mean |Δ| {d_ce.mean():.2e} <= 1e-3, max {d_ce.max():.2e} <= 2e-2 nats")
        m = N // 2
        pre = max(rel(np, getattr(rec, t)(i, h)[:m], getattr(short, t)(i, h)) for i in range(3) for t in "qkv"
                  for h in range(4 if t == "q" else 1))
        shifted = rel(np, rec.k(0, 0)[1:m + 1], short.k(0, 0))
        check(list(short.tokens()) == ids[:m] and pre <= 1e-5,
              f"the {N}-token recording's first {m} positions equal a {m}-token recording's to {pre:.2e} <= 1e-5")
        check(shifted > 1e-2, f"negative control: one position off, {shifted:.2e} > 1e-2")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
