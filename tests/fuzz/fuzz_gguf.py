"""GGUF inputs for the fuzz campaign (tests/fuzz/fuzz_inputs.py): a tiny valid model and its mutations."""
import os
import struct


def tiny_gguf(work):
    """A valid GGUF (v3, llama architecture) small enough to fuzz: dim 32, 1 layer, 2 query heads / 1 KV
    head, FFN 64, a byte-level BPE tokenizer (256 byte pieces + 8 merges, pre-tokenizer smollm), and
    tensors in F32, F16, Q8_0, Q4_0, Q4_1 and Q5_1 (quantized by llama.cpp's `gguf` package).
    Returns (path, text) or (None, reason) when the `gguf` package is absent."""
    try:
        import numpy as np
        import gguf
    except ImportError as e:
        return None, f"gguf checkpoints not fuzzed: {e}"
    rng = np.random.default_rng(11)
    D, F, V = 32, 64, 264
    path = os.path.join(work, "tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_block_count(1)
    w.add_feed_forward_length(F)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    bmap = {}
    n = 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            bmap[b] = chr(b)
        else:
            bmap[b] = chr(256 + n)
            n += 1
    tokens = [bmap[b] for b in range(256)]
    merges = ["a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at", "Ġ o", "Ġo n", "Ġ m"]
    tokens += ["at", "Ġc", "Ġcat", "Ġs", "Ġsat", "Ġo", "Ġon", "Ġm"]
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_bool("tokenizer.ggml.add_bos_token", False)

    def add(name, shape, qtype):
        x = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        if qtype in ("F32", "F16"):
            w.add_tensor(name, x.astype(np.float16) if qtype == "F16" else x)
        else:
            t = getattr(gguf.GGMLQuantizationType, qtype)
            w.add_tensor(name, gguf.quants.quantize(x, t), raw_dtype=t)
    add("token_embd.weight", (V, D), "Q8_0")
    add("blk.0.attn_norm.weight", (D,), "F32")
    add("blk.0.attn_q.weight", (D, D), "Q4_0")
    add("blk.0.attn_k.weight", (D // 2, D), "Q4_1")
    add("blk.0.attn_v.weight", (D // 2, D), "Q5_1")
    add("blk.0.attn_output.weight", (D, D), "F16")
    add("blk.0.ffn_norm.weight", (D,), "F32")
    add("blk.0.ffn_gate.weight", (F, D), "Q8_0")
    add("blk.0.ffn_up.weight", (F, D), "Q4_0")
    add("blk.0.ffn_down.weight", (D, F), "Q5_1")
    add("output_norm.weight", (D,), "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = os.path.join(work, "tiny_gguf.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("a cat sat on a mat. 12 cats, naïve 東京 🙂\n" * 8)
    return path, text


def gguf_cases(kvsim, work, rng, count):
    """Mutated copies of tiny_gguf(): header counts, metadata string/array lengths and value types,
    tensor infos (dimension counts, dimensions, types, offsets) set to extreme values; random bytes
    (mostly in the header), cuts, appended junk."""
    path, text = tiny_gguf(work)
    if path is None:
        return [], text
    blob = open(path, "rb").read()
    # Where the header's u64/u32 fields are: every 8-aligned u64 that looks like a small length or
    # offset, found by scanning (the mutators need no GGUF parser of their own).
    data_start = blob.find(b"output_norm.weight") + 64
    lengths = [o for o in range(24, data_start - 8) if 0 < struct.unpack_from("<Q", blob, o)[0] < 1 << 20]
    cases = []
    for i in range(count):
        data = bytearray(blob)
        op = rng.randrange(6)
        if op == 0:  # header counts and version
            o = rng.choice([4, 8, 16])
            v = rng.choice([0, 1, 2, 3, 4, 2 ** 31, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1, 10 ** 6])
            data[o:o + (4 if o == 4 else 8)] = struct.pack("<I" if o == 4 else "<Q", v % (2 ** 32 if o == 4 else 2 ** 64))
            what = f"header field at {o} = {v}"
        elif op == 1:  # a length / count / dimension / offset in the header
            o = rng.choice(lengths)
            v = rng.choice([0, 1, 7, 31, 33, 255, 256, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 62, 2 ** 64 - 1,
                            struct.unpack_from("<Q", blob, o)[0] + rng.choice([-1, 1, 32, -32])])
            data[o:o + 8] = struct.pack("<Q", v % 2 ** 64)
            what = f"u64 at {o} = {v}"
        elif op == 2:  # a u32 (value type, dimension count, tensor type)
            o = rng.randrange(24, data_start - 4)
            v = rng.choice([0, 1, 2, 4, 5, 7, 8, 9, 12, 13, 16, 30, 39, 99, 2 ** 31])
            data[o:o + 4] = struct.pack("<I", v)
            what = f"u32 at {o} = {v}"
        elif op == 3:
            cut = rng.randrange(len(data))
            data = data[:cut]
            what = f"cut at {cut}"
        elif op == 4:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            what = "bytes appended"
        else:
            hi = data_start if rng.random() < 0.8 else len(data)
            offs = [rng.randrange(hi) for _ in range(rng.randint(1, 8))]
            for o in offs:
                data[o] = rng.randrange(256)
            what = f"bytes at {offs}"
        p = os.path.join(work, f"gguf_{i:04d}.gguf")
        with open(p, "wb") as f:
            f.write(data)
        out_dir = os.path.join(work, f"gguf_{i:04d}_out")
        os.makedirs(out_dir, exist_ok=True)
        mode = ["--text", text, "--tokens", "16"] if rng.random() < 0.7 else ["--generate", "8", "--prompt", "a cat"]
        argv = [kvsim, "record", "--checkpoint", p, *mode, "--out", os.path.join(out_dir, "r.h5")]
        cases.append(("gguf", what, argv, out_dir, [p]))
    return cases, None
