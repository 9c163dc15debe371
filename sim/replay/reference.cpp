#include "kvsim/replay/reference.hpp"

#include <algorithm>
#include <cmath>

#include "kvsim/core/blas.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/lane_sums.hpp"

namespace kvsim {

namespace {
/// The scaled query rows q̃_t = scale·q_t (computed in double) of a block's steps, in scalar type of
/// `Qb`; validates the steps against the n_keys cached keys.
template <class M>
void scaled_queries(const MatF& Q, int64_t n_keys, double scale, const std::vector<int64_t>& steps, M& Qb) {
  if (steps.empty()) throw Error("exact_attention: no steps");
  if (steps.back() > n_keys || steps.front() < 1) throw Error("exact_attention: step out of range");
  Qb.resize(Eigen::Index(steps.size()), Q.cols());
  for (size_t r = 0; r < steps.size(); ++r)
    Qb.row(Eigen::Index(r)) = (Q.row(steps[r] - 1).cast<double>() * scale).template cast<typename M::Scalar>();
}
}  // namespace

/// First key (0-based) step t reads: t − window for a local layer, else 0.
inline int64_t window_begin(int64_t t, int64_t window) { return window > 0 ? std::max<int64_t>(0, t - window) : 0; }

void exact_attention(const MatF& Q, const MatD& K, const MatD& V, double scale, const std::vector<int64_t>& steps,
                     ReferenceBlock& out, int64_t window) {
  MatD Qb;
  scaled_queries(Q, K.rows(), scale, steps, Qb);
  const int64_t rows = static_cast<int64_t>(steps.size());
  const int64_t t_max = steps.back();
  out.steps = steps;
  out.probs_f.resize(0, 0);
  out.probs.resize(rows, t_max);
  out.probs.noalias() = Qb * K.topRows(t_max).transpose();
  out.log_tau.resize(rows);
  out.probs_norm.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = steps[r], lo = window_begin(t, window);
    auto row = out.probs.row(r);
    auto seen = row.segment(lo, t - lo);  // the keys step t reads (all t of them on a global layer)
    const double mx = seen.maxCoeff();
    seen = (seen.array() - mx).exp().matrix();  // Eigen's vectorized exp (~3.5x std::exp)
    const double sum = seen.sum();
    row.head(lo).setZero();
    row.tail(t_max - t).setZero();
    seen /= sum;
    out.log_tau[r] = mx + std::log(sum);
    out.probs_norm[r] = seen.norm();
  }
  out.out.resize(rows, V.cols());
  out.out.noalias() = out.probs * V.topRows(t_max);
}

void exact_attention_f32(const MatF& Q, const MatF& K, const MatF& V, double scale, const std::vector<int64_t>& steps,
                         ReferenceBlock& out, int64_t window) {
  thread_local MatF Qb, P, Z;  // scratch reused across blocks (the block shapes repeat)
  P.swap(out.probs_f);         // reuse the storage the block held last time
  scaled_queries(Q, K.rows(), scale, steps, Qb);
  const int64_t rows = static_cast<int64_t>(steps.size());
  const int64_t t_max = steps.back();
  P.resize(rows, t_max);
  reference_gemm_abt(Qb, K.topRows(t_max), P);  // oneMKL where linked (include/kvsim/core/blas.hpp)
  out.steps = steps;
  out.log_tau.resize(rows);
  out.probs_norm.resize(rows);
  VecD inv(rows);
  // P keeps the unnormalized exp(l − max); the normalization is applied in double to the output rows
  // here and to the probabilities when a row is read (ReferenceBlock::probs_row).
  constexpr int64_t kPiece = 1024;  // floats exponentiated, then summed, per piece (4 KiB)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = steps[r], lo = window_begin(t, window);
    auto row = P.row(r);
    auto seen = row.segment(lo, t - lo);
    const float mx = seen.maxCoeff();
    detail::LaneSums acc;  // τ's sum and ‖a‖² in double (t − lo terms), each piece summed while in L1
    for (int64_t a = 0; a < t - lo; a += kPiece) {
      auto piece = seen.segment(a, std::min(kPiece, t - lo - a));
      piece = (piece.array() - mx).exp().matrix();
      acc.add(piece.data(), piece.size());
    }
    double sum, sq;
    acc.total(sum, sq);
    row.head(lo).setZero();
    row.tail(t_max - t).setZero();
    inv[r] = 1.0 / sum;
    out.log_tau[r] = double(mx) + std::log(sum);
    out.probs_norm[r] = std::sqrt(sq) * inv[r];
  }
  Z.resize(rows, V.cols());
  reference_gemm_ab(P, V.topRows(t_max), Z);
  out.out.resize(rows, V.cols());
  out.out.noalias() = inv.asDiagonal() * Z.cast<double>();
  out.probs.resize(0, 0);
  out.probs_f.swap(P);  // the block keeps the float rows (P becomes the previous block's storage)
  out.probs_inv = std::move(inv);
}

size_t reference_block_end(const std::vector<int64_t>& steps, size_t begin, size_t max_rows) {
  size_t end = begin + 1;
  while (end < steps.size() && end - begin < max_rows && int64_t(end - begin + 1) * steps[end] <= (int64_t(1) << 22)) ++end;
  return end;
}

VecD global_attention_scores(const MatF& Q, const MatD& K, double scale, int64_t window) {
  const int64_t n = Q.rows();
  VecD g = VecD::Zero(n);
  const MatD V = MatD::Zero(n, 1);  // outputs are not needed
  std::vector<int64_t> steps(n);
  for (int64_t t = 0; t < n; ++t) steps[t] = t + 1;
  ReferenceBlock blk;
  for (size_t b0 = 0; b0 < steps.size();) {
    const size_t b1 = reference_block_end(steps, b0);
    exact_attention(Q, K, V, scale, std::vector<int64_t>(steps.begin() + b0, steps.begin() + b1), blk, window);
    g.head(blk.probs.cols()) += blk.probs.colwise().sum().transpose();
    b0 = b1;
  }
  return g;
}

}  // namespace kvsim
