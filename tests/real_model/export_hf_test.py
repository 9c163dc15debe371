#!/usr/bin/env python3
"""Tests of datasets/export_hf.py.

  export_hf_test.py writer KVSIM SRC DATA   the recording writer against kvsim's reader and exact replay
                                            (needs numpy + h5py)
  export_hf_test.py models KVSIM SRC DATA   tiny randomly initialised Llama (GQA), Mistral, Qwen2 (q/k/v
                                            biases), Qwen3 (per-head q/k norm) and Gemma (head_dim ≠
                                            hidden/heads) built from configs: export, then `kvsim inspect
                                            --check-attn` must reproduce the model's own attention output of
                                            every layer to 1e-4; the CLI end to end; every refusal
                                            (needs torch + transformers + h5py)
  export_hf_test.py gguf KVSIM SRC DATA MODELS
                                            two roads to the same tensors: SmolLM2's GGUF through
                                            transformers + the exporter and through `kvsim record` agree
                                            to 1e-4 on q, k, v and attn (negative control: shifted keys)
Exit 0 = passed, 1 = failed, 77 = SKIPPED (ctest SKIP_RETURN_CODE) with the reason printed.
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def kvsim_check_attn(kvsim, path, tol, layers=None):
    cmd = [kvsim, "inspect", "--check-attn", "--attn-tol", str(tol), path]
    if layers is not None:
        cmd[3:3] = ["--layers"] + [str(l) for l in layers]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def text_of(data_dir):
    p = os.path.join(data_dir, "tinystories-sample", "tinystories.txt")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            return f.read()
    print("note: ../shared/data/tinystories-sample absent; using a built-in sentence")
    return "Once upon a time, there was a little girl who loved to play outside in the sun. " * 8


def check_parse_layers(ex):
    """--layers: ranges and lists parse; out-of-range, unsorted and junk specs are refused by name."""
    for spec, want in (("0,2-3", [0, 2, 3]), (None, [0, 1, 2, 3])):
        check(ex.parse_layers(spec, 4) == want, f"--layers {spec} -> {want}")
    for spec in ("5", "2,1", "x"):
        try:
            ex.parse_layers(spec, 4)
            check(False, f"--layers {spec} refused")
        except ex.ExportError as e:
            check("--layers" in str(e), f"--layers {spec} refused: {e}")


def test_writer(kvsim, src, data_dir):
    try:
        import numpy as np
        import h5py  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e.name} not importable (scripts/setup-venv.sh installs numpy and h5py into .venv)")
        return SKIP
    sys.path.insert(0, os.path.join(src, "datasets"))
    import export_hf as ex

    rng = np.random.default_rng(5)
    H, Hkv, n, d = 4, 2, 48, 16
    scale = 0.3
    q = rng.standard_normal((H, n, d)).astype(np.float32)
    k = rng.standard_normal((Hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((Hkv, n, d)).astype(np.float32)

    def attention(kv_of):
        out = np.zeros((H, n, d))
        for h in range(H):
            kk, vv = k[kv_of(h)].astype(np.float64), v[kv_of(h)].astype(np.float64)
            logits = scale * q[h].astype(np.float64) @ kk.T
            logits[np.triu_indices(n, 1)] = -np.inf
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            out[h] = (p / p.sum(axis=1, keepdims=True)) @ vv
        return out

    right = attention(lambda h: h // (H // Hkv))  # docs/recordings.md, the schema: query head h uses KV head h / group
    wrong = attention(lambda h: h % Hkv)          # the other common convention: must be caught
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, tol in (("float32", 1e-5), ("float16", 2e-2)):
            for name, attn, expect in (("right", right, 0), ("wrong", wrong, 1)):
                path = os.path.join(tmp, f"{dtype}_{name}.h5")
                rec = ex.RecordingFile(path, 1, H, Hkv, d, n, scale, "test", "export_hf_test", dtype, True)
                rec.write(0, "q", q)
                rec.write(0, "k", k)
                rec.write(0, "v", v)
                rec.write(0, "attn", attn.astype(np.float32))
                rec.write_tokens(list(range(n)), [f"t{i}" for i in range(n)])
                rec.close()
                check(os.path.exists(path) and not os.path.exists(path + ".tmp"), f"{dtype}: file renamed into place")
                rc, out = kvsim_check_attn(kvsim, path, tol)
                check(rc == expect, f"{dtype} {name} GQA mapping: kvsim --check-attn exit {rc} (want {expect}): {out.strip()}")
        # Refusals: non-finite values name the dataset and index; an aborted file leaves nothing.
        path = os.path.join(tmp, "bad.h5")
        rec = ex.RecordingFile(path, 1, H, Hkv, d, n, scale, "test", "export_hf_test", "float32", False)
        bad = k.copy()
        bad[1, 7, 3] = np.nan
        try:
            rec.write(0, "k", bad)
            check(False, "NaN key rejected")
        except ex.ExportError as e:
            check("/layer_000/k" in str(e) and "(1, 7, 3)" in str(e), f"NaN key rejected by name: {e}")
        try:
            rec.close()
            check(False, "close() with unwritten datasets refused")
        except ex.ExportError as e:
            check("never written" in str(e), f"close() with unwritten datasets refused: {e}")
        rec.abort()
        check(not os.path.exists(path) and not os.path.exists(path + ".tmp"), "aborted export leaves no file")
        try:
            ex.RecordingFile(path, 1, 6, 4, d, n, scale, "m", "s")
            check(False, "n_heads not a multiple of n_kv_heads refused")
        except ex.ExportError as e:
            check("multiple" in str(e), f"head counts refused: {e}")
        # Without torch/transformers the CLI says which module is missing and exits 3, writing nothing.
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            have_hf = True
        except ImportError:
            have_hf = False
        if not have_hf:
            tfile = os.path.join(tmp, "t.txt")
            with open(tfile, "w") as f:
                f.write("hello")
            out = os.path.join(tmp, "nohf.h5")
            r = subprocess.run([sys.executable, os.path.join(src, "datasets", "export_hf.py"), "--model", "x", "--text", tfile,
                                "--tokens", "4", "--out", out], capture_output=True, text=True)
            check(r.returncode == 3 and "not importable" in r.stderr and not os.path.exists(out),
                  f"missing transformers: exit {r.returncode}, {r.stderr.strip()}")
    check_parse_layers(ex)
    return 0


def test_models(kvsim, src, data_dir):
    try:
        import torch
        import transformers
        import h5py  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e.name} is not importable here (bash scripts/setup.sh installs torch and transformers "
              "into .venv)")
        return SKIP
    sys.path.insert(0, os.path.join(src, "datasets"))
    import export_hf as ex

    text = text_of(data_dir)
    n = 96
    ids = list(text.encode("utf-8"))[:n]
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    models = [("llama (GQA 4/2)", transformers.LlamaConfig(**common)),
              ("mistral (GQA 4/2, window 4096)", transformers.MistralConfig(sliding_window=4096, **common)),
              ("qwen2 (q/k/v biases)", transformers.Qwen2Config(**common)),
              ("qwen3 (per-head q/k RMSNorm)", transformers.Qwen3Config(head_dim=16, **common)),
              ("gemma (head_dim 32 != hidden/heads, GELU, (1+w) norms)", transformers.GemmaConfig(head_dim=32, **common))]
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in models:
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
            with torch.no_grad():  # random biases: from_config initialises them to zero
                for mod in model.modules():
                    if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                        mod.bias.normal_(0, 0.5)
            path = os.path.join(tmp, label.split()[0] + ".h5")
            info = ex.export_model(model, torch.tensor([ids]), path, dtype="float32", model_name=label)
            check(info["key_check"] < 1e-5, f"{label}: exporter's rotated keys match the KV cache ({info['key_check']:.2g})")
            rc, out = kvsim_check_attn(kvsim, path, 1e-4)
            check(rc == 0 and out.count("layer ") >= cfg.num_hidden_layers,
                  f"{label}: kvsim's exact replay of every layer reproduces the model's attention to 1e-4: {out.strip()}")
        # A sliding window shorter than the sequence (Mistral, window 16 < 96 tokens): the recording names
        # each layer's window and kvsim's check replays window attention; negative control: without the
        # attribute (full causal attention) the check fails.
        torch.manual_seed(0)
        swa = transformers.AutoModelForCausalLM.from_config(transformers.MistralConfig(sliding_window=16, **common),
                                                            attn_implementation="eager").float().eval()
        path = os.path.join(tmp, "swa.h5")
        ex.export_model(swa, torch.tensor([ids]), path, dtype="float32", model_name="mistral window 16")
        import h5py
        with h5py.File(path, "r") as f:
            windows = list(f.attrs.get("layer_windows", []))
        check(windows == [16, 16, 16], f"sliding window 16 < 96 tokens: layer_windows {windows}")
        rc, out = kvsim_check_attn(kvsim, path, 1e-4)
        check(rc == 0, f"sliding window: kvsim's window-attention check reproduces the model's attention: {out.strip()}")
        with h5py.File(path, "r+") as f:
            del f.attrs["layer_windows"]
        rc, out = kvsim_check_attn(kvsim, path, 1e-4)
        check(rc != 0, f"negative control: the same file read as full causal attention fails the check: {out.strip()[-120:]}")
        # The CLI end to end on a saved tiny Llama (byte tokens: no tokenizer files needed).
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
        mdir = os.path.join(tmp, "tiny-llama")
        model.save_pretrained(mdir)
        tfile = os.path.join(tmp, "text.txt")
        with open(tfile, "w", encoding="utf-8") as f:
            f.write(text[:4000])
        out = os.path.join(tmp, "cli.h5")
        r = subprocess.run([sys.executable, os.path.join(src, "datasets", "export_hf.py"), "--model", mdir, "--text", tfile,
                            "--tokens", "64", "--byte-tokens", "--model-dtype", "float32", "--dtype", "float16",
                            "--device", "cpu", "--out", out], capture_output=True, text=True)
        check(r.returncode == 0 and os.path.exists(out), f"CLI export: {r.stdout.strip()} {r.stderr.strip()[-400:]}")
        rc, msg = kvsim_check_attn(kvsim, out, 2e-2)
        check(rc == 0, f"CLI export (float16 storage) replays within 2e-2: {msg.strip()}")
        r = subprocess.run([sys.executable, os.path.join(src, "datasets", "export_hf.py"), "--model", mdir, "--text", tfile,
                            "--tokens", "100000", "--byte-tokens", "--out", out + "2"], capture_output=True, text=True)
        check(r.returncode == 2 and "tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1
              and not os.path.exists(out + "2") and not os.path.exists(out + "2.tmp"),
              f"CLI: too few tokens refused in one line, exit 2, no file: {r.stderr.strip()}")
        test_refusals(ex, torch, transformers, ids, common, tmp)
    return 0


def test_refusals(ex, torch, transformers, ids, common, tmp):
    """Every refusal export_model promises: ExportError naming the model, and no file left."""
    import types

    def tiny(cfg_cls, **kw):
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg_cls(**common, **kw), attn_implementation="eager").eval()

    def refused(label, model, needle, **kw):
        path = os.path.join(tmp, "refused.h5")
        try:
            ex.export_model(model, torch.tensor([ids]), path, **kw)
            check(False, f"{label} refused")
        except ex.ExportError as e:
            check(needle in str(e) and not os.path.exists(path) and not os.path.exists(path + ".tmp"),
                  f"{label} refused, no file left: {e}")

    m = tiny(transformers.LlamaConfig)
    m.config.attn_logit_softcapping = 50.0  # as Gemma 2 sets it
    refused("attention-logit soft-capping", m, "soft-capping")
    gpt2 = transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=512)
    torch.manual_seed(0)
    refused("an architecture outside the list (gpt2)", transformers.AutoModelForCausalLM.from_config(gpt2).eval(),
            "model_type 'gpt2' is not supported")
    m = tiny(transformers.LlamaConfig)
    del m.model.layers[1].self_attn.k_proj  # as a fused-QKV attention would look
    refused("no separate k_proj", m, "layer 1's attention has no 'k_proj'")
    m = tiny(transformers.LlamaConfig)
    m.model.forward = lambda **kw: types.SimpleNamespace(past_key_values=None)
    refused("a forward pass without a readable KV cache", m, "returned no KV cache")
    m = tiny(transformers.LlamaConfig)
    real_layer = ex.cache_layer
    ex.cache_layer = lambda cache, l: tuple(t[:, :, :-1] for t in real_layer(cache, l))  # a cache missing a position
    try:
        refused("a KV cache whose layout differs (one position short)", m, "cached keys have shape")
    finally:
        ex.cache_layer = real_layer


def test_two_roads(kvsim_bin, src, data_dir, models_dir):
    """SmolLM2's GGUF through transformers + datasets/export_hf.py and through `kvsim record`: the same
    q, k, v and attention output over the same 128 token ids."""
    gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.exists(os.path.join(models_dir, gguf_name)):
        print(f"SKIPPED: {os.path.join(models_dir, gguf_name)} absent (bash scripts/setup.sh fetches it)")
        return SKIP
    try:
        import numpy as np
        import torch
        import transformers
        import kvsim
        from kvsim.model import Model
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return SKIP
    sys.path.insert(0, os.path.join(src, "datasets"))
    import export_hf as ex
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(2)
    text_path = os.path.join(data_dir, "tinystories-sample", "tinystories.txt")
    ids = Model(os.path.join(models_dir, gguf_name)).encode(text_of(data_dir)[:4000])[:128]
    hf = transformers.AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                           attn_implementation="sdpa").eval()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "export.h5"), os.path.join(tmp, "record.h5")
        info = ex.export_model(hf, torch.tensor([ids]), a, dtype="float32", model_name=gguf_name)
        check(info["key_check"] < 1e-5, f"exporter's rotated keys match transformers' KV cache ({info['key_check']:.2g})")
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", os.path.join(models_dir, gguf_name), "--text", text_path,
                            "--tokens", "128", "--out", b], capture_output=True, text=True)
        check(r.returncode == 0, f"kvsim record: {r.stderr.strip()}")
        E, R = kvsim.Recording(a), kvsim.Recording(b)
        check(list(E.tokens()) == list(R.tokens()) == ids, "both roads hold the same 128 token ids")

        def worst(shift_layer=None):
            out = {}
            for l in range(30):
                for t, heads in (("q", 9), ("k", 3), ("v", 3), ("attn", 9)):
                    for h in range(heads):
                        x, y = getattr(E, t)(l, h), getattr(R, t)(l, h)
                        if l == shift_layer and t == "k":
                            y = np.concatenate([y[:1], y[:-1]])  # keys shifted by one position
                        out[t] = max(out.get(t, 0.0), float(np.abs(x - y).max() / np.abs(x).max()))
            return out
        w = worst()
        for t in ("q", "k", "v", "attn"):
            check(w[t] <= 1e-4, f"{t}: export vs kvsim record, 30 layers, max relative deviation {w[t]:.1e} <= 1e-4")
        bad = worst(shift_layer=7)["k"]
        check(bad > 1e-4, f"negative control: layer 7's keys shifted by one position are rejected ({bad:.2f} > 1e-4)")
    return 0


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "gguf":
        rc = test_two_roads(*sys.argv[2:])
        if rc == SKIP:
            return SKIP
        print(f"export_hf gguf: {'FAILED ' + str(len(failures)) if failures else 'all passed'}")
        return 1 if failures else 0
    if len(sys.argv) != 5 or sys.argv[1] not in ("writer", "models"):
        print(__doc__)
        return 2
    mode, kvsim, src, data_dir = sys.argv[1:]
    rc = (test_writer if mode == "writer" else test_models)(kvsim, src, data_dir)
    if rc == SKIP:
        return SKIP
    print(f"export_hf {mode}: {'FAILED ' + str(len(failures)) if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
