// Internal: the SnapKV prompt selection (Li et al., 2024, "SnapKV: LLM Knows What You are Looking
// for Before Generation", §4.1 Algorithm 1 and Eq. 1-2) shared by `snapkv` (sim/policies/snapkv.cpp)
// and `pyramidkv` (sim/policies/pyramidkv.cpp, which only changes the budget per layer).
//
// Prefill (kvsim::prefill, `[data] prefill = P`): the last w prompt queries (the observation
// window, w' = min(w, P)) vote for the P − w' earlier prompt tokens: for each query head,
//   C(j) = Σ_{i = P−w'}^{P−1} softmax(K_{0..i} q̃_i)(j)                        (Eq. 1, summed over the window)
// then 1-D pooling over positions (kernel k, stride 1, padding ⌊k/2⌋; "max": max_pool1d; "avg":
// avg_pool1d with the zero padding counted, as torch's defaults do), then the group's heads combine by
// group_agg (kvpress's GQA rule: pool per head, then average over the group). The top B − w' tokens
// by that score (ties: the earlier position) and the w' window tokens form the cache (Eq. 2); a prompt
// of P ≤ B tokens is kept whole.
//
// Decode (t = P+1..n): every decoded token joins. With decode_window = −1 (the paper) nothing is
// evicted and the cache grows by one token per step. With decode_window = D ≥ 1 the cache never
// exceeds B: when full, the oldest decoded token is evicted if D decoded tokens are held; otherwise a
// prompt token — the observation window's tokens first (oldest first: the decode window takes over
// their role of "recent"), then the selected tokens by increasing score. At steady state the cache is
// the B − D best-scored prompt tokens plus the D newest decoded ones.
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {

/// Per-prompt-token SnapKV scores of one query head: Eq. 1 summed over the last w' prompt queries,
/// then pooled. K [≥ P, d] keys, q_scaled [≥ P, d] scaled queries; returns P − w' scores (token j).
inline VecD snapkv_head_scores(int64_t P, int64_t w, int kernel, bool maxpool, const MatF& K, const MatD& q_scaled) {
  const int64_t prefix = P - w;
  VecD vote = VecD::Zero(std::max<int64_t>(prefix, 0));
  if (prefix <= 0) return vote;
  const MatD Kd = K.topRows(P).cast<double>();
  for (int64_t i = P - w; i < P; ++i) {
    VecD logit = Kd.topRows(i + 1) * q_scaled.row(i).transpose();  // causal: keys 0..i
    const double mx = logit.maxCoeff();
    logit = (logit.array() - mx).exp().matrix();
    vote += logit.head(prefix) / logit.sum();
  }
  VecD pooled(prefix);
  const int64_t half = kernel / 2;
  for (int64_t j = 0; j < prefix; ++j) {
    double acc = maxpool ? -INFINITY : 0.0;
    for (int64_t u = std::max<int64_t>(0, j - half); u <= std::min(prefix - 1, j + half); ++u)
      acc = maxpool ? std::max(acc, vote[u]) : acc + vote[u];
    pooled[j] = maxpool ? acc : acc / double(kernel);
  }
  return pooled;
}

class SnapKVPolicy final : public Policy, public PromptCompressor, public LayerMemoryShare, public SlotAnswersStepper {
 public:
  /// budget B ≥ 2 tokens after the prompt; window w in [1, B]; kernel k odd ≥ 1; decode_window D = −1
  /// (append every decoded token) or in [1, B]; `share` = memory_share (pyramidkv's B_l / M).
  SnapKVPolicy(std::string name, int64_t budget, int64_t window, int kernel, bool maxpool, int64_t decode_window,
               double share, const StreamInfo& s)
      : name_(std::move(name)), B_(budget), w_(window), kernel_(kernel), maxpool_(maxpool), D_(decode_window),
        share_(share), agg_(s.group_agg),
        cache_(decode_window < 0 ? budget + std::max<int64_t>(0, s.n - s.prefill) : budget, s.head_dim, s.policy_f32) {}

  void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled) override {
    const int64_t w = std::min(w_, P), prefix = P - w;
    GroupAggregate agg(agg_, prefix);
    for (const MatD* q : q_scaled) agg.add(snapkv_head_scores(P, w, kernel_, maxpool_, K, *q));
    const VecD score = agg.result();
    std::vector<int64_t> order(static_cast<size_t>(prefix));
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = P <= B_ ? prefix : B_ - w;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    std::vector<char> kept(size_t(P), 0);
    for (int64_t i = 0; i < keep; ++i) kept[size_t(order[size_t(i)])] = 1;
    for (int64_t j = prefix; j < P; ++j) kept[size_t(j)] = 1;
    for (int64_t j = 0; j < P; ++j) {
      if (!kept[size_t(j)]) continue;
      cache_.append(j, K.row(j).data(), V.row(j).data());
      kind_.push_back(j < prefix ? kSelected : kWindow);
      score_.push_back(j < prefix ? score[j] : INFINITY);
    }
    prefilled_ = true;
  }

  void observe(int64_t t, const float* k, const float* v) override {
    if (!prefilled_) throw Error(name_ + ": token " + std::to_string(t) + " arrived before the prompt (set [data] prefill = P)");
    if (cache_.size() < cache_.capacity()) {
      cache_.append(t, k, v);
      kind_.push_back(kDecoded);
      score_.push_back(INFINITY);
      ++decoded_;
      return;
    }
    const int64_t s = victim();
    if (kind_[size_t(s)] == kDecoded) --decoded_;
    cache_.put(s, t, k, v);
    kind_[size_t(s)] = kDecoded;
    score_[size_t(s)] = INFINITY;
    ++decoded_;
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (out) cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }
  double memory_share() const override { return share_; }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }

 private:
  enum Kind : char { kSelected, kWindow, kDecoded };

  /// The slot a decoded token replaces in a full cache (see the header comment).
  int64_t victim() const {
    int64_t best = -1;
    auto older = [&](int64_t a, int64_t b) { return cache_.position(a) < cache_.position(b); };
    const bool decode_full = decoded_ >= D_;
    for (const Kind want : {decode_full ? kDecoded : kWindow, kWindow, kSelected, kDecoded}) {
      for (int64_t s = 0; s < cache_.size(); ++s) {
        if (kind_[size_t(s)] != want) continue;
        if (best < 0) best = s;
        else if (want == kSelected ? (score_[size_t(s)] < score_[size_t(best)] ||
                                      (score_[size_t(s)] == score_[size_t(best)] && older(s, best)))
                                   : older(s, best))
          best = s;
      }
      if (best >= 0) return best;
    }
    throw Error(name_ + ": empty cache cannot evict");
  }

  const std::string name_;
  const int64_t B_, w_;
  const int kernel_;
  const bool maxpool_;
  const int64_t D_;
  const double share_;
  const GroupAgg agg_;
  SlotCache cache_;
  std::vector<Kind> kind_;
  std::vector<double> score_;
  int64_t decoded_ = 0;
  bool prefilled_ = false;
};

