// kvsim: the boundary between the CPU binary and the CUDA module (internal).
//
// The CUDA path (sim/cuda/*.cu) is built as a separate module, libkvsim_cuda.so, that links the CUDA
// runtime and cuBLAS. kvsim and its tests do not link them: sim/cuda/loader.cpp opens the module with
// dlopen() the first time a CUDA function is called (`--device cuda`, `kvsim bench --device cuda`,
// the parity tests). Loading cuBLAS costs ~200 MB of resident memory and ~0.3 s per process, which
// every CPU-only run used to pay at start-up (peak RSS).
//
// The module exports one C symbol, kvsim_cuda_module_api(), returning a table of functions. No
// exception crosses the boundary: each function returns an empty string on success and the error
// message otherwise (the loader rethrows it as kvsim::Error). Both sides are built by the same
// compiler and standard library in one CMake build, so std::string/std::vector cross it safely;
// kAbiVersion guards against a module left over from another build.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/core/runtime.hpp"
#include "kvsim/cuda/cuda.hpp"

namespace kvsim::cuda {

struct ModuleApi {
  static constexpr int kAbiVersion = 6;
  int abi_version;
  /// Usable CUDA devices; 0 with `why` set otherwise. Never fails.
  int (*device_count)(std::string* why);
  /// "NAME (sm_XY, N GiB)" of device 0 into `out`.
  std::string (*device_description)(std::string* out);
  /// See kvsim::cuda::exact_attention (include/kvsim/cuda/cuda.hpp).
  std::string (*exact_attention)(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n,
                                 int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                                 std::vector<double>& log_tau, std::vector<double>& probs_norm,
                                 std::vector<float>* probs);
  /// See kvsim::cuda::replay_policy (streams_id 0) and replay_policy_shared.
  std::string (*replay_policy)(const PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                               int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps,
                               std::vector<float>& z, std::vector<double>& log_sum, std::vector<int64_t>& kept,
                               int64_t& kept_cap, uint64_t streams_id);
  /// See kvsim::cuda::release_shared_streams.
  std::string (*release_streams)(uint64_t streams_id);
  /// See kvsim::cuda::bench; the figures into `out`.
  std::string (*bench)(bool quick, std::string* out);
  /// See kvsim::cuda::configure.
  std::string (*configure)(const Runtime& r);
};

}  // namespace kvsim::cuda

/// The module's one exported symbol.
extern "C" const kvsim::cuda::ModuleApi* kvsim_cuda_module_api();
