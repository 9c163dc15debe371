#!/usr/bin/env python3
"""GGUF checkpoints in `kvsim record`: a llama2.c model converted to GGUF, and refusals of bad files.

  gguf_model_test.py KVSIM DATA_DIR

The converter here writes ../shared/data/stories260K (a llama2.c checkpoint and its SentencePiece
tokenizer) as a GGUF file with llama.cpp's own writer (gguf.GGUFWriter): tokenizer model "llama"
(pieces with "▁", scores, token types), the weights as float32 in llama2.c's order, which is already
GGUF's interleaved rotary order (llama2.c rotates adjacent pairs, as llama.cpp does). Checked:
  1. recording the GGUF and recording the llama2.c files give the same tokens (the GGUF "llama"
     tokenizer against kvsim's tokenizer.bin reader, itself checked against llama2.c), the same
     cross-entropy, values and attention outputs, and queries/keys equal after the channel
     permutation GGUF → Hugging Face order (row 2i + j → j·hd/2 + i); negative control: without the
     permutation the queries differ.
  2. damaged or unsupported files are refused with exit status 2 and one line naming the key or
     tensor: another architecture, rope scaling, a sliding window, an unknown tensor type, an
     unsupported pre-tokenizer, truncation, a misaligned or out-of-file offset, overlapping tensors, a
     duplicate or missing tensor, a shape that disagrees with the metadata, overflowing dimensions,
     GGUF version 1.
Exit 0 passed, 1 failed, 77 SKIPPED (numpy/gguf/h5py or ../shared/data absent).
"""
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def read_llama2c(np, path):
    with open(path, "rb") as f:
        raw = f.read()
    dim, hidden, L, H, KV, V, S = struct.unpack("<7i", raw[:28])
    shared = V > 0
    V = abs(V)
    hd = dim // H
    x = np.frombuffer(raw[28:], dtype=np.float32)
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = x[at:at + n].reshape(shape)
        at += n
        return out
    w = {"cfg": dict(dim=dim, hidden=hidden, L=L, H=H, KV=KV, V=V, S=S, hd=hd)}
    w["emb"] = take(V, dim)
    w["rms_att"] = take(L, dim)
    w["wq"] = take(L, dim, dim)
    w["wk"] = take(L, KV * hd, dim)
    w["wv"] = take(L, KV * hd, dim)
    w["wo"] = take(L, dim, dim)
    w["rms_ffn"] = take(L, dim)
    w["w1"] = take(L, hidden, dim)
    w["w2"] = take(L, dim, hidden)
    w["w3"] = take(L, hidden, dim)
    w["rms_final"] = take(dim)
    take(S, hd // 2)
    take(S, hd // 2)
    w["wcls"] = None if shared else take(V, dim)
    return w


def read_tokenizer(path, V):
    pieces, scores = [], []
    with open(path, "rb") as f:
        f.read(4)
        for _ in range(V):
            score, n = struct.unpack("<fi", f.read(8))
            pieces.append(f.read(n).decode("utf-8", errors="replace"))
            scores.append(score)
    return pieces, scores


def write_gguf(gguf, np, w, pieces, scores, path, arch="llama", kv=None, skip=(), extra=None, pre=None):
    c = w["cfg"]
    g = gguf.GGUFWriter(path, arch)
    g.add_context_length(c["S"])
    g.add_embedding_length(c["dim"])
    g.add_block_count(c["L"])
    g.add_feed_forward_length(c["hidden"])
    g.add_head_count(c["H"])
    g.add_head_count_kv(c["KV"])
    g.add_rope_dimension_count(c["hd"])
    g.add_rope_freq_base(10000.0)
    g.add_layer_norm_rms_eps(1e-5)
    for key, (kind, val) in (kv or {}).items():
        getattr(g, "add_" + kind)(key, val)
    g.add_tokenizer_model("llama" if pre is None else "gpt2")
    if pre is not None:
        g.add_tokenizer_pre(pre)
        g.add_token_merges(["a b"])
    toks, types = [], []
    for i, p in enumerate(pieces):
        if i == 0:
            toks.append("<unk>"); types.append(2)
        elif i in (1, 2):
            toks.append("<s>" if i == 1 else "</s>"); types.append(3)
        elif p.startswith("<0x") and len(p) == 6:
            toks.append(p); types.append(6)
        else:
            toks.append(p.replace(" ", "\u2581")); types.append(1)
    g.add_token_list(toks)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_unk_token_id(0)

    def add(name, arr):
        if name not in skip:
            g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    add("token_embd.weight", w["emb"])
    for l in range(c["L"]):
        b = f"blk.{l}."
        add(b + "attn_norm.weight", w["rms_att"][l])
        add(b + "attn_q.weight", w["wq"][l])
        add(b + "attn_k.weight", w["wk"][l])
        add(b + "attn_v.weight", w["wv"][l])
        add(b + "attn_output.weight", w["wo"][l])
        add(b + "ffn_norm.weight", w["rms_ffn"][l])
        add(b + "ffn_gate.weight", w["w1"][l])
        add(b + "ffn_down.weight", w["w2"][l])
        add(b + "ffn_up.weight", w["w3"][l])
    add("output_norm.weight", w["rms_final"])
    if w["wcls"] is not None:
        add("output.weight", w["wcls"])
    for name, arr, raw_type in extra or []:
        if raw_type is None:
            g.add_tensor(name, arr)
        else:
            g.add_tensor(name, arr, raw_dtype=raw_type)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def tensor_info_at(blob, name):
    """Byte offset of tensor `name`'s info (just after its name string) in a GGUF header."""
    key = struct.pack("<Q", len(name)) + name.encode()
    i = blob.find(key)
    assert i >= 0, name
    return i + len(key)


def check_equivalence(kvsim_bin, ck, tk, text, good, tmp, w, np, h5py, kvsim):
    hd, H, KV = w["cfg"]["hd"], w["cfg"]["H"], w["cfg"]["KV"]
    # 1. The same model through both readers.
    a, b = os.path.join(tmp, "l2c.h5"), os.path.join(tmp, "gguf.h5")
    ra = subprocess.run([kvsim_bin, "record", "--checkpoint", ck, "--tokenizer", tk, "--text", text, "--tokens", "200",
                         "--out", a], capture_output=True, text=True)
    rb = subprocess.run([kvsim_bin, "record", "--checkpoint", good, "--text", text, "--tokens", "200", "--out", b],
                        capture_output=True, text=True)
    check(ra.returncode == 0 and rb.returncode == 0, "both recordings written: " + (ra.stderr + rb.stderr).strip())
    if ra.returncode or rb.returncode:
        return False
    with h5py.File(a) as fa, h5py.File(b) as fb:
        check(np.array_equal(fa["tokens"][:], fb["tokens"][:]),
              "the GGUF 'llama' tokenizer gives the tokenizer.bin's 200 ids")
        ce = float(np.abs(fa["cross_entropy"][:] - fb["cross_entropy"][:]).max())
        check(ce <= 1e-5, f"per-token cross-entropy equal (max |Δ| {ce:.1e})")
        check("GGUF v3" in fb.attrs["checkpoint_format"] and len(fb.attrs["checkpoint_sha256"]) == 64,
              f"the recording names its format ({fb.attrs['checkpoint_format']}) and sha256")
        perm = [2 * i + j for j in range(2) for i in range(hd // 2)]  # HF channel c = j·hd/2 + i ← GGUF 2i + j
        worst = {"q": 0.0, "k": 0.0, "v": 0.0, "attn": 0.0}
        unpermuted = 0.0
        A, B = kvsim.Recording(a), kvsim.Recording(b)
        for l in range(w["cfg"]["L"]):
            for t, heads, p in (("q", H, perm), ("k", KV, perm), ("v", KV, None), ("attn", H, None)):
                for h in range(heads):
                    x, y = getattr(A, t)(l, h), getattr(B, t)(l, h)
                    if p is not None:
                        if t == "q":
                            unpermuted = max(unpermuted, float(np.abs(x - y).max() / np.abs(x).max()))
                        x = x[:, p]
                    worst[t] = max(worst[t], float(np.abs(x - y).max() / np.abs(x).max()))
        for t, v in worst.items():
            check(v <= 1e-5, f"{t} equal across the two readers (max relative |Δ| {v:.1e}; q, k after the permutation)")
        check(unpermuted > 1e-2, f"negative control: without the permutation q differs ({unpermuted:.2f})")

    return True


def check_version2(kvsim_bin, good, text, tmp, np, kvsim):
    """GGUF version 2 (the same layout as 3, which only added big-endian files) reads the same."""
    with open(good, "rb") as f:
        blob = bytearray(f.read())
    blob[4:8] = struct.pack("<I", 2)
    v2 = os.path.join(tmp, "v2.gguf")
    with open(v2, "wb") as f:
        f.write(blob)
    outs = []
    for p in (good, v2):
        outs.append(os.path.join(tmp, os.path.basename(p) + ".h5"))
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", p, "--text", text, "--tokens", "64", "--out", outs[-1]],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"records {os.path.basename(p)}: {r.stderr.strip()}")
    A, B = kvsim.Recording(outs[0]), kvsim.Recording(outs[1])
    same = list(A.tokens()) == list(B.tokens()) and all(np.array_equal(A.q(l, 0), B.q(l, 0)) for l in range(5))
    import h5py
    with h5py.File(outs[1]) as f:
        fmt = f.attrs["checkpoint_format"]
    check(same and fmt.startswith("GGUF v2"), f"a version-2 file records the same tokens and queries as the version-3 "
          f"file and says so ({fmt})")


def check_closed_loop(kvsim_bin, good, text):
    """--policy on a GGUF model: `exact` reproduces the one-token path's cross-entropy bit for bit, and a
    small window raises it (the loop is closed)."""
    outs = {}
    for extra in (["--prefill", "per-token"], ["--policy", "exact"], ["--policy", "window", "--param", "budget=16"]):
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", good, "--text", text, "--tokens", "128", *extra],
                           capture_output=True, text=True)
        outs[extra[1]] = r.stdout
        check(r.returncode == 0, f"record {' '.join(extra)}: {r.stderr.strip()}")
    ce = {k: float(v.split("mean cross-entropy: ")[1].split()[0]) for k, v in outs.items()}
    check(ce["exact"] == ce["per-token"] and "increase 0 nats" in outs["exact"],
          f"closed loop with exact: cross-entropy {ce['exact']} equals the one-token path's {ce['per-token']}")
    check(ce["window"] > ce["exact"] + 0.01, f"closed loop with a 16-token window: {ce['window']} > {ce['exact']}")


def check_prefill(kvsim_bin, good, text, tmp, w, np, kvsim):
    """The batched prefill (GEMMs over all positions, float32 attention) against the one-token path."""
    paths = {}
    for mode in ("batched", "per-token"):
        paths[mode] = os.path.join(tmp, f"prefill_{mode}.h5")
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", good, "--text", text, "--tokens", "300", "--prefill", mode,
                            "--threads", "2", "--out", paths[mode]], capture_output=True, text=True)
        check(r.returncode == 0 and f"forward ({'batched prefill' if mode == 'batched' else mode})" in r.stdout,
              f"--prefill {mode} runs and says so")
    A, B = kvsim.Recording(paths["batched"]), kvsim.Recording(paths["per-token"])
    worst = 0.0
    for l in range(w["cfg"]["L"]):
        for t, heads in (("q", w["cfg"]["H"]), ("k", w["cfg"]["KV"]), ("v", w["cfg"]["KV"]), ("attn", w["cfg"]["H"])):
            for h in range(heads):
                x, y = getattr(A, t)(l, h), getattr(B, t)(l, h)
                worst = max(worst, float(np.abs(x - y).max() / np.abs(y).max()))
    check(worst <= 1e-4, f"batched prefill equals the one-token path: q, k, v, attn of 300 positions within {worst:.1e} (<= 1e-4)")
    import h5py
    with h5py.File(paths["batched"]) as fa, h5py.File(paths["per-token"]) as fb:
        ce = float(np.abs(fa["cross_entropy"][:] - fb["cross_entropy"][:]).max())
    check(ce <= 1e-4, f"per-token cross-entropy equal across the two paths (max |Δ| {ce:.1e})")


def refusal_cases(good, tmp, w, pieces, scores, np, gguf):
    # 2. Refusals: (what, file bytes or writer options, text that the one-line error must hold).
    cases = []

    def written(name, **opts):
        p = os.path.join(tmp, name + ".gguf")
        write_gguf(gguf, np, w, pieces, scores, p, **opts)
        return p
    cases.append(("another architecture", written("arch", arch="phi3"), "architecture 'phi3'"))
    cases.append(("rope scaling", written("rope", kv={"llama.rope.scaling.type": ("string", "linear"),
                                                      "llama.rope.scaling.factor": ("float32", 4.0)}), "rope scaling"))
    cases.append(("sliding window", written("swa", kv={"llama.attention.sliding_window": ("uint32", 64)}), "sliding_window"))
    cases.append(("unexpected tensor", written("bias", extra=[("blk.0.attn_q.bias", np.zeros(64, np.float32), None)]),
                  "unexpected tensor 'blk.0.attn_q.bias'"))
    cases.append(("missing tensor", written("missing", skip=("blk.3.ffn_up.weight",)), "'blk.3.ffn_up.weight' is missing"))
    cases.append(("unsupported pre-tokenizer", written("pre", pre="deepseek-coder"), "deepseek-coder"))
    with open(good, "rb") as f:
        blob = f.read()

    def patched(name, fn):
        b2 = bytearray(blob)
        fn(b2)
        p = os.path.join(tmp, name + ".gguf")
        with open(p, "wb") as f:
            f.write(bytes(b2) if not isinstance(b2, bytes) else b2)
        return p
    q0 = tensor_info_at(blob, "blk.0.attn_q.weight")  # n_dims u32, ne u64 × 2, type u32, offset u64
    k0 = tensor_info_at(blob, "blk.0.attn_k.weight")
    off_q = q0 + 4 + 16 + 4
    off_k = k0 + 4 + 16 + 4
    cases.append(("truncated data", patched("trunc", lambda b: b.__delitem__(slice(len(b) - 1000, None))), "truncated"))
    cases.append(("misaligned offset", patched("misalign", lambda b: b.__setitem__(
        slice(off_q, off_q + 8), struct.pack("<Q", struct.unpack_from("<Q", blob, off_q)[0] + 4))), "alignment"))
    cases.append(("out-of-file offset", patched("beyond", lambda b: b.__setitem__(
        slice(off_q, off_q + 8), struct.pack("<Q", 1 << 40))), "blk.0.attn_q.weight"))
    cases.append(("overlapping tensors", patched("overlap", lambda b: b.__setitem__(
        slice(off_k, off_k + 8), blob[off_q:off_q + 8])), "overlap"))
    cases.append(("duplicate tensor", patched("dup", lambda b: b.__setitem__(
        slice(k0 - len("blk.0.attn_k.weight"), k0), b"blk.0.attn_q.weight")), "appears twice"))
    cases.append(("shape disagrees", patched("shape", lambda b: b.__setitem__(
        slice(q0 + 4, q0 + 12), struct.pack("<Q", 32))), "blk.0.attn_q.weight"))
    cases.append(("overflowing dimensions", patched("overflow", lambda b: (
        b.__setitem__(slice(q0 + 4, q0 + 12), struct.pack("<Q", 1 << 39)),
        b.__setitem__(slice(q0 + 12, q0 + 20), struct.pack("<Q", 1 << 39)))), "2^40"))
    cases.append(("unsupported tensor type", patched("iq", lambda b: b.__setitem__(
        slice(q0 + 20, q0 + 24), struct.pack("<I", 16))), "'blk.0.attn_q.weight' has type IQ2_XXS"))
    cases.append(("unknown tensor type", patched("t99", lambda b: b.__setitem__(
        slice(q0 + 20, q0 + 24), struct.pack("<I", 99))), "'blk.0.attn_q.weight' has type unknown id 99"))
    cases.append(("GGUF version 1", patched("v1", lambda b: b.__setitem__(slice(4, 8), struct.pack("<I", 1))), "version 1"))
    cases.append(("huge metadata count", patched("kvcount", lambda b: b.__setitem__(
        slice(16, 24), struct.pack("<Q", 1 << 60))), "metadata entries"))
    return cases


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    kvsim_bin, data = sys.argv[1:3]
    try:
        import numpy as np
        import gguf
        import h5py
        import kvsim
    except ImportError as e:
        print(f"SKIPPED: {e} (bash scripts/setup.sh installs .venv)")
        return SKIP
    ck = os.path.join(data, "stories260K", "stories260K.bin")
    tk = os.path.join(data, "stories260K", "tok512.bin")
    text = os.path.join(data, "tinystories-sample", "tinystories.txt")
    if not all(os.path.exists(p) for p in (ck, tk, text)):
        print("SKIPPED: ../shared/data/stories260K or tinystories-sample absent")
        return SKIP
    w = read_llama2c(np, ck)
    pieces, scores = read_tokenizer(tk, w["cfg"]["V"])

    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "stories260K.gguf")
        write_gguf(gguf, np, w, pieces, scores, good)
        if not check_equivalence(kvsim_bin, ck, tk, text, good, tmp, w, np, h5py, kvsim):
            return 1
        check_prefill(kvsim_bin, good, text, tmp, w, np, kvsim)
        check_version2(kvsim_bin, good, text, tmp, np, kvsim)
        check_closed_loop(kvsim_bin, good, text)
        cases = refusal_cases(good, tmp, w, pieces, scores, np, gguf)

        for what, path, needle in cases:
            r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", text, "--tokens", "8",
                                "--out", os.path.join(tmp, "x.h5")], capture_output=True, text=True)
            err = r.stderr.strip()
            check(r.returncode == 2 and needle in err and len(err.splitlines()) == 1 and not os.path.exists(os.path.join(tmp, "x.h5")),
                  f"refused: {what}: exit {r.returncode}: {err}")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
