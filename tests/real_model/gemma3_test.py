#!/usr/bin/env python3
"""Gemma 3 270M (GGUF, Q4_K_M) in kvsim against transformers loading the same file.

  gemma3_test.py KVSIM MODELS_DIR DATA_DIR

transformers (`from_pretrained(MODELS_DIR, gguf_file=...)`, float32, CPU) dequantizes the file with the
`gguf` package and builds its own Gemma3ForCausalLM (embedding scale, (1 + w) RMSNorms, per-head q/k
norms, GeGLU, two RoPE bases, sliding-window layers), so it is an implementation written by others of
the same weights. Both read the same token ids (kvsim's; see below). Checked:
  1. logits over 256 tokens of TinyStories (BOS first): max |Δ| / max |logit| ≤ 1e-3, and the NLL.
  2. the post-RoPE queries, keys and values of all 18 layers that `kvsim record` writes equal
     transformers' (captured inside its attention, after the q/k norms) to max |Δ| / max |x| ≤ 1e-4;
     the recording names each layer's window (512 on local layers, 0 on the global layers 5, 11, 17).
  3. the sliding window: over 640 tokens (past the 512-token window) the last 128 positions' logits
     agree ≤ 1e-3; negative control: transformers with every layer global disagrees with kvsim there.
  4. token ids against Google's SentencePiece library (`sentencepiece`), given a model rebuilt from the
     file's pieces, scores and types (BPE, byte fallback, no dummy prefix, whitespace escaped), on
     > 50,000 characters of mixed text with runs of spaces collapsed: identical; negative control: the
     same pieces with their scores negated disagree. Runs of spaces are the one known divergence: kvsim
     uses the file's user-defined whitespace pieces ("  ", "   ", …; a run of k spaces before a word
     becomes the piece of k − 1 spaces and "▁word"), where this rebuilt SentencePiece model splits the
     run into "▁" pieces; checked as such (whitespace pieces used, the text decodes back).
  5. the one-token path (`--prefill per-token`) against the batched prefill over 600 tokens (past the
     window): q, k, v of all 18 layers within 1e-4.
  6. the replay's window reference on a local layer against the model's attention output.
  7. `kvsim record --layers global`: layers 5, 11, 17 alone, bit-equal to the full recording's, and
     replayed to the same metrics.
transformers is not the reference for token ids: its GGUF loader (5.x) builds this file's vocabulary
into a tokenizer that ignores the merge scores ("Once upon" → "On", "ce", "▁up", "on"; the model then
predicts garbage).
Exit 0 passed, 1 failed, 77 SKIPPED (torch/transformers/gguf or the model file absent).
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_checks import hf_setup, logits_with_qkv, rel  # noqa: E402

GGUF = "gemma-3-270m-q4_k_m.gguf"
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)



def check_logits(m, hf, ids, np, torch, transformers):
    # 1. Logits over 256 tokens, with q, k, v captured inside transformers' attention.
    L_hf, captured = logits_with_qkv(hf, ids, torch, transformers)
    L_kv = m.logits(ids)
    dev = rel(np, L_kv, L_hf)
    check(dev <= 1e-3, f"logits over {len(ids)} tokens: max relative deviation {dev:.2e} <= 1e-3")
    n = len(ids) - 1
    nll_kv = float(np.mean([np.logaddexp.reduce(L_kv[t].astype(np.float64)) - L_kv[t, ids[t + 1]] for t in range(n)]))
    nll_hf = float(np.mean([np.logaddexp.reduce(L_hf[t].astype(np.float64)) - L_hf[t, ids[t + 1]] for t in range(n)]))
    check(abs(nll_kv - nll_hf) <= 1e-3, f"NLL kvsim {nll_kv:.5f} vs transformers {nll_hf:.5f} nats/token")
    return captured


def check_recording(kvsim_bin, path, story, ids, captured, np, kvsim):
    # 2. Recorded q, k, v against transformers' post-RoPE tensors; the per-layer windows.
    with tempfile.TemporaryDirectory() as tmp:
        tpath = os.path.join(tmp, "story.txt")
        with open(tpath, "w", encoding="utf-8") as f:
            f.write(story)
        rec_path = os.path.join(tmp, "gemma3.h5")
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", tpath, "--tokens", str(len(ids)),
                            "--out", rec_path], capture_output=True, text=True)
        check(r.returncode == 0, "kvsim record --checkpoint gemma3.gguf: " + (r.stdout + r.stderr).strip()[-200:])
        if r.returncode != 0:
            return
        rec = kvsim.Recording(rec_path)
        check(list(rec.tokens()) == ids, "the recording's tokens are the ids transformers read")
        worst = {"q": 0.0, "k": 0.0, "v": 0.0}
        for layer in range(18):
            q_hf, k_hf, v_hf = captured[layer]
            for h in range(4):
                worst["q"] = max(worst["q"], rel(np, rec.q(layer, h), q_hf[h]))
            worst["k"] = max(worst["k"], rel(np, rec.k(layer, 0), k_hf[0]))
            worst["v"] = max(worst["v"], rel(np, rec.v(layer, 0), v_hf[0]))
        for t in "qkv":
            check(worst[t] <= 1e-4, f"post-RoPE {t} of 18 layers: max relative deviation {worst[t]:.2e} <= 1e-4")
        windows = list(rec.meta.get("layer_windows", []))
        check(windows == [0 if (l + 1) % 6 == 0 else 512 for l in range(18)],
              f"the recording's layer_windows: {windows}")


def check_window(m, hf, ids, np, torch):
    # 3. Past the 512-token window: the last 128 positions of 640.
    with torch.no_grad():
        L_hf = hf(torch.tensor([ids]), logits_to_keep=128).logits[0].numpy()
    L_kv = m.logits(ids)[-128:]
    dev = rel(np, L_kv, L_hf)
    check(dev <= 1e-3, f"640 tokens, logits of the last 128 (local layers windowed): max relative deviation {dev:.2e} <= 1e-3")
    saved = list(hf.config.layer_types)
    hf.config.layer_types = ["full_attention"] * len(saved)
    for layer in hf.model.layers:
        layer.attention_type = "full_attention"
        layer.self_attn.sliding_window = None
    try:
        with torch.no_grad():
            L_full = hf(torch.tensor([ids]), logits_to_keep=128).logits[0].numpy()
    finally:
        hf.config.layer_types = saved
    off = rel(np, L_kv, L_full)
    check(off > 1e-2, f"negative control: transformers with every layer global is {off:.2e} off (> 1e-2)")


def check_paths(kvsim_bin, path, story, np, kvsim):
    # 5. The one-token path (kvsim record --prefill per-token) against the batched prefill, past the window.
    with tempfile.TemporaryDirectory() as tmp:
        tpath = os.path.join(tmp, "story.txt")
        with open(tpath, "w", encoding="utf-8") as f:
            f.write(story)
        recs = {}
        for mode in ("batched", "per-token"):
            out = os.path.join(tmp, mode + ".h5")
            r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", tpath, "--tokens", "600",
                                "--prefill", mode, "--out", out], capture_output=True, text=True)
            check(r.returncode == 0, f"kvsim record --prefill {mode} --tokens 600: " + (r.stdout + r.stderr).strip()[-120:])
            if r.returncode != 0:
                return
            recs[mode] = kvsim.Recording(out)
        a, b = recs["batched"], recs["per-token"]
        check_local_reference(a, np)
        worst = max(rel(np, getattr(b, t)(l, h), getattr(a, t)(l, h)) for l in range(18) for t, heads in
                    (("q", 4), ("k", 1), ("v", 1)) for h in range(heads))
        check(worst <= 1e-4, f"600 tokens: the one-token path's q/k/v equal the prefill's to {worst:.2e} <= 1e-4")
        check_layer_subset(kvsim_bin, path, tpath, tmp, os.path.join(tmp, "batched.h5"), np)


def check_layer_subset(kvsim_bin, path, tpath, tmp, full_path, np):
    # 7. `kvsim record --layers global`: the global layers alone, renumbered, bit-equal to the full
    # recording's layers 5, 11, 17; replayed, the same metrics as the full recording's global layers
    # (which kvsim run picks by default), with model_layers naming them: policies see the model's layer
    # index and count (seeds, PyramidKV's kvpress schedule). Negative control: slot 0 is not the model's
    # layer 0; h2o and snapkv differ (the comparison can fail).
    import h5py
    out = os.path.join(tmp, "global.h5")
    r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", tpath, "--tokens", "600", "--layers", "global",
                        "--out", out], capture_output=True, text=True)
    check(r.returncode == 0, "kvsim record --layers global: " + (r.stdout + r.stderr).strip()[-120:])
    if r.returncode != 0:
        return
    with h5py.File(full_path, "r") as a, h5py.File(out, "r") as b:
        sub = [int(x) for x in b.attrs["subset_layers"]]
        check(sub == [5, 11, 17] and int(b.attrs["n_layers"]) == 3 and "layer_windows" not in b.attrs,
              f"--layers global: subset_layers {sub}, n_layers {int(b.attrs['n_layers'])}, no layer_windows")
        same = all(np.array_equal(a[f"layer_{l:03d}/{t}"][()], b[f"layer_{i:03d}/{t}"][()])
                   for i, l in enumerate(sub) for t in "qkv")
        check(same, "--layers global: q, k, v equal the full recording's layers 5, 11, 17 to the bit")
        check(not np.array_equal(a["layer_000/k"][()], b["layer_000/k"][()]), "negative control: slot 0 is not layer 0")
    cfg = os.path.join(tmp, "subset.toml")
    with open(cfg, "w") as f:
        f.write('name = "subset"\nseed = 1\n[data]\nprefill = 300\n[eval]\nevery = 40\n[[policy]]\nname = "h2o"\nmemory = 0.2\n'
                '[[policy]]\nname = "snapkv"\nmemory = 0.2\n[[policy]]\nname = "uniform"\nmemory = 0.2\n'
                '[[policy]]\nname = "pyramidkv"\nmemory = 0.2\nbudgets = "kvpress"\n')
    res = {}
    for tag, rec in (("full", full_path), ("global", out)):
        r = subprocess.run([kvsim_bin, "run", cfg, "--set", f'data.path="{rec}"', "--out", os.path.join(tmp, "run_" + tag),
                            "--threads", "2"], capture_output=True, text=True)
        check(r.returncode == 0, f"kvsim run on the {tag} recording: " + (r.stdout + r.stderr).strip()[-120:])
        if r.returncode != 0:
            return
        res[tag] = h5py.File(os.path.join(tmp, "run_" + tag, "results.h5"), "r")
    a, b = res["full"], res["global"]
    check([int(x) for x in a.attrs["layers"]] == [5, 11, 17] and [int(x) for x in b.attrs["model_layers"]] == [5, 11, 17],
          f"replayed layers: full {[int(x) for x in a.attrs['layers']]}, subset's model_layers "
          f"{[int(x) for x in b.attrs.get('model_layers', [])]}")
    groups = [g for g in a if g.startswith("policy_")]
    differ = [f"{g}/{d}" for g in groups for d in a[g] if d not in ("layer", "policy_ns")
              and not np.array_equal(a[g][d][()], b[g][d][()], equal_nan=True)]
    check(len(groups) == 4 and not differ, f"replay of the subset equals the full recording's global layers, seeded "
          f"(uniform) and layer-count-dependent (pyramidkv's kvpress budgets) policies included ({differ[:3]})")
    check(not np.array_equal(a[groups[0]]["rel_err"][()], a[groups[1]]["rel_err"][()], equal_nan=True),
          "negative control: h2o's and snapkv's rel_err differ")


def check_local_reference(rec, np):
    # 6. The replay's exact reference on a local layer (data.local_layers = "replay"): window attention
    # over the last 512 keys, as kvsim's reference pass computes it (_exact_causal), against the model's
    # own attention output the recorder wrote (its forward matches transformers, checks 1-4). Negative
    # control: the same pass over every key is off once the stream outgrows the window.
    from kvsim import _kvsim
    m = rec.meta
    windows = list(m.get("layer_windows", []))
    local = [l for l, w in enumerate(windows) if 0 < w < m["n_tokens"]]
    check(bool(local), f"the recording names local layers (layer_windows {windows})")
    if not local:
        return
    layer, w = local[0], windows[local[0]]
    q = np.stack([rec.q(layer, h) for h in range(m["n_heads"])])
    k = np.stack([rec.k(layer, h) for h in range(m["n_kv_heads"])])
    v = np.stack([rec.v(layer, h) for h in range(m["n_kv_heads"])])
    attn = np.stack([rec.attn(layer, h) for h in range(m["n_heads"])])
    z_win = _kvsim._exact_causal(q, k, v, m["softmax_scale"], 1, window=w)[0]
    z_all = _kvsim._exact_causal(q, k, v, m["softmax_scale"], 1)[0]
    late = slice(w + 8, None)  # steps past the window
    err = float(np.max(np.linalg.norm(z_win - attn, axis=-1) / np.linalg.norm(attn, axis=-1)))
    off = float(np.max(np.linalg.norm(z_all[:, late] - attn[:, late], axis=-1) / np.linalg.norm(attn[:, late], axis=-1)))
    check(err <= 1e-4, f"layer {layer} (window {w}): the replay's window reference equals the model's attention to {err:.2e} <= 1e-4")
    check(off > 1e-3, f"layer {layer}: attention over every key differs past the window ({off:.2e} > 1e-3)")


def sentencepiece_from_gguf(path, negate=False):
    """A SentencePiece BPE processor over the GGUF file's own pieces, scores and token types."""
    import sentencepiece as spm
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as pb
    f = GGUFReader(path).fields
    pieces = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    m = pb.ModelProto()
    for piece, score, kind in zip(pieces, scores, types):  # GGUF token types are SentencePiece's piece types
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, -score if negate else score, kind
    t = m.trainer_spec
    t.model_type, t.vocab_size, t.byte_fallback = pb.TrainerSpec.BPE, len(pieces), True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = [int(f["tokenizer.ggml." + k].parts[-1][0]) for k in
                                              ("unknown_token_id", "bos_token_id", "eos_token_id", "padding_token_id")]
    t.allow_whitespace_only_pieces = True
    n = m.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", False, False, True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp, pieces


