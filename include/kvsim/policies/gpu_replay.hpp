// kvsim: the GPU replay capability of a policy (include/kvsim/cuda/cuda.hpp). Only the policies that
// have a GPU replay include this header; the core Policy interface (policy.hpp) does not see CUDA.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kvsim/cuda/cuda.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {

/// A policy with a GPU replay: with `[eval] device = "cuda"` the engine replays the whole stream on
/// the GPU (make_gpu_replay below) instead of stepping the instance. Sizes come from the instance, so
/// parameters are parsed once; nullopt when this instance's mode has no replay (h2o's oracle
/// scores, subgen_kcenter's prefill form).
class GpuReplayable {
 public:
  virtual ~GpuReplayable() = default;
  virtual std::optional<cuda::PolicyReplay> gpu_replay() const = 0;
};

/// A policy whose answer is exact attention over every token (`exact`). With `[eval] device = "cuda"`
/// the engine answers it from the cell's GPU exact reference (the float32 flash or GEMM pass, already
/// computed for the metrics) instead of stepping it on the CPU in double, which was half the host's
/// work in a GPU run; its errors there are then 0 by construction, and the GPU reference's own
/// accuracy against the CPU's is what the CUDA parity tests check.
class ReferenceAnswered {
 public:
  virtual ~ReferenceAnswered() = default;
};

/// True when `p` is a ReferenceAnswered policy.
bool answers_are_reference(const Policy& p);

/// `p`'s GPU replay if it is a GpuReplayable with one for its mode.
std::optional<cuda::PolicyReplay> gpu_replay(const Policy& p);

/// `cpu` (a policy with a gpu_replay()) replayed on the GPU by cuda::replay_policy for one cell: the
/// first observe() runs the whole stream of its query heads (Q: one [n, d] matrix per head,
/// unscaled; K, V [n, d]); attend() then returns the GPU's answers (and uniform's τ̂) at the
/// evaluated `steps`; capacity_matched() is `cpu`'s. The referenced matrices must outlive it.
/// `replay` defaults to cuda::replay_policy (tests pass a CPU stand-in with the same contract).
/// `step_block`: the replay's PolicyReplay::step_block (h2o and buzz; gpu_step_block of the run's eval).
using PolicyReplayFn = std::function<void(const cuda::PolicyReplay&, const float* Q, const float* K, const float* V,
                                          int kv_heads, int group, int64_t n, int d, double scale,
                                          const std::vector<int64_t>& steps, std::vector<float>& z,
                                          std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap)>;
std::unique_ptr<Policy> make_gpu_replay(std::unique_ptr<Policy> cpu, std::vector<const MatF*> Q, const MatF& K,
                                        const MatF& V, double scale, std::vector<int64_t> steps,
                                        PolicyReplayFn replay = {}, int64_t step_block = 0);


}  // namespace kvsim