/// The observation window: `window`, default min(32, ⌊budget/2⌋) (the paper's 32 where it fits).
/// Parameters shared by snapkv and pyramidkv, given the window (snapkv_window): kernel, pooling,
/// decode_window (scaled by `share` for pyramidkv's layer budgets: D_l = max(1, round(D·share)));
/// checked against budget B. Returns the policy.
inline int64_t snapkv_window(ParamReader& p, int64_t budget) {
  return p.get_int("window", std::min<int64_t>(32, budget / 2));
}

inline std::unique_ptr<Policy> make_snapkv_like(const std::string& name, ParamReader& p, const StreamInfo& s,
                                                int64_t budget, double share, int64_t window) {
  if (s.prefill <= 0)
    throw Error("needs a prompt: set [data] prefill = P (≥ 1 tokens; [model] prefill in closed-loop configs)");
  if (budget < 2) throw Error("parameter 'budget' must be at least 2 tokens (a window and one selected token)" + p.where("budget"));
  if (window < 1 || window > budget)
    throw Error("parameter 'window' must be in [1, budget] (budget " + std::to_string(budget) + ")" + p.where("window"));
  const int64_t kernel = p.get_int("kernel");
  if (kernel % 2 == 0) throw Error("parameter 'kernel' must be odd, in [1, 257]" + p.where("kernel"));
  const std::string pooling = p.get_string("pooling");
  const int64_t D0 = p.get_int("decode_window");
  const int64_t D = D0 > 0 ? std::max<int64_t>(1, std::llround(double(D0) * share)) : D0;
  if (D != -1 && (D < 1 || D > budget))
    throw Error("parameter 'decode_window' must be -1 (keep every decoded token) or in [1, budget]" + p.where("decode_window"));
  return std::make_unique<SnapKVPolicy>(name, budget, window, int(kernel), pooling == "max", D, share, s);
}

/// The parameter table snapkv and pyramidkv share (after their budget).
inline std::vector<ParamInfo> snapkv_params() {
  return {{"window", "int", "min(32, ⌊budget/2⌋)", "observation window w: the last w prompt queries vote; its tokens are kept"},
          {"kernel", "int", "7", "pooling kernel size (odd)", "[1, 257]"},
          {"pooling", "string", "max", "\"max\" (max_pool1d) or \"avg\" (avg_pool1d) over positions", "max|avg"},
          {"decode_window", "int", "-1", "-1: keep every decoded token (the paper); D ≥ 1: never above budget, the D newest "
                                         "decoded tokens replace the window and then the lowest-scored prompt tokens"}};
}

}  // namespace kvsim::policies
