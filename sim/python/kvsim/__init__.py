"""kvsim: KV-cache attention approximation, measured on recorded query/key/value tensors.

The C++ engine of the `kvsim` command, one import away (docs/python.md):

  kvsim.run(config)           replay an experiment (TOML path or dict) → kvsim.Results (DataFrames)
  kvsim.Recording(path)       a recording's q, k, v as numpy arrays
  kvsim.synth(...)            a seeded synthetic stream (in memory, or written as a recording)
  kvsim.policies(), metrics() the registries: names, parameters, defaults, units, paper sources
  kvsim.Policy, Answer, Param, register_policy, attend
                              write a policy in Python; the engine measures it with every metric
  kvsim.predict_accuracy(...) a new policy's task accuracy from its open loop alone (kvsim.tasks)
  kvsim.Error                 every bad input (the message the CLI prints)

Build: `bash scripts/setup.sh` puts this package in build/python (PYTHONPATH=build/python).
"""
import os

from . import _kvsim
from ._config import to_sets, to_toml
from ._policy import Answer, Param, Policy, attend, register_policy
from ._results import Results
from .tasks import predict_accuracy

Error = _kvsim.Error
Stream = _kvsim.Stream
__version__ = _kvsim._version()
git_commit = _kvsim._git_commit()

__all__ = ["run", "Results", "Recording", "synth", "kept_tokens", "policies", "metrics", "predict_accuracy", "Error", "Policy",
           "Answer", "Param", "register_policy", "attend", "Stream", "__version__"]


def run(config, *, threads=None, out=None, overrides=None):
    """Replays an experiment through exact attention and every policy, as `kvsim run` does.

    config: a TOML config path (relative data paths resolve against its folder), or a dict with the
      TOML's structure ({"name": ..., "data": {...}, "eval": {...}, "policy": [{...}, ...]};
      relative paths resolve against the working directory).
    threads: worker threads (None = all cores); results are identical at any count.
    out: None keeps the results in memory only; a folder also writes the CLI's files there.
    overrides: a dict {"eval.every": 4, "policy.budget": 0.1} or a list of "key=value" strings
      (the CLI's --set).
    Returns kvsim.Results. Raises kvsim.Error (bad config, missing file, bad data) with the message
    the CLI prints; nothing is written then.
    """
    sets = to_sets(overrides)
    if isinstance(config, (str, os.PathLike)):
        r = _kvsim._run(os.fspath(config), True, sets, int(threads or 0))
    elif isinstance(config, dict):
        r = _kvsim._run(to_toml(config), False, sets, int(threads or 0))
    else:
        raise TypeError("config must be a TOML path or a dict")
    res = Results(r)
    if out is not None:
        res.save(out)
    return res


class Recording:
    """A recording (the HDF5 schema of docs/recordings.md) or a synthetic stream, read one head at a time.

    meta: dict with model, source, rope, n_layers, n_heads, n_kv_heads, head_dim, n_tokens,
      softmax_scale. Arrays are float32 [n_tokens, head_dim] copies; query heads index q (and attn,
      the recorder's own attention output when present), KV heads index k and v (query head h uses
      KV head h // (n_heads // n_kv_heads)). Raises kvsim.Error naming the file, dataset or index.
    """

    def __init__(self, path):
        self._src = _kvsim._open_recording(os.fspath(path)) if not isinstance(path, _kvsim._Source) else path
        self.path = self._src.path or None
        self.meta = self._src.meta()

    def __repr__(self):
        return f"<kvsim.Recording {self._src.describe()}>"

    def q(self, layer, head):
        """Queries of query head `head`, [n_tokens, head_dim] float32 (unscaled)."""
        return self._src.read(layer, "q", head)

    def k(self, layer, kv_head):
        """Keys of KV head `kv_head` (post-rotary when meta["rope"] == "applied"), [n_tokens, head_dim]."""
        return self._src.read(layer, "k", kv_head)

    def v(self, layer, kv_head):
        """Values of KV head `kv_head`, [n_tokens, head_dim] float32."""
        return self._src.read(layer, "v", kv_head)

    def attn(self, layer, head):
        """The model's own attention output of query head `head` (recordings made with it only)."""
        return self._src.read(layer, "attn", head)

    def tokens(self):
        """Token ids, int32 [n_tokens] (empty for synthetic streams and files without /tokens)."""
        return self._src.tokens()


