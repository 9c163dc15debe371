// `buzz`: BUZZ (seeds/002) §3.3 Algorithms 1-2 — sink + beehive body + sliding window; see
// include/kvsim/buzz.hpp for the body recurrence. `log_scale = true` multiplies the logits by
// log_512(t) (BUZZ §3.5, Eq. 7-8; t = tokens so far), measured against the unscaled exact reference.
#include "kvsim/buzz.hpp"

#include <cmath>
#include <deque>

#include "factories.hpp"
#include "kvsim/error.hpp"

namespace kvsim {

std::vector<int64_t> buzz_body_recurrence(int64_t T, int64_t s, int steps) {
  std::vector<int64_t> a;
  int64_t prev = 0;
  for (int j = 0; j < steps; ++j) {
    prev = prev / buzz_s_hat(s) + (T - prev) / s;
    a.push_back(prev);
  }
  return a;
}

double buzz_predicted_T_over_w(int64_t s) {
  return s % 2 ? double(s * s + 1) / double(s + 1) : double(s - 1);
}

double buzz_limit_coefficient(int64_t s) {
  return s % 2 ? double(s * s + 1) / double(s * s + s) : double(s - 1) / double(s);
}

namespace policies {
namespace {

struct Tok {
  int64_t pos;
  VecD k, v;
  double score = 0;  // accumulated attention (group-aggregated)
};

class BuzzPolicy final : public Policy {
 public:
  BuzzPolicy(int64_t sink, int64_t window, int64_t T, int64_t stride, bool log_scale, const StreamInfo& s)
      : sink_(sink), w_(window), T_(T), s_(stride), log_scale_(log_scale), agg_(s.group_agg), d_(s.head_dim) {}

  bool needs_every_query() const override { return true; }
  bool capacity_matched() const override { return true; }

  void observe(int64_t t, const float* k, const float* v) override {
    Tok x{t, Eigen::Map<const VecF>(k, d_).cast<double>(), Eigen::Map<const VecF>(v, d_).cast<double>(), 0};
    if (int64_t(sink_tokens_.size()) < sink_) {
      sink_tokens_.push_back(std::move(x));
      return;
    }
    window_.push_back(std::move(x));
    if (int64_t(window_.size()) > w_) {
      new_.push_back(std::move(window_.front()));
      window_.pop_front();
      if (int64_t(old_.size() + new_.size()) >= T_) evict();
    }
  }

  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    std::vector<Tok*> all;
    for (auto* part : {&sink_tokens_, &old_, &new_}) for (auto& x : *part) all.push_back(&x);
    for (auto& x : window_) all.push_back(&x);
    const double lambda = log_scale_ ? std::log(double(std::max<int64_t>(t, 1))) / std::log(512.0) : 1.0;
    const int64_t m = int64_t(all.size());
    GroupAggregate agg(agg_, m);
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      VecD logits(m);
      for (int64_t j = 0; j < m; ++j) logits[j] = all[j]->k.dot(q.row(i).transpose());
      // Scores accumulate the model's (unscaled) attention; the answer uses the scaled logits.
      VecD p = (logits.array() - logits.maxCoeff()).exp().matrix();
      p /= p.sum();
      agg.add(p);
      if (out) {
        VecD ps = (lambda * (logits.array() - logits.maxCoeff())).exp().matrix();
        ps /= ps.sum();
        Answer& a = (*out)[i];
        a.z = VecD::Zero(d_);
        for (int64_t j = 0; j < m; ++j) a.z += ps[j] * all[j]->v;
        a.has_kept = true;
        a.kept.resize(m);
        for (int64_t j = 0; j < m; ++j) a.kept[j] = all[j]->pos;
      }
    }
    const VecD step = agg.result();
    for (int64_t j = 0; j < m; ++j) all[j]->score += step[j];
  }

  int64_t cache_tokens() const override { return int64_t(sink_tokens_.size() + old_.size() + new_.size() + window_.size()); }
  /// Body sizes after each eviction so far (for the recurrence test).
  const std::vector<int64_t>& body_history() const { return history_; }

 private:
  void evict() {
    const int64_t sh = buzz_s_hat(s_);
    std::vector<Tok> kept;
    // Interval sampling of old tokens: every ŝ-th (positions ŝ−1, 2ŝ−1, ...): ⌊|old|/ŝ⌋ kept.
    for (size_t i = size_t(sh - 1); i < old_.size(); i += size_t(sh)) kept.push_back(std::move(old_[i]));
    // Local max sampling of new tokens (Alg. 2): the highest accumulated score of each full segment.
    for (size_t b = 0; b + size_t(s_) <= new_.size(); b += size_t(s_)) {
      size_t best = b;
      for (size_t i = b + 1; i < b + size_t(s_); ++i)
        if (new_[i].score > new_[best].score) best = i;
      kept.push_back(std::move(new_[best]));
    }
    old_ = std::move(kept);
    new_.clear();
    history_.push_back(int64_t(old_.size()));
  }

  int64_t sink_, w_, T_, s_;
  bool log_scale_;
  std::string agg_;
  int d_;
  std::vector<Tok> sink_tokens_, old_, new_;
  std::deque<Tok> window_;
  std::vector<int64_t> history_;

 public:
  static const std::vector<int64_t>& history_of(const Policy& p) { return static_cast<const BuzzPolicy&>(p).history_; }
};

}  // namespace

std::unique_ptr<Policy> make_buzz(const Params& p, const StreamInfo& s) {
  const int64_t sink = p.get_int("sink", 4);
  const int64_t window = p.get_budget("window", s.n);
  const int64_t T = p.get_budget("threshold", s.n);
  const int64_t stride = p.get_int("stride", 5);
  if (sink < 0) throw Error("parameter 'sink' must be ≥ 0" + p.where("sink"));
  if (window < 1) throw Error("parameter 'window' must be ≥ 1" + p.where("window"));
  if (stride < 2) throw Error("parameter 'stride' must be ≥ 2" + p.where("stride"));
  if (T < stride) throw Error("parameter 'threshold' must be ≥ stride" + p.where("threshold"));
  return std::make_unique<BuzzPolicy>(sink, window, T, stride, p.get_bool("log_scale", false), s);
}

const std::vector<int64_t>& buzz_body_history(const Policy& p) { return BuzzPolicy::history_of(p); }

}  // namespace policies
}  // namespace kvsim
