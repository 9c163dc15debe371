// kvsim CUDA path: exact causal attention for evaluated steps, all query heads of a layer at once.
// Three implementations of the same function (runtime.cuda_exact = flash|gemm|kernel, or KVSIM_CUDA_EXACT, picks one; the
// default is flash, in sim/cuda/flash.cu, where it supports head_dim, else gemm). Two more were measured slower and removed: several chunks per grouped-batched SGEMM (on the H200),
// and 3xTF32 logits on tensor cores (on the H100; docs/performance.md):
//  - gemm: the evaluated steps in chunks of about 64 query rows per KV head (the rows of its query
//    heads together, GQA); per chunk, one strided-batched cuBLAS SGEMM (fp32, no TF32) forms the
//    scaled logits S = scale·Q Kᵀ over the chunk's keys 0..t_c−1 for every KV head, a softmax kernel
//    masks each row at its own step t (causal) and normalizes it in place (hd::OnlineSoftmax, the CPU
//    tests' code), and a second SGEMM forms P V. The masked triangle inside a chunk is the only
//    arithmetic spent on tokens a row does not attend (about 64·stride/2 tokens per row).
//    runtime.cuda_exact_rows (KVSIM_CUDA_EXACT_ROWS) sets the rows per chunk (default 64).
//  - kernel: one thread block per (evaluated step, query head): the logits of the t cached keys (one
//    key per thread) into a scratch row with each thread's online-softmax state, a block merge, then
//    the output with one thread per output dimension — a matrix-vector pass per row (the first
//    version; kept as the reference the bench compares against).
// fp32 arithmetic throughout. Built as the module libkvsim_cuda.so, loaded by sim/cuda/loader.cpp on
// first use (include/kvsim/cuda/module.hpp); the functions below implement include/kvsim/cuda/cuda.hpp's API.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <string>
#include <vector>

#include "kvsim/cuda/module.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "common.cuh"

