// Internal: the per-step attention of the fused state kernels (h2o and buzz, state_kernels.cu), one
// block of kStateThreads per KV head. Warps share the work so loads are coalesced and many are in
// flight: a warp per cached key for the logits (lanes over the head dimension), a warp per group of
// cached tokens for the weighted sum of values (lanes over the head dimension), and warp shuffles
// for the block-wide softmax merge and arg-min (two block barriers each instead of a tree of
// log₂(threads)). Summation orders differ from the CPU's sequential loops only by rounding: the
// parity tests (tests/gpu/cuda_parity.cpp) hold both to ≤ 1e-4 and identical kept sets.
#pragma once
#include <cuda_runtime.h>

#include "kvsim/core/hd.hpp"

namespace kvsim::cuda_impl {

constexpr int kStateThreads = 256;  ///< threads per block of h2o_kernel and buzz_kernel (8 warps)
constexpr int kStateWarps = kStateThreads / 32;
constexpr int kValueDims = 256;  ///< head dimensions per pass of warp_values (8 per lane)

/// lg[j] = <qs, K[pos_of(j)]> for j < m: fp32 products of the scaled query qs [d] (shared memory)
/// and the key rows of Kh ([n][d]). With d a multiple of 4 (16-byte rows), a warp takes 8 keys at a
/// time, 4 lanes per key over float4 chunks of the row (each lane's chunks are independent loads:
/// d/16 of them in flight per lane, so the step is not one L2 round trip per pair of keys), summed
/// by two shuffles; otherwise one warp per key, two keys in flight, lanes over d.
template <class PosOf>
__device__ inline void warp_logits(const float* qs, const float* Kh, int d, long long m, PosOf pos_of, float* lg) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if ((d & 3) == 0) {
    const int sub = lane & 3, d4 = d >> 2;
    const float4* q4 = reinterpret_cast<const float4*>(qs);
    for (long long j0 = 8LL * warp; j0 < m; j0 += 8LL * kStateWarps) {
      const long long j = j0 + (lane >> 2);
      const bool live = j < m;
      const float4* k4 = reinterpret_cast<const float4*>(Kh + pos_of(live ? j : j0) * d);
      float a = 0.f;
#pragma unroll 8
      for (int i = sub; i < d4; i += 4) {
        const float4 k = __ldg(k4 + i), q = q4[i];
        a = fmaf(q.x, k.x, a);
        a = fmaf(q.y, k.y, a);
        a = fmaf(q.z, k.z, a);
        a = fmaf(q.w, k.w, a);
      }
      a += __shfl_xor_sync(0xffffffffu, a, 1);
      a += __shfl_xor_sync(0xffffffffu, a, 2);
      if (sub == 0 && live) lg[j] = a;
    }
    return;
  }
  for (long long j = warp; j < m; j += 2 * kStateWarps) {
    const long long j2 = j + kStateWarps;
    const bool two = j2 < m;
    const float* k = Kh + pos_of(j) * d;
    const float* k2 = Kh + pos_of(two ? j2 : j) * d;
    float a = 0.f, b = 0.f;
#pragma unroll 4
    for (int i = lane; i < d; i += 32) {
      a = fmaf(qs[i], k[i], a);
      b = fmaf(qs[i], k2[i], b);
    }
    for (int off = 16; off > 0; off >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, off);
      b += __shfl_xor_sync(0xffffffffu, b, off);
    }
    if (lane == 0) {
      lg[j] = a;
      if (two) lg[j2] = b;
    }
  }
}

/// Block-wide merge of every thread's online-softmax state: shuffles within each warp, then warp 0
/// over the warps' states; every thread returns the total. `sw` holds kStateWarps states (shared).
__device__ inline hd::OnlineSoftmax<double> block_merge_shfl(hd::OnlineSoftmax<double> st, hd::OnlineSoftmax<double>* sw) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const hd::OnlineSoftmax<double> o{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s1, off),
                                      __shfl_xor_sync(0xffffffffu, st.s2, off)};
    st.merge(o);
  }
  if (lane == 0) sw[warp] = st;
  __syncthreads();
  hd::OnlineSoftmax<double> tot = sw[0];
  for (int w = 1; w < kStateWarps; ++w) tot.merge(sw[w]);  // every thread, the same fixed order
  __syncthreads();  // sw may be reused right after
  return tot;
}

/// z[i] = Σ_{j<m} p[j] · V[pos_of(j)][i] for i < d, in double, written as float to zout: warps over
/// j, lanes over i (coalesced rows of Vh [n][d]), then the warps' partial sums added in warp order
/// through `red` (shared, kStateWarps × kValueDims doubles). Every thread must call it.
template <class PosOf>
__device__ inline void warp_values(const double* p, const float* Vh, int d, long long m, PosOf pos_of, double* red,
                                   float* zout) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kPer = kValueDims / 32;
  for (int i0 = 0; i0 < d; i0 += kValueDims) {
    double acc[kPer];
#pragma unroll
    for (int c = 0; c < kPer; ++c) acc[c] = 0.0;
    for (long long j = warp; j < m; j += kStateWarps) {
      const double pj = p[j];
      const float* v = Vh + pos_of(j) * d + i0;
#pragma unroll
      for (int c = 0; c < kPer; ++c)
        if (i0 + lane + 32 * c < d) acc[c] += pj * double(v[lane + 32 * c]);
    }
#pragma unroll
    for (int c = 0; c < kPer; ++c) red[warp * kValueDims + lane + 32 * c] = acc[c];
    __syncthreads();
    for (int i = threadIdx.x; i < kValueDims && i0 + i < d; i += blockDim.x) {
      double s = 0.0;
      for (int w = 0; w < kStateWarps; ++w) s += red[w * kValueDims + i];
      zout[i0 + i] = float(s);
    }
    __syncthreads();
  }
}

}  // namespace kvsim::cuda_impl
