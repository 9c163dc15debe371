// `kivi`: KIVI (Liu et al., ICML 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
// Cache", §3.2–3.3, Algorithm 1). Every token stays in the cache; old ones are quantized:
//  - keys per channel: for each group of G consecutive tokens and each channel, min m and max M
//    over the G tokens, scale s = (M − m) / (2^b − 1), code = round((x − m) / s) ∈ [0, 2^b − 1]
//    (asymmetric: a zero point m per channel and group) — keys have outlier channels (§3.1);
//  - values per token: the same over groups of G channels of one token (no outlier channels);
//  - the newest tokens stay in full precision: a group of G tokens is quantized as soon as all of it
//    lies outside the R most recent (so R to R + G − 1 tokens are full precision once t ≥ R + G).
// Attention runs over every token with the dequantized keys and values (m + code·s), exactly what a
// fused dequantize-and-attend kernel computes; the answer estimates z and τ, and is not a subset.
//
// Bytes (cache_bytes; full precision = float32, kvsim's element size): a full-precision token 2·d·4;
// a quantized one 2·d·b/8 for codes, plus per G-token key group 2 floats (scale, zero) per channel
// (8d/G per token) and per token 2 floats per value group (8·⌈d/G⌉). `memory = M` sizes R so the cache
// never exceeds M tokens' worth of float32 K+V over the stream (capacity rule); too small an M for
// b bits is refused with the smallest M that fits.
#include <algorithm>
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/masked_attention.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

struct KiviShape {
  int bits, group, d;
  int64_t residual;
  int value_group() const { return std::min(group, d); }
  /// Bytes of one quantized token, amortized over its key group.
  double quantized_token_bytes() const {
    const int vg = value_group();
    return 2.0 * d * bits / 8.0 + 8.0 * d / group + 8.0 * double((d + vg - 1) / vg);
  }
  /// Largest number of full-precision tokens once t tokens have arrived.
  int64_t full_tokens(int64_t t) const { return std::min<int64_t>(t, residual + group - 1); }
  /// An upper bound of the bytes held after t tokens (full tokens + the rest quantized).
  double bytes_bound(int64_t t) const {
    const int64_t f = full_tokens(t);
    return double(f) * 8.0 * d + double(t - f) * quantized_token_bytes();
  }
};

