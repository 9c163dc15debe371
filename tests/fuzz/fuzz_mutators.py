"""Input generators of the kvsim fuzz campaign (tests/fuzz/fuzz_inputs.py): seeded mutations of HDF5
recordings (structural, with h5py, and byte-level), TOML configs, --set overrides and llama2.c
checkpoints/tokenizers. Each *_cases function returns (kind, description, argv, out_dir, files)."""
import os
import random
import shutil
import struct
import subprocess
import warnings

warnings.filterwarnings("ignore", category=RuntimeWarning)  # overflow in the deliberate huge-value mutations

EXTREME = ["0", "-1", "1", "99999999999", "9223372036854775807", "-9223372036854775808", "1e308", "-1e308",
           "nan", "inf", "-inf", "0.0", "1.5", "1e-300", "\"x\"", "\"\"", "true", "[]", "[0, -1]",
           "[99999999999]", "{a = 1}", "2147483648", "4294967297"]
SET_KEYS = ["data.n", "data.d", "data.n_layers", "data.n_heads", "data.n_kv_heads", "data.tokens", "data.layers",
            "data.heads", "data.sequences", "data.softmax_scale", "data.q_scale", "data.cluster_c", "data.n_heavy",
            "data.heavy_strength", "data.query_norm", "eval.every", "eval.from", "eval.gqa", "eval.group_agg",
            "eval.objectives", "eval.objectives_every", "eval.objectives_max_t", "eval.policy_precision",
            "eval.reference_precision", "eval.stepping", "eval.stepping_block", "seed", "name", "policy.budget",
            "policy.memory", "policy.sink",
            "policy.window", "policy.threshold", "policy.stride", "policy.s", "policy.t", "policy.delta",
            "policy.max_clusters", "policy.recent", "policy.centers", "policy.prefill", "policy.eps", "policy.r",
            "policy.0.name", "policy.1.budget", "policy.score", "policy.weighted", "policy.mode", "policy.log_scale"]

BASE_CONFIG = """name = "fuzz"
seed = 3

[data]
synthetic = "heavy_hitter"
n = 48
d = 8
n_layers = 1
n_heads = 2
n_kv_heads = 1

[eval]
every = 8
objectives = true

[[policy]]
name = "exact"

[[policy]]
name = "window"
budget = 0.25

[[policy]]
name = "sink"
budget = 12
sink = 4

[[policy]]
name = "h2o"
budget = 0.25

[[policy]]
name = "uniform"
budget = 0.25

[[policy]]
name = "oracle_topk"
budget = 0.25

[[policy]]
name = "buzz"
memory = 0.5

[[policy]]
name = "subgen"
memory = 0.5
t = 1

[[policy]]
name = "subgen"
delta = 1.0
s = 16
t = 2

[[policy]]
name = "subgen_kcenter"
recent = 0.125
centers = 0.125
mode = "streaming"
"""

RUN_CONFIG = """name = "fuzz_rec"
seed = 1

[data]
path = "{path}"

[eval]
every = 4

[[policy]]
name = "exact"

[[policy]]
name = "h2o"
budget = 0.5

[[policy]]
name = "subgen_kcenter"
recent = 0.25
centers = 0.25
"""


# ---------------------------------------------------------------- inputs: recordings

def base_recordings(kvsim, work):
    """Small valid recordings: kvsim's own (chunked + deflate) and h5py-written (contiguous, float16)."""
    import h5py
    import numpy as np
    a = os.path.join(work, "base_kvsim.h5")
    subprocess.run([kvsim, "synth", "--preset", "clustered", "--n", "24", "--d", "4", "--layers", "2", "--heads", "2",
                    "--kv-heads", "1", "--seed", "5", "--out", a], check=True, capture_output=True)
    b = os.path.join(work, "base_h5py.h5")
    rng = np.random.default_rng(5)
    with h5py.File(b, "w") as f:
        for k, v in (("kvsim_schema", 1), ("n_layers", 1), ("n_heads", 2), ("n_kv_heads", 2), ("head_dim", 4),
                     ("n_tokens", 16)):
            f.attrs[k] = np.int64(v)
        f.attrs["model"] = "fuzz"
        f.attrs["source"] = "fuzz_inputs.py"
        f.attrs["softmax_scale"] = 0.5
        for t in ("q", "k", "v"):
            f.create_dataset(f"layer_000/{t}", data=rng.standard_normal((2, 16, 4)).astype(np.float16))
        q, k = f["layer_000/q"][...].astype(np.float64), f["layer_000/k"][...].astype(np.float64)
        logits = np.einsum("hid,hjd->hij", q, k) * 0.5
        logits += np.triu(np.full((16, 16), -np.inf), 1)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        f.create_dataset("layer_000/attn", data=np.einsum("hij,hjd->hid", w, f["layer_000/v"][...].astype(np.float64)).astype(np.float32))
        f.create_dataset("tokens", data=np.arange(16, dtype=np.int32))
    return [a, b]


