// kvsim built without CUDA (nvcc not found or -DKVSIM_CUDA=OFF): the CUDA API reports its absence.
#include "kvsim/cuda.hpp"
#include "kvsim/error.hpp"

namespace kvsim::cuda {
namespace {
const char* kWhy = "kvsim was built without CUDA (reconfigure where nvcc is available, with -DKVSIM_CUDA=ON)";
}
bool compiled() { return false; }
int device_count(std::string* why) {
  if (why) *why = kWhy;
  return 0;
}
void require_device() { throw Error(std::string("--device cuda: ") + kWhy); }
std::string device_description() { require_device(); return {}; }
void exact_attention(const float*, const float*, const float*, int, int, int64_t, int, double, const std::vector<int64_t>&,
                     std::vector<float>&, std::vector<double>&, std::vector<double>&, std::vector<float>*) {
  require_device();
}
std::string bench(bool) { require_device(); return {}; }
}  // namespace kvsim::cuda
