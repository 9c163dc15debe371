// Helpers shared by the CUDA module's translation units: error checks and an owning device buffer.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kvsim/cuda/cuda.hpp"

#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/core/runtime.hpp"

namespace kvsim::cuda_impl {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

/// Set once a wait for the device ran past its deadline (sync below): the device may be hung, so no
/// later call waits for it (sync fails at once) and device memory is no longer freed (cudaFree waits
/// for the whole device); the run fails and the process lets the memory go with it.
inline std::atomic<bool>& device_hung() {
  static std::atomic<bool> hung{false};
  return hung;
}

/// The module's [runtime] settings (include/kvsim/core/runtime.hpp): the environment's
/// (runtime_from_environment) until the host calls configure() with a run's resolved [runtime]
/// table. Atomics: sync() reads the deadline on every wait.
struct ModuleSettings {
  std::atomic<double> deadline_s{1800};
  std::atomic<int> exact_rows{64};
  std::atomic<int> exact{0};  ///< 0 auto, 1 flash, 2 gemm, 3 kernel
  std::atomic<bool> state_smem{true};
  void set(const Runtime& r) {
    deadline_s = r.cuda_deadline_s;
    exact_rows = r.cuda_exact_rows;
    exact = r.cuda_exact == "flash" ? 1 : r.cuda_exact == "gemm" ? 2 : r.cuda_exact == "kernel" ? 3 : 0;
    state_smem = r.cuda_state_in_shared_memory;
  }
};
/// The settings; the first call reads the environment (a bad value throws kvsim::Error naming the variable).
inline ModuleSettings& settings() {
  static ModuleSettings* s = [] {
    auto* m = new ModuleSettings;  // never freed: read by sync() until the process ends
    m->set(runtime_from_environment());
    return m;
  }();
  return *s;
}

/// Seconds one wait for the device may take (runtime.cuda_deadline_s / KVSIM_CUDA_DEADLINE, default
/// 1800): a kernel that runs longer fails the run in one line instead of waiting forever.
inline double deadline_seconds() { return settings().deadline_s.load(std::memory_order_relaxed); }

/// "did not finish within N s (runtime.cuda_deadline_s, KVSIM_CUDA_DEADLINE); the device may be hung".
inline std::string deadline_text() {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", deadline_seconds());
  return std::string("did not finish within ") + buf + " s (runtime.cuda_deadline_s, KVSIM_CUDA_DEADLINE); the device may be hung";
}

/// Waits for this host thread's stream (the module is built with --default-stream=per-thread:
/// kernels and copies of one thread never wait for another's; cudaDeviceSynchronize would), at most
/// deadline_seconds(): polls cudaStreamQuery (yielding, then sleeping 50 µs between polls, as the
/// runtime's own blocking sync spins or yields) and fails naming `what` past the deadline.
inline void sync(const char* what) {
  if (device_hung())
    throw Error(std::string("CUDA: ") + what + ": not started: an earlier wait for the device " + deadline_text());
  const double limit = deadline_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t e;
  for (int polls = 0; (e = cudaStreamQuery(cudaStreamPerThread)) == cudaErrorNotReady; ++polls) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
      device_hung() = true;
      throw Error(std::string("CUDA: ") + what + " " + deadline_text());
    }
    if (polls < 2000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  check(e, what);
}

/// Device memory from the stream-ordered allocator of this thread's stream (cudaMallocAsync: no
/// device-wide synchronization at free, unlike cudaFree), or cudaMalloc where pools are unsupported.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  bool async = true;
  /// `stream_ordered` false: cudaMalloc, for memory that other host threads' streams read and that
  /// another thread may free (a layer's streams shared by its replays).
  explicit DeviceBuffer(size_t n, bool stream_ordered = true) {
    const size_t bytes = n * sizeof(T) + 1;
    if (!stream_ordered || cudaMallocAsync(reinterpret_cast<void**>(&p), bytes, cudaStreamPerThread) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error; fall back to the synchronous allocator
      async = false;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
    }
  }
  ~DeviceBuffer() {
    if (device_hung()) return;  // a free could wait forever: the memory goes with the process
    if (async) cudaFreeAsync(p, cudaStreamPerThread);
    else cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Both wait for this thread's stream first (sync: within the deadline), so the copy itself never
  // waits for a kernel.
  void upload(const T* h, size_t n, const char* what) {
    sync(what);
    check(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice), what);
  }
  void download(T* h, size_t n, const char* what) const {
    sync(what);
    check(cudaMemcpy(h, p, n * sizeof(T), cudaMemcpyDeviceToHost), what);
  }
};

