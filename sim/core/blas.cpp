#include "kvsim/core/blas.hpp"

#include <mutex>

#include "blas_mkl.hpp"
#include "kvsim/core/error.hpp"

#ifdef KVSIM_HAVE_OPENBLAS
#include <cblas.h>  // scipy-openblas32's header: every symbol carries the scipy_ prefix
#endif

namespace kvsim {

namespace {
void check(const char* what, Eigen::Index m, Eigen::Index k1, Eigen::Index k2, Eigen::Index n, const RefF& C) {
  if (k1 != k2 || C.rows() != m || C.cols() != n)
    throw Error(std::string(what) + ": shapes do not agree (" + std::to_string(m) + "x" + std::to_string(k1) + " by " +
                std::to_string(k2) + "x" + std::to_string(n) + " into " + std::to_string(C.rows()) + "x" +
                std::to_string(C.cols()) + ")");
}

#ifdef KVSIM_HAVE_OPENBLAS
/// OpenBLAS's pthreads build starts a pool of one thread per core; kvsim parallelizes over heads and
/// blocks itself, so every call runs in its caller (one thread), as Eigen's products do.
void init_once() {
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
}
#endif

/// C = A·B (b_transposed: A·Bᵀ), the shapes checked by the caller; `mkl`: on oneMKL where linked
/// (the float32 reference's products), else as the others.
void gemm(const ConstRefF& A, const ConstRefF& B, bool b_transposed, RefF C, bool mkl = false) {
  if (C.size() == 0) return;
  if (A.cols() == 0) {
    C.setZero();
    return;
  }
  if (mkl && detail::mkl_sgemm(A, B, b_transposed, C)) return;
#ifdef KVSIM_HAVE_OPENBLAS
  init_once();
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, blasint(C.rows()),
                    blasint(C.cols()), blasint(A.cols()), 1.0f, A.data(), blasint(A.outerStride()), B.data(),
                    blasint(B.outerStride()), 0.0f, C.data(), blasint(C.outerStride()));
#else
  if (b_transposed) C.noalias() = A * B.transpose();
  else C.noalias() = A * B;
#endif
}
}  // namespace

void gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C) {
  check("gemm_abt", A.rows(), A.cols(), B.cols(), B.rows(), C);
  gemm(A, B, true, C);
}

void gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C) {
  check("gemm_ab", A.rows(), A.cols(), B.rows(), B.cols(), C);
  gemm(A, B, false, C);
}

void reference_gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C) {
  check("reference_gemm_abt", A.rows(), A.cols(), B.cols(), B.rows(), C);
  gemm(A, B, true, C, true);
}

void reference_gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C) {
  check("reference_gemm_ab", A.rows(), A.cols(), B.rows(), B.cols(), C);
  gemm(A, B, false, C, true);
}

std::string reference_gemm_backend() {
  const std::string mkl = detail::mkl_backend();
  return mkl.empty() ? gemm_backend() : mkl;
}

std::string gemm_backend() {
#ifdef KVSIM_HAVE_OPENBLAS
  init_once();
  std::string cfg = scipy_openblas_get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return cfg;
#else
  return "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
         std::to_string(EIGEN_MINOR_VERSION);
#endif
}

}  // namespace kvsim
