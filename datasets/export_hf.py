#!/usr/bin/env python3
"""Export queries, keys and values of a Hugging Face transformers model into a kvsim recording.

Usage:
  .venv/bin/python datasets/export_hf.py --model PATH_OR_NAME --text FILE --tokens N --out rec.h5
                                [--layers 0,4-7] [--dtype float16|float32] [--device auto|cpu|cuda]
                                [--model-dtype auto|float32|bfloat16|float16] [--no-attn] [--byte-tokens]
                                [--gguf-file NAME.gguf] [--no-special-tokens]

One forward pass with the KV cache on (the recording schema of docs/recordings.md, `kvsim_schema = 1`):
  - keys and values: taken from the model's own KV cache after the pass (post-rotary, per KV head,
    exactly what a cache holds), one layer at a time;
  - queries: the output of each attention module's `q_proj` (or `q_norm` where the architecture
    normalises queries per head) with the model's own rotary embedding applied: the cos/sin the
    decoder passes to the attention module (`position_embeddings`) and the architecture's
    `apply_rotary_pos_emb` function;
  - `/layer_LLL/attn` (unless --no-attn): the attention output as the model computed it, captured at
    the input of `o_proj`, so `kvsim inspect --check-attn` can verify the replay;
  - `softmax_scale` from the attention module (`scaling`, which covers models that scale differently,
    e.g. Gemma's query_pre_attn_scalar), `rope = "applied"`, head counts, `/tokens` and
    `/token_strings` (the tokenizer's tokens).
Everything uses forward hooks on public module interfaces; no transformers internals are copied.

Faithfulness checks (the export refuses rather than writing wrong tensors):
  - architectures outside SUPPORTED_MODEL_TYPES, or without separate q/k/v/o projections;
  - attention-logit soft-capping (Gemma 2), ALiBi-style position biases;
  - after the pass, the exporter rotates the captured k_proj/k_norm output with the same cos/sin and
    compares it with the cache at sampled positions: a mismatch (a rotary or norm the exporter does
    not reproduce) aborts the export.

Memory: queries are written from inside the forward pass, layer by layer, and keys/values are moved
to the host one layer at a time, so the host never holds more than one layer's tensors (plus the
model itself). Writes go to OUT.tmp, renamed to OUT when complete; on any error no file is left.
File size: (n_heads + 2·n_kv_heads)·head_dim·bytes per layer and token before compression
(+ n_heads·head_dim·4 with the attention output), e.g. Llama-2-7B in float16: 3·32·128·2 = 24 KiB
per layer and token, 768 KiB per token for 32 layers (+512 KiB with attn); deflate saves ~10%.

Exit status: 0 on success, 2 on bad input or an architecture the exporter refuses (message names
the model, file or option), 3 when transformers/torch/h5py are not importable.
"""
import argparse
import os
import sys

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "granite")


class ExportError(Exception):
    """A refusal or bad input, with a message naming the model, file or option."""


def parse_layers(spec, n_layers):
    """'0,4-7' -> [0, 4, 5, 6, 7]; None -> all. Raises ExportError on bad syntax or range."""
    if spec is None:
        return list(range(n_layers))
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ExportError(f"--layers: cannot parse '{part}' (use e.g. 0,4-7)")
    for l in out:
        if not 0 <= l < n_layers:
            raise ExportError(f"--layers: layer {l} out of range [0, {n_layers})")
    if len(set(out)) != len(out) or out != sorted(out):
        raise ExportError("--layers: layers must be increasing and distinct")
    return out


