// `h2o`: Heavy-Hitter Oracle (Zhang et al., seeds/004) — H2O §4.1 Algorithm 1, Definition 2.1, §5.1.
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

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

class H2OPolicy final : public Policy {
 public:
  H2OPolicy(int64_t budget, int64_t recent, bool global, const StreamInfo& s)
      : budget_(budget), recent_(recent), global_(global), agg_(s.group_agg), cache_(budget, s.head_dim, s.policy_f32),
        score_(budget, 0.0) {}

  bool needs_every_query() const override { return !global_; }
  bool needs_global_scores() const override { return global_; }
  void set_global_scores(const std::vector<const VecD*>& per_head) override {
    GroupAggregate agg(agg_, per_head.at(0)->size());  // as for the accumulated scores
    for (const VecD* g : per_head) agg.add(*g);
    global_score_ = agg.result();
  }

  void observe(int64_t t, const float* k, const float* v) override {
    const double init = global_ ? global_score_[t] : 0.0;  // oracle: the token's whole-stream score
    if (cache_.size() < budget_) {
      score_[cache_.size()] = init;
      cache_.append(t, k, v);
      return;
    }
    // Evict the lowest-score token outside the recent window: after token t joins, positions
    // t − recent_ + 1 .. t are the recent ones, so candidates have position ≤ t − recent_.
    // The rule is shared with the CUDA path (include/kvsim/core/hd.hpp).
    int64_t victim = -1;
    for (int64_t s = 0; s < cache_.size(); ++s) {
      if (!hd::h2o_evictable(cache_.position(s), t, recent_)) continue;  // token t is not yet cached
      if (victim < 0 || hd::h2o_prefer(score_[s], cache_.position(s), score_[victim], cache_.position(victim)))
        victim = s;
    }
    if (victim < 0) throw Error("h2o: no evictable token (recent window ≥ budget)");
    cache_.put(victim, t, k, v);
    score_[victim] = init;
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    const int64_t m = cache_.size();
    const MatD& P = cache_.answer_group(q, out);  // one pass over keys and values for the whole query group
    GroupAggregate agg(agg_, m);
    for (Eigen::Index i = 0; i < q.rows(); ++i) agg.add(P.col(i));
    if (global_) return;  // oracle scores are fixed
    const VecD step = agg.result();
    for (int64_t s = 0; s < m; ++s) score_[s] += step[s];
  }

  int64_t cache_tokens() const override { return cache_.size(); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    if (global_) return std::nullopt;  // the non-causal oracle form stays on the CPU
    cuda::PolicyReplay r;
    r.name = "h2o";
    r.budget = budget_;
    r.recent = recent_;
    r.group_agg = group_agg_code(agg_);
    return r;
  }

 private:
  int64_t budget_, recent_;
  bool global_;
  std::string agg_;
  VecD global_score_;
  SlotCache cache_;
  std::vector<double> score_;
};

}  // namespace

std::unique_ptr<Policy> make_h2o(const Params& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  const double heavy = p.get_double("heavy_ratio", 0.5);
  if (!(heavy > 0 && heavy < 1)) throw Error("parameter 'heavy_ratio' must be in (0, 1)" + p.where("heavy_ratio"));
  if (b < 2) throw Error("parameter 'budget' must be at least 2 tokens (heavy + recent)" + p.where("budget"));
  const int64_t heavy_tokens = std::clamp<int64_t>(std::llround(heavy * double(b)), 1, b - 1);
  const std::string score = p.get_string("score", "accumulated");
  if (score != "accumulated" && score != "oracle")
    throw Error("parameter 'score' must be \"accumulated\" (local H2) or \"oracle\" (global H2)" + p.where("score"));
  return std::make_unique<H2OPolicy>(b, b - heavy_tokens, score == "oracle", s);
}

}  // namespace kvsim::policies
