"""Every name kvpress exports, accounted for: how kvsim runs it beside its own policies, or why it cannot.

kvpress (NVIDIA's library of KV-cache presses, pinned in requirements.txt) exports 47 names in 0.5.5: presses
that score tokens from a compression ratio alone, wrappers that take another press (AdaKV's head-wise budgets,
chunking, per-layer ratios, decoding-time compression…), presses that need weights or statistics from the
Hugging Face hub, presses that rewrite keys, and three names that are not presses. CATALOG lists each with
one of these kinds:

  direct     built from compression_ratio alone; kvsim.kvpress.capture reads back the tokens it keeps
  wrapped    built around a scorer (SnapKVPress unless said) as kvpress intends; captured the same way
  pipeline   runs only while decoding (kvpress's DecodingPress family): no prefill token set to capture,
             but kvpress's pipeline answers tasks with it (scripts/kvpress_task.py)
  cannot     the one-line reason it cannot run here, measured where it could be tried (needs the hub or
             weights released for other models, re-rotates or merges so no token set of the prompt's own keys
             and values exists, compresses channels rather than tokens, has no compression ratio)
  not a press  a base class or the pipeline

`capture(name, ratio, model, ids)` runs one through kvsim.kvpress.capture (on eager attention where the press
reads attention weights). `build(name, ratio)` constructs a runnable entry at compression ratio `ratio` (the share of the prompt's
tokens removed, kvpress's convention); `unlisted()` names what the installed kvpress exports that CATALOG does
not (tests/python/test_kvpress_catalog.py fails on any, so a new kvpress press cannot go unaccounted).
"""
from dataclasses import dataclass
import math

from . import Error


@dataclass(frozen=True)
class Entry:
    """One kvpress export. kind: direct | wrapped | pipeline | cannot | not a press. how: for a runnable
    entry, how it is built (its kvpress expression with R for the ratio); else the reason it is not run."""
    kind: str
    how: str


def _snap(kp, r):
    return kp.SnapKVPress(compression_ratio=r)


def _composed(kp, r):
    # Two presses in turn, each removing 1 - sqrt(1 - r) of what reaches it: r of the prompt overall.
    each = 1.0 - math.sqrt(1.0 - r)
    return kp.ComposedPress([kp.SnapKVPress(compression_ratio=each), kp.KnormPress(compression_ratio=each)])


def _per_layer(kp, r, n_layers=30):
    # SmolLM2-135M has 30 layers; ratios rise linearly from r/2 to 3r/2 (mean r), capped below 1.
    return kp.PerLayerCompressionPress(press=kp.SnapKVPress(),
                                       compression_ratios=[min(0.95, r * (0.5 + l / (n_layers - 1))) for l in range(n_layers)])


# name -> (Entry, builder(kvpress module, ratio) or None)
_DIRECT = ["StreamingLLMPress", "SnapKVPress", "PyramidKVPress", "TOVAPress", "KnormPress", "ExpectedAttentionPress",
           "KeyDiffPress", "LagKVPress", "CURPress", "LeverageScorePress", "CompactorPress", "CapPress",
           "NonCausalAttnPress", "ObservedAttentionPress", "KVzipPress", "KVgradPress"]
_BUILD = {n: (lambda n: lambda kp, r: getattr(kp, n)(compression_ratio=r))(n) for n in _DIRECT}
_BUILD["RandomPress"] = lambda kp, r: kp.RandomPress(compression_ratio=r, seed=0)
_BUILD.update({
    "CriticalKVPress": lambda kp, r: kp.CriticalKVPress(_snap(kp, r)),
    "AdaKVPress": lambda kp, r: kp.AdaKVPress(_snap(kp, r)),
    "CriticalAdaKVPress": lambda kp, r: kp.CriticalAdaKVPress(_snap(kp, r)),
    "ChunkPress": lambda kp, r: kp.ChunkPress(_snap(kp, r), chunk_length=256),
    "ChunkKVPress": lambda kp, r: kp.ChunkKVPress(_snap(kp, r)),
    "EntropyGatedChunkKVPress": lambda kp, r: kp.EntropyGatedChunkKVPress(_snap(kp, r)),
    "BlockPress": lambda kp, r: kp.BlockPress(_snap(kp, r), block_size=128),
    "PerLayerCompressionPress": _per_layer,
    "ComposedPress": _composed,
    "PrefillDecodingPress": lambda kp, r: kp.PrefillDecodingPress(prefilling_press=_snap(kp, r)),
    "KVComposePress": lambda kp, r: kp.KVComposePress(compression_ratio=r, structured=False),
    "DecodingPress": lambda kp, r: kp.DecodingPress(_snap(kp, r), compression_interval=64, target_size=256),
    "CompressionRatioDecodingPress": lambda kp, r: kp.CompressionRatioDecodingPress(
        _snap(kp, r), compression_interval=64, target_compression_ratio=r),
})

