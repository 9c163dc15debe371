// `expected_attention`: Expected Attention (Devoto et al., 2025, "Expected Attention: KV Cache
// Compression by Estimating Attention from Future Queries Distribution", arXiv:2510.00636), with the
// scoring of kvpress's ExpectedAttentionPress. The future queries are modelled as a Gaussian fitted
// to the prompt's queries before RoPE, rotated by the average RoPE of the next `n_future` positions;
// a key's score is its expected unnormalized attention under that Gaussian (the log-normal mean):
//   μ, Σ: mean and covariance (1/(P − s) Σ_t) of the pre-RoPE queries q_t, t = s..P−1 (s = `sink`),
//   R̄ = (1/F) Σ_{p=P}^{P+F−1} R(p),  μ' = R̄ μ,  Σ' = R̄ Σ R̄ᵀ          (F = n_future),
//   a_j = μ'·k_j / √d + k_jᵀ Σ' k_j / (2d)   (the second term with covariance = true),
//   score_j = (softmax_j(a) + ε) · ‖v_j‖ over the prompt tokens j ≥ s (the norm with vnorm = true),
// averaged over the KV head's query heads (group_agg), the s sink tokens always kept. The B best
// prompt tokens stay (ties: the earlier position).
//
// The recording holds post-RoPE queries: q_t before RoPE is R(t)ᵀ q_t / softmax_scale, with R's
// angles t·θ^(−2k/d) computed in float32 as transformers does (the recording's rope_theta and
// rope_pairs; a recording with rope = "none", e.g. synthetic, is taken as unrotated: R = I).
// Decoding appends every token (kvpress compresses the prompt only); with decode_window = D ≥ 1 the
// cache stays at B: the D newest decoded tokens, then the lowest-scored prompt tokens leave first.
// Needs `[data] prefill = P`.
#include <algorithm>
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// RoPE as transformers' default builds it, in float32: pair k's inverse frequency θ^(−2k/d), and the
/// cosine and sine of its angle inv·t at position t.
std::vector<float> rope_inverse_frequencies(double theta, int d) {
  std::vector<float> inv(size_t(d / 2));
  for (int k = 0; k < d / 2; ++k) inv[size_t(k)] = 1.0f / std::pow(float(theta), float(2 * k) / float(d));
  return inv;
}
void rope_angle(float inv, int64_t t, double* c, double* s) {
  const float angle = inv * float(t);
  *c = double(std::cos(angle));
  *s = double(std::sin(angle));
}

/// Pair k's channels: (k, k + d/2) with `halves`, else (2k, 2k + 1).
int pair_a(bool halves, int k) { return halves ? k : 2 * k; }
int pair_b(bool halves, int d, int k) { return halves ? k + d / 2 : 2 * k + 1; }

class ExpectedAttentionPolicy final : public Policy, public PromptCompressor, public SlotAnswersStepper {
 public:
  struct Options {
    int64_t budget, n_future, sink, decode_window;
    bool covariance, vnorm;
    double epsilon;
  };
  ExpectedAttentionPolicy(const Options& o, const StreamInfo& s)
      : o_(o), s_(s), inv_(s.rope_applied ? rope_inverse_frequencies(s.rope_theta, s.head_dim) : std::vector<float>{}),
        cache_(o.decode_window < 0 ? o.budget + std::max<int64_t>(0, s.n - s.prefill) : o.budget, s.head_dim,
               s.policy_f32) {}

