// kvsim: float32 matrix products through OpenBLAS where the build links it, Eigen otherwise.
#pragma once
#include <string>

#include "kvsim/core/types.hpp"

namespace kvsim {

/// Row-major float block with a row stride (a MatF, or a run of its rows or leading columns).
using RefF = Eigen::Ref<MatF, 0, Eigen::OuterStride<>>;
using ConstRefF = Eigen::Ref<const MatF, 0, Eigen::OuterStride<>>;

/// C = A·Bᵀ: A [m, k], B [n, k], C [m, n] (float32, row-major). C must already have that shape.
/// Single-threaded in the calling thread and safe to call from many threads at once (kvsim's own
/// threads split the work). With OpenBLAS (scipy-openblas32, a pthreads build: its buffer allocator
/// is locked, and at one thread a call runs in its caller) this is cblas_sgemm; otherwise Eigen's
/// product. The two round differently (float32 sums in another order), so results record which one
/// ran (gemm_backend()). Throws kvsim::Error when the shapes do not agree.
void gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C);

/// C = A·B: A [m, k], B [k, n], C [m, n]; as gemm_abt.
void gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C);

/// The float32 GEMM in use, e.g. "OpenBLAS 0.3.34.481.3 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
/// or "Eigen 3.4.0"; written to results.h5 (`gemm_backend`) and printed by `kvsim --version`.
std::string gemm_backend();

}  // namespace kvsim
