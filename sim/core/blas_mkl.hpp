// Internal to sim/core: oneMKL's SGEMM where the build links it (CMake option KVSIM_MKL).
#pragma once
#include <string>

#include "kvsim/core/blas.hpp"

namespace kvsim::detail {
/// C = A·B (b_transposed: A·Bᵀ) on oneMKL's sequential layer, shapes already checked and non-empty;
/// false (C untouched) when the build has no oneMKL.
bool mkl_sgemm(const ConstRefF& A, const ConstRefF& B, bool b_transposed, RefF C);
/// "oneMKL 2026.2 build 20260915 (sequential; <the code path MKL dispatched to>)", or "" without oneMKL.
std::string mkl_backend();
}  // namespace kvsim::detail
