"""Checkpoints kvsim can run (llama2.c files and GGUF files of the llama architecture), their
tokenizers, and GGUF tensors dequantized by kvsim's own reader (include/kvsim/model/gguf.hpp).

    from kvsim.model import Model
    m = Model("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = m.encode("Once upon a time")      # list[int], the file's own tokenizer
    logits = m.logits(ids)                  # float32 [len(ids), vocab], teacher-forced

Errors (a bad file, an unknown tensor type, ...) raise kvsim.Error with the CLI's one-line message.
"""
import numpy as np

from . import _kvsim


class Model:
    """A checkpoint and its tokenizer. `checkpoint`: a llama2.c .bin (then `tokenizer` is its
    tokenizer.bin) or a GGUF file (which carries its tokenizer; leave `tokenizer` empty)."""

    def __init__(self, checkpoint, tokenizer=""):
        self._m = _kvsim._Model(str(checkpoint), str(tokenizer))
        self.checkpoint = str(checkpoint)

    @property
    def config(self):
        """dict: format, architecture, n_layers, dim, hidden_dim, n_heads, n_kv_heads, head_dim,
        vocab_size, seq_len, rope_theta, rms_eps, rope_halves, shared_classifier, sha256, tensor_types."""
        return self._m.config()

    def encode(self, text, bos=False):
        """Token ids of `text` (str) without special tokens, or with BOS first when `bos`."""
        return self._m.encode(text, bos)

    def encode_document(self, text):
        """Token ids of `text` as kvsim record streams a document (BOS first when the tokenizer adds one)."""
        return self._m.encode_document(text)

    def decode(self, ids):
        """The text of `ids` (str; invalid UTF-8 from partial tokens replaced)."""
        return self._m.decode(list(ids)).decode("utf-8", errors="replace")

    @property
    def bos_id(self):
        return self._m.bos_id()

    @property
    def eos_id(self):
        return self._m.eos_id()

    @property
    def tokenizer_kind(self):
        """"sentencepiece", "llama2.c bytes" or "byte-level BPE (pre-tokenizer NAME)"."""
        return self._m.tokenizer_kind()

    def logits(self, tokens):
        """Teacher-forced logits, float32 [len(tokens), vocab]: row t predicts token t + 1 from
        tokens[0..t] (positions from 0, the exact KV cache, kvsim's one-token forward pass)."""
        return self._m.logits(list(int(t) for t in tokens))

    def prefill_logits(self, tokens, last=None, threads=0):
        """The last `last` rows (default all) of the teacher-forced logits, float32 [last, vocab], by the
        batched prefill `kvsim record` runs (GEMMs over all positions; `threads` 0 = every core): at long
        contexts only the rows kept are held (all 32,768 rows of Gemma 3's 262,144-token vocabulary
        would be 34 GB). Raises kvsim.Error when `last` is outside [1, len(tokens)]."""
        import os
        ids = list(int(t) for t in tokens)
        return self._m.prefill_logits(ids, len(ids) if last is None else int(last), int(threads) or (os.cpu_count() or 1))


class Tokenizer:
    """The tokenizer a GGUF file carries (its `tokenizer.ggml.*` metadata; the file need not hold a
    model). encode(text, bos=False) -> list[int]; kind -> str."""

    def __init__(self, gguf_path):
        self._t = _kvsim._Tokenizer(str(gguf_path))

    def encode(self, text, bos=False):
        return self._t.encode(text, bos)

    @property
    def kind(self):
        return self._t.kind()


def gguf_tensors(path):
    """[(name, ne, type_name, type_id)] of a GGUF file (ne[0] is the contiguous dimension)."""
    return _kvsim._gguf_tensors(str(path))


def gguf_tensor(path, name):
    """One tensor of a GGUF file dequantized by kvsim, float32, numpy shape ne reversed (as the
    `gguf` package's GGUFReader reports it), in the file's row order (no Q/K un-permutation)."""
    return _kvsim._gguf_tensor(str(path), name)


def dequantize(type_id, data, n):
    """Dequantize `n` values of GGML type `type_id` (int, ggml.h numbering) from `data` (bytes)."""
    return _kvsim._gguf_dequantize(int(type_id), bytes(data), int(n))