def mutate_structure(path, rng):
    """One to three structural changes to the recording at `path` (h5py); returns a description."""
    import h5py
    import numpy as np
    done = []
    with h5py.File(path, "r+") as f:
        datasets = []
        f.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(12)
            if op == 0 and f.attrs:
                k = rng.choice(list(f.attrs))
                del f.attrs[k]
                done.append(f"del attr {k}")
            elif op in (1, 2):
                k = rng.choice(["n_layers", "n_heads", "n_kv_heads", "head_dim", "n_tokens", "kvsim_schema",
                                "softmax_scale", "model", "rope"])
                v = rng.choice([np.int64(0), np.int64(-3), np.int64(2 ** 40), np.int64(2 ** 31), np.float64(np.nan),
                                np.float64(1e300), "x", np.array([1, 2]), np.int8(3), np.uint64(2 ** 63)])
                f.attrs[k] = v
                done.append(f"attr {k}={v!r}")
            elif op == 3 and datasets:
                d = rng.choice(datasets)
                del f[d]
                done.append(f"del {d}")
            elif op in (4, 5, 6) and datasets:
                d = rng.choice(datasets)
                shape = f[d].shape
                del f[d]
                kind = rng.randrange(11)
                if kind == 0:
                    f.create_dataset(d, data=np.ones(shape, dtype=rng.choice(["f8", "i4", "i8", "u1", "?", "f2", "i2"])))
                elif kind == 1:
                    f.create_dataset(d, data=np.array([b"ab"] * max(1, int(np.prod(shape)))).reshape(-1))
                elif kind == 2:
                    s2 = tuple(max(0, s + rng.choice([-1, 1, 7])) for s in shape)
                    f.create_dataset(d, data=np.ones(s2, dtype="f4"))
                elif kind == 3:
                    f.create_dataset(d, data=np.float32(1.0))
                elif kind == 4:
                    f.create_group(d)
                elif kind == 5:
                    f.create_dataset(d, shape=shape, dtype="f4")  # never written
                elif kind == 6 and len(shape) == 3:
                    ds = f.create_dataset(d, shape=shape, dtype="f4", chunks=(1,) + shape[1:])
                    ds[0] = 1.0  # one chunk of several
                elif kind == 7:
                    f.create_dataset(d, data=np.ones(shape, dtype="f4"), compression="lzf")
                elif kind == 8:
                    raw = path + ".raw"
                    with open(raw, "wb") as r:
                        r.write(b"\0" * (4 * int(np.prod(shape))))
                    f.create_dataset(d, shape=shape, dtype="f4", external=[(raw, 0, h5py.h5f.UNLIMITED)])
                elif kind == 9:
                    f[d] = h5py.ExternalLink("/nonexistent/file.h5", "/x")
                else:
                    f.create_dataset(d, data=np.ones(shape, dtype="f4"), maxshape=tuple(None for _ in shape),
                                     chunks=tuple(max(1, s) for s in shape))
                done.append(f"replace {d} ({kind})")
            elif op in (7, 8) and datasets:
                d = rng.choice([x for x in datasets if f[x].dtype.kind == "f"] or datasets)
                if f[d].dtype.kind == "f" and f[d].size:
                    a = f[d][...]
                    idx = tuple(rng.randrange(s) for s in a.shape)
                    a[idx] = rng.choice([np.nan, np.inf, -np.inf, 6e4, 3e38, -3e38, 1e-45])
                    f[d][...] = a
                    done.append(f"value {d}{list(idx)}")
            elif op == 9 and datasets:
                d = rng.choice(datasets)
                if f[d].dtype.kind == "f" and f[d].size:
                    f[d][...] = f[d][...] * rng.choice([1e4, 1e19, 1e30])
                    done.append(f"scale {d}")
            elif op == 10:
                f["layer_000/extra"] = h5py.SoftLink("/nowhere")
                done.append("dangling soft link")
            else:
                n = f.attrs.get("n_layers", 1)
                f.attrs["n_layers"] = np.int64(int(n) + 1) if np.ndim(n) == 0 and np.issubdtype(type(n), np.integer) else 2
                done.append("one layer more than stored")
    return "; ".join(done) or "unchanged"


