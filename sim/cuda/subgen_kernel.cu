// subgen on the GPU (see policies.cu's header): SubGen Algorithm 1, one block per KV head.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kvsim/core/hd.hpp"
#include "policy_kernels.cuh"

namespace kvsim::cuda_impl {

/// kvsim's max_clusters variant (SubGen::merge_clusters), run by the whole block decision for
/// decision: while the clusters exceed the cap, δ doubles and each cluster (in order) merges into the
/// nearest earlier kept one when its representative lies within δ (each merged sample slot from
/// either side by a Philox coin at (seed, round, slot)). The distances of a cluster to the kept ones
/// and δ's first value (half the closest pair, a minimum: exact in any order) are computed by all
/// threads; the nearest is block_argmin's first minimum, as the serial scan; the sample slots are
/// drawn in parallel and the bookkeeping is thread 0's. m, merges, delta and nk are shared; bd, bi
/// are block_argmin's arrays.
__device__ void subgen_merge_rounds(const float* Kh, int d, long long tt, long long max_clusters, uint64_t seed,
                                    long long* rep, long long* cnt, long long* keep, long long* samp, long long& m,
                                    long long& merges, double& delta, long long& nk, double* bd, int64_t* bi) {
  const int tid = threadIdx.x;
  auto dist = [&](long long a, long long b) { return sqrt(hd::key_sqdist(Kh + rep[a] * d, Kh + rep[b] * d, d)); };
  while (max_clusters > 0 && m > max_clusters) {
    if (!(delta > 0)) {
      double md = INFINITY;
      for (long long i = 1; i < m; ++i)
        for (long long j = tid; j < i; j += blockDim.x) md = fmin(md, dist(i, j));
      double b;
      int64_t unused;
      block_argmin(md, md < INFINITY ? 0 : -1, bd, bi, &b, &unused);
      if (tid == 0) delta = b / 2 > 1e-12 ? b / 2 : 1e-12;
      __syncthreads();
    }
    const uint32_t round = uint32_t(merges);
    __syncthreads();
    if (tid == 0) {
      delta *= 2;
      ++merges;
      nk = 0;
    }
    __syncthreads();
    const long long mm = m;
    for (long long i = 0; i < mm; ++i) {
      const long long k = nk;
      double my = INFINITY;
      int64_t mi = -1;
      for (long long j = tid; j < k; j += blockDim.x) {
        const double x = dist(keep[j], i);
        if (x < my) {
          my = x;
          mi = j;
        }
      }
      double bdist;
      int64_t best;
      block_argmin(my, mi, bd, bi, &bdist, &best);
      if (best >= 0 && bdist <= delta) {
        const long long a = keep[best];
        const double pa = double(cnt[a]) / double(cnt[a] + cnt[i]);
        for (long long j = tid; j < tt; j += blockDim.x)
          if (!(hd::philox_u01(seed, round, uint32_t(i * tt + j), hd::kDrawMerge) < pa)) samp[a * tt + j] = samp[i * tt + j];
        __syncthreads();  // every thread has read cnt[a]
        if (tid == 0) cnt[a] += cnt[i];
      } else if (tid == 0) {
        keep[nk++] = i;
      }
      __syncthreads();
    }
    if (tid == 0) {
      for (long long j = 0; j < nk; ++j) {
        const long long i = keep[j];
        if (i == j) continue;
        rep[j] = rep[i];
        cnt[j] = cnt[i];
        for (long long x = 0; x < tt; ++x) samp[j * tt + x] = samp[i * tt + x];
      }
      m = nk;
    }
    __syncthreads();
  }
}

/// Line 12: the nearest representative of key kt under hd::key_sqdist (block arg-min, ties to the
/// lower index; the CPU's first minimum). Called by the whole block.
__device__ void subgen_nearest(const float* Kh, const float* kt, int d, const long long* rep, long long m, double* bd,
                               int64_t* bi, double* best_d2, int64_t* b) {
  double my_d = INFINITY;
  int64_t my_i = -1;
  for (long long i = threadIdx.x; i < m; i += blockDim.x) {
    const double d2 = hd::key_sqdist(Kh + rep[i] * d, kt, d);
    if (d2 < my_d) {
      my_d = d2;
      my_i = i;
    }
  }
  block_argmin(my_d, my_i, bd, bi, best_d2, b);
}

/// Lines 5-6: each matrix-product slot replaced by token t w.p. ‖v‖²/(μ + ‖v‖²) (Philox coin at
/// (seed, t, slot)); then μ += ‖v‖² (mu in shared memory). Called by the whole block.
__device__ void subgen_product_update(const float* Vh, int d, long long t, long long s, uint64_t seed, long long* midx,
                                      double* mvsq, double& mu) {
  const double w = hd::key_sqnorm(Vh + t * d, d);
  const double denom = mu + w, p = denom > 0 ? w / denom : 1.0;
  for (long long j = threadIdx.x; j < s; j += blockDim.x)
    if (p >= 1.0 || hd::philox_u01(seed, uint32_t(t), uint32_t(j), hd::kDrawProduct) < p) {
      midx[j] = t;
      mvsq[j] = w;
    }
  __syncthreads();
  if (threadIdx.x == 0) mu += w;
  __syncthreads();
}

/// Lines 29-31 for every query head of KV head kvh at step t (block r): z/τ from the cluster samples
/// (τ) and the matrix-product samples (z), in one shared log-domain shift. Called by the whole block.
__device__ void subgen_answer(const float* Q, const float* Kh, const float* Vh, int kvh, int group, long long n, int d,
                              double scale, long long t, int r, int rows, long long m, long long tt, long long s,
                              double mu, const long long* cnt, const long long* samp, const long long* midx,
                              const double* mvsq, double* lg, double* qd, double* red, float* z, double* log_sum) {
  const int tid = threadIdx.x;
  const long long ms = m * tt, L = ms + s;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int i = tid; i < d; i += blockDim.x) qd[i] = scale * double(Q[((long long)h * n + t) * d + i]);
    __syncthreads();
    double mx = -INFINITY;
    for (long long j = tid; j < L; j += blockDim.x) {
      const long long id = j < ms ? samp[j] : midx[j - ms];
      double acc = 0.0;
      if (id >= 0)
        for (int i = 0; i < d; ++i) acc += qd[i] * double(Kh[id * d + i]);
      lg[j] = acc;
      mx = fmax(mx, acc);
    }
    red[tid] = mx;
    __syncthreads();
    for (int off = blockDim.x / 2; off > 0; off >>= 1) {
      if (tid < off) red[tid] = fmax(red[tid], red[tid + off]);
      __syncthreads();
    }
    const double c = red[0];
    __syncthreads();
    double part = 0.0;  // τ·e^{−c} = Σ_i n_i/t Σ_{k∈S_i} e^{<q,k>−c}
    for (long long j = tid; j < ms; j += blockDim.x) part += double(cnt[j / tt]) / double(tt) * exp(lg[j] - c);
    red[tid] = part;
    __syncthreads();
    for (int off = blockDim.x / 2; off > 0; off >>= 1) {
      if (tid < off) red[tid] += red[tid + off];
      __syncthreads();
    }
    const double tau = red[0];
    __syncthreads();  // every thread has read red[0] and the logits
    // The weights μ/(s‖v_j‖²) e^{<q,k_j>−c} once per sample, in place of its logit (0 for an empty slot).
    for (long long j = tid; j < s; j += blockDim.x) lg[ms + j] = mvsq[j] > 0 ? mu / (double(s) * mvsq[j]) * exp(lg[ms + j] - c) : 0.0;
    __syncthreads();
    for (int i = tid; i < d; i += blockDim.x) {
      double acc = 0.0;  // z·e^{−c} = Σ_j μ/(s‖v_j‖²) e^{<q,k_j>−c} v_j
      for (long long j = 0; j < s; ++j)
        if (mvsq[j] > 0) acc += lg[ms + j] * double(Vh[midx[j] * d + i]);
      z[((long long)h * rows + r) * d + i] = float(tau > 0 ? acc / tau : acc);
    }
    if (tid == 0) log_sum[(long long)h * rows + r] = tau > 0 ? c + log(tau) : -INFINITY;
    __syncthreads();
  }
}

