// kvsim CUDA path, step 2: policy replays on the GPU for every KV head of a layer at once, with the
// step logic of include/kvsim/core/hd.hpp that the CPU policies run too. Two kinds of kernel:
//  - selection, then kept_attend_kernel: policies whose cache does not depend on attention get their
//    kept token lists first — window / sink (StreamingLLM) in closed form (hd::sink_window_token),
//    uniform by its Philox reservoir (hd::reservoir_slot, one thread per KV head walking the stream),
//    oracle_topk by a bitonic sort of the exact attention (hd::topk_prefer), subgen_kcenter's
//    streaming clustering (hd::kcenter_insert) — and one generic kernel then answers every (evaluated step, KV head) as an independent thread
//    block: the group's logits over the kept tokens (fp32), a block-merged hd::OnlineSoftmax in
//    double (the CPU's policy_precision = "float32"), and the output (one thread per dimension).
//  - fused state machines, one thread block per KV head over t = 0..n−1, for the policies whose
//    eviction reads attention scores: h2o (seeds/004 §4.1 Algorithm 1: block arg-min under
//    hd::h2o_prefer, a total order, so the CPU's serial scan picks the same slot) and buzz (seeds/002
//    §3.3: sink + beehive body + window, hd::buzz_evict run by thread 0 when the body reaches T;
//    log-n scaled answers, §3.5). Each step: every query head's attention over the cache, combined by
//    hd::group_combine into the accumulated scores; and subgen (SubGen Algorithm 1: online clustering
//    by a block arg-min, Philox coin flips per sample slot, merge rounds, lines 29-31 answers).
// Slots hold token positions; keys and values are read from the stream in device memory (a real
// cache would copy them: the arithmetic is the same).
// Written and compiled without a GPU: tests/cuda_parity.cpp compares it with the CPU policies
// wherever a device exists; it has not run yet.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common.cuh"
#include "kvsim/cuda/module.hpp"
#include "kvsim/core/hd.hpp"