def mutate_bytes(path, rng):
    data = bytearray(open(path, "rb").read())
    op = rng.randrange(10)
    if op == 0:
        cut = rng.randrange(1, len(data))
        data = data[:cut]
        what = f"cut at {cut}"
    elif op == 1:
        data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600)))
        what = "junk appended"
    else:
        offs = []
        for _ in range(rng.randint(1, 8)):
            hi = min(len(data), 4096) if rng.random() < 0.75 else len(data)
            o = rng.randrange(hi)
            data[o] = rng.choice([0, 0xFF, 0x80, 0x7F, 8, 64, rng.randrange(256)])
            offs.append(o)
        what = f"bytes at {offs}"
    with open(path, "wb") as f:
        f.write(data)
    return what


def recording_cases(kvsim, work, rng, count, kind):
    try:
        bases = base_recordings(kvsim, work)
    except ImportError:
        return [], f"{kind}: SKIPPED (no h5py)"
    cases = []
    for i in range(count):
        path = os.path.join(work, f"{kind}_{i:04d}.h5")
        shutil.copy(rng.choice(bases), path)
        try:
            what = mutate_structure(path, rng) if kind == "recording-struct" else mutate_bytes(path, rng)
        except Exception as e:  # h5py refused the mutation itself: still a valid input to try
            what = f"partial mutation ({type(e).__name__})"
        if rng.random() < 0.3:
            argv = [kvsim, "inspect", "--check-attn", path] if rng.random() < 0.5 else [kvsim, "inspect", path]
            cases.append((kind, what, argv, None, [path]))
        else:
            cfg = os.path.join(work, f"{kind}_{i:04d}.toml")
            with open(cfg, "w") as f:
                f.write(RUN_CONFIG.format(path=path))
            out = os.path.join(work, f"{kind}_{i:04d}_out")
            cases.append((kind, what, [kvsim, "run", cfg, "--out", out, "--quiet"], out, [path, cfg]))
    return cases, None


# ---------------------------------------------------------------- inputs: configs and --set

def mutate_config(text, rng):
    lines = text.splitlines()
    done = []
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(lines))
        if op in (0, 1, 2) and "=" in lines[i]:
            k = lines[i].split("=", 1)[0]
            v = rng.choice(EXTREME)
            lines[i] = f"{k}= {v}"
            done.append(f"{k.strip()}={v}")
        elif op == 3:
            done.append(f"del line {i}")
            del lines[i]
        elif op == 4:
            lines.insert(i, lines[rng.randrange(len(lines))])
            done.append(f"dup line {i}")
        elif op == 5 and "=" in lines[i]:
            k, v = lines[i].split("=", 1)
            k2 = k.strip()
            k2 = k2[:-1] if len(k2) > 1 and rng.random() < 0.5 else k2 + "x"
            lines[i] = f"{k2} ={v}"
            done.append(f"key {k2}")
        else:
            j = rng.randrange(len(lines[i]) + 1)
            junk = rng.choice(["[", "]", "\"", "=", "\x00", "\xff", "#", "[[policy]]", "\\u0000", "'''"])
            lines[i] = lines[i][:j] + junk + lines[i][j:]
            done.append(f"insert {junk!r} line {i}")
    return "\n".join(lines) + "\n", "; ".join(done)


def config_cases(kvsim, work, rng, count):
    cases = []
    for i in range(count):
        text, what = mutate_config(BASE_CONFIG, rng)
        cfg = os.path.join(work, f"config_{i:04d}.toml")
        with open(cfg, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        out = os.path.join(work, f"config_{i:04d}_out")
        cases.append(("config", what, [kvsim, "run", cfg, "--out", out, "--quiet", "--threads", "1"], out, [cfg]))
    return cases


def set_cases(kvsim, work, rng, count):
    cfg = os.path.join(work, "set_base.toml")
    with open(cfg, "w") as f:
        f.write(BASE_CONFIG)
    cases = []
    for i in range(count):
        sets = []
        for _ in range(rng.randint(1, 3)):
            sets += ["--set", f"{rng.choice(SET_KEYS)}={rng.choice(EXTREME)}"]
        out = os.path.join(work, f"set_{i:04d}_out")
        what = " ".join(sets[1::2])
        cases.append(("set", what, [kvsim, "run", cfg, "--out", out, "--quiet", "--threads", "1"] + sets, out, [cfg]))
    return cases


# ---------------------------------------------------------------- inputs: llama2.c checkpoints

def tiny_model(work):
    """A valid llama2.c v0 checkpoint (dim 8, 1 layer, 2 heads / 1 KV head, vocab 260, seq_len 32) and
    its tokenizer (byte-fallback pieces), deterministic."""
    dim, hidden, layers, heads, kv, vocab, seq = 8, 16, 1, 2, 1, 260, 32
    kv_dim, hs = dim * kv // heads, dim // heads
    floats = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * dim * kv_dim + layers * dim * dim +
              layers * dim + 3 * layers * dim * hidden + dim + seq * hs)
    r = random.Random(7)
    ckpt = os.path.join(work, "tiny.bin")
    with open(ckpt, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq))
        f.write(struct.pack(f"<{floats}f", *[r.uniform(-0.5, 0.5) for _ in range(floats)]))
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)] + [b" a"]
    tok = os.path.join(work, "tiny_tok.bin")
    with open(tok, "wb") as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for i, p in enumerate(pieces):
            f.write(struct.pack("<fi", -float(i), len(p)) + p)
    text = os.path.join(work, "tiny.txt")
    with open(text, "w") as f:
        f.write("a cat sat on a mat. " * 8)
    return ckpt, tok, text


