// kvsim: `kvsim inspect FILE` — schema, shapes and per-layer statistics of a recording.
#pragma once
#include <string>

namespace kvsim {

/// Returns the report text; throws kvsim::Error (validation failures name file/dataset/index).
/// Per layer: mean ‖q‖, ‖k‖, ‖v‖ over heads and tokens, max ‖q̃‖ (the r of SubGen Thm. 1), and the
/// range of the scaled causal logits <k_i, q̃_t> (i ≤ t) over the first `max_tokens` tokens.
std::string inspect_recording(const std::string& path, int64_t max_tokens = 2048);

}  // namespace kvsim
