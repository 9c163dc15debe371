// kvsim: the raw oneMKL SGEMM behind reference_gemm_abt / reference_gemm_ab (sim/core/blas.cpp checks
// the shapes and empty products before calling it). A file of its own: mkl_cblas.h and OpenBLAS's
// cblas.h declare the same enums.
#include "blas_mkl.hpp"

#ifdef KVSIM_HAVE_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#endif

namespace kvsim::detail {

#ifdef KVSIM_HAVE_MKL
bool mkl_sgemm(const ConstRefF& A, const ConstRefF& B, bool b_transposed, RefF C) {
  // The build links mkl_sequential: no threads of its own, so kvsim's threads call it side by side.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, MKL_INT(C.rows()), MKL_INT(C.cols()),
              MKL_INT(A.cols()), 1.0f, A.data(), MKL_INT(A.outerStride()), B.data(), MKL_INT(B.outerStride()), 0.0f,
              C.data(), MKL_INT(C.outerStride()));
  return true;
}

std::string mkl_backend() {
  MKLVersion v;
  mkl_get_version(&v);  // 2026.2 is MajorVersion 2026, UpdateVersion 2
  std::string cpu = v.Processor;  // the code path MKL dispatched to, e.g. "Intel(R) Advanced Vector Extensions 512 ..."
  if (const size_t cut = cpu.find(" with support"); cut != std::string::npos) cpu.resize(cut);
  return "oneMKL " + std::to_string(v.MajorVersion) + "." + std::to_string(v.UpdateVersion) + " build " + v.Build +
         " (sequential; " + cpu + ")";
}
#else
bool mkl_sgemm(const ConstRefF&, const ConstRefF&, bool, RefF) { return false; }
std::string mkl_backend() { return ""; }
#endif

}  // namespace kvsim::detail