_HOW = {
    "CriticalKVPress": "CriticalKVPress(SnapKVPress(R)): scores rescaled by |W_o v|",
    "AdaKVPress": "AdaKVPress(SnapKVPress(R)): head-wise budgets by masking",
    "CriticalAdaKVPress": "CriticalAdaKVPress(SnapKVPress(R))",
    "ChunkPress": "ChunkPress(SnapKVPress(R), chunk_length=256)",
    "ChunkKVPress": "ChunkKVPress(SnapKVPress(R)): 20-token chunks",
    "EntropyGatedChunkKVPress": "EntropyGatedChunkKVPress(SnapKVPress(R))",
    "BlockPress": "BlockPress(SnapKVPress(R), block_size=128)",
    "PerLayerCompressionPress": "PerLayerCompressionPress(SnapKVPress(), ratios R/2 .. 3R/2 over the 30 layers)",
    "ComposedPress": "ComposedPress([SnapKVPress(R'), KnormPress(R')]), (1 - R')^2 = 1 - R",
    "PrefillDecodingPress": "PrefillDecodingPress(prefilling_press=SnapKVPress(R))",
    "DecodingPress": "DecodingPress(SnapKVPress(R), compression_interval=64, target_size=256)",
    "CompressionRatioDecodingPress": "CompressionRatioDecodingPress(SnapKVPress(R), compression_interval=64, "
                                     "target_compression_ratio=R)",
    "RandomPress": "RandomPress(R, seed=0)",
    "KVComposePress": "KVComposePress(R, structured=False): each head keeps its own tokens (the default, structured, "
                      "fills composite slots whose keys are no rows of the cache)",
    "ObservedAttentionPress": "ObservedAttentionPress(R) on eager attention (it reads the attention weights)",
    "KVzipPress": "KVzipPress(R): scores by a reconstruction pass (context repeated), the tokenizer read from a "
                  "local folder (load_model)",
    "KVgradPress": "KVgradPress(R): KVzip with the reconstruction loss's gradients",
}

_CANNOT = {
    "QFilterPress": "needs its Q-filters downloaded from the Hugging Face hub (q_filters); offline here",
    "ExpectedAttentionStatsPress": "needs query statistics from the hub or computed on the kmfoda/booksum dataset; "
                                   "offline here",
    "KVzapPress": "needs its trained KVzap scorer from the hub (kvzap_model_name); offline here",
    "FastKVzipPress": "its trained gates are released for other models only (not SmolLM2), and on the hub",
    "RestoreKVPress": "needs a restore model from the hub (restore_model_name); offline here",
    "DuoAttentionPress": "needs DuoAttention's head patterns from the hub, or the kmfoda/booksum dataset for "
                         "on-the-fly scoring; offline here",
    "LUKVPress": "its pre-computed budget curves ship for Llama-3.1-8B-Instruct only",
    "KeyRerotationPress": "re-rotates the kept keys to new positions: the cache holds keys that are no rows of the "
                          "uncompressed cache, so no token set exists to replay",
    "FinchPress": "re-rotates the kept keys (and needs a delimiter token between context and question): "
                  "no token set of the prompt's own keys",
    "MergingPress": "folds evicted values into kept tokens' values: its keys are its scorer's token set, and "
                    "replaying that set with the original values would measure the scorer, not the press",
    "CAMPress": "merges evicted values into kept ones while decoding: no token set",
    "ThinKPress": "prunes key channels, not tokens: every token stays, with keys that are no rows of the cache",
    "SimLayerKVPress": "no compression ratio: a layer is lazy or keeps everything; on a 512-token SmolLM2 prompt "
                       "(n_recent=128) it found no lazy layer and kept every token (measured)",
    "DMSPress": "evicts below a score threshold, not to a compression ratio, so memory cannot be held equal "
                "(SnapKV's scores at threshold 0 evicted nothing on SmolLM2, measured)",
}

