// kvsim: the replay engine. An experiment (include/kvsim/io/spec.hpp) is planned (plan_run: its
// (layer, KV head) cells, evaluated steps and metric columns); a scheduler (threads or MPI ranks) runs
// the cells, each replaying its stream step by step through the exact reference and every policy
// (sim/replay/cell.cpp) into one MetricRow per (policy, query head, evaluated step), with the metric
// registry's columns (include/kvsim/replay/metrics.hpp); the rows go to a RowSink (disk or memory).
// run_config is the one road from a config to its results (docs/architecture.md, "A replay, step by
// step").
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvsim/io/results.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/replay/metrics.hpp"

namespace kvsim {

/// Evaluated steps (1-based) for a stream of n tokens.
std::vector<int64_t> eval_steps(const EvalSpec& e, int64_t n);

/// True when H2O's objectives are computed at evaluated step t of an n-token stream: `[eval]
/// objectives = true`, t ≤ objectives_max_t and t a multiple of objectives_every or the last step.
bool is_objective_step(const EvalSpec& e, int64_t t, int64_t n);

/// With `[eval] objectives = true`, H2O's objectives are computed at the evaluated steps t ≤
/// objectives_max_t that are multiples of objectives_every (or the last step n). Throws kvsim::Error
/// naming eval.every, eval.from and eval.objectives_every when no evaluated step of an n-token
/// stream is one (e.g. every = 16 from 1 evaluates t = 1, 17, 33, … and objectives_every = 32 meets
/// none of them), instead of a run whose objective metrics are all missing.
void check_objective_steps(const EvalSpec& e, int64_t n);

/// Opens the experiment's stream source (recording file or synthetic preset).
std::unique_ptr<StreamSource> open_source(const DataSpec& d);

/// One (layer, KV head) cell: its layer, KV head and the selected query heads of its group.
struct Cell {
  int layer;
  int kv_head;
  std::vector<int> heads;
};

/// The stream a policy instance of `cell` is built for (everything but the per-instance seed): the
/// replay's n tokens, head_dim, the query heads it answers (1 with `[eval] gqa = "query_head"`, else
/// the cell's group), `[eval] group_agg` and `policy_precision`, `[data] prefill`, the layer.
StreamInfo cell_stream(const Experiment& ex, const Cell& cell, int64_t n, const RecordingMeta& meta);

/// The one place a replay builds a policy: instance i of the config's [[policy]] entry p for `cell`
/// of an n-token stream (kv_head mode: i = 0, one instance for the group; query_head mode: i = the
/// cell's i-th query head), seeded derive_seed(seed, layer, head id, p, 0). Throws kvsim::Error for
/// parameters the stream refuses.
std::unique_ptr<Policy> make_cell_policy(const Experiment& ex, const RecordingMeta& meta, const Cell& cell, int64_t n,
                                         size_t p, int i = 0);

/// What a run replays, fixed before any work (plan_run): the stream's first n tokens, the selected
/// layers and their (layer, KV head) cells, the evaluated steps and the metric columns.
struct RunPlan {
  const Experiment* ex = nullptr;
  const StreamSource* src = nullptr;
  int64_t n = 0;
  std::vector<int> layers;
  std::vector<Cell> cells;
  std::vector<int64_t> steps;          ///< evaluated steps (1-based), eval_steps(ex.eval, n)
  std::vector<MetricColumn> metrics;   ///< every row's columns, metric_columns(ex.eval)
  /// Rows per policy each cell yields (its query heads × evaluated steps).
  std::vector<size_t> rows_per_cell() const;
};

/// Checks `ex` against the stream (data.prefill, eval.from, the objective steps, layers and heads in
/// range, every policy's parameters built once per cell shape) and plans its cells. Throws
/// kvsim::Error naming the config key.
RunPlan plan_run(const Experiment& ex, const StreamSource& src);

/// `progress(done, total)`: called after each finished cell (serialized), cells resumed included.
using Progress = std::function<void(int, int)>;

/// Runs a plan's cells into a sink (include/kvsim/io/results.hpp), skipping the cells the sink
/// already holds: on worker threads of this process (thread_scheduler) or across MPI ranks
/// (mpi::scheduler, include/kvsim/replay/mpi.hpp). A cell's rows depend only on the config and the
/// cell, so every schedule gives the same rows. The first error stops the others and is rethrown.
class CellScheduler {
 public:
  virtual ~CellScheduler() = default;
  virtual void run(const RunPlan& plan, RowSink& sink, int threads, const Progress& progress) = 0;
};

/// `threads` workers taking cells in turn (with `[eval] device = "cuda"`, the GPU replays of a
/// layer's cells batched into one launch per policy when there are more cells than workers).
std::unique_ptr<CellScheduler> thread_scheduler();

/// The job's scheduler: MPI's when kvsim runs as more than one rank, else thread_scheduler().
std::unique_ptr<CellScheduler> job_scheduler();

namespace cell {
class GpuLayerBatch;  // sim/replay/gpu_layer_batch.hpp
}

/// Replays one cell's first n tokens; out[p] receives policy p's rows (query head-major, then step).
/// `batch`: with `[eval] device = "cuda"`, the GPU replays shared by the cells of each layer (one
/// launch per layer and policy); null: one launch per cell.
void replay_cell(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n,
                 std::vector<std::vector<MetricRow>>& out, cell::GpuLayerBatch* batch = nullptr);

/// Replays every planned cell of `ex` through exact attention and every policy (plan_run, then the
/// job's scheduler). With `sink` the rows go there (begin() and write_cell(); the caller finishes it)
/// and the result carries none; without, they are kept in memory (MemoryRows) and returned, ordered
/// by (layer, KV head, query head, step). Results are identical for any thread or rank count
/// (policy_ns aside).
RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads, const Progress& progress = {},
                         RowSink* sink = nullptr);

/// What a run does with each of its sequences (run_config): the sink its rows go to and what follows.
/// `kvsim run` spills each to OUT or OUT/seq_NN with a checkpoint (sim/cli/run.cpp); kvsim.run keeps
/// them in memory (sim/python/run_binding.cpp).
class SequenceOutput {
 public:
  virtual ~SequenceOutput() = default;
  /// Sequence s of S, `one` its single-sequence experiment: the sink for its rows, owned by the
  /// output; null when there is nothing to compute (--resume of finished results).
  virtual RowSink* open(const Experiment& one, int s, int S, const StreamSource& src) = 0;
  /// Progress of sequence s (empty: none).
  virtual Progress progress(int, int) { return {}; }
  /// After the replay: finishes the sink of sequence s with its result (meta, source, policy specs,
  /// wall time; the rows when the sink keeps them).
  virtual void close(const Experiment& one, int s, RunResult&& r) = 0;
};

/// The one road from a config to its results, for `kvsim run`, its MPI ranks and kvsim.run alike:
/// for each sequence of `ex` (sequence_spec), open its stream, plan it, run its cells on the job's
/// scheduler into `out`'s sink, and close it.
void run_config(const Experiment& ex, int threads, SequenceOutput& out);

}  // namespace kvsim
