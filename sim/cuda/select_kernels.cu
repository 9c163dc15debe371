// Selection kernels and kept-list attention (see policies.cu's header): window/sink, uniform,
// oracle_topk, subgen_kcenter streaming.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kvsim/core/hd.hpp"
#include "policy_kernels.cuh"

namespace kvsim::cuda_impl {

/// Attention of each query head of a KV group over a kept token list: grid (rows, kv_heads).
/// Q [kv_heads·group][n][d], K, V [kv_heads][n][d]; kept [kv_heads][rows][cap] token positions,
/// −1 entries skipped. Outputs z [kv_heads·group][rows][d], log_sum [kv_heads·group][rows] (log Σ
/// exp of the logits over the kept tokens). bias (nullable) [kv_heads][rows][cap] is added to the
/// logits (subgen_kcenter's weighted centers). Scratch lg [kv_heads][rows][cap].
__global__ void kept_attend_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d,
                                   float scale, const long long* steps, int rows, const long long* kept, long long cap,
                                   const double* bias, float* z, double* log_sum, float* lg) {
  const int r = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x;
  const long long t = steps[r];
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  const long long* kr = kept + ((long long)kvh * rows + r) * cap;
  const double* br = bias ? bias + ((long long)kvh * rows + r) * cap : nullptr;
  float* lgr = lg + ((long long)kvh * rows + r) * cap;
  extern __shared__ float qs[];  // [d]
  __shared__ double sm[kPolicyThreads], s1[kPolicyThreads], s2[kPolicyThreads];
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Q[((long long)h * n + (t - 1)) * d + i];
    __syncthreads();
    hd::OnlineSoftmax<double> st;
    for (long long j = tid; j < cap; j += blockDim.x) {
      if (kr[j] < 0) continue;
      const float* k = Kh + kr[j] * d;
      const float acc = dot_f32(qs, k, d);
      lgr[j] = acc;
      st.add(double(acc) + (br ? br[j] : 0.0));
    }
    const hd::OnlineSoftmax<double> tot = block_merge(st, sm, s1, s2);  // also orders lgr's writes
    for (int i = tid; i < d; i += blockDim.x) {
      double acc = 0.0;
      for (long long j = 0; j < cap; ++j)
        if (kr[j] >= 0) acc += tot.prob(double(lgr[j]) + (br ? br[j] : 0.0)) * double(Vh[kr[j] * d + i]);
      z[((long long)h * rows + r) * d + i] = float(acc);
    }
    if (tid == 0) log_sum[(long long)h * rows + r] = tot.log_tau();
    __syncthreads();  // qs and lgr are rewritten for the next query head
  }
}

/// window / sink: kept lists in closed form (hd::sink_window_token). Grid (rows, kv_heads).
__global__ void sink_window_select_kernel(long long sink, long long window, const long long* steps, int rows,
                                          long long* kept) {
  const int r = blockIdx.x, kvh = blockIdx.y;
  const long long t = steps[r], cap = sink + window, m = hd::sink_window_count(t, sink, window);
  long long* kr = kept + ((long long)kvh * rows + r) * cap;
  for (long long j = threadIdx.x; j < cap; j += blockDim.x) kr[j] = j < m ? hd::sink_window_token(t, sink, window, j) : -1;
}

/// uniform: the reservoir of each KV head (hd::reservoir_slot with that head's seed), walked by
/// thread 0 from one evaluated step to the next and copied out by the block. Grid (kv_heads).
/// pos_all [kv_heads][B] scratch; kept [kv_heads][rows][B] in slot order, −1 for empty slots.
__global__ void uniform_select_kernel(const unsigned long long* seeds, long long B, const long long* steps, int rows,
                                      long long* pos_all, long long* kept) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  long long* pos = pos_all + (long long)kvh * B;
  const unsigned long long seed = seeds[kvh];
  for (long long s = tid; s < B; s += blockDim.x) pos[s] = -1;
  __syncthreads();
  long long t0 = 0;
  for (int r = 0; r < rows; ++r) {
    const long long T = steps[r];  // tokens 0..T−1 have joined when q_T is answered
    if (tid == 0)
      for (long long t = t0; t < T; ++t)
        if (const long long slot = hd::reservoir_slot(seed, t, B); slot >= 0) pos[slot] = t;
    t0 = T;
    __syncthreads();
    for (long long s = tid; s < B; s += blockDim.x) kept[((long long)kvh * rows + r) * B + s] = pos[s];
    __syncthreads();
  }
}

