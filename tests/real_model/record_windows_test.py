#!/usr/bin/env python3
"""`kvsim record --windows` cuts a text into fresh sequences as each model is fed them.

  record_windows_test.py KVSIM MODELS_DIR DATA_DIR

Gemma 3's GGUF says `tokenizer.ggml.add_bos_token = true`: inference opens every sequence with <bos>,
and the model puts much of its attention there (an attention sink). So each window must be <bos>
followed by the next n − 1 tokens of the text's stream, including windows cut from the middle of the
stream and from a held-out tail (`--text-tail`), which start without one. SmolLM2's GGUF says false:
its windows are plain consecutive cuts of n stream tokens (the negative control: the rule follows the
file's metadata, not the model size or the text). The stream is `encode_document` of the text (kvsim's
Python binding), its tail cut as `text_tokens` documents; the check is the window structure and the
`text_token_offset` attribute, not the tokenizer (gemma3_test.py checks that against SentencePiece).
Exit 0 passed, 1 failed, 77 SKIPPED (a model file or h5py absent).
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
N, W, TAIL = 16, 2, 0.05
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def main():
    kvsim_bin, models, data = sys.argv[1:4]
    try:
        import h5py
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return SKIP
    from kvsim.model import Model  # the build's own binding: a failure here is a failure
    tmp_text = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
    with open(os.path.join(data, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        tmp_text.write(f.read(20000))  # 20 kB: a tail of 5% still holds the windows
    tmp_text.close()
    text = tmp_text.name
    cases = {"gemma3": ("gemma-3-270m-q4_k_m.gguf", True), "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", False)}
    for name, (gguf, bos_first) in cases.items():
        path = os.path.join(models, gguf)
        if not os.path.exists(path):
            print(f"SKIPPED: {path} is absent (bash scripts/setup.sh fetches it)")
            return SKIP
        m = Model(path)
        stream = m.encode_document(open(text, encoding="utf-8").read())
        tail = stream[-int(len(stream) * TAIL):]
        bos = m.bos_id
        if bos_first:
            check(stream[0] == bos and tail[0] != bos, f"{name}: the stream opens with BOS {bos}; its tail does not")
        for args, src, label in (([], stream, "from the start"), (["--text-tail", str(TAIL)], tail, "from the tail")):
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "w.h5")
                subprocess.run([kvsim_bin, "record", "--checkpoint", path, "--text", text, "--tokens", str(N),
                                "--windows", str(W), "--no-attn", "--out", out] + args, check=True,
                               stdout=subprocess.DEVNULL)
                if bos_first and src[0] == bos:  # the stream's own leading BOS is not a text token
                    src = src[1:]
                per = N - 1 if bos_first else N
                for w in range(W):
                    with h5py.File(os.path.join(tmp, f"w_w{w:02d}.h5"), "r") as f:
                        got = [int(t) for t in f["tokens"][:]]
                        offset = int(f.attrs["text_token_offset"])
                    want = ([bos] if bos_first else []) + [int(t) for t in src[w * per:(w + 1) * per]]
                    check(got == want and offset == w * per,
                          f"{name} {label}, window {w}: {'<bos> + ' if bos_first else ''}{per} stream tokens at "
                          f"offset {w * per} (got offset {offset}, BOS first: {got[0] == bos})")
    os.unlink(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
