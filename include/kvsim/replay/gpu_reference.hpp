// kvsim: the engine's view of the GPU reference (Eigen types; kept out of kvsim/cuda/cuda.hpp so nvcc
// never compiles Eigen).
#pragma once
#include <vector>

#include "kvsim/cuda/cuda.hpp"
#include "kvsim/replay/reference.hpp"
#include "kvsim/core/types.hpp"

namespace kvsim::cuda {

/// One query head's ReferenceBlock (double, like exact_attention() in reference.hpp) computed on the
/// GPU by cuda::exact_attention — fp32 arithmetic, so within ~1e-5 of the CPU reference. Q, K, V are
/// [n, d] row-major. Throws kvsim::Error when no device is usable.
void exact_attention_block(const MatF& Q, const MatF& K, const MatF& V, double scale, const std::vector<int64_t>& steps,
                           ReferenceBlock& out);

}  // namespace kvsim::cuda
