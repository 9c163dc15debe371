#include "kvsim/analysis/subgen_algorithm.hpp"

#include <cmath>

#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"

namespace kvsim {

int64_t theorem1_s(double eps, int d, double c_s) {
  if (!(eps > 0) || !(c_s > 0)) throw Error("subgen: eps and c_s must be positive");
  return std::max<int64_t>(1, int64_t(std::ceil(c_s * d / (eps * eps))));
}

int64_t theorem1_t(double eps, double delta, double r, int64_t n, double c_t) {
  if (!(eps > 0) || !(c_t > 0)) throw Error("subgen: eps and c_t must be positive");
  double t = c_t / (eps * eps) * std::exp(2 * delta * r) * std::log(double(std::max<int64_t>(n, 2)));
  if (!(t < 1e8)) throw Error("subgen: Theorem 1's t = " + std::to_string(t) + " is too large (e^{2δr} explodes: reduce δ or r)");
  return std::max<int64_t>(1, int64_t(std::ceil(t)));
}

SubGen::SubGen(const SubGenConfig& cfg, int d, uint64_t seed)
    : cfg_(cfg), d_(d), seed_(seed), delta_(cfg.delta), reps_(16, d), reps_f_(16, d), rep_sqnorm_(16), samples_(16 * cfg.t, d), mk_(cfg.s, d), mv_(cfg.s, d),
      mv_sqnorm_(VecD::Zero(cfg.s)), m_index_(cfg.s, -1) {
  if (!(cfg.delta >= 0)) throw Error("subgen: delta must be ≥ 0");
  if (cfg.s < 1 || cfg.t < 1) throw Error("subgen: s and t must be ≥ 1");
  if (cfg.max_clusters < 0) throw Error("subgen: max_clusters must be ≥ 0");
  mk_.setZero();
  mv_.setZero();
}

void SubGen::begin_block(const MatF& K, int64_t first, int64_t b) {
  if (first < 0 || b < 0 || first + b > K.rows() || K.cols() != d_)
    throw Error("subgen: a block of keys outside the stream (" + std::to_string(first) + " + " + std::to_string(b) + " of " +
                std::to_string(K.rows()) + " rows)");
  block_first_ = first, block_b_ = b, block_m_ = clusters(), block_merges_ = merges_;
  block_keys_ = K.middleRows(first, b).cast<double>();
  block_dots_.noalias() = block_keys_ * reps_.topRows(block_m_).transpose();  // [b, m]
}

int64_t SubGen::nearest(int64_t index, const VecD& k, const float* kp, double& best_d2) {
  const int64_t m = clusters();
  int64_t best = -1;
  best_d2 = INFINITY;
  // Line 12: the nearest representative under hd::key_sqdist on the recorded keys, the first on
  // ties — the GPU replay's choice bit for bit. Found fast: ‖x_i‖² − 2<x_i, k> + ‖k‖² for all
  // representatives in one matrix-vector product, then the exact distance only for those whose
  // estimate is within a rounding bound (1e-9·(‖x_i‖² + ‖k‖²), far above the expansion's
  // ~d·1e-16) of the smallest — usually one.
  if (m > 0) {
    const double kk = k.squaredNorm();
    const int64_t row = index - block_first_;
    if (row >= 0 && row < block_b_ && merges_ == block_merges_) {  // begin_block's products, then the newer representatives
      est_.resize(m);
      est_.head(block_m_) = block_dots_.row(row).transpose();
      for (int64_t i = block_m_; i < m; ++i) est_[i] = reps_.row(i).dot(k);
    } else {
      est_.noalias() = reps_.topRows(m) * k;
    }
    double cut = INFINITY;
    for (int64_t i = 0; i < m; ++i) {
      const double tol = 1e-9 * (rep_sqnorm_[i] + kk) + 1e-300;
      est_[i] = rep_sqnorm_[i] - 2.0 * est_[i] + kk;
      cut = std::min(cut, est_[i] + tol);
    }
    for (int64_t i = 0; i < m; ++i) {
      if (est_[i] - 1e-9 * (rep_sqnorm_[i] + kk) > cut) continue;
      const double d2 = hd::key_sqdist(reps_f_.row(i).data(), kp, d_);
      if (d2 < best_d2) {
        best_d2 = d2;
        best = i;
      }
    }
  }
  return best;
}

void SubGen::update(int64_t index, const float* kp, const float* vp) {
  Eigen::Map<const VecF> kf(kp, d_), vf(vp, d_);
  // A non-finite key has no distance to anything: it would open clusters that no merge round can
  // absorb (the cap could never be met). Refuse it by name instead (e.g. a closed loop whose
  // activations overflowed under this policy).
  if (!kf.allFinite() || !vf.allFinite())
    throw Error("subgen: non-finite key or value at token " + std::to_string(index) +
                " (the stream itself overflowed; SubGen needs finite keys)");
  const VecD k = kf.cast<double>(), v = vf.cast<double>();
  // Every coin flip is hd::philox_u01 at (seed, token, slot, kind): a pure function, so the GPU
  // replay (sim/cuda/policies.cu) flips the same coins.
  const uint32_t tok = uint32_t(index);

  // Line 4: UPDATESOFTMAXNORMALIZER(D, δ, t, k).
  const int64_t m = clusters();
  double best_d2 = INFINITY;
  const int64_t best = nearest(index, k, kp, best_d2);
  if (best >= 0 && std::sqrt(best_d2) <= delta_) {  // line 13
    count_[best] += 1;                                  // line 14
    const double p = 1.0 / double(count_[best]);
    draw(tok, cfg_.t, hd::kDrawCluster);
    for (int64_t j = 0; j < cfg_.t; ++j) {              // lines 16-17
      if (u_[j] < p) {
        samples_.row(best * cfg_.t + j) = k.transpose();
        sample_index_[best][j] = index;
      }
    }
    assign_.push_back(int32_t(best));
  } else {  // lines 20-21: a new cluster with t copies of k
    if (m == reps_.rows()) {
      reps_.conservativeResize(2 * m, Eigen::NoChange);
      reps_f_.conservativeResize(2 * m, Eigen::NoChange);
      rep_sqnorm_.conservativeResize(2 * m);
      samples_.conservativeResize(2 * m * cfg_.t, Eigen::NoChange);
    }
    reps_.row(m) = k.transpose();
    reps_f_.row(m) = kf.transpose();
    rep_sqnorm_[m] = k.squaredNorm();
    count_.push_back(1);
    rep_index_.push_back(index);
    samples_.middleRows(m * cfg_.t, cfg_.t).rowwise() = k.transpose();
    sample_index_.emplace_back(cfg_.t, index);
    assign_.push_back(int32_t(m));
    while (cfg_.max_clusters > 0 && clusters() > cfg_.max_clusters) merge_clusters();
  }

  // Line 5: UPDATEMATRIXPRODUCT(M, s, μ, k, v); line 6: μ += ‖v‖².
  const double w = hd::key_sqnorm(cfg_.sample_by_key ? kp : vp, d_);  // the GPU's ‖v‖² bit for bit
  const double denom = mu_ + w;
  const double p = denom > 0 ? w / denom : 1.0;  // first token (μ = 0): every slot takes it
  if (p < 1.0) draw(tok, cfg_.s, hd::kDrawProduct);
  for (int64_t j = 0; j < cfg_.s; ++j) {
    if (p >= 1.0 || u_[j] < p) {
      mk_.row(j) = k.transpose();
      mv_.row(j) = v.transpose();
      mv_sqnorm_[j] = w;
      m_index_[j] = index;
    }
  }
  mu_ += w;
}

void SubGen::draw(uint32_t token, int64_t count, uint32_t kind) {
  // A separate loop of independent counters: the compiler vectorizes Philox here (2 ns per draw
  // vs ~20 interleaved with the slot updates); the values are hd::philox_u01's, as on the GPU.
  u_.resize(size_t(count));
  double* u = u_.data();
  for (int64_t j = 0; j < count; ++j) u[j] = hd::philox_u01(seed_, token, uint32_t(j), kind);
}

void SubGen::merge_clusters() {
  if (!(delta_ > 0)) {  // δ = 0: start from half the closest pair of representatives
    const int64_t m = clusters();
    double md = INFINITY;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < i; ++j) md = std::min(md, std::sqrt(hd::key_sqdist(reps_f_.row(i).data(), reps_f_.row(j).data(), d_)));
    delta_ = std::max(md / 2, 1e-12);
  }
  delta_ *= 2;
  const uint32_t round = uint32_t(merges_++);
  const int64_t m = clusters();
  std::vector<int64_t> kept;         // surviving cluster ids, in order
  std::vector<int32_t> into(m, -1);  // old id -> new id
  for (int64_t i = 0; i < m; ++i) {
    int64_t best = -1;
    double bd = INFINITY;
    for (size_t j = 0; j < kept.size(); ++j) {
      double dist = std::sqrt(hd::key_sqdist(reps_f_.row(kept[j]).data(), reps_f_.row(i).data(), d_));
      if (dist < bd) {
        bd = dist;
        best = int64_t(j);
      }
    }
    if (best >= 0 && bd <= delta_) {
      const int64_t a = kept[best];
      const double pa = double(count_[a]) / double(count_[a] + count_[i]);
      for (int64_t j = 0; j < cfg_.t; ++j) {
        if (!(hd::philox_u01(seed_, round, uint32_t(i * cfg_.t + j), hd::kDrawMerge) < pa)) {
          samples_.row(a * cfg_.t + j) = samples_.row(i * cfg_.t + j);
          sample_index_[a][j] = sample_index_[i][j];
        }
      }
      count_[a] += count_[i];
      into[i] = int32_t(best);
    } else {
      into[i] = int32_t(kept.size());
      kept.push_back(i);
    }
  }
  for (size_t j = 0; j < kept.size(); ++j) {
    const int64_t i = kept[j];
    if (int64_t(j) == i) continue;
    reps_.row(j) = reps_.row(i);
    reps_f_.row(j) = reps_f_.row(i);
    rep_sqnorm_[j] = rep_sqnorm_[i];
    count_[j] = count_[i];
    rep_index_[j] = rep_index_[i];
    samples_.middleRows(int64_t(j) * cfg_.t, cfg_.t) = samples_.middleRows(i * cfg_.t, cfg_.t);
    sample_index_[j] = std::move(sample_index_[i]);
  }
  const size_t mk = kept.size();
  count_.resize(mk);
  rep_index_.resize(mk);
  sample_index_.resize(mk);
  for (auto& a : assign_) a = into[a];
}

