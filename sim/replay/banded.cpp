#include "kvsim/replay/banded.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvsim/core/error.hpp"
#include "kvsim/core/masked_attention.hpp"

namespace kvsim {
namespace {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

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
  thread_local Mat<S> Qb;
  thread_local std::vector<TwoPartMask> masks;
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
    masks.resize(size_t(rows));
    for (int64_t r = 0; r < int64_t(b1 - b0); ++r) {
      const int64_t t = steps[b0 + r];
      const TwoPartMask m{std::min(c.sink, t), std::max<int64_t>(0, std::max(c.sink, t - c.window) - lo),
                          std::max<int64_t>(0, t - lo)};
      for (int64_t h = 0; h < H; ++h) masks[size_t(r * H + h)] = m;
    }
    two_part_attention(Qb, K.topRows(a), V.topRows(a), K.middleRows(lo, W), V.middleRows(lo, W), masks, Z,
                       Eigen::Index(b0) * H, log_sums);
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
