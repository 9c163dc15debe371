// `kvsim bench --device cuda`: the GPU's own figures (device, cuBLAS SGEMM rooflines, the exact pass
// of both implementations, policy replays); the end-to-end run against the CPU path is in
// sim/cli/bench.cpp. Timings of device work use CUDA events around the work (median of several runs
// after a warm-up) on pseudo-random inputs generated on the device (never zeros).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common.cuh"
#include "policy_kernels.cuh"

namespace kvsim::cuda_impl {
namespace {

/// Uniform values in [−0.5, 0.5) from a hash of (index, seed).
__global__ void fill_uniform_kernel(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = float(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

void fill_uniform(DeviceBuffer<float>& b, size_t n, uint32_t seed) {
  fill_uniform_kernel<<<1024, 256>>>(b.p, n, seed);
  check(cudaGetLastError(), "fill_uniform_kernel launch");
}

/// Host inputs for the from-host runs: `size` values in [−0.5, 0.5) from a linear congruential
/// generator started at `state` (deterministic; distinct values, so no tie-heavy h2o).
std::vector<float> host_uniform(size_t size, uint32_t state) {
  std::vector<float> v(size);
  for (float& f : v) {
    state = state * 1664525u + 1013904223u;
    f = float(state >> 8) / float(1u << 24) - 0.5f;
  }
  return v;
}

/// The evaluated steps of every bench run: every 16th of n.
std::vector<int64_t> every_16th(long long n) {
  std::vector<int64_t> steps;
  for (long long t = 16; t <= n; t += 16) steps.push_back(t);
  return steps;
}

/// Median milliseconds of `reps` runs of f() (after one warm-up run), timed by CUDA events on this
/// thread's stream.
template <class F>
double median_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  f();
  sync("warm-up");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, cudaStreamPerThread), "cudaEventRecord");
    f();
    check(cudaEventRecord(b, cudaStreamPerThread), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float x = 0;
    check(cudaEventElapsedTime(&x, a, b), "cudaEventElapsedTime");
    ms.push_back(x);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Rooflines: cuBLAS SGEMM g³ in fp32 (default math: no tensor cores) and TF32 tensor-core math, median of 5.
/// Returns the fp32 rate (TFLOP/s).
double bench_rooflines(bool quick, std::string& out) {
  char buf[256];
  const int g = quick ? 2048 : 8192;
  const size_t gg = size_t(g) * g;
  DeviceBuffer<float> a(gg), b(gg), c(gg);
  fill_uniform(a, gg, 1);
  fill_uniform(b, gg, 2);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("CUDA: cublasCreate failed");
  cublasSetStream(h, cudaStreamPerThread);
  double fp32 = 0;
  for (auto [mode, name] : {std::pair{CUBLAS_DEFAULT_MATH, "fp32"}, std::pair{CUBLAS_TF32_TENSOR_OP_MATH, "tf32"}}) {
    cublasSetMathMode(h, mode);
    const float one = 1.f, zero = 0.f;
    const double ms = median_ms(5, [&] {
      if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, g, g, g, &one, a.p, g, b.p, g, &zero, c.p, g) != CUBLAS_STATUS_SUCCESS)
        throw Error("CUDA: cublasSgemm failed");
    });
    const double rate = 2.0 * g * g * double(g) / (ms * 1e-3) / 1e12;
    if (fp32 == 0) fp32 = rate;
    std::snprintf(buf, sizeof buf, "cuBLAS SGEMM %d^3 (%s): %.1f TFLOP/s (median of 5, %.3f ms)\n", g, name, rate, ms);
    out += buf;
  }
  cublasDestroy(h);
  return fp32;
}

/// The exact causal pass of 32 heads × n × 128 (MHA), every 16th step, device time only (inputs
/// already on the device): gemm at 64, 128 and 256 rows per chunk, its parts one at a time at the
/// middle n, flash (its variants, and with the probability rows), and the kernel implementation; then
/// one host-to-host call at n = 8192 for the transfers.
void bench_exact(bool quick, double sgemm_fp32, std::string& out) {
  char buf[256];
  out += "exact causal pass (32 heads, head_dim 128, every 16th step, device time, median of 3):\n";
  out += "      n  impl     rows       ms     TFLOP/s  of fp32 SGEMM\n";
  const int heads = 32, d = 128;
  const float scale = float(1 / std::sqrt(double(d)));
  const long long n_mid = quick ? 2048 : 8192;
  for (long long n : quick ? std::vector<long long>{2048} : std::vector<long long>{2048, 8192, 32768}) {
    const std::vector<int64_t> steps = every_16th(n);
    double flops = 0;
    for (int64_t t : steps) flops += 4.0 * double(t) * d * heads;  // q·k and a·v per cached token
    ExactDevice x(heads, heads, n, d, steps, false);
    fill_uniform(x.q, x.q_size(), 3);
    fill_uniform(x.k, x.k_size(), 4);
    fill_uniform(x.v, x.k_size(), 5);
    auto emit = [&](const char* impl, int chunk, double ms, const char* note) {
      const double rate = flops / (ms * 1e-3) / 1e12;
      std::snprintf(buf, sizeof buf, "%7lld  %-7s %5d %8.3f %9.2f %9.1f%%%s\n", n, impl, chunk, ms, rate, 100 * rate / sgemm_fp32, note);
      out += buf;
    };
    auto row = [&](ExactImpl impl, int chunk, unsigned phases, const char* what) {
      const double ms = median_ms(3, [&] { exact_on_device(x, scale, impl, chunk, phases); });
      if (phases == kPhaseAll) return emit(to_string(impl), chunk, ms, "");
      std::snprintf(buf, sizeof buf, "%7lld  %-7s %5d %8.3f   (%s only)\n", n, to_string(impl), chunk, ms, what);
      out += buf;
    };
    // flash: the default (cp.async, default key chunks: the "rows" column is 0), key chunks of 1024
    // and 2048, plain loads into one buffer, and the default with the probability rows written (what
    // the engine asks for).
    for (int keys : {0, 512, 2048})
      emit("flash", keys, median_ms(3, [&] { flash_on_device(x, scale, keys, true); }), keys ? "  (keys per chunk)" : "");
    emit("flash", 0, median_ms(3, [&] { flash_on_device(x, scale, 0, false); }), "  (plain loads, one buffer)");
    if (n == n_mid) {
      emit("flash", 0, median_ms(3, [&] { flash_on_device(x, scale, 0, true, kPhaseLogits); }), "  (fused kernel only)");
      emit("flash", 0, median_ms(3, [&] { flash_on_device(x, scale, 0, true, kPhaseSoftmax); }), "  (combine only)");
    }
    if (n <= 8192) {
      ExactDevice xp(heads, heads, n, d, steps, true);
      check(cudaMemcpyAsync(xp.q.p, x.q.p, x.q_size() * 4, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "copy");
      check(cudaMemcpyAsync(xp.k.p, x.k.p, x.k_size() * 4, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "copy");
      check(cudaMemcpyAsync(xp.v.p, x.v.p, x.k_size() * 4, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "copy");
      emit("flash", 0, median_ms(3, [&] { exact_on_device(xp, scale, ExactImpl::flash); }), "  (probabilities written)");
    }
    for (int rows : {64, 128, 256}) row(ExactImpl::gemm, rows, kPhaseAll, "");
    if (n == n_mid)
      for (int rows : {64, 128}) {
        row(ExactImpl::gemm, rows, kPhaseLogits, "logits SGEMM");
        row(ExactImpl::gemm, rows, kPhaseSoftmax, "softmax");
        row(ExactImpl::gemm, rows, kPhasePV, "P V SGEMM");
      }
    if (n <= 8192) row(ExactImpl::kernel, 0, kPhaseAll, "");  // about 40 ms per 8192: minutes at 32768
  }
  const long long n = quick ? 2048 : 8192;
  const size_t size = size_t(heads) * n * d;
  const std::vector<float> qkv = host_uniform(3 * size, 7);  // Q, K, V one after the other
  const float *Q = qkv.data(), *K = Q + size, *V = K + size;
  const std::vector<int64_t> steps = every_16th(n);
  std::vector<float> z;
  std::vector<double> lt, pn;
  exact_attention(Q, K, V, heads, heads, n, d, 0.088, steps, z, lt, pn, nullptr);  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  exact_attention(Q, K, V, heads, heads, n, d, 0.088, steps, z, lt, pn, nullptr);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::snprintf(buf, sizeof buf, "  the same from host memory at n = %lld (copies of Q, K, V in, answers out): %.3f ms\n", n, sec * 1e3);
  out += buf;
}

/// The replays `kvsim bench --device cuda` times, each at memory B (tokens) with the sizes the
/// policy's gpu_replay() would give, `heads` KV heads.
std::vector<cuda::PolicyReplay> bench_specs(long long B, int heads) {
  // Each spec by field name, with the sizes the policy's gpu_replay() would give at this memory.
  auto spec = [](cuda::ReplayKind kind) {
    cuda::PolicyReplay p;
    p.kind = kind;
    return p;
  };
  std::vector<cuda::PolicyReplay> specs;
  cuda::PolicyReplay w = spec(cuda::ReplayKind::window), s4 = spec(cuda::ReplayKind::sink), h = spec(cuda::ReplayKind::h2o);
  w.window = B;
  s4.sink = 4;
  s4.window = B - 4;
  h.budget = B;
  h.recent = B / 2;
  specs.insert(specs.end(), {w, s4, h});
  cuda::PolicyReplay u = spec(cuda::ReplayKind::uniform);
  u.budget = B;
  for (int k = 0; k < heads; ++k) u.seeds.push_back(0x9e3779b97f4a7c15ULL * uint64_t(k + 1));
  specs.push_back(u);
  // buzz at the same memory: sink 4 + window w + body < T with T/w = 6 (Theorem 3.1, s = 5).
  cuda::PolicyReplay b = spec(cuda::ReplayKind::buzz);
  b.sink = 4;
  b.window = (B - 4) / 7;
  b.threshold = 6 * b.window;
  b.stride = 5;
  specs.push_back(b);
  cuda::PolicyReplay o = spec(cuda::ReplayKind::oracle_topk);
  o.budget = B;
  specs.push_back(o);
  cuda::PolicyReplay kc = spec(cuda::ReplayKind::subgen_kcenter);  // streaming: recent + centers = B
  kc.recent = B / 2;
  kc.budget = B - B / 2;
  specs.push_back(kc);
  cuda::PolicyReplay sg = spec(cuda::ReplayKind::subgen);  // fixed-memory SubGen at the same memory, t = 1
  sg.s = B / 2;
  sg.t = 1;
  sg.max_clusters = (B - sg.s) / 2;
  sg.seeds = u.seeds;
  specs.push_back(sg);
  return specs;
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
    const size_t size = size_t(heads) * n * d;
    const std::vector<float> qkv = host_uniform(3 * size, 12345);  // Q, K, V one after the other
    const float *Q = qkv.data(), *K = Q + size, *V = K + size;
    const std::vector<int64_t> steps = every_16th(n);
    const long long B = n / 5;
    const std::vector<cuda::PolicyReplay> specs = bench_specs(B, heads);
    // Each policy from host memory (Q, K and V copied in, as one replay_policy call does), then with
    // them already on the device (replay_policy_shared: the layer batch's case, one upload per layer)
    // — and for h2o and buzz there, once more with their state in global memory instead of shared.
    const double scale = 1.0 / std::sqrt(double(d));
    auto timed = [&](const cuda::PolicyReplay& p, uint64_t streams_id) {
      std::vector<float> z;
      std::vector<double> ls;
      std::vector<int64_t> kept;
      int64_t cap = 0;
      auto t0 = std::chrono::steady_clock::now();
      cuda_impl::replay_policy(p, Q, K, V, heads, 1, n, d, scale, steps, z, ls, kept, cap, streams_id);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const uint64_t id = ~uint64_t(0) - 1;  // the bench's own streams id (the engine's count up from 1)
    timed(specs[0], id);                   // uploads the shared streams once
    out[out.size() - 1] = ' ';
    out += "   device-resident   head-steps/s\n";
    for (const auto& p : specs) {
      const double s = timed(p, 0), sd = timed(p, id);
      std::snprintf(buf, sizeof buf, "%-14s %6lld %11.3f %13.0f %11.3f %13.0f\n", cuda::to_string(p.kind), n, s,
                    double(heads) * n / s, sd, double(heads) * n / sd);
      out += buf;
      if (p.kind == cuda::ReplayKind::h2o || p.kind == cuda::ReplayKind::buzz) {
        const bool was = state_in_shared_memory();
        set_state_in_shared_memory(false);
        const double sg = timed(p, id);
        set_state_in_shared_memory(was);
        std::snprintf(buf, sizeof buf, "%-14s %6lld %11s %13s %11.3f %13.0f  (state in global memory)\n",
                      cuda::to_string(p.kind), n, "", "", sg, double(heads) * n / sg);
        out += buf;
        for (long long bk : {16LL, 64LL, 128LL}) {  // blocked stepping: a block's logits as one tiled product
          cuda::PolicyReplay pb = p;
          pb.step_block = bk;
          const double sb = timed(pb, id);
          std::snprintf(buf, sizeof buf, "%-14s %6lld %11s %13s %11.3f %13.0f  (blocked, %lld steps)\n",
                        cuda::to_string(p.kind), n, "", "", sb, double(heads) * n / sb, bk);
          out += buf;
        }
      }
    }
    release_streams(id);
  }
}

}  // namespace

std::string bench(bool quick) {
  require_device();
  std::string out = "device: " + device_description() + "\n";
  const double fp32 = bench_rooflines(quick, out);
  bench_exact(quick, fp32, out);
  bench_replays(quick, out);
  return out;
}

}  // namespace kvsim::cuda_impl
