// Internal: helpers shared by the policy files (sim/policies/*.cpp), each of which defines one
// policy and its PolicyInfo (include/kvsim/policies/registry.hpp).
#pragma once
#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kvsim/core/hd.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::policies {

/// The equal-memory rule of fixed-size policies: budget = M tokens, exact at every step.
inline MemoryRule budget_memory_rule() {
  return {"budget = M (min(M, t) tokens at every step)", {"budget"},
          [](int64_t M, const Params&, Params& out, const std::string& where) { out.set("budget", M, where); }};
}

/// The equal-memory rule of a prompt compressor with a decode window (snapkv, pyramidkv,
/// expected_attention), `memory = M`: budget = M and decode_window = ⌊M/2⌋ (unless given): at steady
/// state half the cache holds the best-scored prompt tokens and half the newest decoded ones, min(M, t)
/// tokens at every decoded step. (Measured for snapkv on stories260K, prompt 256 + 256 decoded tokens,
/// M = 154: rel_err falls monotonically with D, 0.22 at D = 16 → 0.041 at D = 150 — long decodes favour
/// recency, so D is a real trade-off to sweep rather than a constant to hide.)
inline MemoryRule prompt_memory_rule() {
  return {"budget = M, decode_window = ⌊M/2⌋ unless given (min(M, t) tokens at every decoded step)",
          {"budget"},
          [](int64_t M, const Params& given, Params& out, const std::string& where) {
            out.set("budget", M, where);
            if (!given.has("decode_window")) out.set("decode_window", std::max<int64_t>(1, M / 2), where);
          }};
}

/// Params from literal key/value pairs (a PolicyInfo's examples).
inline Params example_params(std::initializer_list<std::pair<std::string, ParamValue>> kv) {
  Params p;
  for (const auto& [k, v] : kv) p.set(k, v, "example");
  return p;
}

/// The indices of the k highest scores (ties: the earlier index), in increasing index order: the
/// tokens a one-shot scorer keeps (keydiff's and lagkv's prompt, lagkv's rescored cache).
inline std::vector<int64_t> top_rows(const VecD& score, int64_t k) {
  std::vector<int64_t> order(static_cast<size_t>(score.size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  order.resize(size_t(std::min<int64_t>(k, score.size())));
  std::sort(order.begin(), order.end());
  return order;
}

/// PyramidKV's budget per layer (sim/policies/pyramidkv.cpp): window + the selected part, which falls
/// arithmetically with depth and sums to n_layers·(budget − window).
std::vector<int64_t> pyramidkv_layer_budgets(int64_t budget, int64_t window, double beta, int n_layers);

/// kvpress's PyramidKVPress layer budgets (window included) for a prompt of `prompt` tokens whose mean
/// budget is `budget` tokens (pyramidkv's `budgets = "kvpress"`).
std::vector<int64_t> pyramidkv_kvpress_budgets(int64_t budget, int64_t window, double beta, int n_layers, int64_t prompt);

/// LagKV's scores of the first m rows of K and V [≥ m, head_dim] with `sink` sink tokens and partitions
/// of L tokens (sim/policies/lagkv.cpp), higher = keep: 1 for the sinks and the tail, a token's rank
/// within its partition / L for the others. Size m.
VecD lagkv_scores(const MatF& K, const MatF& V, int64_t m, int64_t sink, int64_t L);

/// Body sizes after each eviction of a `buzz` policy instance (tests).
const std::vector<int64_t>& buzz_body_history(const Policy& p);

}  // namespace kvsim::policies
