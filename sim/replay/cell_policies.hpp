// Internal to the replay (sim/replay/cell.cpp): every policy of an experiment stepped through one
// cell's stream, as a decoder would drive its cache.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "cell_metrics.hpp"

namespace kvsim::cell {

class GpuLayerBatch;

/// The seed of instance i of policy entry p in `cell` (kv_head mode: i = 0; query_head mode: the
/// cell's i-th query head): derive_seed(seed, model_layer, head id, p, 0), where model_layer is the cell's
/// layer in the model (RecordingMeta::model_layer: a layer-subset recording seeds as the full one).
uint64_t instance_seed(const Experiment& ex, const Cell& cell, int64_t model_layer, size_t p, int i);

/// The instances of one policy spec inside a cell: one (kv_head mode) or one per query head.
struct PolicyRun {
  std::vector<std::unique_ptr<Policy>> inst;
  bool every = false, oracle = false;
  int64_t t = 0;                          // tokens observed so far
  int64_t memory_tokens = -1;             // equal-memory target (param `memory`), −1 = none
  std::optional<ClosedFormCache> closed;  // replayed in blocks (ClosedFormPolicy), never stepped
  bool blocked = false;                   // stepped in blocks (BlockStepper, `[eval] stepping = "blocked"`)
  double ns_since_eval = 0;
  int64_t steps_since_eval = 0;
};

/// Stream semantics (docs/architecture.md, a replay step by step): at step t token t−1 (0-based)
/// joins every cache (observe), then q_t is answered (attend: every step for score-based policies,
/// else only at evaluated steps). Closed-form caches (window, sink) answer a block of evaluated steps
/// at once by banded GEMMs (include/kvsim/replay/banded.hpp) and are never stepped.
class PolicySteps {
 public:
  PolicySteps(const Experiment& ex, const Cell& cell, int64_t n, const RecordingMeta& meta, const Streams& streams, double scale,
              Reference& reference, Metrics& metrics, GpuLayerBatch* batch = nullptr);
  /// One run per [[policy]] entry, seeded by (seed, layer, head, entry index); GPU replays when
  /// `[eval] device = "cuda"` and the policy has one (sim/policies/gpu_replay.cpp), through `batch`
  /// (one replay per layer) when given.
  void make();
  /// Hands non-causal oracles (H2O's "global" heavy hitters) the exact column sums, if any asks.
  void global_scores();
  size_t size() const { return runs_.size(); }
  /// Steps policy p from its last step to the block's end; at each evaluated step checks the memory
  /// rule and appends one row per query head to `out`.
  void step(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out);

 private:
  /// Blocked stepping: steps t_first..t_last of every instance of `run` at once (BlockStepper), block_answers_[i]
  /// filled by instance i at each of `steps` (the evaluated steps in the block).
  void advance_block(PolicyRun& run, int64_t t_first, int64_t t_last, const std::vector<int64_t>& steps);
  void step_blocked(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out);
  /// Steps per block for `run` now: `[eval] stepping_block`, else stepping_block_size of its cache.
  int64_t block_steps(const PolicyRun& run) const;
  std::vector<int> heads_of(size_t i) const;
  void step_closed(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out);
  void prefill(PolicyRun& run);
  void attend(PolicyRun& run, int64_t t, bool is_eval, size_t r);
  /// `tokens`, `clusters`: per query head, the instance's cache_tokens() and clusters() at t when recorded then
  /// (blocked stepping).
  void evaluated(size_t p, int64_t t, size_t r, double bytes, double loaded, std::vector<MetricRow>& out,
                 const std::vector<int64_t>* tokens = nullptr, const std::vector<double>* clusters = nullptr);

  const Experiment& ex_;
  const Cell& cell_;
  GpuLayerBatch* batch_;
  const int64_t n_;
  const int d_, G_;
  const RecordingMeta& meta_;
  const bool per_query_;
  const Streams& s_;
  const double scale_;
  Reference& ref_;
  Metrics& metrics_;
  std::vector<PolicyRun> runs_;
  MatD closed_z_;                    // a closed-form block's answers [steps × G, d]
  VecD closed_log_sums_;             // and their log Σ exp(k·q̃) when the closed form reports log τ (exact)
  std::vector<int64_t> closed_kept_; // a closed-form cache's tokens at one step
  MatD q_group_, q_one_;
  std::vector<Answer> answers_, one_;
  std::vector<int64_t> tokens_;  // a blocked step's cache_tokens per query head
  std::vector<double> clusters_;  // and its clusters
  std::vector<BlockAnswers> block_answers_;  // a block's answers per instance (advance_block)
  std::vector<const double*> probs_group_, probs_one_;
};

}  // namespace kvsim::cell
