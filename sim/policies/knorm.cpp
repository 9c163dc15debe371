// `knorm`: L2-norm eviction (Devoto et al., 2024, "A Simple and Effective L2 Norm-Based Strategy for
// KV Cache Compression", §3): keys with a low L2 norm receive high attention, so the cache keeps the
// tokens with the lowest ‖k‖ and evicts the largest-norm key first — no attention score is needed
// (the rule works with fused attention kernels that never materialize the weights). kvsim adds an
// optional protected window of the `recent_ratio · B` newest tokens (default 0: the paper's rule, as
// kvpress's KnormPress). The score is −‖k‖ (float64 norm of the stored float32 key), fixed when the
// token joins; ties evict the oldest.
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "scorer.hpp"

namespace kvsim::policies {
namespace {

class KnormPolicy final : public ScorerPolicy {
 public:
  KnormPolicy(int64_t budget, int64_t recent, const StreamInfo& s)
      : ScorerPolicy("knorm", budget, /*sink=*/0, recent, s), d_(s.head_dim) {}
  bool needs_every_query() const override { return false; }

 private:
  double initial_score(int64_t, const float* k) override {
    double ss = 0;
    for (int i = 0; i < d_; ++i) ss += double(k[i]) * k[i];
    return -std::sqrt(ss);
  }
  void update_scores(int64_t, const ProbsD&, std::vector<double>&) override {}
  int d_;
};

std::unique_ptr<Policy> make_knorm(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  const double r = p.get_double("recent_ratio");
  return std::make_unique<KnormPolicy>(b, std::min<int64_t>(std::llround(r * double(b)), b - 1), s);
}

}  // namespace

KVSIM_POLICY(knorm) {
  static const PolicyInfo info{
      "knorm",
      "keep the tokens with the lowest key L2 norm: when full, the largest-‖k‖ token outside the `recent_ratio · B` "
      "newest is evicted before token t joins (no attention needed)",
      "Devoto et al., 2024 (L2 norm) §3",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"},
       {"recent_ratio", "float", "0", "fraction of B kept as a window of the newest tokens", "[0, 1)"}},
      make_knorm,
      budget_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}}), example_params({{"budget", 0.25}, {"recent_ratio", 0.5}})},
      "#8c6d31",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