/// A one-int device flag a kernel sets non-zero on an internal failure: zeroed on creation, read
/// back with raised() after the kernel has finished.
struct DeviceFlag {
  DeviceBuffer<int> buf{1};
  DeviceFlag() { check(cudaMemsetAsync(buf.p, 0, sizeof(int), cudaStreamPerThread), "memset"); }
  bool raised() const {
    int e = 0;
    buf.download(&e, 1, "copy error flag");
    return e != 0;
  }
};

void replay_policy(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                   int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap, uint64_t streams_id = 0);
/// Frees the device copies of the streams uploaded under `streams_id` (once their replays in flight end).
void release_streams(uint64_t streams_id);

/// Block-wide merge of every thread's online-softmax state (tree over shared memory); all threads
/// return the total. `sm`, `s1`, `s2` are shared arrays of blockDim.x entries.
template <class T>
__device__ inline hd::OnlineSoftmax<T> block_merge(hd::OnlineSoftmax<T> st, T* sm, T* s1, T* s2) {
  const int tid = threadIdx.x;
  sm[tid] = st.m;
  s1[tid] = st.s1;
  s2[tid] = st.s2;
  __syncthreads();
  for (int off = blockDim.x / 2; off > 0; off >>= 1) {
    if (tid < off) {
      hd::OnlineSoftmax<T> a{sm[tid], s1[tid], s2[tid]}, b{sm[tid + off], s1[tid + off], s2[tid + off]};
      a.merge(b);
      sm[tid] = a.m;
      s1[tid] = a.s1;
      s2[tid] = a.s2;
    }
    __syncthreads();
  }
  const hd::OnlineSoftmax<T> tot{sm[0], s1[0], s2[0]};
  __syncthreads();  // the arrays may be reused right after
  return tot;
}

/// <q, k> of a (scaled, shared-memory) query and a key, fp32, sequential over the d dimensions: the
/// policy kernels' logit (the CPU's policy_precision = "float32" products, up to summation order).
__device__ inline float dot_f32(const float* q, const float* k, int d) {
  float acc = 0.f;
  for (int i = 0; i < d; ++i) acc += q[i] * k[i];
  return acc;
}

/// Block-wide arg-min of every thread's (distance, index) candidate (index −1 = none) under the
/// (distance, index) order, so the block returns the serial scan's first minimum
/// (hd::kcenter_nearest; tests/unit/test_hd.cpp emulates this tree). All threads get the result in
/// *d, *i. `sd`, `si` are shared arrays of blockDim.x entries, reusable on return.
__device__ inline void block_argmin(double my_d, int64_t my_i, double* sd, int64_t* si, double* d, int64_t* i) {
  const int tid = threadIdx.x;
  sd[tid] = my_d;
  si[tid] = my_i;
  __syncthreads();
  for (int off = blockDim.x / 2; off > 0; off >>= 1) {
    if (tid < off) {
      const double od = sd[tid + off];
      const int64_t oi = si[tid + off];
      if (oi >= 0 && (si[tid] < 0 || od < sd[tid] || (od == sd[tid] && oi < si[tid]))) {
        sd[tid] = od;
        si[tid] = oi;
      }
    }
    __syncthreads();
  }
  *d = sd[0];
  *i = si[0];
  __syncthreads();
}

/// block_argmin with warp shuffles: each warp's best under the same (distance, index) order, then
/// every thread folds the warps' bests in warp order; two block barriers instead of a tree's
/// log₂(blockDim.x). blockDim.x a multiple of 32; `sd`, `si` shared arrays of blockDim.x / 32 entries.
__device__ inline void block_argmin_warp(double my_d, int64_t my_i, double* sd, int64_t* si, double* d, int64_t* i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const double od = __shfl_xor_sync(0xffffffffu, my_d, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, my_i, off);
    if (oi >= 0 && (my_i < 0 || od < my_d || (od == my_d && oi < my_i))) {
      my_d = od;
      my_i = oi;
    }
  }
  if (lane == 0) {
    sd[warp] = my_d;
    si[warp] = my_i;
  }
  __syncthreads();
  double bd = INFINITY;
  int64_t bi = -1;
  for (int w = 0; w < nw; ++w)
    if (si[w] >= 0 && (bi < 0 || sd[w] < bd || (sd[w] == bd && si[w] < bi))) {
      bd = sd[w];
      bi = si[w];
    }
  *d = bd;
  *i = bi;
  __syncthreads();
}

