// SlotAnswersStepper::step_block (sim/policies/slot_cache.hpp): a block of evaluated steps of a policy that
// answers with exact attention over its SlotCache, as two products over the union of the steps' slots.
#include <algorithm>
#include <cmath>

#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

constexpr double kUnionGrowth = 1.1;  // a group's union of slots within this many times its largest set

/// Row r's softmax over its own columns (cols, in slot order) of the logits' column Lt.col(r), written into
/// the same columns of Pt.col(r) (the others stay zero); returns log Σ exp. Float64: answer_group's arithmetic
/// (attend_cached_group); the test hook g_blocked_masking_off reads every column of the union instead.
double softmax_columns(const MatD& Lt, Eigen::Index r, const int32_t* cols, int64_t m, MatD& Pt, VecD& p) {
  p.resize(m);
  for (int64_t j = 0; j < m; ++j) p[j] = Lt(cols[j], r);
  const double mx = p.maxCoeff();
  p = (p.array() - mx).exp().matrix();
  const double sum = p.sum();
  p /= sum;
  for (int64_t j = 0; j < m; ++j) Pt(cols[j], r) = p[j];
  return mx + std::log(sum);
}

/// The same in float32 mode: float logits, softmax_f32 (exponentials in float, the sum in double), the
/// probabilities rounded to float for the values' product, as SlotCache::attend_group_f32.
double softmax_columns(const MatF& Lt, Eigen::Index r, const int32_t* cols, int64_t m, MatF& Pt, VecF& l, VecD& p) {
  l.resize(m);
  p.resize(m);
  for (int64_t j = 0; j < m; ++j) l[j] = Lt(cols[j], r);
  const double ls = softmax_f32(l.data(), m, p.data());
  for (int64_t j = 0; j < m; ++j) Pt(cols[j], r) = float(p[j]);
  return ls;
}

}  // namespace

void SlotAnswersStepper::step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V,
                                    const std::vector<const MatD*>& q_scaled, BlockAnswers* out) {
  check_step_block(t_first, t_last, K, q_scaled, out, "blocked slot answers");
  const SlotCache& store = answering_store();
  slots_.clear();
  run0_.assign(1, 0);
  observe_block(stepper_policy(), t_first, t_last, K, V, out, [&] {
    slots_.insert(slots_.end(), store.positions(), store.positions() + store.size());
    run0_.push_back(slots_.size());
  });
  if (!out || out->steps.empty()) return;
  // The evaluated steps in groups whose union of slots stays within 5/4 of their largest set: a cache that
  // evicts a token per step (keydiff, a full snapkv) would otherwise make the union grow with the block's span,
  // and the products with it. A cache that only grows (snapkv below its budget) keeps one group.
  if (col_of_.size() < size_t(K.rows())) col_of_.assign(size_t(K.rows()), -1);
  const size_t E = out->steps.size();
  int32_t gid = 0;
  size_t first = 0, u = 0, largest = 0;
  for (size_t i = 0; i < E; ++i) {
    const size_t m = run0_[i + 1] - run0_[i];
    size_t fresh = 0;
    for (size_t j = run0_[i]; j < run0_[i + 1]; ++j) fresh += col_of_[size_t(slots_[j])] != gid;
    if (i > first && double(u + fresh) > kUnionGrowth * double(std::max(largest, m))) {  // step i opens the next group
      answer_steps(first, i, K, V, q_scaled, out);
      first = i, u = 0, largest = 0, fresh = m;
      ++gid;
    }
    for (size_t j = run0_[i]; j < run0_[i + 1]; ++j) col_of_[size_t(slots_[j])] = gid;
    u += fresh;
    largest = std::max(largest, m);
  }
  answer_steps(first, E, K, V, q_scaled, out);
  std::fill(col_of_.begin(), col_of_.end(), -1);
}

