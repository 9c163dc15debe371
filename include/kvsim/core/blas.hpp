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

/// The float32 GEMM of gemm_abt / gemm_ab (the model's linear layers, sim/model/llama.cpp), e.g.
/// "OpenBLAS 0.3.34.481.3 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64" or "Eigen 3.4.0"; printed
/// by `kvsim --version`.
std::string gemm_backend();

/// The float32 exact reference's two products (exact_attention_f32, `[eval] reference_precision =
/// "float32"`): C = A·Bᵀ and C = A·B, shapes and errors as gemm_abt / gemm_ab. On Intel oneMKL's
/// sequential layer where the build links it (CMake option KVSIM_MKL, the `mkl` wheel in .venv):
/// 1.2-1.4x OpenBLAS on the pass's shapes (128 rows × t keys × 128) on the 2-core Xeon host, so the
/// pass is as fast as PyTorch's SDPA, which itself runs on oneMKL/oneDNN (docs/performance.md). Else
/// gemm_abt / gemm_ab. Safe to call from many threads at once; a call runs in its caller.
void reference_gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C);
void reference_gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C);

/// The GEMM of reference_gemm_abt / reference_gemm_ab, e.g. "oneMKL 2026.2 build 20260915 (sequential; Intel(R) AVX-512 ...)"; written to
/// results.h5 (`gemm_backend`: the float32 reference's GEMM) and printed by `kvsim --version`.
std::string reference_gemm_backend();

}  // namespace kvsim