def tiny_model_v2(work):
    """The tiny model's shape as a llama2.c version-2 (Q8_0, group size 8) checkpoint: 256-byte header,
    float32 norms, then int8 codes and float32 scales per tensor (per layer for wq..w3)."""
    dim, hidden, layers, heads, kv, vocab, seq, gs = 8, 16, 1, 2, 1, 260, 32, 8
    kv_dim = dim * kv // heads
    r = random.Random(8)
    head = struct.pack("<Ii7iBi", 0x616B3432, 2, dim, hidden, layers, heads, kv, vocab, seq, 1, gs)
    body = struct.pack(f"<{2 * layers * dim + dim}f", *[r.uniform(0.5, 1.5) for _ in range(2 * layers * dim + dim)])
    for n in [vocab * dim] + [dim * dim, kv_dim * dim, kv_dim * dim, dim * dim, hidden * dim, dim * hidden,
                              hidden * dim] * layers:
        body += bytes(r.randrange(256) for _ in range(n))
        body += struct.pack(f"<{n // gs}f", *[r.uniform(0.001, 0.01) for _ in range(n // gs)])
    path = os.path.join(work, "tiny_q80.bin")
    with open(path, "wb") as f:
        f.write(head.ljust(256, b"\0") + body)
    return path


def checkpoint_cases(kvsim, work, rng, count):
    ckpt, tok, text = tiny_model(work)
    ckpt2 = tiny_model_v2(work)
    cases = []
    for i in range(count):
        target = rng.choices([ckpt, ckpt2, tok], [0.35, 0.3, 0.35])[0]
        path = os.path.join(work, f"ckpt_{i:04d}_" + os.path.basename(target))
        data = bytearray(open(target, "rb").read())
        op = rng.randrange(5)
        if op == 0 and target == ckpt2:
            o = rng.choice([4, 8, 12, 16, 20, 24, 28, 32, 36, 37, 41, 100, 255])
            v = rng.choice([0, -1, 1, 2, 3, 5, 7, 64, 2 ** 31 - 1, -2 ** 31])
            data[o:o + 4] = struct.pack("<i", v)
            what = f"version-2 header int at {o} = {v}"
        elif op == 0 and target == ckpt:
            field = rng.randrange(7)
            v = rng.choice([0, -1, 1, 3, 2 ** 31 - 1, -2 ** 31, 65536, 1 << 20])
            data[4 * field:4 * field + 4] = struct.pack("<i", v)
            what = f"header field {field} = {v}"
        elif op == 0:
            v = rng.choice([0, -1, 2 ** 31 - 1, 5000, 1])
            o = rng.choice([0, 4 + 4 * rng.randrange(8), 8 + 4 * rng.randrange(8)])
            data[o:o + 4] = struct.pack("<i", v)
            what = f"tokenizer int at {o} = {v}"
        elif op == 1:
            cut = rng.randrange(len(data))
            data = data[:cut]
            what = f"cut at {cut}"
        elif op == 2:
            data += b"\x01" * rng.randrange(1, 64)
            what = "bytes appended"
        elif op == 3 and target != tok:
            o = 28 + 4 * rng.randrange((len(data) - 28) // 4)
            data[o:o + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), 3e38, -3e38]))
            what = f"weight at {o} non-finite/huge"
        else:
            offs = [rng.randrange(len(data)) for _ in range(rng.randint(1, 6))]
            for o in offs:
                data[o] = rng.randrange(256)
            what = f"bytes at {offs}"
        with open(path, "wb") as f:
            f.write(data)
        c, t = (ckpt, path) if target == tok else (path, tok)
        out_dir = os.path.join(work, f"ckpt_{i:04d}_out")
        os.makedirs(out_dir, exist_ok=True)
        mode = ["--text", text, "--tokens", "16"] if rng.random() < 0.7 else ["--generate", "8"]
        argv = [kvsim, "record", "--checkpoint", c, "--tokenizer", t, *mode, "--out", os.path.join(out_dir, "r.h5")]
        cases.append(("checkpoint", f"{os.path.basename(target)}: {what}", argv, out_dir, [path]))
    return cases