namespace kvsim::cuda_impl {
namespace {

constexpr int kThreads = 128;

/// kernel implementation. Layouts: Qsel and out [kv head][row][group member][d] (the query head is
/// h = kv·group + g), logits scratch [h][row][t_max].
__global__ void exact_kernel(const float* Qsel, const float* K, const float* V, int group, long long n, int d,
                             float scale, const long long* steps, int rows, long long t_max, float* out, float* log_tau,
                             float* pnorm, float* probs, float* logits) {
  const int r = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const long long t = steps[r];
  const int kv = h / group, g = h % group;
  const float* Kh = K + (long long)kv * n * d;
  const float* Vh = V + (long long)kv * n * d;
  const long long qrow = ((long long)kv * rows + r) * group + g;
  extern __shared__ float qs[];  // the scaled query, [d]
  for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Qsel[qrow * d + i];
  __syncthreads();
  float* lg = logits + ((long long)h * rows + r) * t_max;
  hd::OnlineSoftmax<float> st;
  for (long long j = tid; j < t; j += blockDim.x) {
    const float* k = Kh + j * d;
    float acc = 0.f;
    for (int i = 0; i < d; ++i) acc += qs[i] * k[i];
    lg[j] = acc;
    st.add(acc);
  }
  __shared__ float sm[kThreads], s1[kThreads], s2[kThreads];
  const hd::OnlineSoftmax<float> tot = block_merge(st, sm, s1, s2);
  for (int i = tid; i < d; i += blockDim.x) {
    float acc = 0.f;
    for (long long j = 0; j < t; ++j) acc += expf(lg[j] - tot.m) * Vh[j * d + i];
    out[qrow * d + i] = acc / tot.s1;
  }
  if (probs)
    for (long long j = tid; j < t_max; j += blockDim.x)
      probs[((long long)h * rows + r) * t_max + j] = j < t ? tot.prob(lg[j]) : 0.f;
  if (tid == 0) {
    log_tau[h * rows + r] = tot.log_tau();
    pnorm[h * rows + r] = tot.prob_norm();
  }
}

/// gemm implementation, between the two SGEMMs: one block per (chunk row m, KV head). Row m of the
/// chunk starting at row r0 is query head kv·group + m % group at step steps[r0 + m / group]; its
/// logits S[kv][m][0..tc) are masked at that step, replaced by the softmax weights (0 past the step),
/// and log τ, ‖a‖ and (when asked) the probability row [h][row][t_max] are written.
__global__ void softmax_rows_kernel(float* S, long long tc, int M, int group, int r0, const long long* steps, int rows,
                                    long long t_max, float* log_tau, float* pnorm, float* probs) {
  const int m = blockIdx.x, kv = blockIdx.y, tid = threadIdx.x;
  const int r = r0 + m / group, h = kv * group + m % group;
  const long long t = steps[r];
  float* row = S + ((long long)kv * M + m) * tc;
  hd::OnlineSoftmax<float> st;
  for (long long j = tid; j < t; j += blockDim.x) st.add(row[j]);
  __shared__ float sm[kThreads], s1[kThreads], s2[kThreads];
  const hd::OnlineSoftmax<float> tot = block_merge(st, sm, s1, s2);
  float* pr = probs ? probs + ((long long)h * rows + r) * t_max : nullptr;
  for (long long j = tid; j < tc; j += blockDim.x) {
    const float p = j < t ? tot.prob(row[j]) : 0.f;
    row[j] = p;
    if (pr) pr[j] = p;
  }
  if (pr)
    for (long long j = tc + tid; j < t_max; j += blockDim.x) pr[j] = 0.f;
  if (tid == 0) {
    log_tau[h * rows + r] = tot.log_tau();
    pnorm[h * rows + r] = tot.prob_norm();
  }
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS: ") + what + " failed (status " + std::to_string(int(s)) + ")");
}

/// This host thread's cuBLAS handle on its per-thread default stream, its default math, fp32 without tensor cores (no TF32).
/// Created on first use and kept for the thread's life (destroying it at exit could run after the
/// CUDA runtime has shut down).
cublasHandle_t thread_handle() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t x;
    check_cublas(cublasCreate(&x), "cublasCreate");
    check_cublas(cublasSetStream(x, cudaStreamPerThread), "cublasSetStream");
    check_cublas(cublasSetMathMode(x, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    return x;
  }();
  return h;
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

void require_device() {
  std::string why;
  if (device_count(&why) == 0) throw Error("--device cuda: no usable CUDA device (" + why + ")");
}

std::string device_description() {
  require_device();
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

ExactImpl exact_impl_for(int d) {
  switch (settings().exact.load()) {
    case 1:
      if (!flash_supports(d))
        throw Error("runtime.cuda_exact = flash (KVSIM_CUDA_EXACT): head_dim " + std::to_string(d) + " is not 64 or 128 (use gemm)");
      return ExactImpl::flash;
    case 2: return ExactImpl::gemm;
    case 3: return ExactImpl::kernel;
    default: return flash_supports(d) ? ExactImpl::flash : ExactImpl::gemm;
  }
}

const char* to_string(ExactImpl impl) {
  return impl == ExactImpl::gemm ? "gemm" : impl == ExactImpl::kernel ? "kernel" : "flash";
}


ExactDevice::ExactDevice(int heads_, int kv_heads_, int64_t n_, int d_, const std::vector<int64_t>& steps_, bool want_probs)
    : heads(heads_), kv_heads(kv_heads_), group(heads_ / kv_heads_), rows(int(steps_.size())), n(n_), d(d_),
      t_max(steps_.back()), q(size_t(heads_) * steps_.size() * d_), k(size_t(kv_heads_) * n_ * d_), v(k_size()),
      out(q_size()), log_tau(size_t(heads_) * steps_.size()), pnorm(size_t(heads_) * steps_.size()),
      probs(want_probs ? size_t(heads_) * steps_.size() * steps_.back() : 1), steps(steps_.size()), step_list(steps_.begin(), steps_.end()),
      has_probs(want_probs) {
  steps.upload(step_list.data(), step_list.size(), "copy steps");
}

void exact_on_device(ExactDevice& x, float scale, ExactImpl impl, int chunk, unsigned phases) {
  const int G = x.group, rows = x.rows, d = x.d;
  float* probs = x.has_probs ? x.probs.p : nullptr;
  const std::vector<long long>& st = x.step_list;
  if (impl == ExactImpl::flash) {
    flash_on_device(x, scale);
    return;
  }
  if (impl == ExactImpl::kernel) {
    DeviceBuffer<float> logits(size_t(x.heads) * rows * x.t_max);
    exact_kernel<<<dim3(rows, x.heads), kThreads, d * sizeof(float)>>>(x.q.p, x.k.p, x.v.p, G, x.n, d, scale, x.steps.p, rows,
                                                                      x.t_max, x.out.p, x.log_tau.p, x.pnorm.p, probs, logits.p);
    check(cudaGetLastError(), "exact_kernel launch");
    return;
  }
  // Chunks of C rows: M = C·G query rows per KV head (about `chunk`), keys 0..t_c−1 with t_c the chunk's last step.
  const int C = std::max(1, (chunk > 0 ? chunk : settings().exact_rows.load()) / G), Mmax = C * G;
  DeviceBuffer<float> S(size_t(x.kv_heads) * Mmax * x.t_max);
  cublasHandle_t h = thread_handle();
  const float one = 1.f, zero = 0.f;
  const long long qstride = (long long)rows * G * d, kstride = x.n * d;
  for (int r0 = 0; r0 < rows; r0 += C) {
    const int cr = std::min(C, rows - r0), M = cr * G;
    const long long tc = st[size_t(r0 + cr - 1)];
    // Row-major S (M × tc) = scale · Q_chunk (M × d) · K[0..tc)ᵀ, i.e. column-major Sᵀ = K · Qᵀ.
    if (phases & kPhaseLogits)
      check_cublas(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, int(tc), M, d, &scale, x.k.p, d, kstride,
                                             x.q.p + (long long)r0 * G * d, d, qstride, &zero, S.p, int(tc),
                                             (long long)M * tc, x.kv_heads),
                   "SGEMM Q Kᵀ");
    if (phases & kPhaseSoftmax) {
      softmax_rows_kernel<<<dim3(M, x.kv_heads), kThreads>>>(S.p, tc, M, G, r0, x.steps.p, rows, x.t_max, x.log_tau.p,
                                                             x.pnorm.p, probs);
      check(cudaGetLastError(), "softmax_rows_kernel launch");
    }
    // Row-major O (M × d) = P (M × tc) · V[0..tc), i.e. column-major Oᵀ = Vᵀ · Pᵀ.
    if (phases & kPhasePV)
      check_cublas(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, M, int(tc), &one, x.v.p, d, kstride, S.p,
                                             int(tc), (long long)M * tc, &zero, x.out.p + (long long)r0 * G * d, d,
                                             qstride, x.kv_heads),
                   "SGEMM P V");
  }
}

void exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                     double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                     std::vector<double>& log_tau, std::vector<double>& probs_norm, std::vector<float>* probs) {
  require_device();
  check_shapes_and_steps(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && d >= 1, steps, n,
                         "cuda::exact_attention");
  const ExactImpl impl = exact_impl_for(d);
  ExactDevice x(heads, kv_heads, n, d, steps, probs != nullptr);
  const int rows = x.rows, G = x.group;
  // Only the evaluated query rows travel to the device, as [kv head][row][group member][d].
  std::vector<float> qsel(x.q_size());
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < rows; ++r)
      std::copy_n(Q + (size_t(h) * n + size_t(steps[r] - 1)) * d, d, qsel.begin() + ((size_t(h / G) * rows + r) * G + h % G) * d);
  x.q.upload(qsel.data(), qsel.size(), "copy Q");
  x.k.upload(K, x.k_size(), "copy K");
  x.v.upload(V, x.k_size(), "copy V");
  exact_on_device(x, float(scale), impl);
  sync("exact attention");
  std::vector<float> o(x.q_size()), lt(size_t(heads) * rows), pn(lt.size());
  x.out.download(o.data(), o.size(), "copy out");
  x.log_tau.download(lt.data(), lt.size(), "copy log_tau");
  x.pnorm.download(pn.data(), pn.size(), "copy probs_norm");
  out.resize(o.size());  // back to [h][row][d]
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < rows; ++r)
      std::copy_n(o.begin() + ((size_t(h / G) * rows + r) * G + h % G) * d, d, out.begin() + (size_t(h) * rows + r) * d);
  log_tau.assign(lt.begin(), lt.end());
  probs_norm.assign(pn.begin(), pn.end());
  if (probs) {
    probs->resize(size_t(heads) * rows * x.t_max);
    x.probs.download(probs->data(), probs->size(), "copy probs");
  }
}
}  // namespace kvsim::cuda_impl