double SubGen::query(const Eigen::Ref<const VecD>& q, VecD& out) const {
  double tau;
  double c = query_parts(q, out, tau);
  if (!(tau > 0)) return -INFINITY;
  out /= tau;  // line 31
  return c + std::log(tau);
}

double SubGen::query_parts(const Eigen::Ref<const VecD>& q, VecD& out, double& tau) const {
  const int64_t m = clusters();
  out.setZero(d_);
  tau = 0;
  if (m == 0) return 0;
  // Logits of every stored key in two matrix-vector products over contiguous storage (all m·t cluster
  // samples, all s matrix-product slots); one shared shift c for z and τ (the ratio z/τ is shift-free).
  const VecD sl = samples_.topRows(m * cfg_.t) * q;
  const VecD ml = mk_ * q;
  const double c = std::max(sl.maxCoeff(), ml.maxCoeff());
  // Line 30: τ = Σ_i n_i/t Σ_{k∈S_i} e^{<q,k>}.
  const VecD e = (sl.array() - c).exp().matrix();
  for (int64_t i = 0; i < m; ++i) tau += double(count_[i]) / double(cfg_.t) * e.segment(i * cfg_.t, cfg_.t).sum();
  // Line 29: z = Σ_{(k,v)∈M} μ/(s‖v‖²) e^{<q,k>} v  (slots with ‖v‖ = 0 contribute the zero vector).
  VecD w(cfg_.s);
  for (int64_t j = 0; j < cfg_.s; ++j)
    w[j] = mv_sqnorm_[j] > 0 ? product_weight(j) * std::exp(ml[j] - c) : 0.0;
  out.noalias() = mv_.transpose() * w;
  return c;
}