/// Quantizes x[0], x[stride], …, x[(count−1)·stride] in place to b bits (asymmetric min/max).
void quantize(double* x, int64_t count, int64_t stride, int bits) {
  double mn = INFINITY, mx = -INFINITY;
  for (int64_t i = 0; i < count; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  const double levels = double((1 << bits) - 1), s = (mx - mn) / levels;
  for (int64_t i = 0; i < count; ++i) {
    double& v = x[i * stride];
    v = s > 0 ? mn + std::clamp(std::nearbyint((v - mn) / s), 0.0, levels) * s : mn;
  }
}

class KiviPolicy final : public Policy, public BlockStepper {
 public:
  KiviPolicy(const KiviShape& shape, const StreamInfo& s)
      : sh_(shape), cache_(s.n, s.head_dim, s.policy_f32), K_(shape.group, s.head_dim), V_(shape.group, s.head_dim) {}

  void observe(int64_t t, const float* k, const float* v) override {
    cache_.append(t, k, v);
    keys_.emplace_back(k, k + sh_.d);
    values_.emplace_back(v, v + sh_.d);
    // Quantize every complete group of G tokens that lies outside the R newest.
    while (t + 1 - (quantized_ + sh_.group) >= sh_.residual) {
      for (int i = 0; i < sh_.group; ++i)
        for (int c = 0; c < sh_.d; ++c) {
          K_(i, c) = keys_[size_t(quantized_ + i)][size_t(c)];
          V_(i, c) = values_[size_t(quantized_ + i)][size_t(c)];
        }
      for (int c = 0; c < sh_.d; ++c) quantize(&K_(0, c), sh_.group, 1, sh_.bits);  // per channel (column)
      const int vg = sh_.value_group();
      for (int i = 0; i < sh_.group; ++i)
        for (int c0 = 0; c0 < sh_.d; c0 += vg) quantize(&V_(i, c0), std::min(vg, sh_.d - c0), sh_.group, sh_.bits);
      for (int i = 0; i < sh_.group; ++i) {
        std::vector<float> kq(size_t(sh_.d)), vq(size_t(sh_.d));
        for (int c = 0; c < sh_.d; ++c) {
          kq[size_t(c)] = float(K_(i, c));
          vq[size_t(c)] = float(V_(i, c));
        }
        cache_.put(quantized_ + i, quantized_ + i, kq.data(), vq.data());
      }
      quantized_ += sh_.group;
    }
  }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    for (Eigen::Index i = 0; i < q.rows(); ++i) cache_.attend(q.row(i).transpose(), (*out)[i].z, (*out)[i].log_tau);
  }
  /// Blocked stepping (BlockStepper, include/kvsim/policies/policy.hpp): the block's tokens join as in
  /// observe(), then its evaluated steps are answered together by two_part_attention — the dequantized
  /// tokens as the store holds them at the block's end (rows [0, Q(e_k))) and the stream's full-precision
  /// rows from Q(e_1) on, each evaluated step e masked to dequantized [0, Q(e)) ∪ full-precision [Q(e), e),
  /// the cache as it stood at e (Q(e): tokens quantized by then; a group once quantized never changes).
  /// KIVI reads no query between evaluated steps, so a block needs no walk: two GEMMs over the cache
  /// for all its evaluated steps instead of two matrix-vector products per step and query head.
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) override {
    check_step_block(t_first, t_last, K, q_scaled, out, "kivi");
    q_at_.clear();
    observe_block(*this, t_first, t_last, K, V, out, [&] { q_at_.push_back(quantized_); });
    if (q_at_.empty()) return;
    const std::vector<int64_t>& steps = out->steps;
    const auto G = Eigen::Index(q_scaled.size());
    const int64_t q1 = q_at_.front(), qk = q_at_.back(), W = steps.back() - q1;
    masks_.resize(steps.size() * size_t(G));
    for (size_t i = 0; i < steps.size(); ++i)
      for (Eigen::Index g = 0; g < G; ++g) {
        // The test hook (g_blocked_masking_off) reads every step against the block's last state: tokens
        // quantized later in the block would answer dequantized before their time.
        const int64_t q = g_blocked_masking_off ? qk : q_at_[i];
        masks_[i * size_t(G) + size_t(g)] = {q, q - q1, steps[i] - q1};
      }
    Z_.resize(Eigen::Index(steps.size()) * G, K.cols());
    log_sums_.resize(Z_.rows());
    if (cache_.f32()) {
      block_queries(q_scaled, steps, K.cols(), Qf_);
      two_part_attention(Qf_, cache_.keys_f().topRows(qk), cache_.values_f().topRows(qk), K.middleRows(q1, W),
                         V.middleRows(q1, W), masks_, Z_, 0, &log_sums_);
    } else {
      block_queries(q_scaled, steps, K.cols(), Qd_);
      Kb_ = K.middleRows(q1, W).cast<double>();  // the full-precision rows, as the double store holds them
      Vb_ = V.middleRows(q1, W).cast<double>();
      two_part_attention(Qd_, cache_.keys().topRows(qk), cache_.values().topRows(qk), Kb_, Vb_, masks_, Z_, 0, &log_sums_);
    }
    for (size_t i = 0; i < steps.size(); ++i)
      for (Eigen::Index g = 0; g < G; ++g) {
        Answer& a = out->answers[i][size_t(g)];
        a.z = Z_.row(Eigen::Index(i) * G + g).transpose();
        a.log_tau = log_sums_[Eigen::Index(i) * G + g];
      }
  }
  bool blocks_evaluated_steps() const override { return true; }
  int64_t cache_tokens() const override { return cache_.size(); }
  double cache_bytes(int head_dim) const override {
    const int64_t full = cache_.size() - quantized_;
    return double(full) * 2.0 * head_dim * sizeof(float) + double(quantized_) * sh_.quantized_token_bytes();
  }
  bool capacity_matched() const override { return true; }
  int64_t quantized_tokens() const { return quantized_; }

 private:
  KiviShape sh_;
  SlotCache cache_;                           ///< dequantized old tokens, full-precision new ones
  std::vector<std::vector<float>> keys_, values_;  ///< the originals until their group is quantized
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor> K_, V_;
  int64_t quantized_ = 0;
  // step_block() scratch: tokens quantized at each evaluated step, the rows' masks, queries, answers.
  std::vector<int64_t> q_at_;
  std::vector<TwoPartMask> masks_;
  MatF Qf_;
  MatD Qd_, Kb_, Vb_, Z_;
  VecD log_sums_;
};

