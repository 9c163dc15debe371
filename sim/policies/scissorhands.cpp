// `scissorhands`: Scissorhands (Liu et al., NeurIPS 2023, "Exploiting the Persistence of Importance
// Hypothesis for LLM KV Cache Compression at Test Time", §3 (persistence of importance) and §4,
// Algorithm 2). Tokens that were unimportant to most recent queries stay unimportant, so when the
// cache is full it drops the token that was unimportant most often within a history window of the
// last `history` queries — a token is unimportant to a query when its attention weight is below the
// average 1/m over the m cached tokens — while the `recent_ratio · B` newest tokens are protected.
//
// kvsim's form: one eviction per step (Algorithm 2 drops a batch when the buffer fills; one at a time
// keeps the cache at exactly B like every other fixed-size policy here). Score = −(unimportant
// count over the last `history` steps while cached); ties evict the oldest. In kv_head mode the
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
  ScissorhandsPolicy(int64_t budget, int64_t recent, int64_t history, const StreamInfo& s)
      : ScorerPolicy("scissorhands", budget, /*sink=*/0, recent, s), history_(history),
        low_(size_t(history * budget), 0), count_(size_t(budget), 0) {}

 private:
  /// Records this step's unimportant flags in the ring row `step_ % history` (forgetting the flags
  /// of `history` steps ago) and sets score = −count.
  void update_scores(int64_t, const MatD& P, std::vector<double>& score) override {
    const int64_t m = P.rows();
    GroupAggregate agg(agg_, m);
    for (Eigen::Index i = 0; i < P.cols(); ++i) agg.add(P.col(i));
    const VecD w = agg.result();
    uint8_t* row = &low_[size_t((step_ % history_) * budget_)];
    const double threshold = 1.0 / double(m);
    for (int64_t s = 0; s < m; ++s) {
      const uint8_t flag = w[s] < threshold;
      count_[size_t(s)] += int64_t(flag) - int64_t(row[s]);
      row[s] = flag;
      score[size_t(s)] = -double(count_[size_t(s)]);
    }
    ++step_;
  }
  /// A new token in slot s starts with no history.
  void slot_replaced(int64_t s) override {
    for (int64_t h = 0; h < history_; ++h) low_[size_t(h * budget_ + s)] = 0;
    count_[size_t(s)] = 0;
  }

  const int64_t history_;
  std::vector<uint8_t> low_;    ///< [history][budget] ring of unimportant flags
  std::vector<int64_t> count_;  ///< per slot: flags set in the ring
  int64_t step_ = 0;
};

std::unique_ptr<Policy> make_scissorhands(const Params& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  const double r = p.get_double("recent_ratio", 0.1);
  if (!(r >= 0 && r < 1)) throw Error("parameter 'recent_ratio' must be in [0, 1)" + p.where("recent_ratio"));
  const int64_t history = p.get_int("history", 32);
  if (history < 1 || history > 4096) throw Error("parameter 'history' must be in [1, 4096] queries" + p.where("history"));
  return std::make_unique<ScissorhandsPolicy>(b, std::min<int64_t>(std::llround(r * double(b)), b - 1), history, s);
}

}  // namespace

const PolicyInfo& scissorhands_info() {
  static const PolicyInfo info{
      "scissorhands",
      "persistence of importance: when full, evict the token whose attention fell below the cache average 1/m most "
      "often over the last `history` queries, outside the `recent_ratio · B` newest",
      "Scissorhands (Liu et al., 2023) §4, Alg. 2",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"},
       {"history", "int", "32", "history window: how many recent queries count, in [1, 4096]"},
       {"recent_ratio", "float", "0.1", "fraction of B kept as a window of the newest tokens, in [0, 1)"}},
      make_scissorhands,
      budget_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}})}};
  return info;
}

}  // namespace kvsim::policies