class RecordingFile:
    """Streaming writer of the kvsim recording schema (docs/recordings.md) with h5py.

    Datasets are created up front ([heads, n, head_dim], chunks (1, min(n, 1024), head_dim), shuffle +
    deflate) and filled one (layer, tensor) at a time. Writes to PATH.tmp; close() renames it to
    PATH, abort() deletes it.
    """

    def __init__(self, path, n_layers, n_heads, n_kv_heads, head_dim, n_tokens, softmax_scale, model, source,
                 dtype="float16", with_attn=True, rope_theta=None, windows=None):
        import h5py
        import numpy as np

        if dtype not in ("float16", "float32"):
            raise ExportError(f"--dtype must be float16 or float32, got '{dtype}'")
        if n_heads % n_kv_heads:
            raise ExportError(f"{model}: n_heads = {n_heads} is not a multiple of n_kv_heads = {n_kv_heads}")
        self.path, self.tmp = path, path + ".tmp"
        self.np = np
        self.shape = {"q": n_heads, "k": n_kv_heads, "v": n_kv_heads, "attn": n_heads}
        self.n, self.d = n_tokens, head_dim
        self.dtype = np.float16 if dtype == "float16" else np.float32
        self.f = h5py.File(self.tmp, "w")
        a = self.f.attrs
        a["kvsim_schema"] = np.int64(1)
        a["model"] = model
        a["source"] = source
        a["rope"] = "applied"
        for k, v in (("n_layers", n_layers), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads),
                     ("head_dim", head_dim), ("n_tokens", n_tokens)):
            a[k] = np.int64(v)
        a["softmax_scale"] = np.float64(softmax_scale)
        if rope_theta is not None:  # the default RoPE of transformers: pairs (k, k + head_dim/2)
            a["rope_theta"] = np.float64(rope_theta)
            a["rope_pairs"] = "halves (k, k + head_dim/2): Hugging Face channel order"
        if windows is not None and any(windows):
            a["layer_windows"] = np.asarray(windows, dtype=np.int64)
        chunk = (1, min(n_tokens, 1024), head_dim)
        for l in range(n_layers):
            g = self.f.create_group(f"layer_{l:03d}")
            for t in ("q", "k", "v") + (("attn",) if with_attn else ()):
                g.create_dataset(t, shape=(self.shape[t], n_tokens, head_dim),
                                 dtype=np.float32 if t == "attn" else self.dtype, chunks=chunk, shuffle=True,
                                 compression="gzip", compression_opts=4)
        self.written = set()
        self.expected = {(l, t) for l in range(n_layers) for t in ("q", "k", "v") + (("attn",) if with_attn else ())}

    def write(self, layer, tensor, array):
        """array: numpy [heads, n, head_dim] (float32); checked for shape and finiteness."""
        np = self.np
        want = (self.shape[tensor], self.n, self.d)
        if tuple(array.shape) != want:
            raise ExportError(f"{self.tmp}: /layer_{layer:03d}/{tensor} has shape {tuple(array.shape)}, expected {want}")
        if not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0]
            raise ExportError(f"/layer_{layer:03d}/{tensor}: non-finite value at [head, token, dim] = {tuple(int(i) for i in bad)}")
        if tensor != "attn" and self.dtype == np.float16 and np.abs(array).max() > 65504:
            raise ExportError(f"/layer_{layer:03d}/{tensor}: values exceed float16 range; export with --dtype float32")
        self.f[f"layer_{layer:03d}/{tensor}"][...] = array.astype(np.float32 if tensor == "attn" else self.dtype)
        self.written.add((layer, tensor))

    def write_tokens(self, ids, strings=None):
        import h5py

        self.f.create_dataset("tokens", data=self.np.asarray(ids, dtype=self.np.int32))
        if strings is not None:
            self.f.create_dataset("token_strings", data=list(strings), dtype=h5py.string_dtype("utf-8"))

    def close(self):
        missing = [f"/layer_{l:03d}/{t}" for (l, t) in sorted(self.expected - self.written)]
        if missing:
            raise ExportError(f"{self.tmp}: datasets never written: {', '.join(missing[:4])}")
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self):
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


def cache_layer(cache, l):
    """(keys, values) [batch, n_kv_heads, n, head_dim] of layer l from any transformers cache form."""
    if hasattr(cache, "layers"):  # transformers >= 4.54
        return cache.layers[l].keys, cache.layers[l].values
    if hasattr(cache, "key_cache"):  # 4.36 - 4.53 DynamicCache
        return cache.key_cache[l], cache.value_cache[l]
    return cache[l][0], cache[l][1]  # legacy tuple of tuples


