// `exact`: the full cache — the reference check of the whole pipeline (its error is ~1e-15).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/policies/gpu_replay.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// `exact`: keeps every token; its answer is exact attention and log τ is exact. With `--device cuda`
/// the engine answers it from the GPU reference instead (ReferenceAnswered).
class ExactPolicy final : public Policy, public ReferenceAnswered {
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

std::unique_ptr<Policy> make_exact(ParamReader&, const StreamInfo& s) { return std::make_unique<ExactPolicy>(s); }

}  // namespace

KVSIM_POLICY(exact) {
  static const PolicyInfo info{
      "exact", "every token: exact attention and exact log τ (the pipeline's reference check, error ~1e-15)", "—",
      {}, make_exact, std::nullopt, "yes (the GPU exact reference)", {Params{}},
      "#7f7f7f",  // figure colour
      {}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
