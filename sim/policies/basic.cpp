// Baseline policies: exact (full cache), window (local), sink (StreamingLLM), oracle_topk, uniform.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// `exact`: keeps every token; its answer is exact attention and log τ is exact.
class ExactPolicy final : public Policy {
 public:
  explicit ExactPolicy(const StreamInfo& s) : cache_(s.n, s.head_dim) {}
  void observe(int64_t t, const float* k, const float* v) override { cache_.append(t, k, v); }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      cache_.attend(q.row(i).transpose(), a.z, a.log_tau);
      a.has_kept = true;
      a.kept.resize(cache_.size());
      std::iota(a.kept.begin(), a.kept.end(), 0);
    }
  }
  int64_t cache_tokens() const override { return cache_.size(); }

 private:
  SlotCache cache_;
};

/// `window` (local attention, H2O §5.1 "Local", BUZZ Fig. 1(b)) and `sink` (StreamingLLM: the first
/// `sink` tokens plus the most recent ones; BUZZ §2, SubGen §3.2). Budget B = sink + window.
class SinkWindowPolicy final : public Policy {
 public:
  SinkWindowPolicy(int64_t sink, int64_t window, int d, bool f32)
      : sink_(sink), window_(window), cache_(sink + window, d, f32) {}
  void observe(int64_t t, const float* k, const float* v) override {
    // Shared with the CUDA path (include/kvsim/core/hd.hpp): the first sink + window tokens fill the
    // slots in order, later ones replace the oldest non-sink token (a ring over the window part).
    const int64_t slot = hd::sink_window_slot(t, sink_, window_);
    if (slot == cache_.size()) cache_.append(t, k, v);
    else cache_.put(slot, t, k, v);
  }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.name = sink_ > 0 ? "sink" : "window";
    r.sink = sink_;
    r.window = window_;
    return r;
  }

 private:
  int64_t sink_, window_;
  SlotCache cache_;
};

/// `oracle_topk` (H2O Fig. 2 "oracle"): for each evaluated query, the B tokens of largest exact
/// attention a_t — not causal, the best any eviction of size B could keep. In kv_head mode the set is
/// shared by the group and chosen by the group-aggregated probabilities (group_agg). It stores the
/// whole stream internally (it is a bound, not a cache) but reports B tokens.
class OracleTopK final : public Policy {
 public:
  OracleTopK(int64_t budget, const StreamInfo& s) : budget_(budget), agg_(s.group_agg), all_(s.n, s.head_dim) {}
  void observe(int64_t t, const float* k, const float* v) override { all_.append(t, k, v); }
  bool needs_exact_probs() const override { return true; }
  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>* probs) override {
    if (!out) return;
    if (!probs) throw Error("oracle_topk: the engine did not pass exact attention");
    GroupAggregate agg(agg_, t);
    for (const double* p : *probs) agg.add(Eigen::Map<const VecD>(p, t));
    const VecD& score = agg.ranking();  // ordering only: the mean's division is not needed
    std::vector<int64_t> idx(t);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t b = std::min(budget_, t);
    // Ties broken by position so the choice is deterministic (hd::topk_prefer: the GPU replay's
    // bitonic sort uses the same total order, so it selects the same set).
    std::nth_element(idx.begin(), idx.begin() + (b - 1), idx.end(),
                     [&](int64_t a, int64_t c) { return hd::topk_prefer(score[a], a, score[c], c); });
    idx.resize(b);
    std::sort(idx.begin(), idx.end());
    MatD keys(b, all_.keys().cols()), values(b, all_.keys().cols());
    for (int64_t r = 0; r < b; ++r) {
      keys.row(r) = all_.keys().row(idx[r]);
      values.row(r) = all_.values().row(idx[r]);
    }
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      double ls;
      attend_cached(keys, values, b, q.row(i).transpose(), a.z, ls);
      a.has_kept = true;
      a.kept = idx;
    }
  }
  int64_t cache_tokens() const override { return std::min(budget_, all_.size()); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.name = "oracle_topk";
    r.budget = budget_;
    r.group_agg = group_agg_code(agg_);
    return r;
  }

 private:
  int64_t budget_;
  std::string agg_;
  SlotCache all_;
};

/// `uniform`: B tokens by reservoir sampling (Vitter's Algorithm R), every token of the prefix kept
/// with probability B/t. The partition function estimate is τ̂ = (t/B)·Σ_{j∈S} exp(<k_j, q̃>)
/// (unbiased); the output is the softmax over the sample. Each token's draw is hd::reservoir_slot:
/// Philox at (stream seed, token), so the GPU replay (sim/cuda/policies.cu) keeps the same samples.
class UniformPolicy final : public Policy {
 public:
  UniformPolicy(int64_t budget, const StreamInfo& s)
      : budget_(budget), seed_(s.seed), cache_(budget, s.head_dim, s.policy_f32) {}
  void observe(int64_t t, const float* k, const float* v) override {
    const int64_t slot = hd::reservoir_slot(seed_, t, budget_);
    if (slot == cache_.size()) cache_.append(t, k, v);
    else if (slot >= 0) cache_.put(slot, t, k, v);
  }
  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      a.log_tau = hd::uniform_log_tau(cache_.answer(q.row(i).transpose(), a), t, cache_.size());
    }
  }
  int64_t cache_tokens() const override { return cache_.size(); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.name = "uniform";
    r.budget = budget_;
    r.seeds = {seed_};
    return r;
  }

 private:
  int64_t budget_;
  uint64_t seed_;
  SlotCache cache_;
};

}  // namespace

std::unique_ptr<Policy> make_exact(const Params&, const StreamInfo& s) { return std::make_unique<ExactPolicy>(s); }

std::unique_ptr<Policy> make_window(const Params& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<SinkWindowPolicy>(0, b, s.head_dim, s.policy_f32);
}

std::unique_ptr<Policy> make_sink(const Params& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  int64_t sink = p.get_int("sink", 4);
  if (sink < 0) throw Error("parameter 'sink' must be ≥ 0" + p.where("sink"));
  if (b <= sink)
    throw Error("budget (" + std::to_string(b) + " tokens) must exceed 'sink' (" + std::to_string(sink) +
                ") to leave room for a window" + p.where("budget"));
  return std::make_unique<SinkWindowPolicy>(sink, b - sink, s.head_dim, s.policy_f32);
}

std::unique_ptr<Policy> make_oracle_topk(const Params& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<OracleTopK>(b, s);
}

std::unique_ptr<Policy> make_uniform(const Params& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<UniformPolicy>(b, s);
}

}  // namespace kvsim::policies
