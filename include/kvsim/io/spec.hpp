// kvsim: an experiment's description — what to replay, when to evaluate, which policies — as read
// from a config (sim/cli/config.cpp) and stored with its results.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/core/choices.hpp"
#include "kvsim/core/params.hpp"
#include "kvsim/core/runtime.hpp"
#include "kvsim/io/synth.hpp"

namespace kvsim {

struct DataSpec {
  std::string path;              ///< a recording file, or empty for the synthetic preset
  /// Several sequences: every recording (`[data] path = [...]`; paths[0] == path),
  /// empty for a single one.
  std::vector<std::string> paths;
  /// `[data] recipe`: the command that makes a missing recording (named in the error when it is absent).
  std::string recipe;
  bool synthetic = false;
  SynthParams synth;
  /// Synthetic data: number of independently seeded sequences (`[data] sequences`, default 1).
  int sequences = 1;
  std::vector<int> layers;       ///< empty = all
  std::vector<int> heads;        ///< query heads; empty = all
  int64_t tokens = 0;            ///< replay only the first `tokens` (0 = all)
  /// Prefill then decode (`[data] prefill = P`, docs/architecture.md, a replay step by step): tokens 1..P are the prompt, which every
  /// policy receives at once (kvsim::prefill); decoding streams t = P+1..n and `eval.from` defaults
  /// to P+1. 0 = no prompt.
  int64_t prefill = 0;
  /// `[data] local_layers`: "exact" (default) leaves a recording's local sliding-window layers
  /// (layer_windows, docs/recordings.md) out of the replay, where compression does not matter;
  /// "replay" replays them too, each against window attention over its last w keys as the exact
  /// reference (Gemma 3: w = 512).
  bool replay_local = false;
};

struct EvalSpec {
  int64_t every = 1;             ///< evaluate every `every` steps ...
  int64_t from = 1;              ///< ... starting at step `from`; the last step is always evaluated
  GqaMode gqa = GqaMode::kv_head;  ///< one cache per KV head, or one per query head
  GroupAgg group_agg = GroupAgg::mean;  ///< how score-based policies combine a KV group's scores
  /// "float64" (default) or "float32": arithmetic of the window, sink, h2o, buzz and uniform policies
  /// (sim/policies/slot_cache.hpp). The exact reference and metrics are always double.
  Precision policy_precision = Precision::float64;
  /// "cpu" (default) or "cuda": where the exact reference runs (include/kvsim/cuda/cuda.hpp; fp32 on the
  /// GPU, so reference-relative metrics carry ~1e-5 of its rounding). Policies with a GPU replay
  /// (GpuReplayable: all but subgen_kcenter prefill and h2o oracle scores) run there
  /// too (sim/policies/gpu_replay.cpp).
  Device device = Device::cpu;
  /// "float64" (default; ≤ 1e-6 of long double, docs/theory.md) or "float32": arithmetic of the CPU exact
  /// reference (include/kvsim/replay/reference.hpp, exact_attention_f32: ~2x faster, ~1e-5 relative error,
  /// which the exact policy's metrics then show). Metrics and τ's sum stay double.
  Precision reference_precision = Precision::float64;
  /// "blocked" (default) or "per_step": how the CPU path replays caches whose content is a closed form
  /// of the step (ClosedFormPolicy: window, sink) — a block of evaluated steps through banded
  /// masked GEMMs (include/kvsim/replay/banded.hpp; equal to per-step within 1e-12 in double, 1e-5
  /// in float32), or the policy instance stepped token by token like every other policy.
  ClosedFormMode closed_form = ClosedFormMode::blocked;
  /// "blocked" (default) or "per_step": how the CPU path steps caches that implement BlockStepper
  /// (include/kvsim/policies/policy.hpp: h2o, tova, scissorhands, buzz) — a block of consecutive steps whose
  /// logits come from one GEMM, then walked step by step (equal to per-step up to the dot products'
  /// summation order), or one matrix-vector product per step. `stepping_block` = steps per block (0: the
  /// engine's choice, stepping_block_size()).
  SteppingMode stepping = SteppingMode::blocked;
  int64_t stepping_block = 0;
  // H2O objectives (include/kvsim/analysis/objectives.hpp), off by default: computed at evaluated steps t that
  // are multiples of objectives_every (and the last), for t ≤ objectives_max_t.
  bool objectives = false;
  int64_t objectives_every = 16;
  int64_t objectives_max_t = 1024;
  double theorem44_alpha = 0.0, theorem44_beta = 0.0;
  /// The needle's tokens: spans [begin, end) (0-based positions, ascending, disjoint; none = empty).
  /// Retrieval tasks (`kvsim task`, docs/tasks.md) set them to the tokens that hold the answer (one
  /// needle, several, a chain of assignments, a word's occurrences), and the metrics needle_mass,
  /// needle_kept_mass and needle_kept then apply over their union.
  std::vector<std::pair<int64_t, int64_t>> needle_spans;
  /// k of the metrics topk_mass and topk_kept (the exact row's k largest weights and the share of
  /// them a cache keeps); 0 (default) leaves both out. `kvsim task`'s open loop sets it
  /// (docs/tasks.md, "Offline scores").
  int64_t topk = 0;
};

/// A closed-loop cache's prompt_block (include/kvsim/model/policy_attention.hpp) under `e`: 0 for stepping =
/// "per_step", else stepping_block (−1 when 0: the engine's size).
inline int64_t prompt_block_of(const EvalSpec& e) {
  if (e.stepping != SteppingMode::blocked) return 0;
  return e.stepping_block > 0 ? e.stepping_block : -1;
}

/// A GPU replay's PolicyReplay::step_block under `e` (the h2o and buzz kernels): 0 for stepping =
/// "per_step", else stepping_block, or 64 steps when it is 0 (the kernels' tile scratch is
/// group × block × (budget + block) floats per KV head, small beside the device's memory).
inline int64_t gpu_step_block(const EvalSpec& e) {
  if (e.stepping != SteppingMode::blocked) return 0;
  return e.stepping_block > 0 ? e.stepping_block : 64;
}

struct Experiment {
  std::string name = "experiment";
  uint64_t seed = 1;
  DataSpec data;
  EvalSpec eval;
  std::vector<PolicySpec> policies;
  /// How the run is carried out ([runtime], environment applied); changes no number (core/runtime.hpp).
  Runtime runtime = runtime_from_environment();
  std::string config_text;       ///< the configuration as given (with --set overrides), stored with the results
  /// The configuration with every default filled in (data, eval, each policy's documented literal
  /// defaults), as TOML: results.h5's `resolved_config` attribute (sim/cli/resolved.cpp).
  std::string resolved_text;
};

/// Number of sequences a data spec names (recordings, or synthetic seeds).
int sequence_count(const DataSpec& d);

/// Sequence i of `d` (0 ≤ i < sequence_count(d)) as a single-sequence spec: recording paths[i], or
/// the synthetic preset with seed synth.seed for i = 0 and derive_seed({synth.seed, kSequenceTag, i})
/// otherwise (so a one-sequence run is unchanged). Throws kvsim::Error for i out of range.
DataSpec sequence_spec(const DataSpec& d, int i);

/// The folder of sequence i's files in a several-sequence run's output: "seq_00", "seq_01", …
std::string sequence_folder(int i);

}  // namespace kvsim
