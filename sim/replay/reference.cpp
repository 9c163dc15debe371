#include "kvsim/replay/reference.hpp"

#include <cmath>

#include "kvsim/core/error.hpp"
#include "lane_sums.hpp"

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

void exact_attention(const MatF& Q, const MatD& K, const MatD& V, double scale, const std::vector<int64_t>& steps,
                     ReferenceBlock& out) {
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
    const int64_t t = steps[r];
    auto row = out.probs.row(r);
    const double mx = row.head(t).maxCoeff();
    row.head(t) = (row.head(t).array() - mx).exp().matrix();  // Eigen's vectorized exp (~3.5x std::exp)
    const double sum = row.head(t).sum();
    row.tail(t_max - t).setZero();
    row.head(t) /= sum;
    out.log_tau[r] = mx + std::log(sum);
    out.probs_norm[r] = row.head(t).norm();
  }
  out.out.resize(rows, V.cols());
  out.out.noalias() = out.probs * V.topRows(t_max);
}

void exact_attention_f32(const MatF& Q, const MatF& K, const MatF& V, double scale, const std::vector<int64_t>& steps,
                         ReferenceBlock& out) {
  thread_local MatF Qb, P, Z;  // scratch reused across blocks (the block shapes repeat)
  P.swap(out.probs_f);         // reuse the storage the block held last time
  scaled_queries(Q, K.rows(), scale, steps, Qb);
  const int64_t rows = static_cast<int64_t>(steps.size());
  const int64_t t_max = steps.back();
  P.resize(rows, t_max);
  P.noalias() = Qb * K.topRows(t_max).transpose();
  out.steps = steps;
  out.log_tau.resize(rows);
  out.probs_norm.resize(rows);
  VecD inv(rows);
  // P keeps the unnormalized exp(l − max); the normalization is applied in double to the output rows
  // here and to the probabilities when a row is read (ReferenceBlock::probs_row).
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = steps[r];
    auto row = P.row(r);
    const float mx = row.head(t).maxCoeff();
    row.head(t) = (row.head(t).array() - mx).exp().matrix();
    double sum, sq;  // τ's sum and ‖a‖² in double (t terms)
    detail::lane_sums<true>(row.data(), t, sum, sq);
    row.tail(t_max - t).setZero();
    inv[r] = 1.0 / sum;
    out.log_tau[r] = double(mx) + std::log(sum);
    out.probs_norm[r] = std::sqrt(sq) * inv[r];
  }
  Z.resize(rows, V.cols());
  Z.noalias() = P * V.topRows(t_max);
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

VecD global_attention_scores(const MatF& Q, const MatD& K, double scale) {
  const int64_t n = Q.rows();
  VecD g = VecD::Zero(n);
  const MatD V = MatD::Zero(n, 1);  // outputs are not needed
  std::vector<int64_t> steps(n);
  for (int64_t t = 0; t < n; ++t) steps[t] = t + 1;
  ReferenceBlock blk;
  for (size_t b0 = 0; b0 < steps.size();) {
    const size_t b1 = reference_block_end(steps, b0);
    exact_attention(Q, K, V, scale, std::vector<int64_t>(steps.begin() + b0, steps.begin() + b1), blk);
    g.head(blk.probs.cols()) += blk.probs.colwise().sum().transpose();
    b0 = b1;
  }
  return g;
}

OperatorNormTracker::OperatorNormTracker(int d)
    : G_(MatD::Zero(d, d)),
      P_(MatD::Zero(kPending, d)),
      x_(VecD::Ones(d) / std::sqrt(double(d))),
      fresh_(VecD::Zero(d)),
      w_(d),
      d_(d) {}

void OperatorNormTracker::add(const float* v) {
  P_.row(np_) = Eigen::Map<const VecF>(v, d_).cast<double>().transpose();
  // Signs from the row index (splitmix-style bit mix), so rows cannot cancel in the sum.
  uint64_t h = uint64_t(rows_++) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  fresh_ += ((h >> 7) & 1 ? 1.0 : -1.0) * P_.row(np_).transpose();
  if (++np_ == kPending) flush();
  dirty_ = true;
}

void OperatorNormTracker::flush() {
  // One rank-np GEMM instead of np rank-1 updates (each a read-modify-write of all of G: 3.2 µs at
  // d = 128 here). Both triangles, so products use a plain GEMV (~2x faster than symv here).
  if (np_ == 0) return;
  const auto P = P_.topRows(np_);
  G_.noalias() += P.transpose() * P;
  np_ = 0;
}

const MatD& OperatorNormTracker::gram() {
  flush();
  return G_;
}

