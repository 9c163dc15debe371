// kvsim CUDA path: exact causal attention for evaluated steps, all query heads of a layer at once.
// One thread block per (evaluated step, query head): pass 1 computes the scaled logits of the t
// cached keys (one key per thread, strided) into a scratch row and each thread's online-softmax
// state; a block reduction merges the states (hd::OnlineSoftmax::merge — the same code the CPU tests
// run); pass 2 forms the output with one thread per output dimension (coalesced reads of V) and,
// when asked, writes the normalized attention row. fp32 arithmetic throughout.
// Built as the module libkvsim_cuda.so, loaded by sim/cuda/loader.cpp on first use
// (include/kvsim/cuda/module.hpp); the functions below implement include/kvsim/cuda/cuda.hpp's API.
// First version, written and compiled without a GPU: correctness is checked by the parity tests
// (tests/cuda_parity.cpp) wherever a device exists; speed has not been tuned yet.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <string>
#include <vector>

#include "kvsim/cuda/module.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "common.cuh"

namespace kvsim::cuda_impl {
namespace {

constexpr int kThreads = 128;

__global__ void exact_kernel(const float* Qsel, const float* K, const float* V, int group, long long n, int d,
                             float scale, const long long* steps, int rows, long long t_max, float* out, float* log_tau,
                             float* pnorm, float* probs, float* logits) {
  const int r = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const long long t = steps[r];
  const float* Kh = K + (long long)(h / group) * n * d;
  const float* Vh = V + (long long)(h / group) * n * d;
  extern __shared__ float qs[];  // the scaled query, [d]
  for (int i = tid; i < d; i += blockDim.x) qs[i] = scale * Qsel[((long long)h * rows + r) * d + i];
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
    out[((long long)h * rows + r) * d + i] = acc / tot.s1;
  }
  if (probs)
    for (long long j = tid; j < t_max; j += blockDim.x)
      probs[((long long)h * rows + r) * t_max + j] = j < t ? tot.prob(lg[j]) : 0.f;
  if (tid == 0) {
    log_tau[h * rows + r] = tot.log_tau();
    pnorm[h * rows + r] = tot.prob_norm();
  }
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

void exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                     double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                     std::vector<double>& log_tau, std::vector<double>& probs_norm, std::vector<float>* probs) {
  require_device();
  if (steps.empty() || heads < 1 || kv_heads < 1 || heads % kv_heads || d < 1 || steps.back() > n || steps.front() < 1)
    throw Error("cuda::exact_attention: bad shapes or steps");
  const int rows = int(steps.size());
  const long long t_max = steps.back();
  // Only the evaluated query rows travel to the device.
  std::vector<float> qsel(size_t(heads) * rows * d);
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < d; ++i)
        qsel[(size_t(h) * rows + r) * d + i] = Q[(size_t(h) * n + size_t(steps[r] - 1)) * d + i];
  std::vector<long long> st(steps.begin(), steps.end());
  const size_t kv = size_t(kv_heads) * n * d, hr = size_t(heads) * rows;
  DeviceBuffer<float> dq(qsel.size()), dk(kv), dv(kv), dout(hr * d), dlt(hr), dpn(hr), dlg(hr * t_max);
  DeviceBuffer<float> dpr(probs ? hr * t_max : 1);
  DeviceBuffer<long long> dst(st.size());
  check(cudaMemcpy(dq.p, qsel.data(), qsel.size() * sizeof(float), cudaMemcpyHostToDevice), "copy Q");
  check(cudaMemcpy(dk.p, K, kv * sizeof(float), cudaMemcpyHostToDevice), "copy K");
  check(cudaMemcpy(dv.p, V, kv * sizeof(float), cudaMemcpyHostToDevice), "copy V");
  check(cudaMemcpy(dst.p, st.data(), st.size() * sizeof(long long), cudaMemcpyHostToDevice), "copy steps");
  dim3 grid(rows, heads);
  exact_kernel<<<grid, kThreads, d * sizeof(float)>>>(dq.p, dk.p, dv.p, heads / kv_heads, n, d, float(scale), dst.p, rows,
                                                      t_max, dout.p, dlt.p, dpn.p, probs ? dpr.p : nullptr, dlg.p);
  check(cudaGetLastError(), "exact_kernel launch");
  sync("exact_kernel");
  out.resize(hr * d);
  std::vector<float> lt(hr), pn(hr);
  check(cudaMemcpy(out.data(), dout.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "copy out");
  check(cudaMemcpy(lt.data(), dlt.p, hr * sizeof(float), cudaMemcpyDeviceToHost), "copy log_tau");
  check(cudaMemcpy(pn.data(), dpn.p, hr * sizeof(float), cudaMemcpyDeviceToHost), "copy probs_norm");
  log_tau.assign(lt.begin(), lt.end());
  probs_norm.assign(pn.begin(), pn.end());
  if (probs) {
    probs->resize(hr * t_max);
    check(cudaMemcpy(probs->data(), dpr.p, probs->size() * sizeof(float), cudaMemcpyDeviceToHost), "copy probs");
  }
}

namespace {

/// Rooflines: cuBLAS SGEMM, fp32 and TF32 tensor-core math, best of 5 after a warm-up.
void bench_rooflines(bool quick, std::string& out) {
  char buf[256];
  const int g = quick ? 2048 : 8192;
  {
    DeviceBuffer<float> a(size_t(g) * g), b(size_t(g) * g), c(size_t(g) * g);
    check(cudaMemset(a.p, 0, size_t(g) * g * sizeof(float)), "memset");
    check(cudaMemset(b.p, 0, size_t(g) * g * sizeof(float)), "memset");
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("CUDA: cublasCreate failed");
    cublasSetStream(h, cudaStreamPerThread);  // the stream sync() waits for
    for (auto [mode, name] : {std::pair{CUBLAS_DEFAULT_MATH, "fp32"}, std::pair{CUBLAS_TF32_TENSOR_OP_MATH, "tf32"}}) {
      cublasSetMathMode(h, mode);
      const float one = 1.f, zero = 0.f;
      double best = 1e30;
      for (int rep = 0; rep < 6; ++rep) {
        sync("sync");
        auto t0 = std::chrono::steady_clock::now();
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, g, g, g, &one, a.p, g, b.p, g, &zero, c.p, g);
        sync("sgemm");
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) best = std::min(best, s);
      }
      std::snprintf(buf, sizeof buf, "cuBLAS SGEMM %d^3 (%s): %.1f TFLOP/s\n", g, name, 2.0 * g * g * double(g) / best / 1e12);
      out += buf;
    }
    cublasDestroy(h);
  }
}