std::unique_ptr<Policy> make_kivi(ParamReader& p, const StreamInfo& s) {
  KiviShape sh;
  sh.bits = int(p.get_int("bits"));
  if (sh.bits != 2 && sh.bits != 4 && sh.bits != 8) throw Error("parameter 'bits' must be 2, 4 or 8" + p.where("bits"));
  const int64_t g = p.get_int("group");
  sh.group = int(g);
  sh.d = std::max(s.head_dim, 1);
  const int64_t memory = p.get_int("memory_tokens");
  sh.residual = p.get_budget("residual", s.n);
  if (sh.quantized_token_bytes() >= 8.0 * sh.d)
    throw Error("kivi: group " + std::to_string(g) + " is too small: a quantized token's codes, scales and zero points "
                "would take more bytes than the float32 token" + p.where("group"));
  if (memory < 0) return std::make_unique<KiviPolicy>(sh, s);
  // memory = M: the largest R whose byte bound at t = n stays within M tokens of float32 K+V.
  const double budget = double(std::min<int64_t>(memory, s.n)) * 8.0 * s.head_dim;
  sh.residual = 0;
  if (sh.bytes_bound(s.n) > budget) {
    const double need = sh.bytes_bound(s.n) / (8.0 * s.head_dim);
    throw Error("kivi at " + std::to_string(sh.bits) + " bits cannot fit memory = " + std::to_string(memory) +
                " tokens (n = " + std::to_string(s.n) + "): it needs at least " + std::to_string(int64_t(std::ceil(need))) +
                " tokens' worth" + p.where("memory_tokens"));
  }
  int64_t lo = 0, hi = s.n;  // the largest R with bytes_bound(n) ≤ budget (non-decreasing in R)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    sh.residual = mid;
    if (sh.bytes_bound(s.n) <= budget) lo = mid;
    else hi = mid - 1;
  }
  sh.residual = lo;
  return std::make_unique<KiviPolicy>(sh, s);
}

}  // namespace

KVSIM_POLICY(kivi) {
  static const PolicyInfo info{
      "kivi",
      "every token kept, old ones quantized to b bits: keys per channel over groups of G tokens, values per token "
      "over groups of G channels (asymmetric min/max), the R newest in full precision; attention over all tokens "
      "with dequantized keys and values",
      "KIVI (Liu et al., 2024) §3.2-3.3, Alg. 1",
      {{"bits", "int", "2", "code width: 2, 4 or 8"},
       {"group", "int", "32", "G: tokens per key group and channels per value group", "[1, 4096]"},
       {"residual", "tokens", "128", "R: the newest tokens kept in full precision"},
       {"memory_tokens", "int", "-1", "set by memory = M: R is sized so the cache stays within M tokens of float32 K+V"}},
      make_kivi,
      MemoryRule{"capacity: R sized so bytes (codes, scales, zero points, full-precision tokens) ≤ M tokens of "
                 "float32 K+V at n",
                 {"residual", "memory_tokens"},
                 [](int64_t M, const Params&, Params& out, const std::string& where) { out.set("memory_tokens", M, where); }},
      "no",
      {example_params({{"bits", int64_t(2)}}), example_params({{"bits", int64_t(4)}, {"residual", 0.1}})},
      "#637939",  // figure colour
      {example_params({{"memory", 0.5}, {"bits", int64_t(4)}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
