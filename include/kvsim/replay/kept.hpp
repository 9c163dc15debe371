// kvsim: the token set a policy's cache answers with at one step, for comparing kvsim's policies with
// other implementations of the same method token by token (kvpress's presses: docs/kvpress.md).
#pragma once
#include <cstdint>
#include <vector>

#include "kvsim/io/recording.hpp"
#include "kvsim/io/spec.hpp"

namespace kvsim {

/// The cached tokens (0-based positions, ascending) that answer q_t in the cell (layer, kv_head) for
/// the experiment's policy `policy`, replayed exactly as the engine does (docs/architecture.md, a replay
/// step by step): the instance is built for the cell's stream (cell_stream), handed the prompt when
/// `[data] prefill = P` > 0, then token s−1 joins at each step s = P+1..t and q_s is shown whenever
/// the policy needs every query; at step t its answer names the kept tokens. Returns one set per
/// instance: one in `[eval] gqa = "kv_head"` mode (the KV head's whole query group), one per query head
/// of the group in "query_head" mode. t in [P+1, n] (n: the stream's tokens, or `[data] tokens`); t = 0
/// means P+1, the first decoded step; t = P (when P > 0) is the compressed prompt before any decoded
/// token joins (the cache is read by showing the prompt's last query, q_P, once more).
/// Throws kvsim::Error for a layer, KV head or step out of range, and for a policy whose answer is not
/// attention over a token subset (subgen, kivi) or that is a non-causal oracle.
std::vector<std::vector<int64_t>> kept_tokens(const Experiment& ex, const StreamSource& src, int layer, int kv_head,
                                              size_t policy, int64_t t);

}  // namespace kvsim