namespace kvsim::cuda_impl {
namespace {

constexpr int kPolicyThreads = 128;

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

/// h2o: grid (kv_heads), one sequential block per KV head. State (global): pos [kv_heads][B],
/// score [kv_heads][B] (double), step attention pr [kv_heads][B] (double), logits lg
/// [kv_heads][group][B]. Outputs as sink_window_kernel (kept: slot order, −1 padded); *error set to
/// 1 if no token was evictable (recent ≥ budget: refused on the host already).
__global__ void h2o_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                           long long B, long long recent, int agg, const long long* steps, int rows, float* z,
                           double* log_sum, long long* kept, long long* pos_all, double* score_all, double* pr_all,
                           float* lg_all, int* error) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  long long* pos = pos_all + (long long)kvh * B;
  double* score = score_all + (long long)kvh * B;
  double* pr = pr_all + (long long)kvh * B;
  float* lg = lg_all + (long long)kvh * group * B;
  extern __shared__ float qs[];  // [d]
  __shared__ double sm[kPolicyThreads], s1[kPolicyThreads], s2[kPolicyThreads];
  __shared__ long long best[kPolicyThreads];
  long long size = 0;
  int r = 0;
  for (long long t = 0; t < n; ++t) {
    // observe(t): fill, or evict the lowest-score non-recent token (hd::h2o_prefer, ties to the oldest).
    long long slot = size;
    if (size == B) {
      long long b = -1;
      for (long long s = tid; s < B; s += blockDim.x)
        if (hd::h2o_evictable(pos[s], t, recent) && (b < 0 || hd::h2o_prefer(score[s], pos[s], score[b], pos[b]))) b = s;
      best[tid] = b;
      __syncthreads();
      for (int off = blockDim.x / 2; off > 0; off >>= 1) {
        if (tid < off) {
          const long long a = best[tid], c = best[tid + off];
          if (a < 0 || (c >= 0 && hd::h2o_prefer(score[c], pos[c], score[a], pos[a]))) best[tid] = c;
        }
        __syncthreads();
      }
      slot = best[0];
      __syncthreads();
      if (slot < 0) {
        if (tid == 0) *error = 1;
        return;
      }
    } else {
      ++size;
    }
    if (tid == 0) {
      pos[slot] = t;
      score[slot] = 0.0;
    }
    for (long long s = tid; s < size; s += blockDim.x) pr[s] = 0.0;
    __syncthreads();
    // attend(q_{t+1}): each query head's attention over the cache, combined into the scores.
    const bool eval = r < rows && steps[r] == t + 1;
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Q[((long long)h * n + t) * d + i];
      __syncthreads();
      float* lgg = lg + (long long)g * B;
      hd::OnlineSoftmax<double> st;
      for (long long s = tid; s < size; s += blockDim.x) {
        const float* k = Kh + pos[s] * d;
        const float acc = dot_f32(qs, k, d);
        lgg[s] = acc;
        st.add(double(acc));
      }
      const hd::OnlineSoftmax<double> tot = block_merge(st, sm, s1, s2);
      for (long long s = tid; s < size; s += blockDim.x) pr[s] = hd::group_combine(pr[s], tot.prob(double(lgg[s])), agg);
      if (eval) {
        for (int i = tid; i < d; i += blockDim.x) {
          double acc = 0.0;
          for (long long s = 0; s < size; ++s) acc += tot.prob(double(lgg[s])) * double(Vh[pos[s] * d + i]);
          z[((long long)h * rows + r) * d + i] = float(acc);
        }
        if (tid == 0) log_sum[(long long)h * rows + r] = tot.log_tau();
      }
      __syncthreads();
    }
    for (long long s = tid; s < size; s += blockDim.x) score[s] += hd::group_result(pr[s], agg, group);
    if (eval) {
      long long* kr = kept + ((long long)kvh * rows + r) * B;
      for (long long s = tid; s < B; s += blockDim.x) kr[s] = s < size ? pos[s] : -1;
      ++r;
    }
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

/// subgen_kcenter streaming: grid (kv_heads); the block walks the stream, each token leaving the
/// `recent` window joining the centers by hd::kcenter_nearest + hd::kcenter_apply (= kcenter_insert) (distances hd::key_sqdist of the
/// recorded keys: the CPU policy's decisions bit for bit); at each evaluated step the block writes
/// the kept list in the CPU's order — window ring rows (hd::kcenter_window_token), then the centers —
/// and the logit bias (log cluster size when weighted). Scratch id_all, count_all [kv_heads][kc + 1].
/// (The nearest-center scan is block-parallel; joins, new centers and merge rounds run on thread 0.)
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
  __shared__ double bdist[kPolicyThreads];
  __shared__ int64_t bidx[kPolicyThreads];
  auto sqdist = [&](int64_t a, int64_t b) { return hd::key_sqdist(Kh + a * d, Kh + b * d, d); };
  long long t0 = 0;
  for (int r = 0; r < rows; ++r) {
    const long long T = steps[r];
    for (long long t = t0 < recent ? recent : t0; t < T; ++t) {  // token t − recent leaves the window
      const int64_t id_new = t - recent;
      // hd::kcenter_nearest by the block: per-thread first minimum, then a tree under the
      // (distance, index) order — the serial scan's answer.
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
      block_argmin(my, mi, bdist, bidx, &bd, &bi);
      if (tid == 0) {  // join, or a new center and merge rounds (serial: rare)
        double R = radius;
        int64_t joined = -1;
        n_c = hd::kcenter_apply(id, count, int64_t(n_c), R, kc, id_new, 1.0, bi, bd, &joined, sqdist);
        radius = R;
      }
      __syncthreads();
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

/// subgen (SubGen Algorithm 1, seeds/000 §2; include/kvsim/analysis/subgen.hpp), one block per KV head over
/// the stream, the CPU's SubGen::update step by step: the nearest representative by a block arg-min
/// of hd::key_sqdist under (distance, index) order (the CPU's first minimum); each sample slot's coin
/// hd::philox_u01 at (seed, token, slot) — the CPU's flips; merge rounds (max_clusters > 0) run by
/// thread 0 exactly as SubGen::merge_clusters. At each evaluated step the group's answers (lines
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
  __shared__ long long m, merges;
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
    // Line 12: the nearest representative (block arg-min, ties to the lower index).
    double my_d = INFINITY;
    int64_t my_i = -1;
    for (long long i = tid; i < m; i += blockDim.x) {
      const double d2 = hd::key_sqdist(Kh + rep[i] * d, kt, d);
      if (d2 < my_d) {
        my_d = d2;
        my_i = i;
      }
    }
    double best_d2;
    int64_t b;
    block_argmin(my_d, my_i, bd, bi, &best_d2, &b);
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
    // Merge rounds (kvsim's max_clusters variant; SubGen::merge_clusters, thread 0).
    if (tid == 0 && target < 0)
      while (max_clusters > 0 && m > max_clusters) {
        if (!(delta > 0)) {
          double md = INFINITY;
          for (long long i = 0; i < m; ++i)
            for (long long j = 0; j < i; ++j) md = fmin(md, sqrt(hd::key_sqdist(Kh + rep[i] * d, Kh + rep[j] * d, d)));
          delta = md / 2 > 1e-12 ? md / 2 : 1e-12;
        }
        delta *= 2;
        const uint32_t round = uint32_t(merges++);
        long long nk = 0;
        for (long long i = 0; i < m; ++i) {
          long long best = -1;
          double bdist = INFINITY;
          for (long long j = 0; j < nk; ++j) {
            const double dist = sqrt(hd::key_sqdist(Kh + rep[keep[j]] * d, Kh + rep[i] * d, d));
            if (dist < bdist) {
              bdist = dist;
              best = j;
            }
          }
          if (best >= 0 && bdist <= delta) {
            const long long a = keep[best];
            const double pa = double(cnt[a]) / double(cnt[a] + cnt[i]);
            for (long long j = 0; j < tt; ++j)
              if (!(hd::philox_u01(seed, round, uint32_t(i * tt + j), hd::kDrawMerge) < pa)) samp[a * tt + j] = samp[i * tt + j];
            cnt[a] += cnt[i];
          } else {
            keep[nk++] = i;
          }
        }
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
    // Lines 5-6: each matrix-product slot replaced w.p. ‖v‖²/(μ + ‖v‖²); μ += ‖v‖².
    const double w = hd::key_sqnorm(Vh + t * d, d);
    const double denom = mu + w, p = denom > 0 ? w / denom : 1.0;
    for (long long j = tid; j < s; j += blockDim.x)
      if (p >= 1.0 || hd::philox_u01(seed, uint32_t(t), uint32_t(j), hd::kDrawProduct) < p) {
        midx[j] = t;
        mvsq[j] = w;
      }
    __syncthreads();
    if (tid == 0) mu += w;
    __syncthreads();
    // Lines 29-31 at evaluated steps (query q_{t+1}).
    if (!(r < rows && steps[r] == t + 1)) continue;
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
      for (int i = tid; i < d; i += blockDim.x) {
        double acc = 0.0;  // z·e^{−c} = Σ_j μ/(s‖v_j‖²) e^{<q,k_j>−c} v_j
        for (long long j = 0; j < s; ++j)
          if (mvsq[j] > 0) acc += mu / (double(s) * mvsq[j]) * exp(lg[ms + j] - c) * double(Vh[midx[j] * d + i]);
        z[((long long)h * rows + r) * d + i] = float(tau > 0 ? acc / tau : acc);
      }
      if (tid == 0) log_sum[(long long)h * rows + r] = tau > 0 ? c + log(tau) : -INFINITY;
      __syncthreads();
    }
    if (tid == 0) kept[(long long)kvh * rows + r] = m;
    ++r;
    __syncthreads();
  }
}

/// A BUZZ cache entry: token position and accumulated (group-aggregated) attention score.
struct BuzzTok {
  long long pos;
  double score;
};
struct NoDrop {
  __device__ void operator()(const BuzzTok&) const {}
};

/// buzz: grid (kv_heads), one sequential block per KV head, the CPU policy's state in global
/// scratch: sink [kv_heads][sink], window ring [kv_heads][w], new and old body tokens
/// [kv_heads][T] each; per step the cached list (sink, old, new, window oldest first: the CPU's
/// answer order) in lst [kv_heads][cap], its step attention pr [kv_heads][cap], logits lg
/// [kv_heads][group][cap]. Outputs as kept_attend_kernel, z and log_sum of the λ-scaled logits.
__global__ void buzz_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                            long long sink, long long w, long long T, long long stride, bool log_scale, int agg,
                            const long long* steps, int rows, float* z, double* log_sum, long long* kept, long long cap,
                            BuzzTok* sink_all, BuzzTok* ring_all, BuzzTok* new_all, BuzzTok* old_all, long long* lst_all,
                            double* pr_all, float* lg_all) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  BuzzTok* sk = sink_all + (long long)kvh * (sink > 0 ? sink : 1);
  BuzzTok* ring = ring_all + (long long)kvh * w;
  BuzzTok* neu = new_all + (long long)kvh * T;
  BuzzTok* old = old_all + (long long)kvh * T;
  long long* lst = lst_all + (long long)kvh * cap;
  double* pr = pr_all + (long long)kvh * cap;
  float* lg = lg_all + (long long)kvh * group * cap;
  extern __shared__ float qs[];  // [d]
  __shared__ double sm[kPolicyThreads], s1[kPolicyThreads], s2[kPolicyThreads];
  __shared__ long long n_sink, n_old, n_new, ring_head, ring_count;
  if (tid == 0) n_sink = n_old = n_new = ring_head = ring_count = 0;
  __syncthreads();
  // Entry j of the cached list, in the CPU's order: sink, old, new, then the window oldest first.
  auto at = [&](long long j) -> BuzzTok& {
    if (j < n_sink) return sk[j];
    j -= n_sink;
    if (j < n_old) return old[j];
    j -= n_old;
    if (j < n_new) return neu[j];
    return ring[(ring_head + (j - n_new)) % w];
  };
  int r = 0;
  for (long long t = 0; t < n; ++t) {
    // observe(t) (BuzzPolicy::observe): sink first; then the window; the window's oldest token
    // joins the body as new; the body evicts (hd::buzz_evict) when old + new reaches T.
    if (tid == 0) {
      const BuzzTok x{t, 0.0};
      if (n_sink < sink) sk[n_sink++] = x;
      else if (ring_count < w) ring[(ring_head + ring_count++) % w] = x;
      else {
        neu[n_new++] = ring[ring_head];
        ring[ring_head] = x;
        ring_head = (ring_head + 1) % w;
        if (n_old + n_new >= T) {
          n_old = hd::buzz_evict(old, n_old, neu, n_new, stride, NoDrop{});
          n_new = 0;
        }
      }
    }
    __syncthreads();
    const long long m = n_sink + n_old + n_new + ring_count;
    for (long long j = tid; j < m; j += blockDim.x) {
      lst[j] = at(j).pos;
      pr[j] = 0.0;
    }
    __syncthreads();
    // attend(q_{t+1}) (BuzzPolicy::attend): scores from the unscaled softmax, the answer from the
    // λ-scaled one (λ = log_512(t + 1) with log_scale, else 1).
    const bool eval = r < rows && steps[r] == t + 1;
    const double lambda = hd::buzz_log_scale(t + 1, log_scale);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Q[((long long)h * n + t) * d + i];
      __syncthreads();
      float* lgg = lg + (long long)g * cap;
      hd::OnlineSoftmax<double> st, sl;
      for (long long j = tid; j < m; j += blockDim.x) {
        const float* k = Kh + lst[j] * d;
        const float acc = dot_f32(qs, k, d);
        lgg[j] = acc;
        st.add(double(acc));
        sl.add(lambda * double(acc));
      }
      const hd::OnlineSoftmax<double> tot = block_merge(st, sm, s1, s2);
      for (long long j = tid; j < m; j += blockDim.x) pr[j] = hd::group_combine(pr[j], tot.prob(double(lgg[j])), agg);
      if (eval) {
        const hd::OnlineSoftmax<double> tl = block_merge(sl, sm, s1, s2);
        for (int i = tid; i < d; i += blockDim.x) {
          double acc = 0.0;
          for (long long j = 0; j < m; ++j) acc += tl.prob(lambda * double(lgg[j])) * double(Vh[lst[j] * d + i]);
          z[((long long)h * rows + r) * d + i] = float(acc);
        }
        if (tid == 0) log_sum[(long long)h * rows + r] = tl.log_tau();
      }
      __syncthreads();
    }
    for (long long j = tid; j < m; j += blockDim.x) at(j).score += hd::group_result(pr[j], agg, group);
    if (eval) {
      long long* kr = kept + ((long long)kvh * rows + r) * cap;
      for (long long j = tid; j < cap; j += blockDim.x) kr[j] = j < m ? lst[j] : -1;
      ++r;
    }
    __syncthreads();
  }
}

}  // namespace

