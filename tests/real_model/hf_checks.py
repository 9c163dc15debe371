"""Helpers shared by the tests that compare kvsim with transformers on the same GGUF file."""


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
