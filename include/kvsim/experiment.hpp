// kvsim: an experiment (what to replay, when to evaluate, which policies) and the replay engine.
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvsim/policy.hpp"
#include "kvsim/recording.hpp"
#include "kvsim/synth.hpp"

namespace kvsim {

struct PolicySpec {
  std::string name;    ///< registry name (exact, window, ...)
  std::string label;   ///< unique display label, e.g. "window(budget=0.25)"
  Params params;
};

struct DataSpec {
  std::string path;              ///< a recording file, or empty for the synthetic preset
  bool synthetic = false;
  SynthParams synth;
  std::vector<int> layers;       ///< empty = all
  std::vector<int> heads;        ///< query heads; empty = all
  int64_t tokens = 0;            ///< replay only the first `tokens` (0 = all)
};

struct EvalSpec {
  int64_t every = 1;             ///< evaluate every `every` steps ...
  int64_t from = 1;              ///< ... starting at step `from`; the last step is always evaluated
  std::string gqa = "kv_head";   ///< "kv_head" (one cache per KV head) or "query_head"
  std::string group_agg = "mean";
  /// "float64" (default) or "float32": arithmetic of the window, sink, h2o, buzz and uniform policies
  /// (sim/policies/slot_cache.hpp). The exact reference and metrics are always double.
  std::string policy_precision = "float64";
  /// "cpu" (default) or "cuda": where the exact reference runs (include/kvsim/cuda.hpp; fp32 on the
  /// GPU, so reference-relative metrics carry ~1e-5 of its rounding). Policies with a GPU replay
  /// (Policy::gpu_replay: all but subgen_kcenter prefill and h2o oracle scores) run there
  /// too (sim/policies/gpu_replay.cpp).
  std::string device = "cpu";
  /// "float64" (default; ≤ 1e-6 of long double, DESIGN §6) or "float32": arithmetic of the CPU exact
  /// reference (include/kvsim/reference.hpp, exact_attention_f32: ~2x faster, ~1e-5 relative error,
  /// which the exact policy's metrics then show). Metrics and τ's sum stay double.
  std::string reference_precision = "float64";
  // H2O objectives (include/kvsim/objectives.hpp), off by default: computed at evaluated steps t that
  // are multiples of objectives_every (and the last), for t ≤ objectives_max_t.
  bool objectives = false;
  int64_t objectives_every = 16;
  int64_t objectives_max_t = 1024;
  double theorem44_alpha = 0.0, theorem44_beta = 0.0;
};

struct Experiment {
  std::string name = "experiment";
  uint64_t seed = 1;
  DataSpec data;
  EvalSpec eval;
  std::vector<PolicySpec> policies;
  std::string config_text;       ///< the resolved configuration, stored with the results
};

/// One evaluated (policy, layer, query head, step). NaN marks a metric that does not apply.
struct MetricRow {
  int32_t layer = 0, head = 0;
  int64_t step = 0;
  double rel_err, eps_spectral, tau_rel_err, kept_mass, oracle_mass, mass_ratio, attention_loss;
  double cache_tokens, cache_bytes, clusters, policy_ns;
  // H2O objectives (NaN unless [eval] objectives = true and this step is one where they are computed).
  double log_value = NAN, log_opt = NAN;               ///< g_t(S), and its optimum g_t(top-|S|)
  double fl_value = NAN, fl_greedy = NAN, fl_opt = NAN; ///< facility location of S, greedy, brute-force OPT
  double fl_ratio = NAN;                               ///< fl_value / fl_greedy
  double thm44 = NAN;                                  ///< Theorem 4.4 verdict: 1 holds, 0 fails, NaN unknown
};

/// Column names of MetricRow's metrics (after layer, head, step) in order.
const std::vector<std::string>& metric_names();
double metric_value(const MetricRow& r, size_t i);

struct PolicyResult {
  PolicySpec spec;
  std::vector<MetricRow> rows;   ///< ordered by (layer, kv head, query head, step)
};

struct RunResult {
  RecordingMeta meta;
  std::string source;
  int64_t n_tokens = 0;          ///< tokens replayed
  std::vector<int> layers;
  std::vector<PolicyResult> policies;
  double wall_seconds = 0;
  int threads = 1;
};

/// Evaluated steps (1-based) for a stream of n tokens.
std::vector<int64_t> eval_steps(const EvalSpec& e, int64_t n);

/// Opens the experiment's stream source (recording file or synthetic preset).
std::unique_ptr<StreamSource> open_source(const DataSpec& d);

/// Replays every selected (layer, kv head) cell through exact attention and every policy, over
/// `threads` worker threads. Results are identical for any thread count (policy_ns aside).
/// `progress(done, total)` is called after each cell (from worker threads, serialized).
/// With `spill` (include/kvsim/results.hpp), each finished cell's rows go to disk at once and the
/// returned RunResult carries no rows (memory independent of the number of layers).
class ResultSpill;
RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads,
                         const std::function<void(int, int)>& progress = {}, ResultSpill* spill = nullptr);

}  // namespace kvsim