def check_architecture(model, n_tokens):
    """Raises ExportError for architectures whose attention kvsim's replay would not reproduce."""
    cfg = model.config
    name = getattr(cfg, "_name_or_path", "") or type(model).__name__
    mt = getattr(cfg, "model_type", "?")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ExportError(f"{name}: model_type '{mt}' is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)}); "
                          "ALiBi, fused-QKV and other attention variants are refused rather than exported wrongly")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        raise ExportError(f"{name}: attention-logit soft-capping is not replayed by kvsim")
    if getattr(cfg, "alibi", False) or getattr(cfg, "position_embedding_type", "rope") == "alibi":
        raise ExportError(f"{name}: ALiBi position biases are not replayed by kvsim")
    for l, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not hasattr(attn, proj):
                raise ExportError(f"{name}: layer {l}'s attention has no '{proj}' (fused projections are not supported)")


def layer_windows(model, layers):
    """Per exported layer, the tokens its attention sees (the recording's layer_windows): the window on
    a local layer (layer_types "sliding_attention", or every layer when the config has no layer_types,
    e.g. Mistral), 0 on a global one; None when the model has no sliding window."""
    cfg = model.config
    window = getattr(cfg, "sliding_window", None)
    if not window or not getattr(cfg, "use_sliding_window", True):
        return None
    types = getattr(cfg, "layer_types", None)
    if types:
        return [int(window) if types[l] == "sliding_attention" else 0 for l in layers]
    return [int(window)] * len(layers)


def full_cache(model, layers):
    """forward() arguments for a cache keeping every token: a sliding-window model gets a DynamicCache
    built without its config (built from it, local layers keep only the window's last tokens)."""
    import transformers
    if layer_windows(model, layers) is None or not hasattr(transformers, "DynamicCache"):
        return {}
    return {"past_key_values": transformers.DynamicCache()}


def attention_geometry(model):
    cfg = model.config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    attn0 = model.model.layers[0].self_attn
    scale = getattr(attn0, "scaling", None)
    if scale is None:
        qpas = getattr(cfg, "query_pre_attn_scalar", None)
        scale = (qpas if qpas else head_dim) ** -0.5
    return n_heads, n_kv, head_dim, float(scale)


def default_rope_theta(model, head_dim):
    """The RoPE base θ when `model` rotates with transformers' default RoPE (one rotary embedding, rope_type
    "default", attention scaling 1, inverse frequencies θ^(−2k/head_dim) for all head_dim/2 pairs), else None: the
    recording then carries no rope_theta, and policies that undo the rotation refuse it by name."""
    import numpy as np

    rot = getattr(model.model, "rotary_emb", None)
    cfg = model.config
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None)) if isinstance(params, dict) else None
    if rot is None or theta is None or getattr(rot, "rope_type", "default") != "default":
        return None
    if float(getattr(rot, "attention_scaling", 1.0)) != 1.0 or not hasattr(rot, "inv_freq"):
        return None
    inv = rot.inv_freq.detach().double().cpu().numpy()
    if 2 * inv.shape[0] != head_dim:  # partial rotary
        return None
    expect = 1.0 / float(theta) ** (np.arange(0, head_dim, 2) / head_dim)
    return float(theta) if np.allclose(inv, expect, rtol=1e-6, atol=0) else None


