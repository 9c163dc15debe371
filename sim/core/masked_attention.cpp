// Masked attention over two sets of rows (include/kvsim/core/masked_attention.hpp).
#include "kvsim/core/masked_attention.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

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

/// The core of a chunk: query rows Qb [rows, d] against two column sets, the a rows of (Ka, Va) and the W
/// rows of (Kb, Vb); row i attends over Ka[0, m[i].a_end) ∪ Kb[m[i].b_beg, m[i].b_end). Writes the normalized
/// answers to Z's rows [z0, z0 + rows) and, when given, their log-sums to (*log_sums)[z0 …]. L and Zs: scratch.
template <class S>
void two_part_chunk(const Mat<S>& Qb, const Eigen::Ref<const Mat<S>>& Ka, const Eigen::Ref<const Mat<S>>& Va,
                    const Eigen::Ref<const Mat<S>>& Kb, const Eigen::Ref<const Mat<S>>& Vb,
                    const std::vector<TwoPartMask>& m, Mat<S>& L, Mat<S>& Zs, MatD& Z, Eigen::Index z0, VecD* log_sums) {
  const Eigen::Index rows = Qb.rows(), d = Qb.cols(), a = Ka.rows(), W = Kb.rows();
  L.resize(rows, a + W);
  if (a > 0) L.leftCols(a).noalias() = Qb * Ka.transpose();
  if (W > 0) L.rightCols(W).noalias() = Qb * Kb.transpose();
  thread_local VecD inv;
  inv.resize(rows);
  for (Eigen::Index i = 0; i < rows; ++i) {
    const TwoPartMask& r = m[size_t(i)];
    S mx;
    const double sum = masked_softmax_row(L.row(i).data(), a + W, r.a_end, std::max(r.a_end, a + r.b_beg),
                                          std::max(r.a_end, a + r.b_end), mx);
    inv[i] = 1.0 / sum;
    if (log_sums) (*log_sums)[z0 + i] = double(mx) + std::log(sum);
  }
  Zs.resize(rows, d);
  if (a > 0) Zs.noalias() = L.leftCols(a) * Va;
  else Zs.setZero();
  if (W > 0) Zs.noalias() += L.rightCols(W) * Vb;
  Z.middleRows(z0, rows).noalias() = inv.asDiagonal() * Zs.template cast<double>();
}

/// two_part_attention's argument checks: shapes agree, and every row's mask lies within its columns and is not empty.
template <class QM, class R>
void two_part_check(const QM& Q, const R& Ka, const R& Va, const R& Kb, const R& Vb, const std::vector<TwoPartMask>& masks,
                    const MatD& Z, Eigen::Index z0, const VecD* log_sums) {
  const Eigen::Index d = Q.cols();
  if (z0 < 0 || Z.rows() < z0 + Q.rows() || Z.cols() != d || (log_sums && log_sums->size() < z0 + Q.rows()))
    throw Error("two-part attention: the output rows [z0, z0 + queries) do not fit Z (or log_sums)");
  if (Ka.cols() != d || Va.cols() != d || Kb.cols() != d || Vb.cols() != d || Va.rows() != Ka.rows() || Vb.rows() != Kb.rows())
    throw Error("two-part attention: queries, keys and values differ in shape");
  if (Eigen::Index(masks.size()) != Q.rows()) throw Error("two-part attention: one mask per query row is needed");
  for (const TwoPartMask& m : masks)
    if (m.a_end < 0 || m.a_end > Ka.rows() || m.b_beg < 0 || m.b_end > Kb.rows() || m.b_beg > m.b_end ||
        m.a_end + m.b_end - m.b_beg < 1)
      throw Error("two-part attention: a row's mask lies outside its columns or is empty (a_end, b_beg, b_end)");
}

/// two_part_attention in scalar S: the checks, then the chunk with this thread's scratch.
template <class S>
void two_part(const Mat<S>& Q, const Eigen::Ref<const Mat<S>>& Ka, const Eigen::Ref<const Mat<S>>& Va,
              const Eigen::Ref<const Mat<S>>& Kb, const Eigen::Ref<const Mat<S>>& Vb, const std::vector<TwoPartMask>& masks,
              MatD& Z, Eigen::Index z0, VecD* log_sums) {
  two_part_check(Q, Ka, Va, Kb, Vb, masks, Z, z0, log_sums);
  thread_local Mat<S> L, Zs;
  two_part_chunk<S>(Q, Ka, Va, Kb, Vb, masks, L, Zs, Z, z0, log_sums);
}

}  // namespace

void two_part_attention(const MatD& Q, const Eigen::Ref<const MatD>& Ka, const Eigen::Ref<const MatD>& Va,
                        const Eigen::Ref<const MatD>& Kb, const Eigen::Ref<const MatD>& Vb, const std::vector<TwoPartMask>& masks,
                        MatD& Z, Eigen::Index z0, VecD* log_sums) {
  two_part<double>(Q, Ka, Va, Kb, Vb, masks, Z, z0, log_sums);
}

void two_part_attention(const MatF& Q, const Eigen::Ref<const MatF>& Ka, const Eigen::Ref<const MatF>& Va,
                        const Eigen::Ref<const MatF>& Kb, const Eigen::Ref<const MatF>& Vb, const std::vector<TwoPartMask>& masks,
                        MatD& Z, Eigen::Index z0, VecD* log_sums) {
  two_part<float>(Q, Ka, Va, Kb, Vb, masks, Z, z0, log_sums);
}

}  // namespace kvsim
