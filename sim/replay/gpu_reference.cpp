// The engine's view of the GPU reference: one query head's ReferenceBlock from cuda::exact_attention.
#include "kvsim/replay/gpu_reference.hpp"

namespace kvsim::cuda {

void exact_attention_block(const MatF& Q, const MatF& K, const MatF& V, double scale, const std::vector<int64_t>& steps,
                           ReferenceBlock& out) {
  const int d = int(K.cols());
  std::vector<float> z, probs;
  std::vector<double> lt, pn;
  exact_attention(Q.data(), K.data(), V.data(), 1, 1, K.rows(), d, scale, steps, z, lt, pn, &probs);
  const Eigen::Index rows = Eigen::Index(steps.size()), t_max = steps.back();
  out.steps = steps;
  out.out = Eigen::Map<const MatF>(z.data(), rows, d).cast<double>();
  out.probs = Eigen::Map<const MatF>(probs.data(), rows, t_max).cast<double>();
  out.log_tau = Eigen::Map<const VecD>(lt.data(), rows);
  out.probs_norm = Eigen::Map<const VecD>(pn.data(), rows);
}

}  // namespace kvsim::cuda
