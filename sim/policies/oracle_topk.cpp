// `oracle_topk`: the non-causal top-B bound (H2O Fig. 2 "oracle").
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"

namespace kvsim::policies {
namespace {

/// `oracle_topk` (H2O Fig. 2 "oracle"): for each evaluated query, the B tokens of largest exact
/// attention a_t — not causal, the best any eviction of size B could keep. In kv_head mode the set is
/// shared by the group and chosen by the group-aggregated probabilities (group_agg). It stores the
/// whole stream internally (it is a bound, not a cache) but reports B tokens. Its answer is the exact rows it is
/// handed renormalized over its set, so with `[eval] reference_precision = "float32"` it carries that reference's
/// float32 rounding, as the exact policy does.
class OracleTopK final : public Policy, public ExactProbsOracle, public GpuReplayable {
 public:
  OracleTopK(int64_t budget, const StreamInfo& s) : budget_(budget), agg_(s.group_agg), values_(s.n, s.head_dim) {}
  void observe(int64_t t, const float* k, const float* v) override {
    (void)k;  // the logits come with the exact rows (ExactProbsOracle): no key is read
    if (t >= values_.rows())
      throw Error("oracle_topk: token " + std::to_string(t) + " beyond the stream's " + std::to_string(values_.rows()) + " tokens");
    if (t != size_) throw Error("oracle_topk: token " + std::to_string(t) + " observed out of order (expected " + std::to_string(size_) + ")");
    values_.row(t) = Eigen::Map<const Eigen::Matrix<float, 1, Eigen::Dynamic>>(v, values_.cols());
    ++size_;
  }
  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>* probs) override {
    if (!out) return;
    if (!probs) throw Error("oracle_topk: the engine did not pass exact attention");
    GroupAggregate agg(agg_, t);
    for (const double* p : *probs) agg.add(Eigen::Map<const VecD>(p, t));
    const int64_t b = std::min(budget_, t);
    choose(agg.ranking(), t, b);  // ordering only: the mean's division is not needed
    // The answer over the chosen rows S: softmax over S of the logits l = the exact row a_t renormalized over S,
    // since a_t(j) = exp(l_j − log τ): z = Σ_{j∈S} a_t(j) v_j / Σ_{j∈S} a_t(j). Only the values of S are read.
    const Eigen::Index G = q.rows();
    z_.setZero(G, values_.cols());
    VecD mass = VecD::Zero(G);
    for (int64_t j : idx_)
      for (Eigen::Index g = 0; g < G; ++g) {
        const double a = (*probs)[size_t(g)][j];
        mass[g] += a;
        z_.row(g).noalias() += a * values_.row(j).cast<double>();
      }
    for (Eigen::Index i = 0; i < G; ++i) {
      Answer& a = (*out)[i];
      a.z = z_.row(i).transpose() / mass[i];
      a.has_kept = true;
      a.kept = idx_;
    }
  }
  int64_t cache_tokens() const override { return std::min(budget_, size_); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.kind = cuda::ReplayKind::oracle_topk;
    r.budget = budget_;
    r.group_agg = static_cast<int>(agg_);
    return r;
  }

 private:
  /// idx_ = the b positions first in hd::topk_prefer's order (larger score, ties to the older position:
  /// the GPU replay's bitonic sort selects the same set), ascending: the b-th largest score θ by
  /// nth_element over a copy of the scores, then one pass taking every score above θ and, oldest first,
  /// as many equal to θ as b still needs.
  void choose(const VecD& score, int64_t t, int64_t b) {
    sorted_.assign(score.data(), score.data() + t);
    std::nth_element(sorted_.begin(), sorted_.begin() + (b - 1), sorted_.end(), std::greater<double>());
    const double theta = sorted_[size_t(b - 1)];
    int64_t above = 0;
    for (int64_t j = 0; j < t; ++j) above += score[j] > theta;
    int64_t ties = b - above;
    idx_.clear();
    for (int64_t j = 0; j < t; ++j)
      if (score[j] > theta || (score[j] == theta && ties-- > 0)) idx_.push_back(j);
  }

  int64_t budget_;
  GroupAgg agg_;
  MatF values_;  // the stream's values v_j, row j, as recorded (it stores them all: a bound, not a cache)
  int64_t size_ = 0;
  std::vector<double> sorted_;  // choose() scratch: the scores, partly ordered
  std::vector<int64_t> idx_;    // the chosen positions, ascending
  MatD z_;                      // scratch: the unnormalized answers [G, head_dim]
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
