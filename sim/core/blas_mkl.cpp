// kvsim: the float32 exact reference's GEMMs on Intel oneMKL where the build links it
// (include/kvsim/core/blas.hpp). A file of its own: mkl_cblas.h and OpenBLAS's cblas.h declare the
// same enums.
#include <string>

#include "kvsim/core/blas.hpp"
#include "kvsim/core/error.hpp"

#ifdef KVSIM_HAVE_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#endif

namespace kvsim {

#ifdef KVSIM_HAVE_MKL
namespace {
/// C = A·B (b_transposed: A·Bᵀ) on MKL's sequential layer (the build links mkl_sequential: no
/// threads of its own, so kvsim's threads call it side by side).
void mkl_gemm(const char* what, const ConstRefF& A, const ConstRefF& B, bool b_transposed, RefF C) {
  const Eigen::Index k2 = b_transposed ? B.cols() : B.rows(), n = b_transposed ? B.rows() : B.cols();
  if (A.cols() != k2 || C.rows() != A.rows() || C.cols() != n)
    throw Error(std::string(what) + ": shapes do not agree (" + std::to_string(A.rows()) + "x" + std::to_string(A.cols()) +
                " by " + std::to_string(k2) + "x" + std::to_string(n) + " into " + std::to_string(C.rows()) + "x" +
                std::to_string(C.cols()) + ")");
  if (C.size() == 0) return;
  if (A.cols() == 0) {
    C.setZero();
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, MKL_INT(C.rows()), MKL_INT(C.cols()),
              MKL_INT(A.cols()), 1.0f, A.data(), MKL_INT(A.outerStride()), B.data(), MKL_INT(B.outerStride()), 0.0f,
              C.data(), MKL_INT(C.outerStride()));
}
}  // namespace

void reference_gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C) { mkl_gemm("reference_gemm_abt", A, B, true, C); }
void reference_gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C) { mkl_gemm("reference_gemm_ab", A, B, false, C); }

std::string reference_gemm_backend() {
  MKLVersion v;
  mkl_get_version(&v);  // 2026.2 is MajorVersion 2026, UpdateVersion 2
  std::string cpu = v.Processor;  // the code path MKL dispatched to, e.g. "Intel(R) Advanced Vector Extensions 512 ..."
  if (const size_t cut = cpu.find(" with support"); cut != std::string::npos) cpu.resize(cut);
  return "oneMKL " + std::to_string(v.MajorVersion) + "." + std::to_string(v.UpdateVersion) + " build " + v.Build +
         " (sequential; " + cpu + ")";
}
#else
void reference_gemm_abt(const ConstRefF& A, const ConstRefF& B, RefF C) { gemm_abt(A, B, C); }
void reference_gemm_ab(const ConstRefF& A, const ConstRefF& B, RefF C) { gemm_ab(A, B, C); }
std::string reference_gemm_backend() { return gemm_backend(); }
#endif

}  // namespace kvsim
