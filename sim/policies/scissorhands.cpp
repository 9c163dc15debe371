// `scissorhands`: Scissorhands (Liu et al., NeurIPS 2023, "Exploiting the Persistence of Importance
// Hypothesis for LLM KV Cache Compression at Test Time", §3 (persistence of importance) and §4,
// Algorithm 2). Tokens that were unimportant to most recent queries stay unimportant, so when the
// cache is full it drops the token that was unimportant most often within a history window of the
// last `history` queries — a token is unimportant to a query when its attention weight is below the
// average 1/m over the m cached tokens — while the `recent_ratio · B` newest tokens are protected.
//
// kvsim's form: one eviction per step (Algorithm 2 drops a batch when the buffer fills; one at a time
// keeps the cache at exactly B like every other fixed-size policy here). Score = −(unimportant
// count over the last `history` steps while cached, one 64-bit shift register per slot, so
// history ≤ 64); ties evict the oldest. In kv_head mode the
// group's weights combine by group_agg before the threshold. Defaults (history 32 queries, recent
// 10% of B) are kvsim's: the paper sets the windows per model.
#include <algorithm>
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "scorer.hpp"

namespace kvsim::policies {
namespace {

class ScissorhandsPolicy final : public ScorerPolicy {
 public:
  ScissorhandsPolicy(int64_t budget, int64_t recent, int history, const StreamInfo& s)
      : ScorerPolicy("scissorhands", budget, /*sink=*/0, recent, s),
        window_(history == 64 ? ~uint64_t(0) : (uint64_t(1) << history) - 1), low_(size_t(budget), 0) {}

 private:
  /// Shifts this step's unimportant flag into each slot's history bits (the last `history` queries
  /// while cached) and sets score = −(number of flags set).
  void update_scores(int64_t, const ProbsD& P, std::vector<double>& score) override {
    const int64_t m = P.rows();
    const VecD w = group_weights(P);
    const double threshold = 1.0 / double(m);
    for (int64_t s = 0; s < m; ++s) {
      uint64_t& bits = low_[size_t(s)];
      bits = ((bits << 1) | uint64_t(w[s] < threshold)) & window_;
      score[size_t(s)] = -double(__builtin_popcountll(bits));
    }
  }
  /// A new token in slot s starts with no history.
  void slot_replaced(int64_t s) override { low_[size_t(s)] = 0; }

  const uint64_t window_;     ///< mask of the last `history` flags
  std::vector<uint64_t> low_;  ///< per slot: unimportant flags, newest in bit 0
};

std::unique_ptr<Policy> make_scissorhands(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  const double r = p.get_double("recent_ratio");
  const int64_t history = p.get_int("history");
  return std::make_unique<ScissorhandsPolicy>(b, std::min<int64_t>(std::llround(r * double(b)), b - 1), int(history), s);
}

}  // namespace

KVSIM_POLICY(scissorhands) {
  static const PolicyInfo info{
      "scissorhands",
      "persistence of importance: when full, evict the token whose attention fell below the cache average 1/m most "
      "often over the last `history` queries, outside the `recent_ratio · B` newest",
      "Scissorhands (Liu et al., 2023) §4, Alg. 2",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"},
       {"history", "int", "32", "history window: how many recent queries count", "[1, 64]"},
       {"recent_ratio", "float", "0.1", "fraction of B kept as a window of the newest tokens", "[0, 1)"}},
      make_scissorhands,
      budget_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}})},
      "#393b79",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
