// Sums of float rows accumulated in double, shared by the float32 exact reference (τ's sum and ‖a‖²,
// sim/replay/reference.cpp), the float32 closed-form caches (sim/replay/banded.cpp) and the float32
// policies' softmax (sim/policies/slot_cache.hpp, softmax_f32).
#pragma once
#include <cstdint>

namespace kvsim::detail {

/// Σ x_i, and Σ x_i² when kSquares, of n floats, accumulated in double in 8 independent lanes (which
/// the compiler vectorizes without reassociating: Eigen's x.cast<double>().sum() runs scalar, 3x
/// slower here). Order: the lanes, then the tail, then the lanes' totals. `sq` is left alone when
/// !kSquares.
template <bool kSquares>
inline void lane_sums(const float* x, int64_t n, double& sum, double& sq) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const double v = x[i + k];
      s[k] += v;
      if constexpr (kSquares) q[k] += v * v;
    }
  sum = 0;
  if constexpr (kSquares) sq = 0;
  for (; i < n; ++i) {
    sum += double(x[i]);
    if constexpr (kSquares) sq += double(x[i]) * double(x[i]);
  }
  for (int k = 0; k < 8; ++k) {
    sum += s[k];
    if constexpr (kSquares) sq += q[k];
  }
}

/// Σ x_i of n floats in double (lane_sums<false>).
inline double lane_sum(const float* x, int64_t n) {
  double sum = 0, unused = 0;
  lane_sums<false>(x, n, sum, unused);
  return sum;
}

/// lane_sums<true> over a row given in consecutive pieces (each but the last a multiple of 8 long):
/// the same lanes, tail and order as one lane_sums<true> call over the whole row, so the same sums
/// bit for bit. Lets a caller sum each piece while it is still in L1 after writing it.
struct LaneSums {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail_s = 0, tail_q = 0;
  void add(const float* x, int64_t n) {
    double ls[8], lq[8];  // the lanes in locals, which the compiler keeps in vector registers
    for (int k = 0; k < 8; ++k) ls[k] = s[k], lq[k] = q[k];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) {
        const double v = x[i + k];
        ls[k] += v;
        lq[k] += v * v;
      }
    for (int k = 0; k < 8; ++k) s[k] = ls[k], q[k] = lq[k];
    for (; i < n; ++i) tail_s += double(x[i]), tail_q += double(x[i]) * double(x[i]);
  }
  void total(double& sum, double& sq) const {
    sum = tail_s, sq = tail_q;
    for (int k = 0; k < 8; ++k) sum += s[k], sq += q[k];
  }
};

}  // namespace kvsim::detail
