"""kvsim's budgets files (`kvsim allocate`, docs/cli.md "Budgets per layer and head") as kvpress presses.

An allocation gives each (layer, KV head) cache its own budget b[l][h], averaging M. kvpress spends one
compression ratio everywhere, so this module carries the allocation over in two forms:

- `BudgetsPress` (`budgets_press`): any kvpress ScorerPress's scores, and per (layer, KV head) the top
  `counts[l][h]` context tokens kept; the rest are masked the way kvpress's AdaKVPress masks
  (`module.masked_key_indices`, given zero weight by kvpress's attention patch). The cache keeps its shape,
  so it runs on the CPU with sdpa attention, per head and per layer alike.
- `per_layer_press`: a layer-granularity file as kvpress's own PerLayerCompressionPress (one ratio per
  layer). kvpress runs that wrapper with flash attention only (docs/kvpress.md), so it is the export for a
  GPU, not for this machine.

`counts_for(path, memory, context)` scales the file's budgets to a context of C tokens: the mean kept per
covered cache is int(C · memory) for a fractional memory (kvpress's n_kept = int(C·(1 − r)) at r = 1 −
memory) or min(memory, C) tokens, each cache b·K/M rounded by largest remainder so that the total is
exact — the rule kvsim's engine applies to a stream of another length (include/kvsim/policies/budgets.hpp).
Layers the file does not cover (Gemma 3's local layers) keep every token: −1.
"""
import json
import math

_CLASS = None


def load(path):
    """The budgets file as a dict; kvsim.Error naming the file when it is not one."""
    from . import Error

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise Error(f"{path}: cannot read a budgets file ({e})") from e
    for key in ("kvsim_budgets", "n_layers", "n_kv_heads", "layers", "n", "allocations"):
        if key not in data:
            raise Error(f"{path}: missing key '{key}' (not a budgets file written by kvsim allocate)")
    return data


def allocation(data, memory, path="budgets file"):
    """The allocation of `data` for `memory` (a fraction of n, or tokens), matched as kvsim matches it: by
    its token count at the file's n."""
    from . import Error

    def tokens(m):
        # kvsim's rounding of a fraction of n (std::llround: halves away from zero), or whole tokens clamped to n
        return max(1, math.floor(m * data["n"] + 0.5)) if isinstance(m, float) and m <= 1 else min(int(m), data["n"])

    want = tokens(memory)
    for a in data["allocations"]:
        if a["memory_tokens"] == want:
            return a
    held = ", ".join(str(a["memory_tokens"]) for a in data["allocations"])
    raise Error(f"{path}: no allocation for memory {memory} ({want} tokens at n = {data['n']}); it holds {held}")


def scale(budgets, source, target):
    """`budgets` (rows of ints averaging `source`) scaled to average `target`: floor of b·target/source, then
    one more to the largest remainders (ties: the earlier cache, row-major); the total is exact."""
    flat = [b for row in budgets for b in row]
    exact = [b * target / source for b in flat]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(flat)), key=lambda i: -(exact[i] - out[i]))  # stable: earlier first among equals
    for i in order[: len(flat) * target - sum(out)]:
        out[i] += 1
    width = len(budgets[0])
    return [out[i:i + width] for i in range(0, len(out), width)]


def counts_for(path, memory, context, mean=None):
    """Per model layer and KV head, the context tokens to keep of a C-token context (−1: keep all). The
    allocation is the file's for `memory`; its budgets are scaled to average `mean` tokens per covered cache
    (default: int(C · memory), or `memory` tokens) — `mean` = the budget kvsim pinned for a trial, so that
    both tools keep the same count per cache."""
    data = load(path)
    a = allocation(data, memory, path)
    if mean is not None:
        target = min(int(mean), context)
    else:
        target = int(context * memory) if isinstance(memory, float) and memory <= 1 else min(int(memory), context)
    rows = scale(a["budgets"], a["memory_tokens"], max(1, target))
    counts = [[-1] * data["n_kv_heads"] for _ in range(data["n_layers"])]
    for layer, row in zip(data["layers"], rows):
        counts[layer] = [min(max(1, b), context) for b in row]
    return counts


def _press_class():
    global _CLASS
    if _CLASS is None:
        from dataclasses import dataclass

        import torch
        from kvpress.presses.base_press import BasePress
        from kvpress.presses.scorer_press import ScorerPress

        @dataclass
        class BudgetsPress(BasePress):
            """`press`'s scores, and per (layer, KV head) the top counts[layer][h] tokens kept (−1: all); the
            others masked as AdaKVPress masks them. `kept` collects, per compressed (layer, KV head), the
            tokens left unmasked: what the press did, read back for checks."""

            press: ScorerPress
            counts: list
            kept: list = None

            def post_init_from_model(self, model):
                self.press.post_init_from_model(model)

            @property
            def compression_ratio(self):
                return self.press.compression_ratio

            @compression_ratio.setter
            def compression_ratio(self, value):
                self.press.compression_ratio = value

            def compress(self, module, hidden_states, keys, values, attentions, kwargs):
                row = self.counts[module.layer_idx]
                if all(c < 0 for c in row):
                    return keys, values
                scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
                bsz, heads, k_len = scores.shape
                b_idx, h_idx, s_idx = [], [], []
                for h in range(heads):
                    keep = k_len if row[h] < 0 else min(row[h], k_len)
                    if self.kept is not None:
                        self.kept.append(keep)
                    if keep >= k_len:
                        continue
                    pruned = torch.topk(-scores[:, h], k_len - keep, dim=-1).indices  # [bsz, pruned]
                    b_idx.append(torch.arange(bsz).repeat_interleave(k_len - keep))
                    h_idx.append(torch.full(((k_len - keep) * bsz,), h, dtype=torch.long))
                    s_idx.append(pruned.flatten())
                if b_idx:
                    module.masked_key_indices = (torch.cat(b_idx), torch.cat(h_idx), torch.cat(s_idx))
                return keys, values

        _CLASS = BudgetsPress
    return _CLASS


def budgets_press(press, counts):
    """A kvpress press keeping counts[layer][kv_head] tokens per cache by `press`'s scores (a ScorerPress)."""
    return _press_class()(press=press, counts=counts, kept=[])


def per_layer_press(path, memory, press):
    """A layer-granularity budgets file as kvpress.PerLayerCompressionPress(press, ratios): layer l's ratio is
    1 − b_l / n (0 for a layer the file does not cover). kvpress runs it with flash attention only."""
    from . import Error
    import kvpress

    data = load(path)
    if data.get("granularity") != "layer":
        raise Error(f"{path}: PerLayerCompressionPress takes one ratio per layer; this file is per "
                    f"{data.get('granularity', 'head')} (use budgets_press)")
    a = allocation(data, memory, path)
    ratios = [0.0] * data["n_layers"]
    for layer, row in zip(data["layers"], a["budgets"]):
        ratios[layer] = 1.0 - row[0] / data["n"]
    return kvpress.PerLayerCompressionPress(press=press, compression_ratios=ratios)
