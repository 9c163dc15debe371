#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (GGUF, Q4_1) in kvsim against transformers loading the same file.

  smollm2_test.py KVSIM MODELS_DIR DATA_DIR

transformers (`from_pretrained(MODELS_DIR, gguf_file=...)`, float32, CPU) dequantizes the file with the
`gguf` package and undoes the converter's Q/K permutation itself, so it is an implementation written
by others of the same weights. Checked:
  1. token ids: kvsim's tokenizer (from the file's metadata) equals transformers' tokenizer built from
     the same file on > 50,000 characters of mixed text (TinyStories, Tiny Shakespeare, C++ and Python
     source of this repository, non-ASCII prose); negative control: a copy of the tokenizer whose merge
     list is reversed (same vocabulary) must disagree with transformers on the same text.
  2. logits over 256 tokens of TinyStories: max |Δ| / max |logit| ≤ 1e-3.
  3. the post-RoPE queries, keys and values of every layer and head that `kvsim record` writes equal
     transformers' (captured inside its attention) to max |Δ| / max |x| ≤ 1e-4, in transformers' channel
     order; negative control: the same queries in GGUF's interleaved order are far off.
  4. greedy generation of 64 tokens after a prompt is identical.
Exit 0 passed, 1 failed, 77 SKIPPED (torch/transformers/gguf or the model file absent).
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_checks import hf_setup, logits_with_qkv  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def mixed_text(root, data_dir):
    parts = []
    with open(os.path.join(data_dir, "tinystories-sample", "tinystories.txt"), encoding="utf-8") as f:
        parts.append(f.read()[:15000])
    with open(os.path.join(data_dir, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        parts.append(f.read()[:12000])
    for rel in ("sim/model/gguf.cpp", "sim/model/tokenizer.cpp", "scripts/fetch_models.py", "tests/house/docs_test.py"):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            parts.append(f.read()[:8000])
    parts.append(
        "Naïve café owners in Zürich sold crème brûlée for 12,50 € — 東京では午後3時に雨が降りました。"
        " Москва и Київ; Ελληνικά γράμματα αβγ; عربى; हिन्दी; 한국어 문장; emoji 🙂🚀👍🏽 and math ∑ ≤ ∞ ≈ π.\n"
        "\tTabs,  double  spaces,\r\nCRLF lines, 1234567890 digits, 3.14159, 1e-6, 0x1F, $100, 50%.\n" * 20)
    return "\n\n".join(parts)


def tokenizer_gguf(gguf, path, tokens, merges, pre):
    """A GGUF holding only a byte-level BPE tokenizer (no tensors)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_pretokenizers(text, tokens, merges, gguf, Tokenizer):
    """kvsim's "gpt2" and "llama-bpe" pre-tokenizers (llama.cpp's expressions run by PCRE2) against
    Hugging Face `tokenizers` configured as GPT-2's and Meta Llama 3's tokenizer.json configure them,
    over SmolLM2's vocabulary and merges."""
    from tokenizers import Regex, Tokenizer as HFTokenizer, models, pre_tokenizers
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    for pre, hf_pre in (("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
                        ("llama-bpe", pre_tokenizers.Sequence([
                            pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))):
        hf = HFTokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        hf.pre_tokenizer = hf_pre
        theirs = hf.encode(text, add_special_tokens=False).ids
        with tempfile.TemporaryDirectory() as tmp:
            ours = Tokenizer(tokenizer_gguf(gguf, os.path.join(tmp, pre + ".gguf"), tokens, merges, pre)).encode(text)
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        check(ours == theirs, f"pre-tokenizer {pre}: ids equal Hugging Face tokenizers' ({len(ours)} tokens; "
              f"first difference at {first})")


def check_tokens(m, tok, path, text, gguf, Tokenizer):
    # 1. Tokens on mixed text, with a negative control (reversed merge priorities).
    ours = m.encode(text)
    theirs = tok.encode(text, add_special_tokens=False)
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    check(len(text) >= 50000 and ours == theirs,
          f"token ids equal transformers' on {len(text)} characters ({len(ours)} tokens; first difference at {first})")
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    field = reader.fields["tokenizer.ggml.merges"]
    merges = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    with tempfile.TemporaryDirectory() as tmp:
        control = Tokenizer(tokenizer_gguf(gguf, os.path.join(tmp, "reversed.gguf"), tokens, merges[::-1], "smollm")).encode(text)
        plain = Tokenizer(path).encode(text)
    check(plain == ours, "kvsim.model.Tokenizer of the file equals the model's tokenizer")
    check_pretokenizers(text, tokens, merges, gguf, Tokenizer)
    check(control != theirs, "negative control: reversed merge priorities disagree with transformers "
          f"({sum(a != b for a, b in zip(control, theirs))} of {len(theirs)} positions differ or lengths "
          f"{len(control)} vs {len(theirs)})")



def check_logits(m, tok, hf, story, np, torch, transformers):
    # 2. Logits over 256 tokens of TinyStories.
    ids = m.encode(story)[:256]
    check(len(ids) == 256 and ids == tok.encode(story, add_special_tokens=False)[:256], "256 held-out tokens, same ids")
    L_hf, captured = logits_with_qkv(hf, ids, torch, transformers)
    L_kv = m.logits(ids)
    dev = float(np.abs(L_kv - L_hf).max() / np.abs(L_hf).max())
    check(dev <= 1e-3, f"logits over 256 tokens: max relative deviation {dev:.2e} <= 1e-3")
    nll_kv = float(np.mean([np.logaddexp.reduce(L_kv[t].astype(np.float64)) - L_kv[t, ids[t + 1]] for t in range(255)]))
    nll_hf = float(np.mean([np.logaddexp.reduce(L_hf[t].astype(np.float64)) - L_hf[t, ids[t + 1]] for t in range(255)]))
    check(abs(nll_kv - nll_hf) <= 1e-3, f"held-out NLL kvsim {nll_kv:.5f} vs transformers {nll_hf:.5f} nats/token")

    return ids, captured


def check_recording(kvsim_bin, path, story, ids, captured, np, kvsim):
    # 3. Recorded q, k, v against transformers' post-RoPE tensors.
    with tempfile.TemporaryDirectory() as tmp:
        tpath = os.path.join(tmp, "ids.txt")
        with open(tpath, "w", encoding="utf-8") as f:
            f.write(story)
        rec_path = os.path.join(tmp, "smollm2.h5")
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", tpath, "--tokens", "256", "--out", rec_path],
                           capture_output=True, text=True)
        check(r.returncode == 0, "kvsim record --checkpoint SmolLM2.gguf --tokens 256: " + (r.stdout + r.stderr).strip()[-200:])
        if r.returncode != 0:
            return 1
        rec = kvsim.Recording(rec_path)
        check(list(rec.tokens()) == ids, "the recording's tokens are the 256 ids")
        worst = {"q": 0.0, "k": 0.0, "v": 0.0}
        for layer in range(30):
            q_hf, k_hf, v_hf = captured[layer]
            for h in range(9):
                a = rec.q(layer, h)
                worst["q"] = max(worst["q"], float(np.abs(a - q_hf[h]).max() / np.abs(q_hf[h]).max()))
            for h in range(3):
                worst["k"] = max(worst["k"], float(np.abs(rec.k(layer, h) - k_hf[h]).max() / np.abs(k_hf[h]).max()))
                worst["v"] = max(worst["v"], float(np.abs(rec.v(layer, h) - v_hf[h]).max() / np.abs(v_hf[h]).max()))
        for t in "qkv":
            check(worst[t] <= 1e-4, f"post-RoPE {t} of 30 layers: max relative deviation {worst[t]:.2e} <= 1e-4")
        perm = [i for k in range(32) for i in (k, k + 32)]  # halves order -> GGUF's interleaved order
        q_hf = captured[3][0][0]
        bad = float(np.abs(rec.q(3, 0)[:, perm] - q_hf).max() / np.abs(q_hf).max())
        check(bad > 1e-2, f"negative control: q in GGUF's interleaved channel order is {bad:.2f} off (> 1e-2)")



def check_generation(kvsim_bin, path, m, hf, torch, kvsim):
    with tempfile.TemporaryDirectory() as tmp:
        # 4. Greedy generation of 64 tokens.
        prompt = "Once upon a time, a little robot found a red ball in the park."
        p_ids = m.encode(prompt)
        gen_path = os.path.join(tmp, "gen.h5")
        r = subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--generate", str(len(p_ids) + 64), "--prompt", prompt,
                            "--out", gen_path], capture_output=True, text=True)
        check(r.returncode == 0, "kvsim record --generate: " + (r.stdout + r.stderr).strip()[-200:])
        ours = list(kvsim.Recording(gen_path).tokens())
        with torch.no_grad():
            out = hf.generate(torch.tensor([p_ids]), max_new_tokens=64, do_sample=False, eos_token_id=m.eos_id,
                              pad_token_id=m.eos_id)[0].tolist()
        check(len(ours) == len(p_ids) + 64 and ours == out[:len(ours)],
              f"greedy generation of 64 tokens identical ({m.decode(ours[len(p_ids):])[:60]!r}...)")



def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    kvsim_bin, models, data_dir = sys.argv[1:4]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(models, GGUF)
    mods = hf_setup(path, ("gguf",))
    if mods is None:
        return SKIP
    np, torch, transformers = mods
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import gguf
    import kvsim
    from kvsim.model import Model, Tokenizer

    tok = AutoTokenizer.from_pretrained(models, gguf_file=GGUF)
    hf = AutoModelForCausalLM.from_pretrained(models, gguf_file=GGUF, dtype=torch.float32)
    hf.eval()
    m = Model(path)
    check_tokens(m, tok, path, mixed_text(root, data_dir), gguf, Tokenizer)
    with open(os.path.join(data_dir, "tinystories-sample", "tinystories.txt"), encoding="utf-8") as f:
        story = f.read()[20000:40000]
    ids, captured = check_logits(m, tok, hf, story, np, torch, transformers)
    if check_recording(kvsim_bin, path, story, ids, captured, np, kvsim) is not None:
        return 1
    check_generation(kvsim_bin, path, m, hf, torch, kvsim)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
