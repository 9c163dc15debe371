// kvsim: the CUDA path, first step: the exact causal reference on the GPU.
// Compiled from sim/cuda/*.cu when CMake finds nvcc (option KVSIM_CUDA, default ON; sm_90 SASS +
// compute_80 PTX); otherwise sim/cuda/loader.cpp provides the same API, reporting that CUDA is absent.
// Every call that needs a device throws kvsim::Error with the reason when none is usable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {
struct Runtime;
}

namespace kvsim::cuda {

/// True when this binary was compiled with the CUDA path.
bool compiled();
/// Usable CUDA devices; 0 with `why` set (no driver, no device, built without CUDA) otherwise.
int device_count(std::string* why = nullptr);
/// Throws kvsim::Error naming the reason unless a CUDA device is usable ("--device cuda").
void require_device();
/// "NAME (sm_XY, N GiB)" of device 0.
std::string device_description();

/// Exact causal attention of `heads` query heads at once (docs/architecture.md, a replay step by step; fp32 arithmetic, online softmax
/// from include/kvsim/core/hd.hpp), for the evaluated steps `steps` (1-based, increasing, ≤ n).
/// Q: [heads][n][d] unscaled, K, V: [kv_heads][n][d] (query head h uses KV head h / (heads/kv_heads)),
/// all row-major float32 on the host. Outputs (host, resized): out [heads][rows][d],
/// log_tau [heads][rows], probs_norm [heads][rows], and when `probs` is non-null the attention
/// rows [heads][rows][t_max] (zero beyond t). Throws kvsim::Error on CUDA errors.
void exact_attention(const float* Q, const float* K, const float* V, int heads, int kv_heads, int64_t n, int d,
                     double scale, const std::vector<int64_t>& steps, std::vector<float>& out,
                     std::vector<double>& log_tau, std::vector<double>& probs_norm, std::vector<float>* probs);

/// A policy replayed on the GPU (the GPU path, step 2), with its sizes in tokens:
///  - "window" (sink = 0) and "sink" (StreamingLLM: sink + window);
///  - "h2o": budget = heavy + recent, `recent` protected tokens (< budget), group_agg;
///  - "uniform": reservoir sampling of `budget` tokens, one Philox seed per KV head in `seeds`
///    (hd::reservoir_slot: the CPU policy's seed gives the CPU policy's samples);
///  - "buzz": sink + window + beehive body with `threshold` T and `stride` s, log_scale (BUZZ §3.5),
///    group_agg for the accumulated scores;
///  - "subgen_kcenter" (streaming mode): the `recent` last tokens plus at most `budget` centers of
///    the older keys by hd::kcenter_insert; `weighted` adds log(cluster size) to a center's logit;
///  - "subgen": SubGen Algorithm 1 with radius `delta`, `s` matrix-product and `t` cluster samples,
///    `max_clusters` (0 = as published), one Philox seed per KV head in `seeds` (hd::philox_u01:
///    the CPU policy's seed gives its coin flips). It keeps no token subset: its kept rows hold one
///    entry, the cluster count m, and log_sum is log τ̂;
///  - "oracle_topk": at each evaluated step the `budget` tokens of largest exact attention (the KV
///    group's by group_agg, undivided), ties to the older token (hd::topk_prefer); kept ascending.
/// Which replay a PolicyReplay asks for (one per GPU kernel family; cuda::replay_policy switches on
/// it with no default, so a new kind without a kernel does not compile).
enum class ReplayKind { window, sink, h2o, uniform, buzz, oracle_topk, subgen_kcenter, subgen };

/// The policy name of `k` ("window", ... — the registry name whose gpu_replay() gives it).
inline const char* to_string(ReplayKind k) {
  switch (k) {
    case ReplayKind::window: return "window";
    case ReplayKind::sink: return "sink";
    case ReplayKind::h2o: return "h2o";
    case ReplayKind::uniform: return "uniform";
    case ReplayKind::buzz: return "buzz";
    case ReplayKind::oracle_topk: return "oracle_topk";
    case ReplayKind::subgen_kcenter: return "subgen_kcenter";
    case ReplayKind::subgen: return "subgen";
  }
  return "?";
}

struct PolicyReplay {
  ReplayKind kind = ReplayKind::window;
  int64_t sink = 0, window = 0;    ///< window / sink / buzz
  int64_t budget = 0, recent = 0;  ///< h2o: cache size B and protected recent tokens; uniform: B
  int group_agg = 0;               ///< hd::GroupAgg (mean 0, max 1, sum 2): h2o's and buzz's scores
  std::vector<uint64_t> seeds;     ///< uniform: one per KV head
  int64_t threshold = 0, stride = 0;  ///< buzz: T and s
  bool log_scale = false;             ///< buzz: logits × log_512(t)
  bool weighted = false;              ///< subgen_kcenter: center logits + log(cluster size)
  double delta = 0;                   ///< subgen: cluster radius δ (0 with max_clusters: adaptive)
  int64_t s = 0, t = 0, max_clusters = 0;  ///< subgen: |M|, |S_i|, cluster cap (0 = none)
};

/// Slots of the `kept` rows cuda::replay_policy returns for `p` (the most tokens its cache holds):
/// budget (h2o, uniform, oracle_topk), sink + window (window, sink), sink + window + threshold (buzz),
/// recent + centers (subgen_kcenter), 1 (subgen: its cluster count).
inline int64_t replay_capacity(const PolicyReplay& p) {
  switch (p.kind) {
    case ReplayKind::h2o:
    case ReplayKind::uniform:
    case ReplayKind::oracle_topk: return p.budget;
    case ReplayKind::buzz: return p.sink + p.window + p.threshold;
    case ReplayKind::subgen_kcenter: return p.recent + p.budget;
    case ReplayKind::subgen: return 1;  // the cluster count
    case ReplayKind::window:
    case ReplayKind::sink: return p.sink + p.window;
  }
  return 0;
}

/// Replays every KV head's stream through `p` on the GPU, one cache per KV head shared by its
/// `group` query heads (the CPU's kv_head mode), with the step logic of include/kvsim/core/hd.hpp.
/// Q: [kv_heads·group][n][d] unscaled (query head h uses KV head h / group); K, V: [kv_heads][n][d];
/// row-major float32 on the host. At each evaluated step (1-based, increasing): z [kv_heads·group]
/// [rows][d] (the answer), log_sum [kv_heads·group][rows] (log Σ exp over the cache, of the scaled
/// logits for buzz), kept [kv_heads][rows][kept_cap] token positions in the CPU policy's answer order
/// (slot order; buzz: sink, old, new, window), −1 padded (kept_cap = replay_capacity(p)). Throws kvsim::Error without a device, for other policies, or on bad sizes.
void replay_policy(const PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads, int group,
                   int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap);

/// replay_policy with Q, K and V uploaded once for every replay that names the same `streams_id`
/// (non-zero, unique per set of streams: the caller's key, e.g. a layer's): the first call copies them
/// to the device, later calls with that id use the device copies and ignore their own Q, K and V
/// pointers (their sizes must match). release_shared_streams(streams_id) lets the copies go once the
/// replays using them end. The engine replays a layer's GPU policies this way (GpuLayerBatch).
void replay_policy_shared(uint64_t streams_id, const PolicyReplay& p, const float* Q, const float* K, const float* V,
                          int kv_heads, int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps,
                          std::vector<float>& z, std::vector<double>& log_sum, std::vector<int64_t>& kept,
                          int64_t& kept_cap);
/// Drops the device copies uploaded under `streams_id` (nothing when none are, or the module is not loaded).
void release_shared_streams(uint64_t streams_id);

/// Sets the module's [runtime] choices (include/kvsim/core/runtime.hpp: the exact pass, its rows per
/// chunk, the policy kernels' state in shared memory, the deadline of a wait) for the calls that
/// follow; until called, the module takes them from the environment. run_experiment calls it with the
/// run's resolved table. Throws kvsim::Error without a device.
void configure(const Runtime& r);

/// `kvsim bench --device cuda`: the device, cuBLAS SGEMM rates (fp32 and TF32 tensor cores, 8192³)
/// as rooflines, and the exact causal pass (32 heads, head_dim 128, every 16th step evaluated) at
/// n ∈ {2048, 8192, 32768} in TFLOP/s. Printable figures; throws kvsim::Error without a device.
std::string bench(bool quick);

}  // namespace kvsim::cuda
