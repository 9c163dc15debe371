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

/// `exact`: keeps every token; its answer is exact attention and log τ is exact (SubGen Eq. 2's τ),
/// always in double. With `--device cuda` the engine answers it from the GPU reference instead
/// (ReferenceAnswered). Its cache is a closed form of the step — every token so far, a window as long
/// as the stream — so the CPU engine answers a block of its evaluated steps with two GEMMs
/// (ClosedFormPolicy; include/kvsim/replay/banded.hpp), in double as here, with the same log τ.
class ExactPolicy final : public Policy, public ReferenceAnswered, public ClosedFormPolicy {
 public:
  explicit ExactPolicy(const StreamInfo& s) : n_(s.n), cache_(s.n, s.head_dim, false, /*lazy=*/true) {}
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
  ClosedFormCache closed_form() const override {
    ClosedFormCache c{0, n_};
    c.log_tau = true;
    c.double_only = true;
    return c;
  }

 private:
  int64_t n_;
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
