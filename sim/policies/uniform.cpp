// `uniform`: reservoir sampling of B tokens with an unbiased partition-function estimate.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// `uniform`: B tokens by reservoir sampling (Vitter's Algorithm R), every token of the prefix kept
/// with probability B/t. The partition function estimate is τ̂ = (t/B)·Σ_{j∈S} exp(<k_j, q̃>)
/// (unbiased); the output is the softmax over the sample. Each token's draw is hd::reservoir_slot:
/// Philox at (stream seed, token), so the GPU replay (sim/cuda/policies.cu) keeps the same samples.
class UniformPolicy final : public Policy, public GpuReplayable, public SlotAnswersStepper {
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
    r.kind = cuda::ReplayKind::uniform;
    r.budget = budget_;
    r.seeds = {seed_};
    return r;
  }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }
  double answer_log_tau(double log_sum, int64_t t, int64_t m) const override { return hd::uniform_log_tau(log_sum, t, m); }

 private:
  int64_t budget_;
  uint64_t seed_;
  SlotCache cache_;
};

std::unique_ptr<Policy> make_uniform(ParamReader& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<UniformPolicy>(b, s);
}

}  // namespace

KVSIM_POLICY(uniform) {
  static const PolicyInfo info{
      "uniform",
      "`budget` tokens by reservoir sampling (Philox draw per token, shared with the GPU); "
      "τ̂ = (t/B)·Σ_S e^{⟨k,q̃⟩}",
      "baseline (Vitter's Algorithm R)",
      {{"budget", "tokens", "required", "cache size B: tokens, or a fraction of n"}},
      make_uniform,
      budget_memory_rule(),
      "yes",
      {example_params({{"budget", 0.25}})},
      "#d62728",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
