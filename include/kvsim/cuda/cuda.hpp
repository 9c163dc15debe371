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

/// A policy replayed on the GPU (the GPU path, step 2): its kind and sizes in tokens.
/// Which replay a PolicyReplay asks for: one per GPU kernel family, described once in
/// kReplayKindTable below (capacity, size checks, how its rows are read); the policy whose
/// gpu_replay() returns it builds it in its own file (sim/policies/NAME.cpp), and the CUDA module
/// launches it from one switch without default (sim/cuda/policies.cu), so a new kind without a table
/// entry or a kernel does not compile.
enum class ReplayKind { window, sink, h2o, uniform, buzz, oracle_topk, subgen_kcenter, subgen };
inline constexpr int kReplayKindCount = 8;

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
  /// h2o and buzz: steps whose logits are formed at once, as one tiled product of the block's queries
  /// and the keys the cache holds at its start plus the block's own (blocked stepping, `[eval]
  /// stepping = "blocked"`); 0 steps one token at a time. Answers equal up to float32 rounding.
  int64_t step_block = 0;
};

/// What a replay's `kept` row holds: token positions (−1 padded), or, for a policy that keeps no
/// token subset (subgen), its cluster count m in the row's first slot.
enum class KeptRow { tokens, cluster_count };
/// How the engine reads a policy's cluster count from a replay (Policy::clusters()): not at all (the
/// CPU instance's NaN), the kept tokens beyond the `recent` window (subgen_kcenter's centers), or
/// the kept row's count (subgen).
enum class Clusters { none, beyond_recent, kept_row };
/// The partition-function estimate a replay answers with (Answer::log_tau): none (the engine's
/// from the kept set), uniform's τ̂ rescaled from log_sum (hd::uniform_log_tau), or log_sum itself
/// (subgen's τ̂, SubGen Algorithm 1 line 30).
enum class Tau { none, uniform, log_sum };

/// Everything the GPU path and the engine's adapter need to know of one ReplayKind, in one row.
struct ReplayKindInfo {
  ReplayKind kind;
  const char* name;  ///< the registry name whose gpu_replay() gives it
  /// Slots of the `kept` rows (the most tokens its cache holds; subgen: 1, its cluster count).
  int64_t (*capacity)(const PolicyReplay&);
  /// Whether the sizes and parameters are ones the kernel accepts, for `kv_heads` KV heads of n
  /// tokens (capacity ≥ 1 is checked for every kind).
  bool (*sizes_ok)(const PolicyReplay&, int kv_heads, int64_t n);
  /// True: the cache holds min(t, capacity) tokens at every step; false: the count at each
  /// answered step is read from the replay (buzz, subgen_kcenter, subgen).
  bool fixed_size;
  KeptRow kept;
  Clusters clusters;
  Tau tau;
};

