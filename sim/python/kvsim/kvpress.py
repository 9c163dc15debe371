"""kvsim beside kvpress (NVIDIA's library of KV-cache presses, PyPI `kvpress`): the tokens a press keeps.

A kvpress press compresses a transformers model's KV cache at prefill, one attention layer at a time
(kvpress.presses.base_press.BasePress.forward_hook). This module runs a press on a prompt and reads
back, per layer and KV head, which prompt tokens the compressed cache still holds, so that kvsim's
policies of the same name can be compared token by token (tests/real_model/kvpress_conformance_test.py) and
docs/kvpress.md's parameter mapping checked.

  load_model(gguf_path)            a transformers causal LM (float32, CPU) from a GGUF file
  capture(press, model, ids)       PressCapture: the kept token positions per layer and KV head, and
                                   the press's scores where it has a `score` method (ScorerPress)
  near_ties(scores, kept, other)   the tokens two kept sets disagree on whose scores sit within float32
                                   rounding of the press's cut-off
  save(cap, path)                  a press file for kvsim's `press_replay` policy

From the command line (PYTHONPATH=build/python), a press file in one step:
  python -m kvsim.kvpress PRESS --model GGUF --text FILE --tokens P --out FILE [--ratio R] [--set KEY=VALUE]...
It exits 2 with one line naming the press, the model or the file when kvpress has no such press, the
press refuses its parameters or the model, or a file is missing (main() below).

How the kept positions are found: the prompt is run once without the press (the full cache) and once
with it; every key row left in the compressed cache is looked up, bit for bit, among the full cache's
rows of the same layer and KV head. During prefill kvpress computes each layer's attention with the
full cache and compresses afterwards, so the hidden states, and hence the keys, of both passes are
the same tensors. A press that changes keys (merging, re-rotation) has rows that match nothing: that
ends in a kvsim.Error naming the press, as does a model kvpress cannot apply the press to.
"""
from dataclasses import dataclass, field
import os
import weakref

from . import Error


def _imports():
    try:
        import numpy as np
        import torch
        import transformers
        import kvpress
    except ImportError as e:  # pragma: no cover - setup installs them (tests/cli/setup_check.py)
        raise Error(f"kvsim.kvpress needs torch, transformers and kvpress ({e}); run bash scripts/setup.sh") from e
    return np, torch, transformers, kvpress


def load_model(gguf_path):
    """A transformers causal LM and its tokenizer from a GGUF file (dequantized to float32 by
    transformers through the `gguf` package; CPU, eval mode). Returns (model, tokenizer). Raises
    kvsim.Error naming the file when it is missing or transformers cannot load it."""
    np, torch, transformers, _ = _imports()
    gguf_path = os.fspath(gguf_path)
    if not os.path.isfile(gguf_path):
        raise Error(f"{gguf_path}: no such GGUF file")
    folder, name = os.path.split(os.path.abspath(gguf_path))
    transformers.utils.logging.disable_progress_bar()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - any loader failure is a bad input here
        raise Error(f"{gguf_path}: transformers cannot load this GGUF ({type(e).__name__}: {e})") from e
    # Presses that load the tokenizer by the model's name (KVzip and KVgrad build their reconstruction prompt
    # with AutoTokenizer.from_pretrained(model.config.name_or_path)) find the GGUF's tokenizer in a folder of
    # its own, offline; the folder is removed at exit.
    import atexit
    import shutil
    import tempfile

    tok_dir = tempfile.mkdtemp(prefix="kvsim_tokenizer_")
    atexit.register(shutil.rmtree, tok_dir, ignore_errors=True)
    tok.save_pretrained(tok_dir)
    model.config.name_or_path = tok_dir
    return model.eval(), tok


@dataclass
class PressCapture:
    """What a press kept of an n-token prompt.

    kept[layer][kv_head]: int64 positions (0-based, ascending) still in the compressed cache.
    scores[layer]: float64 [n_kv_heads, n] (the press's own `score` output, higher = kept) for presses
      with a score method, else None.
    n: prompt tokens; press: the press's class name.
    """
    kept: list
    scores: list
    n: int
    press: str
    n_kv_heads: int = field(default=0)


_last_full = {}  # the uncompressed keys of the last (model, prompt): one entry, reused by the next capture


def _full_cache(model, ids, torch, transformers):
    """The uncompressed cache's keys per layer, [n_kv_heads, n, head_dim]. Several presses are usually
    captured on one prompt, so the last prompt's keys are kept and the forward pass is not repeated."""
    # The attention implementation is part of the key: eager and sdpa round differently, so keys of later
    # layers differ in their last bits (ObservedAttentionPress runs on eager attention).
    prompt = ids.numpy().tobytes() + str(getattr(model.config, "_attn_implementation", "")).encode()
    same_model = _last_full.get("model") is not None and _last_full["model"]() is model  # a weak reference
    if not (same_model and _last_full["prompt"] == prompt):
        cache = transformers.DynamicCache()
        with torch.no_grad():
            model(ids, past_key_values=cache, use_cache=True)
        keys = [cache.layers[l].keys[0].float().cpu().numpy() for l in range(len(cache.layers))]
        _last_full.update(model=weakref.ref(model), prompt=prompt, keys=keys)
    return _last_full["keys"]


