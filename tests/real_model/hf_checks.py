"""Helpers shared by the tests that compare kvsim with transformers on the same GGUF file."""
import importlib
import os


def hf_setup(gguf_path, extra_modules=()):
    """What a transformers check needs before it starts: the model file and the Python libraries (numpy, torch,
    transformers and `extra_modules`). Prints a SKIPPED line naming the missing piece and returns None, or
    quiets transformers' logging and progress bars, pins torch to 2 threads and returns (numpy, torch,
    transformers)."""
    if not os.path.exists(gguf_path):
        print(f"SKIPPED: {gguf_path} absent (bash scripts/setup.sh fetches it)")
        return None
    try:
        import numpy
        import torch
        import transformers
        for m in extra_modules:
            importlib.import_module(m)
    except ImportError as e:
        print(f"SKIPPED: {e} (bash scripts/setup.sh installs .venv)")
        return None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(2)
    return numpy, torch, transformers


def rel(np, a, b):
    """max |a − b| / max |b|: the largest difference relative to the reference's largest magnitude."""
    return float(np.abs(a - b).max() / np.abs(b).max())



def logits_with_qkv(hf, ids, torch, transformers):
    """transformers' logits [n, vocab] for `ids` (float32 numpy), with each layer's post-RoPE query, key
    and value captured inside its attention: {layer: (q [heads, n, d], k [kv_heads, n, d], v)}."""
    captured = {}

    def capture(module, query, key, value, attention_mask, **kw):
        captured[module.layer_idx] = (query[0].detach().numpy().copy(), key[0].detach().numpy().copy(),
                                      value[0].detach().numpy().copy())
        return transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, query, key, value, attention_mask, **kw)

    transformers.AttentionInterface.register("kvsim_capture", capture)
    # sdpa's mask under the custom name: without it transformers builds none, and a sliding-window
    # layer (Gemma 3's local layers) would attend over every earlier token (tests/real_model/gemma3_long_test.py).
    transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.register("kvsim_capture", transformers.masking_utils.sdpa_mask)
    hf.set_attn_implementation("kvsim_capture")
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].numpy()
    finally:
        hf.set_attn_implementation("sdpa")
    return logits, captured
