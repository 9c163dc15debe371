// `keydiff`: KeyDiff (Park et al., 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context
// LLM Inference in Resource-Constrained Environments", §3, Eq. 3-4 and Algorithm 1). Tokens whose keys
// point where the cache's keys point on average carry little that the others do not: the cache keeps
// the keys *least* similar to the anchor, the mean of the cached keys normalized to unit length,
//   score(j) = −cos(k_j, ā),  ā = (1/m) Σ_i k_i / ‖k_i‖,
// and evicts the highest-cosine token first. No attention weight is needed (fused kernels suffice).
//
// With a prompt (`[data] prefill = P`), the prompt is one block (Algorithm 1 with the block = the
// prompt, as kvpress's KeyDiffPress does): the anchor is taken over the P prompt keys and the B
// highest-scored tokens stay (ties: the earlier position). After that, and for a stream without a prompt,
// the blocks are single tokens: token t joins, and if the cache then holds B + 1 tokens, the older
// token with the highest cosine to the anchor of all B + 1 keys leaves (ties: the oldest), so the
// cache that answers q_t holds min(t, B) tokens including token t. The normalized key uses
// max(‖k‖, 1e-12), as torch's F.normalize.
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

class KeyDiffPolicy final : public Policy, public PromptCompressor, public SlotAnswersStepper {
 public:
  KeyDiffPolicy(int64_t budget, const StreamInfo& s)
      : B_(budget), d_(s.head_dim), cache_(budget, s.head_dim, s.policy_f32), unit_(budget, s.head_dim), sum_(VecD::Zero(s.head_dim)) {}

  void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>&) override {
    MatD unit(P, d_);
    for (int64_t j = 0; j < P; ++j) unit.row(j) = normalized(K.row(j).data()).transpose();
    const VecD anchor = unit.colwise().mean().transpose();
    const double an = anchor.norm();
    VecD score(P);
    for (int64_t j = 0; j < P; ++j) {
      const double kn = double(K.row(j).cast<double>().norm());
      score[j] = -K.row(j).cast<double>().dot(anchor) / std::max(kn * an, 1e-8);  // torch's cosine_similarity
    }
    for (int64_t j : top_rows(score, B_)) join(j, K.row(j).data(), V.row(j).data(), unit.row(j).transpose());
  }

  void observe(int64_t t, const float* k, const float* v) override {
    const VecD u = normalized(k);
    if (cache_.size() < B_) return join(t, k, v, u);
    // Block of one token: the anchor over the B cached keys and k_t; the older key closest to it leaves.
    const VecD anchor = sum_ + u;
    int64_t victim = 0;
    double best = -INFINITY;
    for (int64_t s = 0; s < cache_.size(); ++s) {
      const double c = unit_.row(s).dot(anchor);  // ∝ cos(k_s, anchor): the anchor's norm is common
      if (c > best || (c == best && cache_.position(s) < cache_.position(victim))) best = c, victim = s;
    }
    sum_ -= unit_.row(victim).transpose();
    cache_.put(victim, t, k, v);
    unit_.row(victim) = u.transpose();
    sum_ += u;
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (out) cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }

 private:
  VecD normalized(const float* k) const {
    VecD u = Eigen::Map<const VecF>(k, d_).cast<double>();
    return u / std::max(u.norm(), 1e-12);
  }
  void join(int64_t t, const float* k, const float* v, const VecD& u) {
    unit_.row(cache_.size()) = u.transpose();
    cache_.append(t, k, v);
    sum_ += u;
  }

  const int64_t B_;
  const int d_;
  SlotCache cache_;
  MatD unit_;  ///< each slot's key / ‖key‖
  VecD sum_;   ///< Σ of the cached unit keys (the anchor × the cache size)
};

std::unique_ptr<Policy> make_keydiff(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<KeyDiffPolicy>(b, s);
}

}  // namespace

KVSIM_POLICY(keydiff) {
  static const PolicyInfo info{
      "keydiff",
      "keep the keys least similar to the anchor (the mean unit-length cached key): a prompt is one block (its B "
      "lowest-cosine tokens stay, as kvpress's KeyDiffPress), then each new token joins and the older token with "
      "the highest cosine to the anchor leaves",
      "KeyDiff (Park et al., 2025) §3, Eq. 3-4, Algorithm 1",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"}},
      make_keydiff,
      budget_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}})},
      "#5254a3",  // figure colour
      // kvsim bench: parameters, after a prefill, float32 too; its rule's d·m cosines per step (observe's scan)
      {example_params({{"budget", 0.25}}), false, true, 1}};
  return info;
}

}  // namespace kvsim::policies