def capture(press, model, input_ids):
    """Runs `press` (a kvpress press) on the prompt `input_ids` (1-D ints) through `model` and returns
    a PressCapture. Raises kvsim.Error naming the press when kvpress refuses the model or the prompt,
    or when the compressed cache holds keys that are not rows of the full cache (a press that merges
    or re-rotates keys: kvsim compares token selections only). A press that masks entries per head
    (AdaKV: masked_key_indices) keeps, per head, every token it does not mask."""
    np, torch, transformers, kvpress = _imports()
    name = type(press).__name__
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64)).reshape(1, -1)
    n = int(ids.shape[1])
    full = _full_cache(model, ids, torch, transformers)
    scores = {}
    # The scorer: the press itself, or the ScorerPress an AdaKV-style wrapper holds (press.press).
    scorer = press if hasattr(press, "score") else getattr(press, "press", None)
    if scorer is not None and hasattr(scorer, "score"):
        inner = scorer.score

        def recording_score(module, hidden_states, keys, values, attentions, kwargs):
            s = inner(module, hidden_states, keys, values, attentions, kwargs)
            scores[module.layer_idx] = s[0].detach().double().cpu().numpy()
            return s

        scorer.score = recording_score
    cache = transformers.DynamicCache()
    try:
        with torch.no_grad(), press(model):
            model(ids, past_key_values=cache, use_cache=True)
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - kvpress's refusals are assertions and ValueErrors
        raise Error(f"kvpress {name} cannot be applied to {type(model).__name__} on a {n}-token prompt "
                    f"({type(e).__name__}: {e})") from e
    finally:
        if scorer is not None and "score" in vars(scorer):
            del scorer.score
    kept = []
    for layer, keys_full in enumerate(full):
        masked = getattr(model.model.layers[layer].self_attn, "masked_key_indices", None)
        if masked is not None:
            # AdaKV-style presses keep the whole cache and mask entries per head, which kvpress's attention
            # patch gives zero weight while decoding: head h keeps every token it does not mask.
            heads_m, seq_m = (x.cpu().numpy() for x in masked[1:])
            per_head = []
            for h in range(keys_full.shape[0]):
                keep = np.ones(n, dtype=bool)
                keep[seq_m[heads_m == h]] = False
                per_head.append(np.flatnonzero(keep).astype(np.int64))
            kept.append(per_head)
            continue
        small = cache.layers[layer].keys[0].float().cpu().numpy()
        per_head = []
        for h in range(keys_full.shape[0]):
            where = {keys_full[h, j].tobytes(): j for j in range(n)}
            pos = []
            for row in small[h]:
                j = where.get(row.tobytes())
                if j is None:
                    raise Error(f"kvpress {name}: layer {layer} KV head {h} holds a key that is no row of the "
                                "uncompressed cache (the press merges or re-rotates keys; kvsim compares token "
                                "selections only)")
                pos.append(j)
            per_head.append(np.asarray(sorted(pos), dtype=np.int64))
        kept.append(per_head)
    return PressCapture(kept=kept, scores=[scores.get(l) for l in range(len(full))], n=n, press=name,
                        n_kv_heads=len(kept[0]) if kept else 0)


def near_ties(scores, kept, other, rel=1e-5):
    """Of the tokens on which two kept sets of one KV head differ (kept △ other), how many are near-ties:
    tokens the press ranked within `rel` (relative to the largest |score|) of its cut-off, where float32
    rounding of the same formula may rank them either way. A token the press kept but `other` did not is
    a near-tie when its score exceeds the best excluded token's by at most that much; a token `other`
    kept but the press did not, when it falls short of the lowest kept token's by at most that much.
    scores: [n] the press's scores for this head; kept: the press's set; other: the compared set.
    Returns (n_differing, n_near_ties)."""
    import numpy as np

    s = np.asarray(scores, dtype=np.float64)
    a = np.zeros(s.shape[0], dtype=bool)
    a[np.asarray(kept, dtype=np.int64)] = True
    b = np.zeros(s.shape[0], dtype=bool)
    b[np.asarray(other, dtype=np.int64)] = True
    only_a, only_b = np.flatnonzero(a & ~b), np.flatnonzero(b & ~a)
    if only_a.size + only_b.size == 0:
        return 0, 0
    tol = rel * max(float(np.abs(s[np.isfinite(s)]).max(initial=0.0)), 1e-300)
    lowest_kept = s[a].min() if a.any() else np.inf
    best_excluded = s[~a].max() if (~a).any() else -np.inf
    ties = int(np.sum(s[only_a] - best_excluded <= tol) + np.sum(lowest_kept - s[only_b] <= tol))
    return int(only_a.size + only_b.size), ties


