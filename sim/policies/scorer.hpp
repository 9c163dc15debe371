// Internal: ScorerPolicy — the base of score-based eviction policies (kvpress's "ScorerPress" idea):
// "score every cached token, keep the top B, protect sink and recent tokens".
//
// Step t (the stream order of docs/architecture.md): observe(k_t, v_t): while the cache holds fewer than B tokens the token
// joins; otherwise the lowest-score token that is neither a sink (position < sink) nor among the
// `recent` newest (position > t − recent) is evicted (ties: the oldest; hd::h2o_prefer, shared with
// the GPU path) and token t takes its slot with initial_score(t). The cache that answers q_t thus
// holds at most B tokens and changes by at most one token per step (H2O Definition 2.1).
// attend(Q̃_t): the group's attention over the cache answers the queries; update_scores() then sees
// it ([m, G]: column g = softmax of query g over the m cached slots) and the per-slot scores.
// A subclass supplies the scoring rule (H2O: accumulated attention, sim/policies/h2o.cpp; TOVA: the
// last query's attention; KNorm: −‖k‖; Scissorhands: how rarely a token was unimportant lately).
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {

class ScorerPolicy : public Policy, public SlotAnswersStepper {
 public:
  /// budget B ≥ 1 tokens; sink + recent < budget (else nothing could be evicted); `name` for errors.
  ScorerPolicy(std::string name, int64_t budget, int64_t sink, int64_t recent, const StreamInfo& s)
      : name_(std::move(name)), budget_(budget), sink_(sink), recent_(recent), agg_(s.group_agg),
        cache_(budget, s.head_dim, s.policy_f32), score_(budget, 0.0) {}

  bool needs_every_query() const override { return true; }

  void observe(int64_t t, const float* k, const float* v) final { observe_slot(t, k, v); }

  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) final {
    const ProbsD& P = cache_.answer_group(q, out);  // one pass over keys and values for the whole query group
    update_scores(t, P, score_);
  }

  /// Blocked stepping (BlockStepper; sim/policies/scorer_block.cpp). A scorer that reads every query walks its
  /// blocks; one that reads only the evaluated queries (knorm, h2o with oracle scores: their scores are fixed when
  /// a token joins, so attending changes nothing) answers a block's evaluated steps together over its store, as
  /// the slot-store answerers do (SlotAnswersStepper).
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) final;
  bool blocks_evaluated_steps() const final { return !needs_every_query(); }

  int64_t cache_tokens() const override { return cache_.size(); }

 protected:
  /// observe(): token t joins (evicting first when the cache is full); returns the slot it took.
  int64_t observe_slot(int64_t t, const float* k, const float* v) {
    const double init = initial_score(t, k);
    if (cache_.size() < budget_) {
      score_[cache_.size()] = init;
      cache_.append(t, k, v);
      return cache_.size() - 1;
    }
    const int64_t victim = lowest_evictable(t);
    if (victim < 0) throw Error(name_ + ": no evictable token (sink + recent ≥ budget)");
    cache_.put(victim, t, k, v);
    score_[victim] = init;
    slot_replaced(victim);
    return victim;
  }

  /// The victim when token t joins a full cache: the slot with the lowest score among positions ≥ sink that are
  /// not among the `recent` newest after t joins (hd::h2o_evictable), ties to the oldest position
  /// (hd::h2o_prefer's total order); −1 when none is evictable. Two passes: the lowest score in 8 independent
  /// lanes (which the compiler vectorizes), then the oldest position holding it — the same slot as folding
  /// hd::h2o_prefer over the slots, for scores that are not NaN.
  int64_t lowest_evictable(int64_t t) const {
    const int64_t m = cache_.size(), sink = sink_, recent = recent_;
    const int64_t* pos = cache_.positions();
    const double* sc = score_.data();
    auto evictable = [&](int64_t s) { return pos[s] >= sink && hd::h2o_evictable(pos[s], t, recent); };
    double lane[8];
    for (double& l : lane) l = INFINITY;
    int64_t s = 0;
    for (; s + 8 <= m; s += 8)
      for (int k = 0; k < 8; ++k) {
        const double v = evictable(s + k) ? sc[s + k] : INFINITY;
        lane[k] = v < lane[k] ? v : lane[k];
      }
    double best = INFINITY;
    for (; s < m; ++s)
      if (evictable(s)) best = std::min(best, sc[s]);
    for (const double l : lane) best = std::min(best, l);
    int64_t victim = -1;
    for (s = 0; s < m; ++s)
      if (sc[s] == best && evictable(s) && (victim < 0 || pos[s] < pos[victim])) victim = s;
    return victim;
  }

  /// Score of token t (key k [head_dim]) when it joins (H2O: 0; an oracle: its whole-stream score;
  /// KNorm: −‖k‖).
  virtual double initial_score(int64_t /*t*/, const float* /*k*/) { return 0.0; }
  /// The group's attention weight on each of the m cached slots: P's columns combined by group_agg.
  VecD group_weights(const ProbsD& P) const {
    GroupAggregate agg(agg_, P.rows());
    for (Eigen::Index i = 0; i < P.cols(); ++i) agg.add(P.col(i));
    return agg.result();
  }
  // SlotAnswersStepper: the policy and the store its attend() answers from.
  Policy& stepper_policy() final { return *this; }
  const SlotCache& answering_store() const final { return cache_; }
  /// Called when slot `s` is reused for a new token (per-slot state beyond the score resets).
  virtual void slot_replaced(int64_t /*s*/) {}
  /// Updates `score` (one entry per cache slot; slots [0, P.rows()) are filled) after step t's
  /// queries attended with probabilities P [m, G].
  virtual void update_scores(int64_t t, const ProbsD& P, std::vector<double>& score) = 0;

  const std::string name_;
  const int64_t budget_, sink_, recent_;
  const GroupAgg agg_;  ///< group_agg: how the group's attention combines into one score
  SlotCache cache_;
  std::vector<double> score_;

 private:
  // step_block's scratch (no allocation per block once sized)
  MatD block_qd_, block_kd_, block_ld_[2];
  ProbsD block_P_;
  MatF block_qf_, block_lf_[2];
  std::vector<int64_t> block_tok_, block_slots_;  // the block token in each slot (−1: none), the slots taken
  VecD block_col_;
  VecF block_colf_;
};

}  // namespace kvsim::policies