/// oracle_topk, selection for rows [r0, r0 + gridDim.x): grid (chunk rows, kv_heads). At step t the
/// KV group's exact attention over all t tokens in double (logits too, so the ranking matches the
/// CPU's float64 reference up to rounding order), combined by hd::group_combine without the mean's
/// division (the CPU ranks by GroupAggregate::ranking), then Batcher's bitonic network
/// (hd::bitonic_compare_swap under hd::topk_prefer) over P = next power of two ≥ t indices, and a
/// second one over the first min(B, t) by position. Scratch per chunk row: sc, lg [n_pad] (double),
/// idx [n_pad]. kept [kv_heads][rows][B] ascending, −1 padded.
__global__ void oracle_select_kernel(const float* Q, const float* K, int group, long long n, int d, double scale,
                                     long long B, int agg, const long long* steps, int rows, int r0, long long n_pad,
                                     double* sc_all, double* lg_all, long long* idx_all, long long* kept) {
  const int cr = blockIdx.x, r = r0 + cr, kvh = blockIdx.y, tid = threadIdx.x;
  const long long t = steps[r];
  const float* Kh = K + (long long)kvh * n * d;
  const long long slot = (long long)kvh * gridDim.x + cr;
  double* sc = sc_all + slot * n_pad;
  double* lg = lg_all + slot * n_pad;
  long long* idx = idx_all + slot * n_pad;
  extern __shared__ double qd[];  // [d]
  __shared__ double sm[kPolicyThreads], s1[kPolicyThreads], s2[kPolicyThreads];
  for (long long j = tid; j < t; j += blockDim.x) sc[j] = 0.0;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int i = tid; i < d; i += blockDim.x) qd[i] = scale * double(Q[((long long)h * n + (t - 1)) * d + i]);
    __syncthreads();
    hd::OnlineSoftmax<double> st;
    for (long long j = tid; j < t; j += blockDim.x) {
      const float* k = Kh + j * d;
      double acc = 0.0;
      for (int i = 0; i < d; ++i) acc += qd[i] * double(k[i]);
      lg[j] = acc;
      st.add(acc);
    }
    const hd::OnlineSoftmax<double> tot = block_merge(st, sm, s1, s2);
    for (long long j = tid; j < t; j += blockDim.x) sc[j] = hd::group_combine(sc[j], tot.prob(lg[j]), agg);
    __syncthreads();
  }
  long long P = 1;
  while (P < t) P <<= 1;
  for (long long j = tid; j < P; j += blockDim.x) idx[j] = j;
  __syncthreads();
  auto by_score = [&](long long a, long long b) {  // padding (≥ t) ranks last
    if (a >= t || b >= t) return a < b;
    return hd::topk_prefer(sc[a], a, sc[b], b);
  };
  for (long long k = 2; k <= P; k <<= 1)
    for (long long j = k >> 1; j > 0; j >>= 1) {
      for (long long i = tid; i < P; i += blockDim.x) hd::bitonic_compare_swap(idx, i, j, k, by_score);
      __syncthreads();
    }
  const long long b = B < t ? B : t;
  long long P2 = 1;
  while (P2 < b) P2 <<= 1;
  for (long long i = b + tid; i < P2; i += blockDim.x) idx[i] = n_pad + i;  // padding after every position
  __syncthreads();
  auto by_pos = [](long long a, long long c) { return a < c; };
  for (long long k = 2; k <= P2; k <<= 1)
    for (long long j = k >> 1; j > 0; j >>= 1) {
      for (long long i = tid; i < P2; i += blockDim.x) hd::bitonic_compare_swap(idx, i, j, k, by_pos);
      __syncthreads();
    }
  long long* kr = kept + ((long long)kvh * rows + r) * B;
  for (long long i = tid; i < B; i += blockDim.x) kr[i] = i < b ? idx[i] : -1;
}