void OperatorNormTracker::gram_times(const double* x, double* w) {
  Eigen::Map<const VecD> xv(x, d_);
  Eigen::Map<VecD> wv(w, d_);
  wv.noalias() = G_ * xv;
  if (np_ > 0) {
    const auto P = P_.topRows(np_);
    h_.noalias() = P * xv;
    wv.noalias() += P.transpose() * h_;
  }
}

namespace {

/// k-th largest eigenvalue (k = 1: the largest) of the symmetric tridiagonal matrix (diagonal a,
/// off-diagonal b) by bisection on the Sturm count (number of eigenvalues below x), to `rel_tol`
/// relative. `floor`, when finite, is a known lower bound (a Ritz value of a leading submatrix, by
/// Cauchy interlacing): the bracket is then found by steps up from it (1e-8, 16x larger each time),
/// which saves most of the bisection steps when Lanczos is near convergence.
double tridiagonal_eigenvalue(const VecD& a, const VecD& b, Eigen::Index k, double rel_tol, double floor = -INFINITY) {
  const Eigen::Index m = a.size();
  double lo = INFINITY, hi = -INFINITY;
  for (Eigen::Index i = 0; i < m; ++i) {  // Gershgorin
    const double r = (i > 0 ? std::abs(b[i - 1]) : 0.0) + (i + 1 < m ? std::abs(b[i]) : 0.0);
    lo = std::min(lo, a[i] - r);
    hi = std::max(hi, a[i] + r);
  }
  auto below_kth = [&](double x) {  // is the k-th largest eigenvalue below x?
    Eigen::Index count = 0;
    double q = 1;
    for (Eigen::Index i = 0; i < m; ++i) {
      q = a[i] - x - (i > 0 ? b[i - 1] * b[i - 1] / q : 0.0);
      if (q == 0) q = -1e-300;
      count += q < 0;
    }
    return count >= m - k + 1;
  };
  if (std::isfinite(floor) && floor > lo && floor < hi) {
    lo = floor;
    for (double step = 1e-8 * std::max(std::abs(floor), 1e-300); lo + step < hi; step *= 16) {
      if (below_kth(lo + step)) {
        hi = lo + step;
        break;
      }
      lo += step;
    }
  }
  for (int it = 0; it < 200 && hi - lo > rel_tol * std::max(std::abs(lo), std::abs(hi)); ++it) {
    const double mid = 0.5 * (lo + hi);
    if (below_kth(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

/// Unit eigenvector of the tridiagonal matrix for eigenvalue θ (inverse iteration, 3 sweeps of a
/// tridiagonal solve of (T − θI)y = y_prev with a tiny shift so it is never exactly singular).
VecD tridiagonal_eigenvector(const VecD& a, const VecD& b, double theta) {
  const Eigen::Index m = a.size();
  VecD y = VecD::Ones(m) / std::sqrt(double(m));
  const double shift = theta + 1e-10 * std::max(1.0, std::abs(theta));
  VecD c(m), d(m);
  for (int sweep = 0; sweep < 3; ++sweep) {
    // Thomas algorithm on (T − shift·I) y_new = y.
    double denom = a[0] - shift;
    if (denom == 0) denom = 1e-300;
    c[0] = m > 1 ? b[0] / denom : 0;
    d[0] = y[0] / denom;
    for (Eigen::Index i = 1; i < m; ++i) {
      denom = a[i] - shift - b[i - 1] * c[i - 1];
      if (denom == 0) denom = 1e-300;
      c[i] = i + 1 < m ? b[i] / denom : 0;
      d[i] = (y[i] - b[i - 1] * d[i - 1]) / denom;
    }
    y[m - 1] = d[m - 1];
    for (Eigen::Index i = m - 2; i >= 0; --i) y[i] = d[i] - c[i] * y[i + 1];
    const double ny = y.norm();
    if (!(ny > 0) || !std::isfinite(ny)) return VecD::Unit(m, m - 1);
    y /= ny;
  }
  return y;
}

}  // namespace

double OperatorNormTracker::op_norm() {
  // Restarted Lanczos warm-started from the previous top Ritz vector: Krylov convergence depends on
  // the square root of the relative gap (power iteration on the gap itself), so isotropic value
  // streams (λ₂/λ₁ ≈ 1) converge in tens of matrix-vector products instead of hundreds. The Ritz value
  // and the Ritz residual r = ‖Gx − θx‖ = |β_m s_m| are checked after 1, 2, …, 8, 12, 16, 20, 24
  // products; it stops when r ≤ 1e-9·θ (|θ − λ| ≤ r for the eigenvalue λ nearest θ), when
  // r² ≤ 1e-11·θ·gap (|θ − λ| ≤ r²/gap, the gap estimated by the second Ritz value), or when the Ritz
  // value stalls (≤ 1e-11·θ between checks); after 20 restarts it falls back to a dense solver.
  constexpr double kResidual = 1e-9, kGapResidual = 1e-11, kStall = 1e-11;
  if (!dirty_) return last_;
  const int m_max = std::min(d_, 24);
  if (Q_.rows() != d_ || Q_.cols() != m_max) Q_.resize(d_, m_max);
  double theta = 0;
  iters_ = 0;
  bool converged = false;
  double theta_prev = 0;
  VecD& alpha = alpha_;
  VecD& beta = beta_;
  alpha.resize(m_max);
  beta.resize(m_max);
  // The warm start alone can miss a direction the new rows brought in: if the last Ritz vector has no
  // component along the new top eigenvector (exact zeros, e.g. values that move to other coordinates),
  // no Krylov space built from it ever reaches it. A top eigenvector u orthogonal to every added row
  // keeps λ_max unchanged (λ only grows by Σ (uᵀv)²), so a start vector with a component along the
  // new rows (their signed sum, signs hashed from the row index, at 1e-3 of the warm vector) closes
  // that gap; Lanczos amplifies the component as fast as the new eigenvalue stands out.
  const double nf = fresh_.norm();
  if (nf > 0) x_ = x_ / x_.norm() + 1e-3 * fresh_ / nf;
  fresh_.setZero();
  for (int restart = 0; restart < 20 && !converged; ++restart) {
    Q_.col(0) = x_ / x_.norm();
    for (int j = 0; j < m_max; ++j) {
      gram_times(Q_.col(j).data(), w_.data());
      ++iters_;
      alpha[j] = Q_.col(j).dot(w_);
      // The three-term recurrence, then reorthogonalization against every Lanczos vector so far,
      // repeated once when it removed most of the vector (Daniel–Gragg–Kaufman–Stewart criterion):
      // orthogonality is lost once the top Ritz value has converged.
      w_ -= alpha[j] * Q_.col(j);
      if (j > 0) w_ -= beta[j - 1] * Q_.col(j - 1);
      const auto B = Q_.leftCols(j + 1);
      for (int pass = 0; pass < 2; ++pass) {
        const double before = w_.norm();
        h_.noalias() = B.transpose() * w_;
        w_.noalias() -= B * h_;
        if (w_.norm() > 0.7 * before) break;
      }
      const int m = j + 1;
      const double beta_last = w_.norm();
      const bool breakdown = beta_last <= 1e-14 * std::max(1e-300, std::abs(alpha[0]));
      // Ritz value of T_m by Sturm bisection, its vector by inverse iteration (both O(m)).
      if (breakdown || m == m_max || m <= 8 || m % 4 == 0) {
        // θ by bisection from the last checked Ritz value (never above this one, by interlacing; the
        // restart's first Ritz value is the warm vector's Rayleigh quotient, the last θ up to rounding).
        const double floor = theta_prev * (1 - 1e-12);
        theta = m == 1 ? alpha[0] : tridiagonal_eigenvalue(alpha.head(m), beta.head(m - 1), 1, 1e-14, floor);
        // Ritz values increase monotonically towards λ₁ and converge like residual²/gap, long before
        // the vector: a stalled Ritz value also ends the iteration.
        const bool stalled = m > 2 && theta - theta_prev <= kStall * theta;
        theta_prev = theta;
        const VecD sv = m == 1 ? VecD::Ones(1) : tridiagonal_eigenvector(alpha.head(m), beta.head(m - 1), theta);
        const double res = std::abs(beta_last * sv[m - 1]);  // Ritz residual ‖Gx − θx‖
        // |θ − λ| ≤ res for the eigenvalue λ nearest θ, and ≤ res²/gap once the gap to the rest of the
        // spectrum is known; the gap is estimated by the second Ritz value (to 1e-6 relative).
        bool done = theta <= 0 || breakdown || stalled || res <= kResidual * theta;
        if (!done && m >= 2 && res * res <= kGapResidual * theta * theta) {
          const double gap = theta - tridiagonal_eigenvalue(alpha.head(m), beta.head(m - 1), 2, 1e-6);
          done = res * res <= kGapResidual * theta * gap;
        }
        if (done || m == m_max) {
          VecD x = Q_.leftCols(m) * sv;
          const double nx = x.norm();
          if (nx > 0 && std::isfinite(nx)) x_ = x / nx;
          converged = done;
          break;
        }
      }
      beta[j] = beta_last;
      Q_.col(j + 1) = w_ / beta_last;
    }
  }
  if (!converged) {
    Eigen::SelfAdjointEigenSolver<MatD> es(gram());
    theta = es.eigenvalues().maxCoeff();
    x_ = es.eigenvectors().col(d_ - 1);
  }
  if (x_.norm() == 0 || !std::isfinite(x_.norm())) x_ = VecD::Ones(d_) / std::sqrt(double(d_));
  last_ = std::sqrt(std::max(0.0, theta));
  dirty_ = false;
  return last_;
}

}  // namespace kvsim
