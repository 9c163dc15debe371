// kvsim CUDA path, step 2: the deterministic slot policies on the GPU — window and sink (StreamingLLM)
// and H2O (seeds/004 §4.1 Algorithm 1) — for every KV head of a layer at once, with the step logic
// of include/kvsim/hd.hpp that the CPU policies run too:
//  - window / sink: the cache after t tokens is hd::sink_window_token's closed form, so each
//    (evaluated step, KV head) is an independent thread block: logits of the group's queries over
//    the kept tokens, a block-merged hd::OnlineSoftmax, and the output (one thread per dimension).
//  - h2o: a sequential state machine, one thread block per KV head over t = 0..n−1: eviction by a
//    block arg-min under hd::h2o_prefer (a total order: the CPU's serial scan picks the same slot),
//    then each query head's attention over the cache (fp32 logits, double softmax and scores, as
//    the CPU's policy_precision = "float32"), combined by hd::group_combine into the scores.
// Slots hold token positions; keys and values are read from the stream in device memory (a real
// cache would copy them: the arithmetic is the same).
// Written and compiled without a GPU: tests/cuda_parity.cpp compares it with the CPU policies
// wherever a device exists; it has not run yet.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "common.cuh"
#include "kvsim/cuda_module.hpp"
#include "kvsim/hd.hpp"

namespace kvsim::cuda_impl {
namespace {

constexpr int kPolicyThreads = 128;

/// window / sink: grid (rows, kv_heads). Q [kv_heads·group][n][d], K, V [kv_heads][n][d].
/// Outputs: z [kv_heads·group][rows][d], log_sum [kv_heads·group][rows], kept [kv_heads][rows][cap]
/// (−1 beyond the count). Scratch lg [kv_heads][rows][cap].
__global__ void sink_window_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d,
                                   float scale, long long sink, long long window, const long long* steps, int rows,
                                   float* z, double* log_sum, long long* kept, float* lg) {
  const int r = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x;
  const long long t = steps[r], cap = sink + window, m = hd::sink_window_count(t, sink, window);
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  float* lgr = lg + ((long long)kvh * rows + r) * cap;
  long long* kr = kept + ((long long)kvh * rows + r) * cap;
  for (long long j = tid; j < cap; j += blockDim.x) kr[j] = j < m ? hd::sink_window_token(t, sink, window, j) : -1;
  extern __shared__ float qs[];  // [d]
  __shared__ float sm[kPolicyThreads], s1[kPolicyThreads], s2[kPolicyThreads];
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Q[((long long)h * n + (t - 1)) * d + i];
    __syncthreads();
    hd::OnlineSoftmax<float> st;
    for (long long j = tid; j < m; j += blockDim.x) {
      const float* k = Kh + hd::sink_window_token(t, sink, window, j) * d;
      float acc = 0.f;
      for (int i = 0; i < d; ++i) acc += qs[i] * k[i];
      lgr[j] = acc;
      st.add(acc);
    }
    const hd::OnlineSoftmax<float> tot = block_merge(st, sm, s1, s2);  // also orders lgr's writes
    for (int i = tid; i < d; i += blockDim.x) {
      float acc = 0.f;
      for (long long j = 0; j < m; ++j) acc += expf(lgr[j] - tot.m) * Vh[hd::sink_window_token(t, sink, window, j) * d + i];
      z[((long long)h * rows + r) * d + i] = acc / tot.s1;
    }
    if (tid == 0) log_sum[(long long)h * rows + r] = tot.log_tau();
    __syncthreads();  // qs and lgr are rewritten for the next query head
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
        float acc = 0.f;
        for (int i = 0; i < d; ++i) acc += qs[i] * k[i];
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

}  // namespace

void replay_policy(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                   int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
  require_device();
  const bool h2o = p.name == "h2o";
  if (!h2o && p.name != "window" && p.name != "sink")
    throw Error("cuda::replay_policy: policy '" + p.name + "' has no GPU replay yet (window, sink, h2o)");
  if (steps.empty() || kv_heads < 1 || group < 1 || d < 1 || n < 1 || steps.front() < 1 || steps.back() > n)
    throw Error("cuda::replay_policy: bad shapes or steps");
  for (size_t i = 1; i < steps.size(); ++i)
    if (steps[i] <= steps[i - 1]) throw Error("cuda::replay_policy: steps must increase");
  const long long cap = h2o ? p.budget : p.sink + p.window;
  if (cap < 1 || (h2o && (p.recent < 0 || p.recent >= p.budget)) || (!h2o && (p.sink < 0 || p.window < 1)))
    throw Error("cuda::replay_policy: bad policy sizes");
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
  if (!h2o) {
    DeviceBuffer<float> lg(size_t(kv_heads) * rows * cap);
    sink_window_kernel<<<dim3(rows, kv_heads), kPolicyThreads, d * sizeof(float)>>>(
        dq.p, dk.p, dv.p, group, n, d, float(scale), p.sink, p.window, dst.p, rows, dz.p, dls.p, dkept.p, lg.p);
    check(cudaGetLastError(), "sink_window_kernel launch");
    check(cudaDeviceSynchronize(), "sink_window_kernel");
  } else {
    DeviceBuffer<long long> pos(size_t(kv_heads) * cap);
    DeviceBuffer<double> score(size_t(kv_heads) * cap), pr(size_t(kv_heads) * cap);
    DeviceBuffer<float> lg(size_t(kv_heads) * group * cap);
    DeviceBuffer<int> err(1);
    check(cudaMemset(err.p, 0, sizeof(int)), "memset");
    h2o_kernel<<<kv_heads, kPolicyThreads, d * sizeof(float)>>>(dq.p, dk.p, dv.p, group, n, d, float(scale), cap, p.recent,
                                                                p.group_agg, dst.p, rows, dz.p, dls.p, dkept.p, pos.p,
                                                                score.p, pr.p, lg.p, err.p);
    check(cudaGetLastError(), "h2o_kernel launch");
    check(cudaDeviceSynchronize(), "h2o_kernel");
    int e = 0;
    err.download(&e, 1, "copy error flag");
    if (e) throw Error("cuda::replay_policy: h2o found no evictable token (recent window ≥ budget)");
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