/// The exact pass's implementation: the fused flash kernel (sim/cuda/flash.cu; head_dim 64 or 128),
/// cuBLAS SGEMMs around a softmax kernel per chunk of rows (gemm, sim/cuda/exact.cu), or the first
/// version's one block per (step, query head). runtime.cuda_exact (KVSIM_CUDA_EXACT) = flash, gemm or
/// kernel; auto: flash where it supports the head dimension, else gemm. flash with another head_dim is refused.
enum class ExactImpl { gemm, kernel, flash };
ExactImpl exact_impl_for(int d);
const char* to_string(ExactImpl impl);

/// A layer's exact pass on the device: inputs, outputs and the evaluated steps (increasing, ≤ n).
/// q and out are [kv head][row][group member][d] (query head h = kv·group + g); k, v [kv head][n][d];
/// log_tau, pnorm [h][row]; probs [h][row][t_max] when asked for (t_max = the last step).
struct ExactDevice {
  int heads, kv_heads, group, rows;
  long long n;
  int d;
  long long t_max;
  size_t q_size() const { return size_t(heads) * rows * d; }
  size_t k_size() const { return size_t(kv_heads) * n * d; }
  DeviceBuffer<float> q, k, v, out, log_tau, pnorm, probs;
  DeviceBuffer<long long> steps;
  std::vector<long long> step_list;  ///< the steps, host copy
  bool has_probs;
  ExactDevice(int heads, int kv_heads, int64_t n, int d, const std::vector<int64_t>& steps, bool want_probs);
};
/// The parts of the gemm pass, for the bench's breakdown: the logits SGEMM, the softmax kernel, the
/// P·V SGEMM.
enum ExactPhase : unsigned { kPhaseLogits = 1, kPhaseSoftmax = 2, kPhasePV = 4, kPhaseAll = 7 };

/// Runs the pass on this thread's stream (asynchronous: sync() before reading the outputs). `chunk`:
/// query rows per KV head and chunk for gemm (0: runtime.cuda_exact_rows, default 64);
/// `phases`: the parts to run (all but for the bench's breakdown).
void exact_on_device(ExactDevice& x, float scale, ExactImpl impl, int chunk = 0, unsigned phases = kPhaseAll);

/// The flash implementation (sim/cuda/flash.cu): whether it handles head dimension d, and the pass
/// (asynchronous, on this thread's stream). `chunk_keys`: keys per split-K chunk (0: the default
/// rule); `async`: tiles loaded by cp.async into separate key and value buffers (else plain loads
/// into one shared buffer); `phases`: kPhaseLogits runs the fused kernel, kPhaseSoftmax the combine
/// (both but for the bench's breakdown; the probabilities need both).
bool flash_supports(int d);
void flash_on_device(ExactDevice& x, float scale, int chunk_keys = 0, bool async = true, unsigned phases = kPhaseAll);

/// The module's implementations of cuda::exact_attention and cuda::device_description (exact.cu).
void exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                     double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                     std::vector<double>& log_tau, std::vector<double>& probs_norm, std::vector<float>* probs);
std::string device_description();

/// `kvsim bench --device cuda`'s GPU figures (sim/cuda/bench.cu).
std::string bench(bool quick);

/// The checks both entry points make of their shapes and evaluated steps: `shapes_ok` (the caller's
/// own), steps non-empty in [1, n]; throws "`who`: bad shapes or steps", then, unless the steps strictly
/// increase, "`who`: steps must increase".
inline void check_shapes_and_steps(bool shapes_ok, const std::vector<int64_t>& steps, int64_t n, const char* who) {
  if (!shapes_ok || steps.empty() || steps.front() < 1 || steps.back() > n)
    throw Error(std::string(who) + ": bad shapes or steps");
  for (size_t i = 1; i < steps.size(); ++i)
    if (steps[i] <= steps[i - 1]) throw Error(std::string(who) + ": steps must increase");
}

/// Usable devices (0 with `why`); require_device throws naming the reason.
int device_count(std::string* why);
void require_device();

}  // namespace kvsim::cuda_impl
