// `lagkv`: LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which
// Tokens Are Important", arXiv:2504.04704), with the scoring of kvpress's LagKVPress. No query and no
// attention weight is used: a token's importance is read from its key and value against the *next*
// partition of the sequence (its lag reference).
//
// Scores of a sequence of m cached tokens (in position order), with sink s and lag L:
//  - m < s + 2L: no partition can be scored; the s sink tokens score 1 and token j ≥ s scores
//    (j − s)/(m − s), so the cache keeps the sinks and the most recent tokens (a StreamingLLM cache).
//  - else the tokens after the sinks form ⌊(m − s)/L⌋ partitions of L tokens; the last partition and
//    the remainder (the tail) and the sinks score 1. A token x_i of partition p (p below the last) is
//    min-max normalized per dimension by partition p + 1 (its reference R),
//        x̂_i = (x_i − min_R) / (max_R − min_R),
//    its lag-relative information is the standard deviation of x̂_i over the dimensions (unbiased, as
//    torch.std), turned into a distribution over the partition by a softmax; the key's and the value's
//    are averaged, and the token's score is its rank within the partition divided by L (in [0, 1)).
// The cache keeps the B highest-scored tokens (ties: the earlier position).
//
// With a prompt (`[data] prefill = P`), the P prompt tokens are scored as one sequence and the B best
// stay (what kvpress's LagKVPress keeps at prefill). While decoding, as kvpress's DecodingPress does
// with a scorer press, the cache is compressed in chunks: when token t arrives at a full cache (B
// tokens), the B + 1 tokens are rescored as one sequence and the best B + 1 − `interval` stay, so the
// cache holds at most B tokens and is rescored every `interval` tokens (the newest always stays: it is
// in the tail, or the most recent).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {

namespace {

/// Buffers partition_scores reuses from one token and one partition to the next (no allocation per token).
struct LagScratch {
  Eigen::RowVectorXf lo_f, hi_f;
  VecD lo, inv, x, info;
};

/// The softmax over partition [start, start + L) of each token's lag-relative information, its
/// reference the rows [start + L, start + 2L) of X. The reference's per-dimension min and max are taken in
/// float and widened (exact: widening is monotone), so the arithmetic is that of the reference cast to double.
VecD partition_scores(const MatF& X, int64_t start, int64_t L, LagScratch& w) {
  const Eigen::Index d = X.cols();
  w.lo_f = X.row(start + L);
  w.hi_f = w.lo_f;
  for (int64_t r = start + L + 1; r < start + 2 * L; ++r) {  // row by row: contiguous, vectorized
    w.lo_f = w.lo_f.cwiseMin(X.row(r));
    w.hi_f = w.hi_f.cwiseMax(X.row(r));
  }
  w.lo = w.lo_f.transpose().cast<double>();
  // A dimension the reference holds constant has no scale: it is left at 0 (kvpress divides by 0).
  w.inv = (w.hi_f.transpose().cast<double>() - w.lo).unaryExpr([](double r) { return r > 0 ? 1 / r : 0.0; });
  w.info.resize(L);
  w.x.resize(d);
  for (int64_t i = 0; i < L; ++i) {
    w.x = (X.row(start + i).cast<double>().transpose() - w.lo).cwiseProduct(w.inv);
    const double mean = w.x.mean();
    w.info[i] = std::sqrt((w.x.array() - mean).square().sum() / double(std::max<Eigen::Index>(d - 1, 1)));
  }
  const double mx = w.info.maxCoeff();
  VecD e = (w.info.array() - mx).exp().matrix();
  return e / e.sum();
}

}  // namespace

VecD lagkv_scores(const MatF& K, const MatF& V, int64_t m, int64_t sink, int64_t L) {
  VecD s = VecD::Ones(m);
  if (m < sink + 2 * L) {
    for (int64_t j = sink; j < m; ++j) s[j] = double(j - sink) / double(m - sink);
    return s;
  }
  const int64_t partitions = (m - sink) / L;
  std::vector<int64_t> order(static_cast<size_t>(L));
  thread_local LagScratch w;
  for (int64_t p = 0; p + 1 < partitions; ++p) {
    const int64_t start = sink + p * L;
    const VecD score = (partition_scores(K, start, L, w) + partition_scores(V, start, L, w)) / 2;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] < score[b]; });
    for (int64_t r = 0; r < L; ++r) s[start + order[size_t(r)]] = double(r) / double(L);
  }
  return s;
}

