#include "kvsim/reference.hpp"

#include <cmath>

#include "kvsim/error.hpp"

namespace kvsim {

void exact_attention(const MatF& Q, const MatD& K, const MatD& V, double scale, const std::vector<int64_t>& steps,
                     ReferenceBlock& out) {
  if (steps.empty()) throw Error("exact_attention: no steps");
  const int64_t rows = static_cast<int64_t>(steps.size());
  const int64_t t_max = steps.back();
  const int d = static_cast<int>(Q.cols());
  if (t_max > K.rows() || steps.front() < 1) throw Error("exact_attention: step out of range");
  MatD Qb(rows, d);
  for (int64_t r = 0; r < rows; ++r) Qb.row(r) = Q.row(steps[r] - 1).cast<double>() * scale;
  out.steps = steps;
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

size_t reference_block_end(const std::vector<int64_t>& steps, size_t begin) {
  size_t end = begin + 1;
  while (end < steps.size() && end - begin < 256 && int64_t(end - begin + 1) * steps[end] <= (int64_t(1) << 22)) ++end;
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
  VecD vd = vf.cast<double>();
  G_.selfadjointView<Eigen::Upper>().rankUpdate(vd);
  dirty_ = true;
}

double OperatorNormTracker::op_norm() {
  if (!dirty_) return last_;
  MatD S = G_.selfadjointView<Eigen::Upper>();
  double lambda = -1;
  iters_ = 0;
  const int kMax = 1000;
  for (; iters_ < kMax; ++iters_) {
    VecD y = S * x_;
    double rq = x_.dot(y);  // Rayleigh quotient of the current unit vector
    double ny = y.norm();
    if (ny == 0) {
      lambda = 0;
      break;
    }
    x_ = y / ny;
    bool done = std::abs(rq - lambda) <= 1e-12 * std::max(1e-300, std::abs(rq));
    lambda = rq;
    if (done) break;
  }
  if (iters_ == kMax) {  // pathological (nearly equal top eigenvalues): fall back to a direct solve
    Eigen::SelfAdjointEigenSolver<MatD> es(S);
    lambda = es.eigenvalues().maxCoeff();
    x_ = es.eigenvectors().col(d_ - 1);
  }
  if (x_.norm() == 0 || !std::isfinite(x_.norm())) x_ = VecD::Ones(d_) / std::sqrt(double(d_));
  last_ = std::sqrt(std::max(0.0, lambda));
  dirty_ = false;
  return last_;
}

}  // namespace kvsim
