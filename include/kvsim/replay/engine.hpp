// kvsim: the replay engine. An experiment (include/kvsim/io/spec.hpp) is split into (layer, KV head)
// cells; each cell replays its stream step by step through the exact reference and every policy
// (sim/replay/cell.cpp) and yields one MetricRow per (policy, query head, evaluated step), with the
// metric registry's columns (include/kvsim/replay/metrics.hpp).
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

/// Replays every selected (layer, kv head) cell through exact attention and every policy, over
/// `threads` worker threads. Results are identical for any thread count (policy_ns aside).
/// `progress(done, total)` is called after each cell (from worker threads, serialized).
/// With `spill` (include/kvsim/io/results.hpp), each finished cell's rows go to disk at once and the
/// returned RunResult carries no rows (memory independent of the number of layers).
class ResultSpill;
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

namespace cell {
class GpuLayerBatch;  // sim/replay/gpu_layer_batch.hpp
}

/// Replays one cell's first n tokens; out[p] receives policy p's rows (query head-major, then step).
/// `batch`: with `[eval] device = "cuda"`, the GPU replays shared by the cells of each layer (one
/// launch per layer and policy); null: one launch per cell.
void replay_cell(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n,
                 std::vector<std::vector<MetricRow>>& out, cell::GpuLayerBatch* batch = nullptr);

RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads,
                         const std::function<void(int, int)>& progress = {}, ResultSpill* spill = nullptr);

}  // namespace kvsim