  void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled) override {
    const int d = s_.head_dim;
    const int64_t first = std::min(o_.sink, P), m = P - first;
    VecD score = VecD::Zero(P);
    if (m > 0) {
      GroupAggregate agg(s_.group_agg, m);
      const MatD Kd = K.middleRows(first, m).cast<double>();
      const MatD Rbar = average_rope(P, d);
      for (const MatD* q : q_scaled) agg.add(head_scores(*q, Kd, Rbar, P, first));
      VecD sc = agg.result();
      if (o_.vnorm)
        for (int64_t j = 0; j < m; ++j) sc[j] = (sc[j] + o_.epsilon) * V.row(first + j).cast<double>().norm();
      score.tail(m) = sc;
      score.head(first).setConstant(sc.maxCoeff() + 1);  // kvpress: the sinks score above every token
    }
    for (int64_t j : top_rows(score, o_.budget)) {
      cache_.append(j, K.row(j).data(), V.row(j).data());
      score_.push_back(score[j]);
    }
    prefilled_ = true;
  }

  void observe(int64_t t, const float* k, const float* v) override {
    if (!prefilled_) throw Error("expected_attention: token " + std::to_string(t) + " arrived before the prompt (set [data] prefill = P)");
    if (cache_.size() < cache_.capacity()) {
      cache_.append(t, k, v);
      score_.push_back(INFINITY);
      ++decoded_;
      return;
    }
    // decode_window D: the oldest decoded token once D are held, else the lowest-scored prompt token.
    int64_t victim = -1;
    for (int64_t s = 0; s < cache_.size(); ++s) {
      const bool dec = std::isinf(score_[size_t(s)]);
      if (dec != (decoded_ >= o_.decode_window)) continue;
      if (victim < 0 || (dec ? cache_.position(s) < cache_.position(victim)
                             : score_[size_t(s)] < score_[size_t(victim)] ||
                                   (score_[size_t(s)] == score_[size_t(victim)] && cache_.position(s) < cache_.position(victim))))
        victim = s;
    }
    if (victim < 0) throw Error("expected_attention: no token to evict (internal)");
    if (std::isinf(score_[size_t(victim)])) --decoded_;
    cache_.put(victim, t, k, v);
    score_[size_t(victim)] = INFINITY;
    ++decoded_;
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (out) cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }

 private:
  /// R̄: the mean of R(p) over the n_future positions after the prompt (identity without RoPE);
  /// R(p) turns pair k's channels (a, b) by its angle: x'_a = c x_a − s x_b, x'_b = s x_a + c x_b.
  MatD average_rope(int64_t P, int d) const {
    MatD R = MatD::Identity(d, d);
    if (!s_.rope_applied) return R;
    for (int k = 0; k < d / 2; ++k) {
      double cs = 0, sn = 0, c, s;
      for (int64_t p = P; p < P + o_.n_future; ++p) {
        rope_angle(inv_[size_t(k)], p, &c, &s);
        cs += c;
        sn += s;
      }
      cs /= double(o_.n_future);
      sn /= double(o_.n_future);
      const int a = pair_a(s_.rope_halves, k), b = pair_b(s_.rope_halves, d, k);
      R(a, a) = cs, R(a, b) = -sn, R(b, a) = sn, R(b, b) = cs;
    }
    return R;
  }

  /// R(t)ᵀ q: a post-RoPE query at token t turned back (identity without RoPE).
  VecD unrotate(VecD q, int64_t t) const {
    if (!s_.rope_applied) return q;
    const int d = s_.head_dim;
    double c, s;
    for (int k = 0; k < d / 2; ++k) {
      rope_angle(inv_[size_t(k)], t, &c, &s);
      const int a = pair_a(s_.rope_halves, k), b = pair_b(s_.rope_halves, d, k);
      const double x = q[a], y = q[b];
      q[a] = c * x + s * y;
      q[b] = c * y - s * x;
    }
    return q;
  }

  /// softmax over the m = P − first prompt keys Kd of one query head's expected logits.
  VecD head_scores(const MatD& q_scaled, const MatD& Kd, const MatD& Rbar, int64_t P, int64_t first) const {
    const int d = s_.head_dim;
    const int64_t m = P - first;
    const double scale = s_.softmax_scale > 0 ? s_.softmax_scale : 1.0 / std::sqrt(double(d));
    MatD pre(m, d);  // the queries before RoPE, unscaled
    for (int64_t t = first; t < P; ++t) pre.row(t - first) = unrotate(q_scaled.row(t).transpose() / scale, t).transpose();
    const VecD mu = pre.colwise().mean().transpose();
    const VecD mu_r = Rbar * mu;
    VecD a = Kd * mu_r / std::sqrt(double(d));
    if (o_.covariance) {
      const MatD c = pre.rowwise() - mu.transpose();
      const MatD cov_r = Rbar * ((c.transpose() * c) / double(m)) * Rbar.transpose();
      a += ((Kd * cov_r).cwiseProduct(Kd)).rowwise().sum() / double(d) / 2.0;
    }
    const double mx = a.maxCoeff();
    VecD e = (a.array() - mx).exp().matrix();
    return e / e.sum();
  }

  const Options o_;
  const StreamInfo s_;
  const std::vector<float> inv_;  ///< RoPE's inverse frequency per pair (empty without RoPE)
  SlotCache cache_;
  std::vector<double> score_;  ///< per slot: the prompt token's score, +inf for a decoded token
  int64_t decoded_ = 0;
  bool prefilled_ = false;
};