namespace {
/// hd::kcenter_apply run by the whole block, decision for decision: thread 0 joins the token to
/// center bi or makes it a new center; past kc centers, R's first value (the closest pair: a minimum
/// over all pairs, exact in any order) and each merge round's nearest earlier kept center
/// (block_argmin_warp under (distance, index): the serial scan's first minimum) are computed by all
/// threads, the merges applied by thread 0 in the serial order. n_c, radius and kept are shared.
template <class SqDist>
__device__ void kcenter_apply_block(int64_t* id, double* count, long long& n_c, double& radius, long long kc,
                                    int64_t id_new, int64_t bi, double bd, SqDist sqdist, double* sd, int64_t* si,
                                    long long& kept) {
  const int tid = threadIdx.x;
  if (kc == 0) return;
  if (tid == 0) {
    if (n_c > 0 && radius > 0 && bi >= 0 && sqrt(bd) <= 2 * radius) count[bi] += 1.0;
    else {
      id[n_c] = id_new;
      count[n_c] = 1.0;
      ++n_c;
    }
  }
  __syncthreads();
  if (n_c <= kc) return;
  if (radius == 0) {  // the first overflow: R = half the closest pair's distance (≥ 1e-12)
    double md = INFINITY;
    for (long long i = 1; i < n_c; ++i)
      for (long long j = tid; j < i; j += blockDim.x) md = fmin(md, sqdist(id[i], id[j]));
    double bm;
    int64_t unused;
    block_argmin_warp(md, md < INFINITY ? 0 : -1, sd, si, &bm, &unused);
    if (tid == 0) {
      const double h = sqrt(bm) / 2;
      radius = h > 1e-12 ? h : 1e-12;
    }
    __syncthreads();
  }
  while (n_c > kc) {  // merge rounds: R doubles, each center merges into the nearest earlier kept one within 2R
    if (tid == 0) {
      radius *= 2;
      kept = 0;
    }
    __syncthreads();
    const long long n = n_c;
    for (long long c = 0; c < n; ++c) {
      const long long kp = kept;
      double my = INFINITY;
      int64_t mi = -1;
      for (long long j = tid; j < kp; j += blockDim.x) {
        const double dd = sqdist(id[j], id[c]);
        if (dd < my) {
          my = dd;
          mi = j;
        }
      }
      double b;
      int64_t bj;
      block_argmin_warp(my, mi, sd, si, &b, &bj);
      if (tid == 0) {
        if (bj >= 0 && sqrt(b) <= 2 * radius) count[bj] += count[c];
        else {
          id[kept] = id[c];
          count[kept] = count[c];
          ++kept;
        }
      }
      __syncthreads();
    }
    if (tid == 0) n_c = kept;
    __syncthreads();
  }
}
}  // namespace

/// subgen_kcenter streaming: grid (kv_heads); the block walks the stream, each token leaving the
/// `recent` window joining the centers by hd::kcenter_nearest + hd::kcenter_apply (= kcenter_insert) (distances hd::key_sqdist of the
/// recorded keys: the CPU policy's decisions bit for bit); at each evaluated step the block writes
/// the kept list in the CPU's order — window ring rows (hd::kcenter_window_token), then the centers —
/// and the logit bias (log cluster size when weighted). Scratch id_all, count_all [kv_heads][kc + 1].
/// (The nearest-center scan is block-parallel over kKcenterThreads threads, a center each: every
/// distance is a sequential fma chain, so more threads put more key rows in flight; merge rounds
/// too, in kcenter_apply_block.)
__global__ void kcenter_select_kernel(const float* K, long long n, int d, long long recent, long long kc, bool weighted,
                                      const long long* steps, int rows, long long cap, int64_t* id_all,
                                      double* count_all, long long* kept, double* bias) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  int64_t* id = id_all + (long long)kvh * (kc + 1);
  double* count = count_all + (long long)kvh * (kc + 1);
  __shared__ long long n_c;
  __shared__ double radius;
  if (tid == 0) {
    n_c = 0;
    radius = 0.0;
  }
  __syncthreads();
  __shared__ double bdist[kKcenterThreads / 32];
  __shared__ int64_t bidx[kKcenterThreads / 32];
  __shared__ long long kept_c;
  auto sqdist = [&](int64_t a, int64_t b) { return hd::key_sqdist(Kh + a * d, Kh + b * d, d); };
  long long t0 = 0;
  for (int r = 0; r < rows; ++r) {
    const long long T = steps[r];
    for (long long t = t0 < recent ? recent : t0; t < T; ++t) {  // token t − recent leaves the window
      const int64_t id_new = t - recent;
      // hd::kcenter_nearest by the block: per-thread first minimum, then the (distance, index) order
      // across threads — the serial scan's answer.
      double my = INFINITY;
      int64_t mi = -1;
      if (kc > 0 && radius > 0)
        for (long long i = tid; i < n_c; i += blockDim.x) {
          const double dd = sqdist(id[i], id_new);
          if (dd < my) {
            my = dd;
            mi = i;
          }
        }
      double bd;
      int64_t bi;
      block_argmin_warp(my, mi, bdist, bidx, &bd, &bi);
      kcenter_apply_block(id, count, n_c, radius, kc, id_new, bi, bd, sqdist, bdist, bidx, kept_c);
    }
    t0 = T;
    __syncthreads();
    const long long w = T < recent ? T : recent, m = w + n_c;
    long long* kr = kept + ((long long)kvh * rows + r) * cap;
    double* br = bias + ((long long)kvh * rows + r) * cap;
    for (long long j = tid; j < cap; j += blockDim.x) {
      if (j < w) {
        kr[j] = hd::kcenter_window_token(T, recent, j);
        br[j] = 0.0;
      } else if (j < m) {
        kr[j] = id[j - w];
        br[j] = weighted ? log(count[j - w]) : 0.0;
      } else {
        kr[j] = -1;
        br[j] = 0.0;
      }
    }
    __syncthreads();
  }
}

}  // namespace kvsim::cuda_impl
