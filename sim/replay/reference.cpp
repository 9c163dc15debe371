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

OperatorNormTracker::OperatorNormTracker(int d) : G_(MatD::Zero(d, d)), x_(VecD::Ones(d) / std::sqrt(double(d))), d_(d) {}

void OperatorNormTracker::add(const float* v) {
  Eigen::Map<const VecF> vf(v, d_);
  // Both triangles, in place: G(i, j) and G(j, i) get the same fma(v_i, v_j, ·), so G stays exactly
  // symmetric, and op_norm multiplies by it directly. (Updating the upper triangle and mirroring it
  // into a full copy at every op_norm — a strided scalar copy — was 70% of op_norm's own time.)
  v_ = vf.cast<double>();
  G_.noalias() += v_ * v_.transpose();
  dirty_ = true;
}

namespace {

/// Largest eigenvalue of the symmetric tridiagonal matrix (diagonal a, off-diagonal b) by bisection
/// on the Sturm count (number of eigenvalues below x), to ~1e-15 relative.
double tridiagonal_max_eigenvalue(const VecD& a, const VecD& b) {
  const Eigen::Index m = a.size();
  double lo = INFINITY, hi = -INFINITY;
  for (Eigen::Index i = 0; i < m; ++i) {  // Gershgorin
    const double r = (i > 0 ? std::abs(b[i - 1]) : 0.0) + (i + 1 < m ? std::abs(b[i]) : 0.0);
    lo = std::min(lo, a[i] - r);
    hi = std::max(hi, a[i] + r);
  }
  auto below = [&](double x) {
    Eigen::Index count = 0;
    double q = 1;
    for (Eigen::Index i = 0; i < m; ++i) {
      q = a[i] - x - (i > 0 ? b[i - 1] * b[i - 1] / q : 0.0);
      if (q == 0) q = -1e-300;
      count += q < 0;
    }
    return count;
  };
  for (int it = 0; it < 200 && hi - lo > 1e-15 * std::max(std::abs(lo), std::abs(hi)); ++it) {
    const double mid = 0.5 * (lo + hi);
    if (below(mid) == m) hi = mid;  // every eigenvalue is below mid
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
  // Restarted Lanczos with full reorthogonalization, warm-started from the previous top Ritz vector:
  // Krylov convergence depends on the square root of the relative gap (power iteration on the
  // gap itself), so isotropic value streams (λ₂/λ₁ ≈ 1) converge in tens of matrix-vector products
  // instead of hundreds. Stops when the Ritz residual ‖Sx − θx‖ = |β_m s_m| ≤ 1e-9·θ, which bounds
  // |θ − λ| by 1e-9·θ (5e-10 relative on ‖V‖_op); after 20 restarts it falls back to a dense solver.
  if (!dirty_) return last_;
  const int m_max = std::min(d_, 24);
  if (Q_.rows() != d_ || Q_.cols() != m_max) Q_.resize(d_, m_max);
  double theta = 0;
  iters_ = 0;
  bool converged = false;
  double theta_prev = 0;
  for (int restart = 0; restart < 20 && !converged; ++restart) {
    VecD alpha(m_max), beta(m_max);
    Q_.col(0) = x_ / x_.norm();
    for (int j = 0; j < m_max; ++j) {
      w_.noalias() = G_ * Q_.col(j);  // a plain GEMV: ~2x faster than symv here
      VecD& w = w_;
      ++iters_;
      alpha[j] = Q_.col(j).dot(w);
      // Full reorthogonalization against every Lanczos vector so far (twice: classical Gram-Schmidt
      // loses orthogonality once the top Ritz value has converged).
      for (int pass = 0; pass < 2; ++pass) w -= Q_.leftCols(j + 1) * (Q_.leftCols(j + 1).transpose() * w);
      const int m = j + 1;
      const double beta_last = w.norm();
      const bool breakdown = beta_last <= 1e-14 * std::max(1e-300, std::abs(alpha[0]));
      // Ritz value of T_m, checked at m = 2, 4, 8, 12, ... by Sturm bisection (O(m) per bisection
      // step); the Ritz vector by inverse iteration on T_m − θI only when the iteration ends.
      if (breakdown || m == m_max || m == 2 || m % 4 == 0) {
        theta = tridiagonal_max_eigenvalue(alpha.head(m), beta.head(m - 1));
        // Ritz values increase monotonically towards λ₁; the eigenvalue converges like residual²/gap,
        // long before the eigenvector, so a stalled Ritz value ends the iteration.
        const bool stalled = m > 2 && theta - theta_prev <= 1e-11 * theta;
        theta_prev = theta;
        bool done = theta <= 0 || breakdown || stalled;
        if (done || m == m_max) {
          const VecD sv = tridiagonal_eigenvector(alpha.head(m), beta.head(m - 1), theta);
          done = done || std::abs(beta_last * sv[m - 1]) <= 1e-9 * theta;  // Ritz residual ‖Sx − θx‖
          VecD x = Q_.leftCols(m) * sv;
          const double nx = x.norm();
          if (nx > 0 && std::isfinite(nx)) x_ = x / nx;
          converged = done;
          break;
        }
      }
      beta[j] = beta_last;
      Q_.col(j + 1) = w / beta_last;
    }
  }
  if (!converged) {
    Eigen::SelfAdjointEigenSolver<MatD> es(G_);
    theta = es.eigenvalues().maxCoeff();
    x_ = es.eigenvectors().col(d_ - 1);
  }
  if (x_.norm() == 0 || !std::isfinite(x_.norm())) x_ = VecD::Ones(d_) / std::sqrt(double(d_));
  last_ = std::sqrt(std::max(0.0, theta));
  dirty_ = false;
  return last_;
}

}  // namespace kvsim