def save(cap, path, **attrs):
    """Writes a PressCapture as a press file for kvsim's `press_replay` policy (HDF5: root attributes
    kvsim_press = 1, press, prompt = n, n_layers, n_kv_heads and `attrs`; /layer_LLL/kv_head_HH the kept
    positions), atomically: to PATH.tmp, then renamed. A config then replays it with
    `{"name": "press_replay", "file": path}` and `[data] prefill = n` on a recording of the same prompt."""
    import h5py
    import numpy as np

    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["kvsim_press"] = np.int64(1)
            f.attrs["press"] = cap.press
            f.attrs["prompt"] = np.int64(cap.n)
            f.attrs["n_layers"] = np.int64(len(cap.kept))
            f.attrs["n_kv_heads"] = np.int64(cap.n_kv_heads)
            for k, v in attrs.items():
                f.attrs[k] = v
            for layer, heads in enumerate(cap.kept):
                for h, kept in enumerate(heads):
                    f.create_dataset(f"layer_{layer:03d}/kv_head_{h:02d}", data=np.asarray(kept, dtype=np.int32))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _value(text):
    """A --set value: a Python literal (int, float, bool, None, string in quotes), else the text."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv=None):
    """`python -m kvsim.kvpress PRESS --model GGUF --text FILE --tokens P --out FILE [--ratio R]
    [--set KEY=VALUE]...`: runs kvpress's PRESS (a class of the kvpress package, built with
    compression_ratio = R and the --set keyword arguments) on the first P tokens of FILE as the GGUF's
    tokenizer encodes it (special tokens included, as datasets/export_hf.py records), and writes the kept
    positions as a press file for `press_replay` (save). Returns 0, or 2 after one line on stderr naming
    the press, the model or the file at fault (argparse's own usage errors exit 2 too)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m kvsim.kvpress",
                                 description="Run a kvpress press on a GGUF model and save the tokens it keeps "
                                             "for kvsim's press_replay policy.")
    ap.add_argument("press", help="a kvpress press class, e.g. SnapKVPress")
    ap.add_argument("--model", required=True, help="GGUF file (transformers loads it, float32, CPU)")
    ap.add_argument("--text", required=True, help="UTF-8 text; its first --tokens tokens are the prompt")
    ap.add_argument("--tokens", type=int, required=True, help="prompt length P")
    ap.add_argument("--out", required=True, help="the press file to write (HDF5)")
    ap.add_argument("--ratio", type=float, default=0.5, help="compression_ratio (default 0.5)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another press argument")
    a = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loading bar: the output stays one line
    try:
        _, _, _, kvpress = _imports()
        cls = getattr(kvpress, a.press, None)
        if not (isinstance(cls, type) and a.press.endswith("Press")):
            raise Error(f"kvpress has no press '{a.press}'")
        kwargs = {"compression_ratio": a.ratio}
        for kv in a.set:
            key, eq, val = kv.partition("=")
            if not eq or not key:
                raise Error(f"--set {kv!r}: expected KEY=VALUE")
            kwargs[key] = _value(val)
        try:
            press = cls(**kwargs)
        except Exception as e:  # noqa: BLE001 - a refused argument is bad input
            raise Error(f"kvpress {a.press}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): "
                        f"{type(e).__name__}: {e}") from e
        if a.tokens < 1:
            raise Error(f"--tokens {a.tokens}: must be at least 1")
        try:
            with open(a.text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise Error(f"{a.text}: cannot read the text ({type(e).__name__}: {e})") from e
        model, tok = load_model(a.model)
        ids = tok(text, return_tensors="pt").input_ids[0][: a.tokens]
        if len(ids) < a.tokens:
            raise Error(f"{a.text}: {len(ids)} tokens, fewer than --tokens {a.tokens}")
        cap = capture(press, model, ids.tolist())
        save(cap, a.out, ratio=a.ratio, model=os.path.basename(a.model))
    except Error as e:
        print(f"kvsim.kvpress: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    kept = sum(len(h) for layer in cap.kept for h in layer) / max(1, len(cap.kept) * cap.n_kv_heads)
    print(f"{a.press} (compression_ratio {a.ratio}) on {os.path.basename(a.model)}: {len(cap.kept)} layers x "
          f"{cap.n_kv_heads} KV heads keep {kept:.1f} of {cap.n} tokens on average -> {a.out}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
