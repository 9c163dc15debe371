// `h2o`: Heavy-Hitter Oracle (Zhang et al., 2023) — H2O §4.1 Algorithm 1, Definition 2.1, §5.1.
// Budget B = B_heavy + B_recent (default half and half). Step t:
//   observe(k_t, v_t): if the cache is full, evict the non-recent token with the lowest accumulated
//     attention score (ties: the oldest), then add token t  →  |S_t| ≤ B and |S_t \ S_{t−1}| ≤ 1
//     (Def. 2.1), and the most recent B_recent tokens are always cached;
//   attend(q_t): the normalized attention of q_t over S_t (the decoder's output at step t) is added
//     to every cached token's score (Alg. 1's F_score accumulation, h(z) = z). In kv_head mode the
//     group's query heads' attention vectors are combined by group_agg (mean | max | sum).
// `score = "oracle"` ranks tokens instead by their attention from *all* queries of the stream, future
// included (H2O §3's "global" heavy hitters vs the "local" accumulated ones, Fig. 2): not causal, an
// upper reference for what accumulated scores could achieve.
// Eviction happens before the new token is added, using the scores of queries 1..t−1, so the cache
// that answers q_t holds at most B tokens — the same memory as a window of B (Algorithm 1 evicts
// after attending over S_{t−1} ∪ {t}, which transiently holds B + 1).
#include <cmath>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "scorer.hpp"

namespace kvsim::policies {
namespace {

class H2OPolicy final : public ScorerPolicy, public GlobalScoresOracle, public GpuReplayable {
 public:
  H2OPolicy(int64_t budget, int64_t recent, bool global, const StreamInfo& s)
      : ScorerPolicy("h2o", budget, /*sink=*/0, recent, s), global_(global) {}

  bool needs_every_query() const override { return !global_; }
  bool needs_global_scores() const override { return global_; }
  void set_global_scores(const std::vector<const VecD*>& per_head) override {
    GroupAggregate agg(agg_, per_head.at(0)->size());  // as for the accumulated scores
    for (const VecD* g : per_head) agg.add(*g);
    global_score_ = agg.result();
  }

  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    if (global_) return std::nullopt;  // the non-causal oracle form stays on the CPU
    cuda::PolicyReplay r;
    r.kind = cuda::ReplayKind::h2o;
    r.budget = budget_;
    r.recent = recent_;
    r.group_agg = static_cast<int>(agg_);
    return r;
  }

 private:
  double initial_score(int64_t t, const float*) override { return global_ ? global_score_[t] : 0.0; }  // oracle: whole-stream score
  /// Alg. 1's F_score accumulation (h(z) = z): the group's attention, combined by group_agg, added
  /// to every cached token's score; oracle scores are fixed.
  void update_scores(int64_t, const ProbsD& P, std::vector<double>& score) override {
    if (global_) return;
    const int64_t m = P.rows();
    const VecD step = group_weights(P);
    for (int64_t s = 0; s < m; ++s) score[s] += step[s];
  }

  bool global_;
  VecD global_score_;
};

std::unique_ptr<Policy> make_h2o(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  const double heavy = p.get_double("heavy_ratio");
  if (b < 2) throw Error("parameter 'budget' must be at least 2 tokens (heavy + recent)" + p.where("budget"));
  const int64_t heavy_tokens = std::clamp<int64_t>(std::llround(heavy * double(b)), 1, b - 1);
  const std::string score = p.get_string("score");  // accumulated (local H2) or oracle (global H2)
  return std::make_unique<H2OPolicy>(b, b - heavy_tokens, score == "oracle", s);
}

}  // namespace

KVSIM_POLICY(h2o) {
  static const PolicyInfo info{
      "h2o",
      "heavy hitters + recent tokens: every step q_t's attention over the cache is added to each cached token's "
      "score; when full, the lowest-score token outside the `budget − heavy` most recent is evicted before the new "
      "one joins (|S_t| ≤ B, |S_t \\ S_{t−1}| ≤ 1). `score = \"oracle\"` ranks by the attention of all queries, "
      "future included (\"global\" heavy hitters, not causal)",
      "H2O §4.1 Alg. 1, Def. 2.1, Fig. 2",
      {{"budget", "tokens", "required", "cache size B = heavy + recent tokens (≥ 2)"},
       {"heavy_ratio", "float", "0.5", "fraction of B for heavy hitters; the rest protects recent tokens", "(0, 1)"},
       {"score", "string", "accumulated", "\"accumulated\" (local, causal) or \"oracle\" (global, non-causal)",
        "accumulated|oracle"}},
      make_h2o,
      budget_memory_rule(),
      "yes (score = \"accumulated\")",
      {example_params({{"budget", 0.25}}), example_params({{"budget", 0.25}, {"score", std::string("oracle")}})},
      "#1f77b4",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