// ---- the module's exported table (no exception crosses it) ----------------------------------------
namespace {
template <class F>
std::string guarded(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "CUDA module: unknown error";
  }
}

int api_device_count(std::string* why) { return kvsim::cuda_impl::device_count(why); }
std::string api_device_description(std::string* out) {
  return guarded([&] { *out = kvsim::cuda_impl::device_description(); });
}
std::string api_exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                                double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                                std::vector<double>& log_tau, std::vector<double>& probs_norm,
                                std::vector<float>* probs) {
  return guarded([&] {
    kvsim::cuda_impl::exact_attention(Q, K, V, heads, kv_heads, n, d, scale, steps, out, log_tau, probs_norm, probs);
  });
}
std::string api_replay_policy(const kvsim::cuda::PolicyReplay& p, const float* Q, const float* K, const float* V,
                              int kv_heads, int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps,
                              std::vector<float>& z, std::vector<double>& log_sum, std::vector<int64_t>& kept,
                              int64_t& kept_cap, uint64_t streams_id) {
  return guarded([&] {
    kvsim::cuda_impl::replay_policy(p, Q, K, V, kv_heads, group, n, d, scale, steps, z, log_sum, kept, kept_cap, streams_id);
  });
}
std::string api_release_streams(uint64_t streams_id) {
  return guarded([&] { kvsim::cuda_impl::release_streams(streams_id); });
}
std::string api_bench(bool quick, std::string* out) { return guarded([&] { *out = kvsim::cuda_impl::bench(quick); }); }
std::string api_configure(const kvsim::Runtime& r) { return guarded([&] { kvsim::cuda_impl::settings().set(r); }); }

const kvsim::cuda::ModuleApi kApi{kvsim::cuda::ModuleApi::kAbiVersion, api_device_count, api_device_description,
                                  api_exact_attention, api_replay_policy, api_release_streams, api_bench,
                                  api_configure};
}  // namespace

extern "C" __attribute__((visibility("default"))) const kvsim::cuda::ModuleApi* kvsim_cuda_module_api() { return &kApi; }