void replay_policy(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                   int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
  require_device();
  const std::string& name = p.name;
  if (name != "window" && name != "sink" && name != "h2o" && name != "uniform" && name != "buzz" &&
      name != "oracle_topk" && name != "subgen_kcenter" && name != "subgen")
    throw Error("cuda::replay_policy: policy '" + name +
                "' has no GPU replay (window, sink, h2o, uniform, buzz, oracle_topk, subgen_kcenter, subgen)");
  if (steps.empty() || kv_heads < 1 || group < 1 || d < 1 || n < 1 || steps.front() < 1 || steps.back() > n)
    throw Error("cuda::replay_policy: bad shapes or steps");
  for (size_t i = 1; i < steps.size(); ++i)
    if (steps[i] <= steps[i - 1]) throw Error("cuda::replay_policy: steps must increase");
  const long long cap = cuda::replay_capacity(p);
  bool ok = cap >= 1;
  if (name == "h2o") ok = ok && p.recent >= 0 && p.recent < p.budget;
  else if (name == "oracle_topk") ok = ok && p.group_agg >= 0 && p.group_agg <= 2;
  else if (name == "subgen_kcenter") ok = ok && p.recent >= 1 && p.budget >= 0;
  else if (name == "subgen")
    ok = ok && p.s >= 1 && p.t >= 1 && p.max_clusters >= 0 && p.delta >= 0 && (p.delta > 0 || p.max_clusters > 0) &&
         p.seeds.size() == size_t(kv_heads) && n < (int64_t(1) << 32);
  else if (name == "uniform") ok = ok && p.seeds.size() == size_t(kv_heads) && n < (int64_t(1) << 32);
  else if (name == "buzz") ok = ok && p.sink >= 0 && p.window >= 1 && p.stride >= 2 && p.threshold >= p.stride;
  else ok = ok && p.sink >= 0 && p.window >= 1;
  if (!ok) throw Error("cuda::replay_policy: bad sizes for policy '" + name + "'");
  kept_cap = cap;
  const int rows = int(steps.size()), H = kv_heads * group;
  const size_t qn = size_t(H) * n * d, kvn = size_t(kv_heads) * n * d;
  DeviceBuffer<float> dq(qn), dk(kvn), dv(kvn), dz(size_t(H) * rows * d);
  DeviceBuffer<double> dls(size_t(H) * rows);
  DeviceBuffer<long long> dkept(size_t(kv_heads) * rows * cap), dst(steps.size());
  dq.upload(Q, qn, "copy Q");
  dk.upload(K, kvn, "copy K");
  dv.upload(V, kvn, "copy V");
  const std::vector<long long> st(steps.begin(), steps.end());
  dst.upload(st.data(), st.size(), "copy steps");
  const size_t qbytes = size_t(d) * sizeof(float);
  if (name == "window" || name == "sink" || name == "uniform" || name == "oracle_topk" || name == "subgen_kcenter") {
    std::unique_ptr<DeviceBuffer<double>> bias;
    if (name == "subgen_kcenter") {
      bias = std::make_unique<DeviceBuffer<double>>(size_t(kv_heads) * rows * cap);
      DeviceBuffer<int64_t> ids(size_t(kv_heads) * (p.budget + 1));
      DeviceBuffer<double> counts(size_t(kv_heads) * (p.budget + 1));
      kcenter_select_kernel<<<kv_heads, kPolicyThreads>>>(dk.p, n, d, p.recent, p.budget, p.weighted, dst.p, rows, cap,
                                                          ids.p, counts.p, dkept.p, bias->p);
      check(cudaGetLastError(), "kcenter_select_kernel launch");
      sync("kcenter_select_kernel");
    } else if (name == "oracle_topk") {
      // Rows in chunks so the per-row scratch (score, logit, index: 24 bytes × n_pad) stays ≤ ~1 GiB.
      long long n_pad = 1;
      while (n_pad < n) n_pad <<= 1;
      const long long per_row = 24 * n_pad * kv_heads;
      const int chunk = int(std::max<long long>(1, std::min<long long>(rows, (1ll << 30) / per_row)));
      DeviceBuffer<double> sc(size_t(chunk) * kv_heads * n_pad), lgd(size_t(chunk) * kv_heads * n_pad);
      DeviceBuffer<long long> idx(size_t(chunk) * kv_heads * n_pad);
      for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int cr = std::min(chunk, rows - r0);
        oracle_select_kernel<<<dim3(cr, kv_heads), kPolicyThreads, size_t(d) * sizeof(double)>>>(
            dq.p, dk.p, group, n, d, scale, cap, p.group_agg, dst.p, rows, r0, n_pad, sc.p, lgd.p, idx.p, dkept.p);
        check(cudaGetLastError(), "oracle_select_kernel launch");
      }
      sync("oracle_select_kernel");
    } else if (name == "uniform") {
      DeviceBuffer<unsigned long long> seeds(p.seeds.size());
      const std::vector<unsigned long long> sd(p.seeds.begin(), p.seeds.end());
      seeds.upload(sd.data(), sd.size(), "copy seeds");
      DeviceBuffer<long long> pos(size_t(kv_heads) * cap);
      uniform_select_kernel<<<kv_heads, kPolicyThreads>>>(seeds.p, cap, dst.p, rows, pos.p, dkept.p);
      check(cudaGetLastError(), "uniform_select_kernel launch");
      sync("uniform_select_kernel");
    } else {
      sink_window_select_kernel<<<dim3(rows, kv_heads), kPolicyThreads>>>(p.sink, p.window, dst.p, rows, dkept.p);
      check(cudaGetLastError(), "sink_window_select_kernel launch");
    }
    DeviceBuffer<float> lg(size_t(kv_heads) * rows * cap);
    kept_attend_kernel<<<dim3(rows, kv_heads), kPolicyThreads, qbytes>>>(dq.p, dk.p, dv.p, group, n, d, float(scale), dst.p,
                                                                         rows, dkept.p, cap, bias ? bias->p : nullptr,
                                                                         dz.p, dls.p, lg.p);
    check(cudaGetLastError(), "kept_attend_kernel launch");
    sync("kept_attend_kernel");
  } else if (name == "h2o") {
    DeviceBuffer<long long> pos(size_t(kv_heads) * cap);
    DeviceBuffer<double> score(size_t(kv_heads) * cap), pr(size_t(kv_heads) * cap);
    DeviceBuffer<float> lg(size_t(kv_heads) * group * cap);
    DeviceBuffer<int> err(1);
    check(cudaMemsetAsync(err.p, 0, sizeof(int), cudaStreamPerThread), "memset");
    h2o_kernel<<<kv_heads, kPolicyThreads, qbytes>>>(dq.p, dk.p, dv.p, group, n, d, float(scale), cap, p.recent,
                                                     p.group_agg, dst.p, rows, dz.p, dls.p, dkept.p, pos.p, score.p,
                                                     pr.p, lg.p, err.p);
    check(cudaGetLastError(), "h2o_kernel launch");
    sync("h2o_kernel");
    int e = 0;
    err.download(&e, 1, "copy error flag");
    if (e) throw Error("cuda::replay_policy: h2o found no evictable token (recent window ≥ budget)");
  } else if (name == "subgen") {
    // Clusters: at most max_clusters + 1 (the cap) or n (Algorithm 1 as published).
    const long long cap_m = p.max_clusters > 0 ? std::min<long long>(p.max_clusters + 1, n) : n;
    const double bytes = double(kv_heads) * (double(cap_m) * (3 * 8 + 16 * p.t) + 24.0 * p.s);
    if (bytes > 8e9)
      throw Error("cuda::replay_policy: subgen's scratch (" + std::to_string(int64_t(bytes / 1e9)) +
                  " GB for up to " + std::to_string(cap_m) + " clusters × t = " + std::to_string(p.t) +
                  ") is too large for the GPU replay; set max_clusters or use the CPU");
    DeviceBuffer<unsigned long long> seeds(p.seeds.size());
    const std::vector<unsigned long long> sd(p.seeds.begin(), p.seeds.end());
    seeds.upload(sd.data(), sd.size(), "copy seeds");
    DeviceBuffer<long long> rep(size_t(kv_heads) * cap_m), cnt(size_t(kv_heads) * cap_m), keep(size_t(kv_heads) * cap_m),
        samp(size_t(kv_heads) * cap_m * p.t), midx(size_t(kv_heads) * p.s);
    DeviceBuffer<double> mvsq(size_t(kv_heads) * p.s), lgs(size_t(kv_heads) * (cap_m * p.t + p.s));
    DeviceBuffer<int> err(1);
    check(cudaMemsetAsync(err.p, 0, sizeof(int), cudaStreamPerThread), "memset");
    subgen_kernel<<<kv_heads, kPolicyThreads, size_t(d) * sizeof(double)>>>(
        dq.p, dk.p, dv.p, group, n, d, scale, p.delta, p.s, p.t, p.max_clusters, cap_m, seeds.p, dst.p, rows, dz.p, dls.p,
        dkept.p, rep.p, cnt.p, keep.p, samp.p, midx.p, mvsq.p, lgs.p, err.p);
    check(cudaGetLastError(), "subgen_kernel launch");
    sync("subgen_kernel");
    int e = 0;
    err.download(&e, 1, "copy error flag");
    if (e) throw Error("cuda::replay_policy: subgen exceeded its cluster capacity (internal)");
  } else {  // buzz
    DeviceBuffer<BuzzTok> sk(size_t(kv_heads) * (p.sink > 0 ? p.sink : 1)), ring(size_t(kv_heads) * p.window),
        neu(size_t(kv_heads) * p.threshold), old(size_t(kv_heads) * p.threshold);
    DeviceBuffer<long long> lst(size_t(kv_heads) * cap);
    DeviceBuffer<double> pr(size_t(kv_heads) * cap);
    DeviceBuffer<float> lg(size_t(kv_heads) * group * cap);
    buzz_kernel<<<kv_heads, kPolicyThreads, qbytes>>>(dq.p, dk.p, dv.p, group, n, d, float(scale), p.sink, p.window,
                                                      p.threshold, p.stride, p.log_scale, p.group_agg, dst.p, rows,
                                                      dz.p, dls.p, dkept.p, cap, sk.p, ring.p, neu.p, old.p, lst.p,
                                                      pr.p, lg.p);
    check(cudaGetLastError(), "buzz_kernel launch");
    sync("buzz_kernel");
  }
  z.resize(size_t(H) * rows * d);
  dz.download(z.data(), z.size(), "copy z");
  log_sum.resize(size_t(H) * rows);
  dls.download(log_sum.data(), log_sum.size(), "copy log_sum");
  std::vector<long long> kk(size_t(kv_heads) * rows * cap);
  dkept.download(kk.data(), kk.size(), "copy kept");
  kept.assign(kk.begin(), kk.end());
}

}  // namespace kvsim::cuda_impl