/// subgen (SubGen Algorithm 1, SubGen §2; include/kvsim/analysis/subgen_algorithm.hpp), one block per KV head over
/// the stream, the CPU's SubGen::update step by step: the nearest representative by a block arg-min
/// of hd::key_sqdist under (distance, index) order (the CPU's first minimum); each sample slot's coin
/// hd::philox_u01 at (seed, token, slot) — the CPU's flips; merge rounds (max_clusters > 0) as
/// SubGen::merge_clusters, block-parallel (subgen_merge_rounds). At each evaluated step the group's answers (lines
/// 29-31, one shared shift): z/τ into z, log τ̂ into log_sum, the cluster count into kept[..][0].
/// Token ids index the stream in device memory. Scratch per KV head: rep, cnt, keep [cap_m], samp
/// [cap_m·t], midx [s], mvsq [s], lg [cap_m·t + s].
__global__ void subgen_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, double scale,
                              double delta0, long long s, long long tt, long long max_clusters, long long cap_m,
                              const unsigned long long* seeds, const long long* steps, int rows, float* z,
                              double* log_sum, long long* kept, long long* rep_all, long long* cnt_all,
                              long long* keep_all, long long* samp_all, long long* midx_all, double* mvsq_all,
                              double* lg_all, int* error) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  long long* rep = rep_all + (long long)kvh * cap_m;
  long long* cnt = cnt_all + (long long)kvh * cap_m;
  long long* keep = keep_all + (long long)kvh * cap_m;
  long long* samp = samp_all + (long long)kvh * cap_m * tt;
  long long* midx = midx_all + (long long)kvh * s;
  double* mvsq = mvsq_all + (long long)kvh * s;
  double* lg = lg_all + (long long)kvh * (cap_m * tt + s);
  const uint64_t seed = seeds[kvh];
  extern __shared__ double qd[];  // [d]
  __shared__ double bd[kPolicyThreads], red[kPolicyThreads];
  __shared__ int64_t bi[kPolicyThreads];
  __shared__ long long m, merges, nk;
  __shared__ double mu, delta, p_new;
  __shared__ long long target;  // the cluster the token joins, or −1 for a new one
  if (tid == 0) {
    m = 0;
    merges = 0;
    mu = 0.0;
    delta = delta0;
  }
  for (long long j = tid; j < s; j += blockDim.x) {
    midx[j] = -1;
    mvsq[j] = 0.0;
  }
  __syncthreads();
  int r = 0;
  for (long long t = 0; t < n; ++t) {
    const float* kt = Kh + t * d;
    double best_d2;
    int64_t b;
    subgen_nearest(Kh, kt, d, rep, m, bd, bi, &best_d2, &b);  // line 12
    if (tid == 0) {
      if (b >= 0 && sqrt(best_d2) <= delta) {  // lines 13-14
        cnt[b] += 1;
        target = b;
        p_new = 1.0 / double(cnt[b]);
      } else {  // lines 20-21
        if (m >= cap_m) *error = 1;
        else {
          rep[m] = t;
          cnt[m] = 1;
          target = -1 - m;
          ++m;
        }
      }
    }
    __syncthreads();
    if (*error) return;
    if (target >= 0) {  // lines 16-17: each sample slot replaced w.p. 1/n_i
      for (long long j = tid; j < tt; j += blockDim.x)
        if (hd::philox_u01(seed, uint32_t(t), uint32_t(j), hd::kDrawCluster) < p_new) samp[target * tt + j] = t;
    } else {
      const long long c = -1 - target;
      for (long long j = tid; j < tt; j += blockDim.x) samp[c * tt + j] = t;
    }
    __syncthreads();
    // Merge rounds (kvsim's max_clusters variant; SubGen::merge_clusters).
    if (target < 0) subgen_merge_rounds(Kh, d, tt, max_clusters, seed, rep, cnt, keep, samp, m, merges, delta, nk, bd, bi);
    subgen_product_update(Vh, d, t, s, seed, midx, mvsq, mu);  // lines 5-6
    // Lines 29-31 at evaluated steps (query q_{t+1}).
    if (!(r < rows && steps[r] == t + 1)) continue;
    subgen_answer(Q, Kh, Vh, kvh, group, n, d, scale, t, r, rows, m, tt, s, mu, cnt, samp, midx, mvsq, lg, qd, red, z,
                  log_sum);
    if (tid == 0) kept[(long long)kvh * rows + r] = m;
    ++r;
    __syncthreads();
  }
}

}  // namespace kvsim::cuda_impl