namespace {

class LagKVPolicy final : public Policy, public PromptCompressor, public SlotAnswersStepper {
 public:
  LagKVPolicy(int64_t budget, int64_t sink, int64_t lag, int64_t interval, const StreamInfo& s)
      : B_(budget), sink_(sink), lag_(lag), keep_(std::max<int64_t>(1, budget + 1 - interval)), d_(s.head_dim),
        f32_(s.policy_f32), K_(budget + 1, s.head_dim), V_(budget + 1, s.head_dim), cache_(budget, s.head_dim, s.policy_f32) {}

  void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>&) override {
    const VecD score = lagkv_scores(K, V, P, sink_, lag_);
    for (int64_t j : top_rows(score, B_)) append(j, K.row(j).data(), V.row(j).data());
    rebuild();
  }

  void observe(int64_t t, const float* k, const float* v) override {
    append(t, k, v);
    if (m_ <= B_) {
      cache_.append(t, k, v);
      return;
    }
    // A full cache and token t: rescore the B + 1 tokens as one sequence, keep the best B + 1 − interval.
    const VecD score = lagkv_scores(K_, V_, m_, sink_, lag_);
    const std::vector<int64_t> kept = top_rows(score, keep_);
    for (size_t i = 0; i < kept.size(); ++i) {  // compact, in position order (kept is sorted)
      K_.row(Eigen::Index(i)) = K_.row(kept[i]);
      V_.row(Eigen::Index(i)) = V_.row(kept[i]);
      pos_[i] = pos_[size_t(kept[i])];
    }
    m_ = int64_t(kept.size());
    pos_.resize(size_t(m_));
    rebuild();
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (out) cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return m_; }
  /// Between B + 1 − interval and B tokens once decoding compresses: matched on capacity.
  bool capacity_matched() const override { return true; }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }

 private:
  void append(int64_t t, const float* k, const float* v) {
    K_.row(m_) = Eigen::Map<const VecF>(k, d_).transpose();
    V_.row(m_) = Eigen::Map<const VecF>(v, d_).transpose();
    pos_.push_back(t);
    ++m_;
  }
  void rebuild() {  // the answering cache from the kept rows
    cache_.clear();
    for (int64_t i = 0; i < m_; ++i) cache_.append(pos_[size_t(i)], K_.row(i).data(), V_.row(i).data());
  }

  const int64_t B_, sink_, lag_, keep_;
  const int d_;
  const bool f32_;
  MatF K_, V_;                // the kept tokens' keys and values in position order (+ one arriving)
  std::vector<int64_t> pos_;  // their positions
  int64_t m_ = 0;
  SlotCache cache_;
};

std::unique_ptr<Policy> make_lagkv(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  const int64_t sink = p.get_int("sink"), lag = p.get_int("lag");
  const int64_t interval = p.get_int("interval", std::min(lag, b));
  if (interval < 1 || interval > b)
    throw Error("parameter 'interval' must be in [1, budget = " + std::to_string(b) + "]" + p.where("interval"));
  return std::make_unique<LagKVPolicy>(b, sink, lag, interval, s);
}

}  // namespace

KVSIM_POLICY(lagkv) {
  static const PolicyInfo info{
      "lagkv",
      "keep the tokens whose keys and values vary most against the next partition of `lag` tokens (min-max "
      "normalized, std over dimensions, ranked within the partition), sinks and the last partition always: a prompt "
      "is one sequence (kvpress's LagKVPress), then a full cache is rescored every `interval` tokens",
      "LagKV (Liang et al., 2025, arXiv:2504.04704), as kvpress's LagKVPress scores it",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"},
       {"sink", "int", "4", "first tokens always kept (n_sink)", "[0, inf)"},
       {"lag", "int", "128", "partition size L (lag_size)", "[2, inf)"},
       {"interval", "int", "min(lag, budget)", "decoding: tokens between rescorings of a full cache (1..budget)"}},
      make_lagkv,
      MemoryRule{"budget = M (capacity: at most M tokens; a full cache drops `interval` tokens at a time)", {"budget"},
                 [](int64_t M, const Params&, Params& out, const std::string& where) { out.set("budget", M, where); }},
      "no",
      {example_params({{"budget", 0.25}}), example_params({{"budget", 0.5}, {"lag", int64_t(16)}})},
      "#ad494a",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
