// kvsim: `kvsim inspect FILE` — schema, shapes and per-layer statistics of a recording.
#pragma once
#include <string>
#include <vector>

namespace kvsim {

/// Returns the report text; throws kvsim::Error (validation failures name file/dataset/index).
/// Per layer: mean ‖q‖, ‖k‖, ‖v‖ over heads and tokens, max ‖q̃‖ (the r of SubGen Thm. 1), and the
/// range of the scaled causal logits <k_i, q̃_t> (i ≤ t) over the first `max_tokens` tokens.
std::string inspect_recording(const std::string& path, int64_t max_tokens = 2048);

/// Replay fidelity of a recording that carries `/layer_*/attn` (the recorder's or exporter's own
/// attention output): kvsim's exact attention (docs/architecture.md, a replay step by step, double precision) of every stored query
/// head and step against it. `worst[i]` is max over heads and steps of ‖ref − attn‖ / ‖ref‖ for
/// layers[i] (empty `layers` = all). Throws kvsim::Error naming the file and layer when a layer has
/// no attn dataset or a layer index is out of range.
struct AttentionCheck {
  std::vector<int> layers;
  std::vector<double> worst;
};
AttentionCheck check_recorded_attention(const std::string& path, const std::vector<int>& layers = {});

}  // namespace kvsim