def export_model(model, input_ids, out_path, layers=None, dtype="float16", with_attn=True, model_name=None,
                 source=None, token_strings=None, k_check_positions=8, k_check_tol=1e-3):
    """Exports one forward pass of `model` (a transformers *ForCausalLM) over `input_ids` [1, n].

    Returns a dict with n_tokens, layers and the worst key-rotation mismatch found (relative).
    Raises ExportError on refusals; never leaves a partial file.
    """
    import inspect as pyinspect

    import numpy as np
    import torch

    n = int(input_ids.shape[-1])
    check_architecture(model, n)
    n_layers_model = len(model.model.layers)
    layers = list(range(n_layers_model)) if layers is None else layers
    H, Hkv, d, scale = attention_geometry(model)
    name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__
    rec = RecordingFile(out_path, len(layers), H, Hkv, d, n, scale, name,
                        source or f"datasets/export_hf.py --model {name} --tokens {n}", dtype, with_attn,
                        default_rope_theta(model, d), layer_windows(model, layers))
    check_pos = sorted(set(np.linspace(0, n - 1, min(n, k_check_positions)).astype(int).tolist()))
    state = {}
    k_rot_samples = {}
    handles = []

    def rope_fn(attn):
        mod = sys.modules[type(attn).__module__]
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if fn is None:
            raise ExportError(f"{name}: {type(attn).__module__} has no apply_rotary_pos_emb")
        return fn

    def pre_attn(idx):
        def hook(module, args, kwargs):
            pe = kwargs.get("position_embeddings")
            if pe is None and len(args) > 1 and isinstance(args[1], tuple):
                pe = args[1]
            if pe is None and hasattr(module, "rotary_emb"):  # transformers 4.38 - 4.44
                pos = kwargs.get("position_ids")
                if pos is None:
                    pos = torch.arange(n, device=input_ids.device).unsqueeze(0)
                pe = module.rotary_emb(args[0] if args else kwargs["hidden_states"], pos)
            if pe is None:
                raise ExportError(f"{name}: cannot find the rotary cos/sin passed to layer {idx}'s attention "
                                  "(transformers >= 4.38 is needed)")
            state["pe"] = pe
        return hook

    def rotate(module_attn, x, heads):
        # x: [B, n, heads*d] or [B, n, heads, d] -> [B, heads, n, d], rotated.
        x = x.reshape(x.shape[0], x.shape[1], heads, d).transpose(1, 2)
        cos, sin = state["pe"]
        fn = rope_fn(module_attn)
        params = pyinspect.signature(fn).parameters
        if "position_ids" in params and len(params) >= 5 and cos.dim() == 2:
            r, _ = fn(x, x, cos, sin, torch.arange(n, device=x.device).unsqueeze(0))
        else:
            r, _ = fn(x, x, cos, sin)
        return r

    def q_hook(idx, out_idx):
        def hook(module, args, output):
            attn = model.model.layers[idx].self_attn
            q = rotate(attn, output, H)[0].float().cpu().numpy()
            rec.write(out_idx, "q", q)
        return hook

    def k_hook(idx):
        def hook(module, args, output):
            attn = model.model.layers[idx].self_attn
            k = rotate(attn, output, Hkv)[0].float()
            k_rot_samples[idx] = k[:, check_pos, :].cpu().numpy()
        return hook

    def o_hook(out_idx):
        def hook(module, args):
            a = args[0]
            a = a.reshape(a.shape[0], n, H, d)[0].transpose(0, 1).float().cpu().numpy()
            rec.write(out_idx, "attn", a)
        return hook

    try:
        for out_idx, l in enumerate(layers):
            attn = model.model.layers[l].self_attn
            handles.append(attn.register_forward_pre_hook(pre_attn(l), with_kwargs=True))
            qmod = getattr(attn, "q_norm", None) or attn.q_proj
            kmod = getattr(attn, "k_norm", None) or attn.k_proj
            handles.append(qmod.register_forward_hook(q_hook(l, out_idx)))
            handles.append(kmod.register_forward_hook(k_hook(l)))
            if with_attn:
                handles.append(attn.o_proj.register_forward_pre_hook(o_hook(out_idx)))
        with torch.no_grad():
            # The decoder stack only: the LM head's [n, vocab] logits are not needed (16 GB at n = 32k).
            out = model.model(input_ids=input_ids, use_cache=True, **full_cache(model, layers))
        cache = out.past_key_values
        if cache is None:
            raise ExportError(f"{name}: the forward pass returned no KV cache")
        worst = 0.0
        for out_idx, l in enumerate(layers):
            k, v = cache_layer(cache, l)
            if tuple(k.shape) != (1, Hkv, n, d):
                raise ExportError(f"{name}: layer {l}'s cached keys have shape {tuple(k.shape)}, expected {(1, Hkv, n, d)}")
            k = k[0].float().cpu().numpy()
            v = v[0].float().cpu().numpy()
            ref = k[:, check_pos, :]
            mine = k_rot_samples[l]
            err = float(np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-30))
            worst = max(worst, err)
            if err > k_check_tol:
                raise ExportError(f"{name}: layer {l}: keys rotated by the exporter differ from the model's KV cache "
                                  f"(relative {err:.2g} > {k_check_tol:g}); this architecture's rotary or key "
                                  "normalisation is not reproduced, refusing to write queries that may be wrong")
            rec.write(out_idx, "k", k)
            rec.write(out_idx, "v", v)
            del k, v
        rec.write_tokens(input_ids[0].cpu().numpy(), token_strings)
        rec.close()
        return {"n_tokens": n, "layers": layers, "key_check": worst}
    except BaseException:
        rec.abort()
        raise
    finally:
        for h in handles:
            h.remove()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="local path or Hugging Face name (must be loadable offline here)")
    ap.add_argument("--text", required=True, help="UTF-8 text file to tokenize")
    ap.add_argument("--tokens", type=int, required=True, help="number of tokens to export (n)")
    ap.add_argument("--out", required=True, help="output recording (.h5)")
    ap.add_argument("--layers", default=None, help="layers to export, e.g. 0,4-7 (default: all)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "float32"), help="storage type of q/k/v")
    ap.add_argument("--model-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    ap.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"),
                    help="attention kernel of the forward pass (eager materializes n×n weights per head)")
    ap.add_argument("--no-attn", action="store_true", help="do not store the attention output")
    ap.add_argument("--gguf-file", default=None,
                    help="load the model and tokenizer from this GGUF file inside the --model folder (transformers' "
                         "gguf_file=; dequantized on load)")
    ap.add_argument("--no-special-tokens", action="store_true",
                    help="tokenize without the tokenizer's special tokens (BOS), e.g. to match `kvsim record` on a "
                         "GGUF whose add_bos_token is false")
    ap.add_argument("--byte-tokens", action="store_true",
                    help="tokens = UTF-8 bytes of the text (for tokenizer-less test models; vocab ≥ 256)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws its own progress bar
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        import torch
        import transformers
    except ImportError as e:
        print(f"export_hf.py: error: {e.name} is not importable ({e}); install torch, transformers and h5py", file=sys.stderr)
        return 3
    # One line on stderr for a refusal: no download/loading progress bars or library warnings around it.
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        if a.tokens < 1:
            raise ExportError(f"--tokens must be ≥ 1, got {a.tokens}")
        try:
            with open(a.text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ExportError(f"{a.text}: cannot read as UTF-8 text ({e})")
        dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a.model_dtype]
        device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, gguf_file=a.gguf_file,
                                                                      attn_implementation=a.attn_implementation)
        except (OSError, ValueError) as e:
            raise ExportError(f"{a.model}: cannot load the model ({e})")
        model.to(device).eval()
        strings = None
        if a.byte_tokens:
            ids = list(text.encode("utf-8"))
            if model.config.vocab_size < 256:
                raise ExportError(f"--byte-tokens needs vocab_size ≥ 256, {a.model} has {model.config.vocab_size}")
        else:
            try:
                tok = transformers.AutoTokenizer.from_pretrained(a.model, gguf_file=a.gguf_file)
            except (OSError, ValueError) as e:
                raise ExportError(f"{a.model}: cannot load its tokenizer ({e}); --byte-tokens for tokenizer-less models")
            ids = tok(text, add_special_tokens=not a.no_special_tokens)["input_ids"]
        if len(ids) < a.tokens:
            raise ExportError(f"{a.text}: only {len(ids)} tokens, --tokens asks for {a.tokens}")
        ids = ids[: a.tokens]
        if not a.byte_tokens:
            strings = tok.convert_ids_to_tokens(ids)
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        layers = parse_layers(a.layers, len(model.model.layers))
        src = "datasets/export_hf.py " + " ".join(sys.argv[1:] if argv is None else argv)
        info = export_model(model, input_ids, a.out, layers, a.dtype, not a.no_attn, a.model, src, strings)
        print(f"wrote {a.out}: {info['n_tokens']} tokens, {len(info['layers'])} layers, "
              f"key-rotation check {info['key_check']:.2g}")
        return 0
    except ExportError as e:
        print(f"export_hf.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