void SlotAnswersStepper::answer_steps(size_t i0, size_t i1, const MatF& K, const MatF& V,
                                      const std::vector<const MatD*>& q_scaled, BlockAnswers* out) {
  const auto G = Eigen::Index(q_scaled.size()), d = Eigen::Index(K.cols());
  // The union of the steps' slots as the products' columns, ascending (col_of_ marks are the caller's: reset).
  cols_.clear();
  for (size_t j = run0_[i0]; j < run0_[i1]; ++j)
    if (col_of_[size_t(slots_[j])] != -2) col_of_[size_t(slots_[j])] = -2, cols_.push_back(slots_[j]);
  std::sort(cols_.begin(), cols_.end());
  for (size_t c = 0; c < cols_.size(); ++c) col_of_[size_t(cols_[c])] = int32_t(c);
  std::vector<int32_t> cols(run0_[i1] - run0_[i0]);  // each step's slots as columns
  for (size_t j = run0_[i0]; j < run0_[i1]; ++j) cols[j - run0_[i0]] = col_of_[size_t(slots_[j])];
  for (int64_t pos : cols_) col_of_[size_t(pos)] = -1;
  std::vector<int32_t> all;  // the test hook: every row reads the whole union
  if (g_blocked_masking_off) {
    all.resize(cols_.size());
    for (size_t c = 0; c < all.size(); ++c) all[c] = int32_t(c);
  }
  const auto u = Eigen::Index(cols_.size());
  const size_t E = i1 - i0;
  std::vector<double> log_sum(E * size_t(G));
  auto run_cols = [&](size_t i) { return g_blocked_masking_off ? all.data() : cols.data() + (run0_[i0 + i] - run0_[i0]); };
  auto run_len = [&](size_t i) { return g_blocked_masking_off ? int64_t(all.size()) : int64_t(run0_[i0 + i + 1] - run0_[i0 + i]); };
  steps_.assign(out->steps.begin() + std::ptrdiff_t(i0), out->steps.begin() + std::ptrdiff_t(i1));
  if (!answering_store().f32()) {
    Kd_.resize(u, d);
    Vd_.resize(u, d);
    for (Eigen::Index c = 0; c < u; ++c) {  // the store holds the stream's float rows as doubles
      Kd_.row(c) = K.row(cols_[size_t(c)]).cast<double>();
      Vd_.row(c) = V.row(cols_[size_t(c)]).cast<double>();
    }
    block_queries(q_scaled, steps_, d, Qd_);
    Ltd_.noalias() = Kd_ * Qd_.transpose();  // [u, rows]: a row's logits are one contiguous column
    Ptd_.setZero(u, Qd_.rows());
    for (size_t i = 0; i < E; ++i)
      for (Eigen::Index g = 0; g < G; ++g)
        log_sum[i * size_t(G) + size_t(g)] = softmax_columns(Ltd_, Eigen::Index(i) * G + g, run_cols(i), run_len(i), Ptd_, p_);
    Zd_.noalias() = Ptd_.transpose() * Vd_;
  } else {
    Kf_.resize(u, d);
    Vf_.resize(u, d);
    for (Eigen::Index c = 0; c < u; ++c) {
      Kf_.row(c) = K.row(cols_[size_t(c)]);
      Vf_.row(c) = V.row(cols_[size_t(c)]);
    }
    block_queries(q_scaled, steps_, d, Qf_);
    Ltf_.noalias() = Kf_ * Qf_.transpose();
    Ptf_.setZero(u, Qf_.rows());
    for (size_t i = 0; i < E; ++i)
      for (Eigen::Index g = 0; g < G; ++g)
        log_sum[i * size_t(G) + size_t(g)] = softmax_columns(Ltf_, Eigen::Index(i) * G + g, run_cols(i), run_len(i), Ptf_, lf_, p_);
    Zf_.noalias() = Ptf_.transpose() * Vf_;
    Zd_ = Zf_.cast<double>();
  }
  for (size_t i = 0; i < E; ++i) {
    const size_t k = i0 + i;
    for (Eigen::Index g = 0; g < G; ++g) {
      Answer& a = out->answers[k][size_t(g)];
      a.z = Zd_.row(Eigen::Index(i) * G + g).transpose();
      a.has_kept = true;
      a.kept.assign(slots_.begin() + std::ptrdiff_t(run0_[k]), slots_.begin() + std::ptrdiff_t(run0_[k + 1]));
      a.log_tau = answer_log_tau(log_sum[i * size_t(G) + size_t(g)], out->steps[k], int64_t(run0_[k + 1] - run0_[k]));
    }
  }
}

}  // namespace kvsim::policies