_NOT_A_PRESS = {
    "BasePress": "the base class every press derives from",
    "ScorerPress": "the base class of the scoring presses (score -> top-k)",
    "KVPressTextGenerationPipeline": "kvpress's pipeline (context compressed once, questions answered); "
                                     "scripts/kvpress_task.py drives it",
}


def _catalog():
    out = {}
    for n in _BUILD:
        kind = "direct" if n in _DIRECT or n in ("RandomPress", "KVComposePress") else "wrapped"
        if n in ("DecodingPress", "CompressionRatioDecodingPress"):
            kind = "pipeline"
        out[n] = Entry(kind, _HOW.get(n, f"{n}(compression_ratio=R)"))
    out.update({n: Entry("cannot", why) for n, why in _CANNOT.items()})
    out.update({n: Entry("not a press", why) for n, why in _NOT_A_PRESS.items()})
    return out


CATALOG = _catalog()


def exported():
    """The names the installed kvpress exports (kvpress.__all__), in its order."""
    import kvpress

    return list(kvpress.__all__)


def unlisted(names=None):
    """The exported names (default: the installed kvpress's) that CATALOG does not account for."""
    return [n for n in (exported() if names is None else names) if n not in CATALOG]


def runnable(kinds=("direct", "wrapped")):
    """Catalogued names of the given kinds, in catalogue order."""
    return [n for n, e in CATALOG.items() if e.kind in kinds]


def build(name, ratio):
    """The press `name` at compression ratio `ratio` (0 <= ratio < 1: the share of prompt tokens removed).
    Raises kvsim.Error naming the press when it is not catalogued as runnable, with its reason."""
    import kvpress

    e = CATALOG.get(name)
    if e is None:
        raise Error(f"kvpress press '{name}' is not in kvsim.kvpress_catalog.CATALOG")
    if name not in _BUILD:
        raise Error(f"kvpress {name} is not run by kvsim ({e.kind}): {e.how}")
    if not (0.0 <= ratio < 1.0):
        raise Error(f"kvpress {name}: compression ratio {ratio} outside [0, 1)")
    return _BUILD[name](kvpress, float(ratio))


EAGER = {"ObservedAttentionPress"}  # presses that read the attention weights (output_attentions)

# Presses whose prefill can be captured but whose answers kvpress's pipeline cannot decode on the CPU: their
# layers keep different numbers of tokens, which kvpress supports with flash attention only (a GPU kernel); with
# sdpa or eager attention the mask takes layer 0's length and decoding fails (measured: "size of tensor a (930)
# must match the size of tensor b (960)").
NO_CPU_PIPELINE = {
    "PyramidKVPress": "its layers keep different numbers of tokens: kvpress decodes that with flash attention only "
                      "(GPU); on the CPU its pipeline fails at the first decoded token",
    "PerLayerCompressionPress": "as PyramidKVPress (kvpress: 'only works with flash attention')",
}


def pipeline_runnable():
    """Catalogued presses kvpress's pipeline can answer with on the CPU (direct, wrapped and pipeline kinds,
    less NO_CPU_PIPELINE)."""
    return [n for n in runnable(("direct", "wrapped", "pipeline")) if n not in NO_CPU_PIPELINE]


def capture(name, ratio, model, ids):
    """kvsim.kvpress.capture of the catalogued press `name` at `ratio` on the prompt `ids` through `model` (from
    kvsim.kvpress.load_model), with torch's generator seeded (0), switching the model to eager attention for
    the presses in EAGER and back after.
    Returns the PressCapture; raises kvsim.Error naming the press (see build and capture)."""
    import torch

    from . import kvpress as bridge

    # Seeded: LeverageScorePress and CompactorPress draw random sketches from torch's global generator.
    torch.manual_seed(0)
    press = build(name, ratio)
    if name not in EAGER:
        return bridge.capture(press, model, ids)
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return bridge.capture(press, model, ids)
    finally:
        model.set_attn_implementation(before)