/// The replay kinds, indexed by ReplayKind (checked below):
///  - window (sink = 0) and sink (StreamingLLM: sink + window): sink + window slots;
///  - h2o: budget = heavy + recent, `recent` protected tokens (< budget), group_agg;
///  - uniform: reservoir sampling of `budget` tokens, one Philox seed per KV head in `seeds`
///    (hd::reservoir_slot: the CPU policy's seed gives the CPU policy's samples);
///  - buzz: sink + window + beehive body with `threshold` T and `stride` s, log_scale (BUZZ §3.5),
///    group_agg for the accumulated scores;
///  - oracle_topk: at each evaluated step the `budget` tokens of largest exact attention (the KV
///    group's by group_agg, undivided), ties to the older token (hd::topk_prefer); kept ascending;
///  - subgen_kcenter (streaming mode): the `recent` last tokens plus at most `budget` centers of the
///    older keys by hd::kcenter_insert; `weighted` adds log(cluster size) to a center's logit;
///  - subgen: SubGen Algorithm 1 with radius `delta`, `s` matrix-product and `t` cluster samples,
///    `max_clusters` (0 = as published), one Philox seed per KV head in `seeds` (hd::philox_u01: the
///    CPU policy's seed gives its coin flips). It keeps no token subset; log_sum is log τ̂.
inline constexpr ReplayKindInfo kReplayKindTable[] = {
    {ReplayKind::window, "window", [](const PolicyReplay& p) { return p.sink + p.window; },
     [](const PolicyReplay& p, int, int64_t) { return p.sink >= 0 && p.window >= 1; }, true, KeptRow::tokens,
     Clusters::none, Tau::none},
    {ReplayKind::sink, "sink", [](const PolicyReplay& p) { return p.sink + p.window; },
     [](const PolicyReplay& p, int, int64_t) { return p.sink >= 0 && p.window >= 1; }, true, KeptRow::tokens,
     Clusters::none, Tau::none},
    {ReplayKind::h2o, "h2o", [](const PolicyReplay& p) { return p.budget; },
     [](const PolicyReplay& p, int, int64_t) { return p.recent >= 0 && p.recent < p.budget; }, true, KeptRow::tokens,
     Clusters::none, Tau::none},
    {ReplayKind::uniform, "uniform", [](const PolicyReplay& p) { return p.budget; },
     [](const PolicyReplay& p, int kv_heads, int64_t n) {
       return p.seeds.size() == size_t(kv_heads) && n < (int64_t(1) << 32);
     },
     true, KeptRow::tokens, Clusters::none, Tau::uniform},
    {ReplayKind::buzz, "buzz", [](const PolicyReplay& p) { return p.sink + p.window + p.threshold; },
     [](const PolicyReplay& p, int, int64_t) {
       return p.sink >= 0 && p.window >= 1 && p.stride >= 2 && p.threshold >= p.stride;
     },
     false, KeptRow::tokens, Clusters::none, Tau::none},
    {ReplayKind::oracle_topk, "oracle_topk", [](const PolicyReplay& p) { return p.budget; },
     [](const PolicyReplay& p, int, int64_t) { return p.group_agg >= 0 && p.group_agg <= 2; }, true,
     KeptRow::tokens, Clusters::none, Tau::none},
    {ReplayKind::subgen_kcenter, "subgen_kcenter", [](const PolicyReplay& p) { return p.recent + p.budget; },
     [](const PolicyReplay& p, int, int64_t) { return p.recent >= 1 && p.budget >= 0; }, false, KeptRow::tokens,
     Clusters::beyond_recent, Tau::none},
    {ReplayKind::subgen, "subgen", [](const PolicyReplay&) { return int64_t(1); },
     [](const PolicyReplay& p, int kv_heads, int64_t n) {
       return p.s >= 1 && p.t >= 1 && p.max_clusters >= 0 && p.delta >= 0 && (p.delta > 0 || p.max_clusters > 0) &&
              p.seeds.size() == size_t(kv_heads) && n < (int64_t(1) << 32);
     },
     false, KeptRow::cluster_count, Clusters::kept_row, Tau::log_sum},
};

namespace detail {
constexpr bool replay_table_in_order() {
  int i = 0;
  for (const ReplayKindInfo& r : kReplayKindTable)
    if (int(r.kind) != i++) return false;
  return i == kReplayKindCount;
}
}  // namespace detail
static_assert(detail::replay_table_in_order(), "kReplayKindTable: one row per ReplayKind, in enum order");

/// The table row of `k`.
inline const ReplayKindInfo& replay_kind_info(ReplayKind k) { return kReplayKindTable[int(k)]; }
/// The policy name of `k` ("window", ... — the registry name whose gpu_replay() gives it).
inline const char* to_string(ReplayKind k) { return replay_kind_info(k).name; }
/// Slots of the `kept` rows cuda::replay_policy returns for `p` (kReplayKindTable's capacity).
inline int64_t replay_capacity(const PolicyReplay& p) { return replay_kind_info(p.kind).capacity(p); }

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
