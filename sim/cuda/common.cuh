// Helpers shared by the CUDA module's translation units: error checks and an owning device buffer.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/cuda.hpp"

#include "kvsim/error.hpp"

namespace kvsim::cuda_impl {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) { check(cudaMalloc(&p, n * sizeof(T) + 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const T* h, size_t n, const char* what) { check(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice), what); }
  void download(T* h, size_t n, const char* what) const {
    check(cudaMemcpy(h, p, n * sizeof(T), cudaMemcpyDeviceToHost), what);
  }
};

void replay_policy(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                   int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap);

/// Usable devices (0 with `why`); require_device throws naming the reason.
int device_count(std::string* why);
void require_device();

}  // namespace kvsim::cuda_impl
