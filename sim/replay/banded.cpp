#include "kvsim/replay/banded.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <string>

#include "kvsim/core/error.hpp"
#include "kvsim/core/lane_sums.hpp"

namespace kvsim {
namespace {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Σ x_i of a contiguous range in double: the float32 reference's lanes for float, Eigen's sum for
/// double (the per-step path's p.sum()).
double range_sum(const float* x, int64_t n) {
  double sum, unused;
  detail::lane_sums<false>(x, n, sum, unused);
  return sum;
}
double range_sum(const double* x, int64_t n) { return n > 0 ? Eigen::Map<const VecD>(x, n).sum() : 0.0; }

/// e^{x − mx} in place over a contiguous range. In float the argument is clamped at −87 (e^{−87} =
/// 1.6e-38, the smallest normal float being 1.2e-38): subnormal weights made the output SGEMM 1.5x
/// slower on real-looking streams (heavy_hitter logits), and a weight that small next to the row's
/// largest (1) moves z by < t·1.6e-38 relative — nothing float can represent.
template <class S>
void exp_range(Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, 1>> r, S mx) {
  if constexpr (std::is_same_v<S, float>) r = (r.array() - mx).max(-87.0f).exp().matrix();
  else r = (r.array() - mx).exp().matrix();
}

/// One chunk's row of logits (length a + W) turned into unnormalized weights e^{l − max} on the row's
/// cached columns [0, a_end) ∪ [b_beg, b_end) and 0 elsewhere; returns their sum (double) and sets
/// `mx` to the largest cached logit.
template <class S>
double masked_softmax_row(S* row, int64_t len, int64_t a_end, int64_t b_beg, int64_t b_end, S& mx) {
  using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  Eigen::Map<Vec> r(row, len);
  mx = -INFINITY;
  if (a_end > 0) mx = r.head(a_end).maxCoeff();
  if (b_end > b_beg) mx = std::max(mx, r.segment(b_beg, b_end - b_beg).maxCoeff());
  r.segment(a_end, b_beg - a_end).setZero();
  r.tail(len - b_end).setZero();
  double sum = 0;
  if (a_end > 0) {
    exp_range<S>(Eigen::Map<Vec>(row, a_end), mx);
    sum += range_sum(row, a_end);
  }
  if (b_end > b_beg) {
    exp_range<S>(Eigen::Map<Vec>(row + b_beg, b_end - b_beg), mx);
    sum += range_sum(row + b_beg, b_end - b_beg);
  }
  return sum;
}

template <class S>
void answers(const std::vector<const MatD*>& qs, const Mat<S>& K, const Mat<S>& V, const ClosedFormCache& c,
             const std::vector<int64_t>& steps, MatD& Z, VecD* log_sums) {
  const int64_t n = K.rows(), d = K.cols(), H = int64_t(qs.size());
  if (c.sink < 0 || c.window < 0 || c.sink + c.window < 1) throw Error("closed-form cache: sink + window must be ≥ 1");
  if (V.rows() != n || V.cols() != d) throw Error("closed-form cache: K and V differ in shape");
  for (const MatD* q : qs)
    if (q->rows() < n || q->cols() != d) throw Error("closed-form cache: a query matrix is not [n, head_dim]");
  Z.resize(Eigen::Index(steps.size()) * H, d);
  if (log_sums) log_sums->resize(Z.rows());
  if (steps.empty()) return;
  thread_local Mat<S> Qb, L, Zs;
  thread_local VecD inv;
  const int64_t span_max = std::max<int64_t>(int64_t(kBandRows) - 1, c.window / 4);
  // Like the exact reference's blocks (reference_block_end): at most 2^22 logits per chunk, so a
  // long window (e.g. half of a 128k stream) does not grow the scratch past ~32 MB per thread.
  const size_t max_steps = size_t(std::clamp<int64_t>((int64_t(1) << 22) / (H * (c.sink + c.window + span_max)), 1,
                                                      int64_t(kBandRows)));
  for (size_t b0 = 0; b0 < steps.size();) {
    size_t b1 = b0 + 1;
    while (b1 < steps.size() && b1 - b0 < max_steps && steps[b1] - steps[b0] <= span_max) ++b1;
    const int64_t t_first = steps[b0], t_last = steps[b1 - 1];
    if (t_first < 1 || t_last > n) throw Error("closed-form cache: steps must lie within [1, " + std::to_string(n) + "]");
    for (size_t r = b0 + 1; r < b1; ++r)
      if (steps[r] <= steps[r - 1]) throw Error("closed-form cache: steps must increase");
    // Columns [0, a): tokens [0, a) (the sinks the chunk uses); [a, a + W): tokens [lo, t_last).
    const int64_t a = std::min(c.sink, t_last), lo = std::max(c.sink, t_first - c.window);
    const int64_t W = std::max<int64_t>(0, t_last - lo), rows = int64_t(b1 - b0) * H;
    Qb.resize(rows, d);
    for (int64_t r = 0; r < int64_t(b1 - b0); ++r)
      for (int64_t h = 0; h < H; ++h) Qb.row(r * H + h) = qs[h]->row(steps[b0 + r] - 1).template cast<S>();
    L.resize(rows, a + W);
    if (a > 0) L.leftCols(a).noalias() = Qb * K.topRows(a).transpose();
    if (W > 0) L.rightCols(W).noalias() = Qb * K.middleRows(lo, W).transpose();
    inv.resize(rows);
    for (int64_t r = 0; r < int64_t(b1 - b0); ++r) {
      const int64_t t = steps[b0 + r];
      const int64_t a_end = std::min(c.sink, t);
      const int64_t b_beg = a + std::max<int64_t>(0, std::max(c.sink, t - c.window) - lo), b_end = a + std::max<int64_t>(0, t - lo);
      for (int64_t h = 0; h < H; ++h) {
        S mx;
        const double sum = masked_softmax_row(L.row(r * H + h).data(), a + W, a_end, std::max(a_end, b_beg), std::max(a_end, b_end), mx);
        inv[r * H + h] = 1.0 / sum;
        if (log_sums) (*log_sums)[(int64_t(b0) + r) * H + h] = double(mx) + std::log(sum);
      }
    }
    Zs.resize(rows, d);
    if (a > 0) Zs.noalias() = L.leftCols(a) * V.topRows(a);
    else Zs.setZero();
    if (W > 0) Zs.noalias() += L.rightCols(W) * V.middleRows(lo, W);
    Z.middleRows(Eigen::Index(b0) * H, rows).noalias() = inv.asDiagonal() * Zs.template cast<double>();
    b0 = b1;
  }
}

}  // namespace

void closed_form_answers(const std::vector<const MatD*>& qs, const MatD& K, const MatD& V, const ClosedFormCache& c,
                         const std::vector<int64_t>& steps, MatD& Z, VecD* log_sums) {
  answers<double>(qs, K, V, c, steps, Z, log_sums);
}

void closed_form_answers(const std::vector<const MatD*>& qs, const MatF& K, const MatF& V, const ClosedFormCache& c,
                         const std::vector<int64_t>& steps, MatD& Z, VecD* log_sums) {
  answers<float>(qs, K, V, c, steps, Z, log_sums);
}

void closed_form_kept(const ClosedFormCache& c, int64_t t, std::vector<int64_t>& kept) {
  const int64_t m = std::min(t, c.sink + c.window);
  kept.resize(size_t(m));
  if (t <= c.sink + c.window) {
    for (int64_t j = 0; j < m; ++j) kept[j] = j;
    return;
  }
  for (int64_t s = 0; s < c.sink; ++s) kept[s] = s;
  // Ring slot s ≥ sink holds the newest token x < t with (x − sink) mod window = s − sink.
  const int64_t base = t - c.window, off = ((base - c.sink) % c.window + c.window) % c.window;
  for (int64_t s = 0; s < c.window; ++s) kept[c.sink + s] = base + ((s - off) % c.window + c.window) % c.window;
}

}  // namespace kvsim