def check_tokens(m, path, text):
    # 4. Token ids against SentencePiece.
    import re
    prose = re.sub(" {2,}", " ", text)
    sp, pieces = sentencepiece_from_gguf(path)
    ours, ref = m.encode(prose), sp.encode(prose)
    first = next((i for i in range(min(len(ours), len(ref))) if ours[i] != ref[i]), min(len(ours), len(ref)))
    check(len(prose) > 50000 and ours == ref,
          f"token ids on {len(prose):,} characters (runs of spaces collapsed): kvsim {len(ours):,} vs SentencePiece "
          f"{len(ref):,}, first difference at {first}")
    bad, _ = sentencepiece_from_gguf(path, negate=True)
    neg = bad.encode(prose)
    differ = sum(a != b for a, b in zip(ours, neg)) + abs(len(ours) - len(neg))
    check(differ > len(ours) // 10, f"negative control: scores negated, {differ:,} ids differ")
    spaces = {i for i, p in enumerate(pieces) if len(p) >= 2 and p.strip(" ") == ""}
    ok = True
    for k in range(3, 8):
        s = "x" + " " * k + "y"
        ids = m.encode(s)
        ok = ok and any(i in spaces for i in ids) and m.decode(ids) == s
    check(ok, f"runs of 3-7 spaces use the file's whitespace pieces ({len(spaces)} of them) and decode back")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    kvsim_bin, models, data_dir = sys.argv[1:4]
    path = os.path.join(models, GGUF)
    mods = hf_setup(path, ("sentencepiece",))  # sentencepiece: the token-id reference
    if mods is None:
        return SKIP
    np, torch, transformers = mods
    from transformers import AutoModelForCausalLM
    import kvsim
    from kvsim.model import Model

    hf = AutoModelForCausalLM.from_pretrained(models, gguf_file=GGUF, dtype=torch.float32)
    hf.eval()
    m = Model(path)
    from smollm2_test import mixed_text  # the same > 50,000 characters of mixed text
    check_tokens(m, path, mixed_text(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), data_dir))
    with open(os.path.join(data_dir, "tinystories-sample", "tinystories.txt"), encoding="utf-8") as f:
        story = f.read()[20000:40000]
    doc = [m.bos_id] + m.encode(story)
    ids = doc[:256]
    captured = check_logits(m, hf, ids, np, torch, transformers)
    check_recording(kvsim_bin, path, story, ids, captured, np, kvsim)
    check_window(m, hf, doc[:640], np, torch)
    check_paths(kvsim_bin, path, story, np, kvsim)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
