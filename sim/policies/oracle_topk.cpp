// `oracle_topk`: the non-causal top-B bound (H2O Fig. 2 "oracle").
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

/// `oracle_topk` (H2O Fig. 2 "oracle"): for each evaluated query, the B tokens of largest exact
/// attention a_t — not causal, the best any eviction of size B could keep. In kv_head mode the set is
/// shared by the group and chosen by the group-aggregated probabilities (group_agg). It stores the
/// whole stream internally (it is a bound, not a cache) but reports B tokens.
class OracleTopK final : public Policy, public ExactProbsOracle, public GpuReplayable {
 public:
  OracleTopK(int64_t budget, const StreamInfo& s) : budget_(budget), agg_(s.group_agg), all_(s.n, s.head_dim) {}
  void observe(int64_t t, const float* k, const float* v) override { all_.append(t, k, v); }
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
    // Attention over the chosen rows, read where they are stored (a gathered copy of the B rows was
    // half of this function's time): each row's G logits, a softmax per query, then z = Σ_r p_r v_r
    // over the same rows — attend_cached's arithmetic (double), the logits' sums in another order.
    const MatD &K = all_.keys(), &V = all_.values();
    const Eigen::Index G = q.rows();
    logits_.resize(b, G);  // column-major: one query's logits are contiguous
    for (int64_t r = 0; r < b; ++r)
      for (Eigen::Index g = 0; g < G; ++g) logits_(r, g) = K.row(idx[r]).dot(q.row(g));
    VecD inv(G);
    for (Eigen::Index g = 0; g < G; ++g) {
      auto col = logits_.col(g);
      col = (col.array() - col.maxCoeff()).exp();
      inv[g] = 1.0 / col.sum();
    }
    z_.setZero(G, K.cols());
    for (int64_t r = 0; r < b; ++r)
      for (Eigen::Index g = 0; g < G; ++g) z_.row(g).noalias() += logits_(r, g) * V.row(idx[r]);
    for (Eigen::Index i = 0; i < G; ++i) {
      Answer& a = (*out)[i];
      a.z = z_.row(i).transpose() * inv[i];
      a.has_kept = true;
      a.kept = idx;
    }
  }
  int64_t cache_tokens() const override { return std::min(budget_, all_.size()); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.kind = cuda::ReplayKind::oracle_topk;
    r.budget = budget_;
    r.group_agg = static_cast<int>(agg_);
    return r;
  }

 private:
  int64_t budget_;
  GroupAgg agg_;
  SlotCache all_;
  Eigen::MatrixXd logits_;  // scratch: the chosen rows' logits [B, G], then their weights
  MatD z_;                  // scratch: the unnormalized answers [G, head_dim]
};

std::unique_ptr<Policy> make_oracle_topk(ParamReader& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<OracleTopK>(b, s);
}

}  // namespace

KVSIM_POLICY(oracle_topk) {
  static const PolicyInfo info{
      "oracle_topk",
      "per evaluated query, the `budget` tokens of largest exact attention (not causal: the best any eviction of "
      "that size could keep; in kv_head mode one set per KV group by group_agg)",
      "H2O Fig. 2 \"oracle\"",
      {{"budget", "tokens", "required", "cache size B: tokens, or a fraction of n"}},
      make_oracle_topk,
      budget_memory_rule(),
      "yes",
      {example_params({{"budget", 0.25}})},
      "#17becf",  // figure colour
      {}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