_SYNTH_PARAMS = ("softmax_scale", "q_scale", "k_scale", "v_scale", "cluster_c", "cluster_gamma", "cluster_diameter",
                 "center_scale", "query_norm", "n_heavy", "heavy_strength")


def synth(preset, n=1024, d=64, layers=1, heads=4, kv_heads=None, seed=1, path=None, **params):
    """A seeded synthetic stream (include/kvsim/io/synth.hpp): preset "gaussian", "clustered" (keys
    (m(n), δ₀)-clusterable, SubGen Definition 1) or "heavy_hitter" (H2O §3), with n tokens of head_dim
    d, `layers` layers, `heads` query heads and `kv_heads` KV heads (default = heads). params: the
    preset's parameters (cluster_c, cluster_gamma, cluster_diameter, center_scale, query_norm,
    n_heavy, heavy_strength, q_scale, k_scale, v_scale, softmax_scale), as in a config's [data].
    path=None: generated in memory on each read; a path: written there as a recording (atomically).
    Returns a kvsim.Recording. Raises kvsim.Error for a bad preset or parameter.
    """
    unknown = sorted(set(params) - set(_SYNTH_PARAMS))
    if unknown:
        raise Error(f"kvsim.synth: unknown parameter '{unknown[0]}' (known: {', '.join(_SYNTH_PARAMS)})")
    data = {"synthetic": preset, "n": n, "d": d, "n_layers": layers, "n_heads": heads,
            "n_kv_heads": heads if kv_heads is None else kv_heads, **params}
    text = to_toml({"seed": seed, "data": data, "policy": [{"name": "exact"}]})
    return Recording(_kvsim._synth(text, "" if path is None else os.fspath(path)))


def kept_tokens(config, *, layer=None, kv_head=None, step=0, policy=0, overrides=None):
    """The tokens the cache of one policy of `config` answers with at step `step` of cell (layer,
    kv_head), replayed exactly as kvsim.run does (the prompt of `[data] prefill = P` handed over at once,
    then one token per step): for comparing kvsim's policies token by token with another implementation
    of the same method (kvsim.kvpress).

    config: a TOML path or dict, as for kvsim.run; policy: the index of its [[policy]] entry (after
      sweeps expand); step: t in [P+1, n], 0 = P+1 (the first decoded step, whose cache is the
      compressed prompt plus token P), or P itself (P > 0): the compressed prompt alone.
    Returns a list of int64 numpy arrays of 0-based positions, ascending: one for the KV head's cache
    (`[eval] gqa = "kv_head"`) or one per query head of its group ("query_head"). With layer and kv_head
    both None: a dict {(layer, kv_head): that list} over every cell of the stream. Raises kvsim.Error
    for an index or step out of range, or a policy that keeps no token subset (subgen, kivi) or is a
    non-causal oracle.
    """
    import numpy as np

    sets = to_sets(overrides)
    if isinstance(config, (str, os.PathLike)):
        text, is_path = os.fspath(config), True
    elif isinstance(config, dict):
        text, is_path = to_toml(config), False
    else:
        raise TypeError("config must be a TOML path or a dict")
    if (layer is None) != (kv_head is None):
        raise TypeError("give both layer and kv_head, or neither (every cell)")
    cells = [] if layer is None else [(int(layer), int(kv_head))]
    kept = _kvsim._kept(text, is_path, sets, cells, int(policy), int(step))
    out = {cell: [np.asarray(k, dtype=np.int64) for k in sets_] for cell, sets_ in kept}
    return out if layer is None else out[(int(layer), int(kv_head))]


def policies():
    """The policy registry (built-in and registered Python policies): a list of dicts with name,
    summary, source (paper, section, equation), params (name, kind, default, doc), memory (the
    `memory = M` rule) and gpu (GPU replay coverage)."""
    return _kvsim._policies()


def metrics():
    """The metric registry, in results order: a list of dicts with name, unit, description, source."""
    return _kvsim._metrics()