void SubGen::query_rows(const MatD& Q, MatD& Z, std::vector<double>& log_tau) const {
  const int64_t m = clusters();
  const Eigen::Index G = Q.rows();
  Z.setZero(G, d_);
  log_tau.assign(size_t(G), -INFINITY);
  if (m == 0) return;
  // query_parts' two products with every row of Q at once: [m·t, G] and [s, G]. Coefficient-wise (lazyProduct): each
  // stored row is read from memory once and dotted with the G queries while it is in L1. A GEMM would first pack the
  // whole store (a copy as large as what it reads) to multiply it by only G columns.
  const auto Qt = Q.transpose();
  MatD SL(m * cfg_.t, G), ML(cfg_.s, G);
  SL.noalias() = samples_.topRows(m * cfg_.t).lazyProduct(Qt);
  ML.noalias() = mk_.lazyProduct(Qt);
  // The shift c of each column, and every exponential at once over the contiguous [m·t, G] rows (a column of a
  // row-major matrix is strided, and Eigen's exp would go scalar on it).
  const Eigen::RowVectorXd c = SL.colwise().maxCoeff().cwiseMax(ML.colwise().maxCoeff());
  const MatD E = (SL.rowwise() - c).array().exp().matrix();
  MatD W(cfg_.s, G);
  std::vector<double> tau(static_cast<size_t>(G), 0.0);
  for (Eigen::Index g = 0; g < G; ++g) {
    double t = 0;  // line 30, in query_parts' order
    for (int64_t i = 0; i < m; ++i) t += double(count_[i]) / double(cfg_.t) * E.col(g).segment(i * cfg_.t, cfg_.t).sum();
    for (int64_t j = 0; j < cfg_.s; ++j)  // line 29's weights
      W(j, g) = mv_sqnorm_[j] > 0 ? product_weight(j) * std::exp(ML(j, g) - c[g]) : 0.0;
    tau[size_t(g)] = t;
  }
  for (int64_t j = 0; j < cfg_.s; ++j)  // line 29's sum over M, each stored value read once for the G rows
    for (Eigen::Index g = 0; g < G; ++g) Z.row(g) += W(j, g) * mv_.row(j);
  for (Eigen::Index g = 0; g < G; ++g) {
    const double t = tau[size_t(g)];
    if (!(t > 0)) continue;  // as query(): −∞, z left scaled
    Z.row(g) /= t;            // line 31
    log_tau[size_t(g)] = c[g] + std::log(t);
  }
}

}  // namespace kvsim