/// The exact causal pass of 32 heads × n × 128 in TFLOP/s.
void bench_exact(bool quick, std::string& out) {
  char buf[256];
  out += "exact causal pass (32 heads, head_dim 128, every 16th step, fp32; host transfers included):\n";
  out += "      n     seconds   TFLOP/s\n";
  const int heads = 32, d = 128;
  for (long long n : quick ? std::vector<long long>{2048} : std::vector<long long>{2048, 8192, 32768}) {
    std::vector<float> Q(size_t(heads) * n * d, 0.01f), K(Q.size(), 0.02f), V(Q.size(), 0.03f);
    std::vector<int64_t> steps;
    for (long long t = 16; t <= n; t += 16) steps.push_back(t);
    std::vector<float> z;
    std::vector<double> lt, pn;
    exact_attention(Q.data(), K.data(), V.data(), heads, heads, n, d, 1.0, steps, z, lt, pn, nullptr);  // warm-up
    auto t0 = std::chrono::steady_clock::now();
    exact_attention(Q.data(), K.data(), V.data(), heads, heads, n, d, 1.0, steps, z, lt, pn, nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = 0;
    for (int64_t t : steps) flops += 4.0 * double(t) * d * heads;  // q·k and a·v per cached token
    std::snprintf(buf, sizeof buf, "%7lld %11.3f %9.3f\n", n, s, flops / s / 1e12);
    out += buf;
  }
}

/// Policy replays (replay_policy): 32 KV heads × 1 query head each, 20% budgets, every 16th step
/// answered; head-steps per second = heads × n / seconds (host transfers included).
void bench_replays(bool quick, std::string& out) {
  char buf[256];
  const int heads = 32, d = 128;
  out += "policy replays on the GPU (32 KV heads, head_dim 128, 20% budget, every 16th step answered):\n";
  out += "policy              n     seconds  head-steps/s\n";
  {
    const long long n = quick ? 2048 : 8192;
    std::vector<float> Q(size_t(heads) * n * d), K(Q.size()), V(Q.size());
    uint32_t x = 12345;  // deterministic pseudo-random inputs (distinct scores: no tie-heavy h2o)
    for (auto* vec : {&Q, &K, &V})
      for (float& f : *vec) {
        x = x * 1664525u + 1013904223u;
        f = float(x >> 8) / float(1u << 24) - 0.5f;
      }
    std::vector<int64_t> steps;
    for (long long t = 16; t <= n; t += 16) steps.push_back(t);
    const long long B = n / 5;
    std::vector<cuda::PolicyReplay> specs = {{"window", 0, B, 0, 0, 0}, {"sink", 4, B - 4, 0, 0, 0}, {"h2o", 0, 0, B, B / 2, 0}};
    cuda::PolicyReplay u{"uniform", 0, 0, B, 0, 0};
    for (int h = 0; h < heads; ++h) u.seeds.push_back(0x9e3779b97f4a7c15ULL * uint64_t(h + 1));
    specs.push_back(u);
    // buzz at the same memory: sink 4 + window w + body < T with T/w = 6 (Theorem 3.1, s = 5).
    cuda::PolicyReplay b{"buzz", 4, (B - 4) / 7, 0, 0, 0};
    b.threshold = 6 * b.window;
    b.stride = 5;
    specs.push_back(b);
    specs.push_back({"oracle_topk", 0, 0, B, 0, 0});
    cuda::PolicyReplay kc{"subgen_kcenter", 0, 0, B / 2, B - B / 2, 0};  // streaming: recent + centers = B
    specs.push_back(kc);
    cuda::PolicyReplay sg{"subgen", 0, 0, 0, 0, 0};  // fixed-memory SubGen at the same memory, t = 1
    sg.s = B / 2;
    sg.t = 1;
    sg.max_clusters = (B - sg.s) / 2;
    sg.seeds = u.seeds;
    specs.push_back(sg);
    for (const auto& p : specs) {
      std::vector<float> z;
      std::vector<double> ls;
      std::vector<int64_t> kept;
      int64_t cap = 0;
      auto t0 = std::chrono::steady_clock::now();
      cuda_impl::replay_policy(p, Q.data(), K.data(), V.data(), heads, 1, n, d, 1.0 / std::sqrt(double(d)), steps, z, ls, kept, cap);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::snprintf(buf, sizeof buf, "%-14s %6lld %11.3f %13.0f\n", p.name.c_str(), n, s, double(heads) * n / s);
      out += buf;
    }
  }
}

}  // namespace

std::string bench(bool quick) {
  require_device();
  std::string out = "device: " + device_description() + "\n";
  bench_rooflines(quick, out);
  bench_exact(quick, out);
  bench_replays(quick, out);
  return out;
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
                              int64_t& kept_cap) {
  return guarded([&] {
    kvsim::cuda_impl::replay_policy(p, Q, K, V, kv_heads, group, n, d, scale, steps, z, log_sum, kept, kept_cap);
  });
}
std::string api_bench(bool quick, std::string* out) { return guarded([&] { *out = kvsim::cuda_impl::bench(quick); }); }

const kvsim::cuda::ModuleApi kApi{kvsim::cuda::ModuleApi::kAbiVersion, api_device_count, api_device_description,
                                  api_exact_attention, api_replay_policy, api_bench};
}  // namespace

extern "C" __attribute__((visibility("default"))) const kvsim::cuda::ModuleApi* kvsim_cuda_module_api() { return &kApi; }
