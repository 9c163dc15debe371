// The CPU side of the CUDA path: implements include/kvsim/cuda/cuda.hpp by loading libkvsim_cuda.so on
// first use (include/kvsim/cuda/module.hpp says why). Without the CUDA build, or when the module or
// the CUDA libraries cannot be loaded, device_count() is 0 with the reason and every call that needs a
// device throws kvsim::Error naming it.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "kvsim/cuda/cuda.hpp"
#include "kvsim/cuda/module.hpp"
#include "kvsim/core/error.hpp"

namespace kvsim::cuda {
namespace {

struct Loaded {
  const ModuleApi* api = nullptr;
  std::string why;  // why api is null
};

/// Candidate module paths: $KVSIM_CUDA_MODULE, next to the running executable (and one folder up,
/// for the test binaries in build/tests/), then the build tree's path compiled in.
std::vector<std::string> module_candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("KVSIM_CUDA_MODULE"); env && *env) {
    c.push_back(env);
    return c;  // an explicit choice is not second-guessed
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    c.push_back((exe.parent_path() / "libkvsim_cuda.so").string());
    c.push_back((exe.parent_path().parent_path() / "libkvsim_cuda.so").string());
  }
#ifdef KVSIM_CUDA_MODULE_PATH
  c.push_back(KVSIM_CUDA_MODULE_PATH);
#endif
  return c;
}

const Loaded& loaded() {
  static Loaded l;
  static std::once_flag once;
  std::call_once(once, [] {
#ifndef KVSIM_HAS_CUDA
    l.why = "kvsim was built without CUDA (reconfigure where nvcc is available, with -DKVSIM_CUDA=ON)";
#else
    std::string tried;
    for (const auto& path : module_candidates()) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        tried += (tried.empty() ? "" : ", ") + path + " (absent)";
        continue;
      }
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* e = dlerror();
        l.why = "cannot load the CUDA module " + path + ": " + (e ? e : "unknown dlopen error");
        return;
      }
      using Entry = const ModuleApi* (*)();
      auto entry = reinterpret_cast<Entry>(dlsym(h, "kvsim_cuda_module_api"));
      const ModuleApi* api = entry ? entry() : nullptr;
      if (!api || api->abi_version != ModuleApi::kAbiVersion) {
        l.why = "the CUDA module " + path + " is from another kvsim build (rebuild kvsim)";
        return;
      }
      l.api = api;
      return;
    }
    l.why = "the CUDA module libkvsim_cuda.so was not found: " + tried + " (set KVSIM_CUDA_MODULE)";
#endif
  });
  return l;
}

const ModuleApi& api_or_throw() {
  const Loaded& l = loaded();
  if (!l.api) throw Error("--device cuda: " + l.why);
  return *l.api;
}

void rethrow(const std::string& err) {
  if (!err.empty()) throw Error(err);
}

}  // namespace

bool compiled() {
#ifdef KVSIM_HAS_CUDA
  return true;
#else
  return false;
#endif
}

int device_count(std::string* why) {
  const Loaded& l = loaded();
  if (!l.api) {
    if (why) *why = l.why;
    return 0;
  }
  return l.api->device_count(why);
}

void require_device() {
  std::string why;
  if (device_count(&why) == 0) throw Error("--device cuda: no usable CUDA device (" + why + ")");
}

std::string device_description() {
  require_device();
  std::string out;
  rethrow(api_or_throw().device_description(&out));
  return out;
}

void exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                     double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                     std::vector<double>& log_tau, std::vector<double>& probs_norm, std::vector<float>* probs) {
  require_device();
  rethrow(api_or_throw().exact_attention(Q, K, V, heads, kv_heads, n, d, scale, steps, out, log_tau, probs_norm, probs));
}

void replay_policy(const PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads, int group,
                   int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
  require_device();
  rethrow(api_or_throw().replay_policy(p, Q, K, V, kv_heads, group, n, d, scale, steps, z, log_sum, kept, kept_cap, 0));
}

void replay_policy_shared(uint64_t streams_id, const PolicyReplay& p, const float* Q, const float* K, const float* V,
                          int kv_heads, int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps,
                          std::vector<float>& z, std::vector<double>& log_sum, std::vector<int64_t>& kept,
                          int64_t& kept_cap) {
  if (streams_id == 0) throw Error("cuda::replay_policy_shared: streams_id 0 is not a shared id");
  require_device();
  rethrow(api_or_throw().replay_policy(p, Q, K, V, kv_heads, group, n, d, scale, steps, z, log_sum, kept, kept_cap, streams_id));
}

void release_shared_streams(uint64_t streams_id) {
  const Loaded& l = loaded();
  if (l.api) rethrow(l.api->release_streams(streams_id));
}

void configure(const Runtime& r) {
  require_device();
  rethrow(api_or_throw().configure(r));
}

std::string bench(bool quick) {
  require_device();
  std::string out;
  rethrow(api_or_throw().bench(quick, &out));
  return out;
}

}  // namespace kvsim::cuda