std::unique_ptr<Policy> make_expected_attention(ParamReader& p, const StreamInfo& s) {
  ExpectedAttentionPolicy::Options o{};
  o.budget = p.get_budget("budget", s.n);
  if (o.budget < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  o.n_future = p.get_int("n_future");
  o.sink = p.get_int("sink");
  o.decode_window = p.get_int("decode_window");
  if (o.decode_window == 0 || o.decode_window < -1 || o.decode_window > o.budget)
    throw Error("parameter 'decode_window' must be -1 (append) or in [1, budget]" + p.where("decode_window"));
  o.covariance = p.get_bool("covariance");
  o.vnorm = p.get_bool("vnorm");
  o.epsilon = p.get_double("epsilon");
  if (s.rope_applied && !(s.rope_theta > 0))
    throw Error("policy 'expected_attention' needs the recording's RoPE (attributes rope_theta and rope_pairs, written by "
                "kvsim record and datasets/export_hf.py); this recording has post-RoPE queries without them");
  return std::make_unique<ExpectedAttentionPolicy>(o, s);
}

}  // namespace

KVSIM_POLICY(expected_attention) {
  static const PolicyInfo info{
      "expected_attention",
      "prefill: keep the prompt tokens with the largest expected attention from future queries (a Gaussian fitted to the "
      "prompt's queries before RoPE, rotated by the average RoPE of the next n_future positions), times ‖v‖, sinks "
      "always (kvpress's ExpectedAttentionPress); decoded tokens are appended (decode_window = D: the cache stays at B). "
      "Needs [data] prefill",
      "Expected Attention (Devoto et al., 2025, arXiv:2510.00636), as kvpress's ExpectedAttentionPress scores it",
      {{"budget", "tokens", "required", "tokens kept from the prompt, B (≥ 1); with decode_window the cache size"},
       {"n_future", "int", "512", "future positions whose RoPE is averaged (n_future_positions)", "[1, inf)"},
       {"sink", "int", "4", "first tokens always kept and left out of the query statistics (n_sink)", "[0, inf)"},
       {"covariance", "bool", "true", "add the query covariance term kᵀΣ'k/(2d) (use_covariance)"},
       {"vnorm", "bool", "true", "multiply the scores by ‖v‖ (use_vnorm)"},
       {"epsilon", "float", "0", "added to the scores before the ‖v‖ factor", "[0, inf)"},
       {"decode_window", "int", "-1", "-1: decoded tokens are appended; D in [1, budget]: the D newest decoded tokens "
                                      "replace the lowest-scored prompt tokens, so the cache never exceeds B"}},
      make_expected_attention,
      prompt_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}}), example_params({{"budget", 0.25}, {"covariance", false}, {"n_future", int64_t(64)},
                                                          {"decode_window", int64_t(4)}})},
      "#7b4173",  // figure colour
      {example_params({{"memory", 0.25}}), true, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
