// kvsim: result files. `results.h5` holds every evaluated row; `summary.csv` the aggregates.
//
// results.h5: root attributes experiment, source, config (as given), resolved_config (every default
//   filled in), kvsim_version, git_commit, recording_path/bytes/sha1, n_tokens, seed, n_layers,
//   n_heads, n_kv_heads, head_dim, threads, wall_seconds; one group per policy /policy_{i:02d} with
//   attributes name, label, params, param_<name> (typed) and 1-D datasets layer, head, step and one
//   per metric column that applies (the metric registry's, with `unit`, `description` and `source`
//   attributes). NaN = not applicable at that row.
// summary.csv: policy,label,layer,metric,count,mean,median,p95,max,all_layers,<one column per policy
//   parameter> — one row per policy, layer and metric; the all-layer aggregate has layer −1 and
//   all_layers = 1 (an integer layer column); NaN rows skipped in the statistics.
// cells.csv: policy,label,layer,head,metric,count,mean,median,p95,max,<parameters> — the same per
//   (layer, query head) cell, over its evaluated steps.
// All files are written to a temporary name and renamed into place (never half-written).
#pragma once
#include <array>
#include <cmath>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvsim/io/recording.hpp"
#include "kvsim/io/spec.hpp"

namespace kvsim {

/// A metric column of a result: its name (dataset / CSV `metric` value), unit, description and
/// source, from the metric registry (include/kvsim/replay/metrics.hpp).
struct MetricColumn {
  std::string name, unit, description, source;
  size_t index = 0;  ///< the value's slot in MetricRow (the registry position)
};

/// Most metrics a row can hold (the registry's size is checked against it).
inline constexpr size_t kMaxMetrics = 32;

/// One evaluated (policy, layer, query head, step): the value of each metric column, in the run's
/// column order. NaN marks a metric that does not apply.
struct MetricRow {
  int32_t layer = 0, head = 0;
  int64_t step = 0;
  std::array<double, kMaxMetrics> value;
  double operator[](size_t i) const { return value[i]; }
  double& operator[](size_t i) { return value[i]; }
};

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
  std::vector<MetricColumn> metrics;  ///< the columns of every row, in order
};


struct Stat {
  int64_t count = 0;
  double mean = NAN, median = NAN, p95 = NAN, max = NAN;
};

/// Every parameter name any policy of the run has, sorted: the parameter columns of summary.csv,
/// cells.csv and sequences.csv, one each.
std::vector<std::string> param_keys(const std::vector<PolicySpec>& specs);

/// One policy's parameter cells for the columns `keys` (param_keys): ",v1,,v3" — each value as a
/// CSV field, empty where the policy has no such parameter.
std::string param_cells(const PolicySpec& spec, const std::vector<std::string>& keys);

/// Statistics over the finite values of `v` (NaN entries are skipped).
Stat summarize(std::vector<double> v);

void write_results(const RunResult& r, const Experiment& ex, const std::string& out_dir);

/// summary.csv's and cells.csv's text for an in-memory result (the Python API's Results.summary;
/// write_results writes the same text to the files).
void write_summary_csv(const RunResult& r, std::ostream& o);
void write_cells_csv(const RunResult& r, std::ostream& o);

/// Each policy's statistics over all its rows, [policy][metric column] (summary.csv's all-layer rows;
/// ResultSpill::overall() for a spilled run).
std::vector<std::vector<Stat>> overall_stats(const RunResult& r);

/// The human-readable table printed by `kvsim run` (policy × key metrics, means and p95 over all rows).
std::string summary_table(const RunResult& r);

/// Where a run's rows go, one finished (layer, KV head) cell at a time: the run (run_experiment,
/// include/kvsim/replay/engine.hpp) calls begin() once with the rows each cell yields per policy, then
/// write_cell() for every finished cell, from any worker thread, in any order. Implemented by
/// ResultSpill (to disk, with a checkpoint: `kvsim run`) and MemoryRows (in memory: kvsim.run, tests).
class RowSink {
 public:
  virtual ~RowSink() = default;
  /// `meta`: the stream's (a checkpoint's manifest needs it).
  virtual void begin(const std::vector<size_t>& rows_per_cell, const std::vector<MetricColumn>& metrics,
                     const RecordingMeta* meta) = 0;
  /// True for a cell whose rows the sink already holds (--resume): nothing to compute.
  virtual bool cell_done(size_t) const { return false; }
  /// Cells the sink held before the run (taken from a checkpoint).
  virtual size_t cells_resumed() const { return 0; }
  /// Cell `cell`'s rows, [policy][row] (thread-safe; the sink may move them out).
  virtual void write_cell(size_t cell, std::vector<std::vector<MetricRow>>&& rows) = 0;
};

/// A RowSink that keeps every cell's rows in memory; take() moves them, cell by cell in cell order,
/// into each policy's rows (reserved exactly: the rows exist once in memory, not twice).
class MemoryRows final : public RowSink {
 public:
  void begin(const std::vector<size_t>& rows_per_cell, const std::vector<MetricColumn>&, const RecordingMeta*) override;
  void write_cell(size_t cell, std::vector<std::vector<MetricRow>>&& rows) override;
  /// Appends policy p's rows of every cell to policies[p].rows (policies sized by the caller).
  void take(std::vector<PolicyResult>& policies);

 private:
  std::vector<std::vector<std::vector<MetricRow>>> cells_;  // [cell][policy][row]
};

/// Streams a run's rows to disk as its cells finish, so memory does not grow with the number of
/// layers: run_experiment() calls begin() once with the rows each cell yields
/// per policy, then write_cell() for every finished cell (any thread, any order: rows land at the
/// cell's fixed offset, so the files are those write_results() writes, at any thread count — tested);
/// finish() adds the attributes, writes summary.csv and cells.csv reading one column at a time, and
/// renames everything into place. Until finish() succeeds nothing is visible under the final names;
/// the destructor removes the temporary files of an unfinished run.
///
/// With `checkpoint` (the CLI always: include/kvsim/io/cell_checkpoint.hpp), begin() opens the output
/// folder's cell checkpoint (refusing an unfinished run there unless resume or force is set), takes
/// the finished cells' rows from it (cell_done() is then true for them: the engine skips them), and
/// write_cell() makes each cell durable before anything else; finish() removes the checkpoint.
struct ResumeMode;
class ResultSpill final : public RowSink {
 public:
  ResultSpill(const std::string& out_dir, const Experiment& ex, const ResumeMode* checkpoint = nullptr);
  ~ResultSpill();
  ResultSpill(const ResultSpill&) = delete;
  ResultSpill& operator=(const ResultSpill&) = delete;
  /// `meta` (the stream's) is needed for a checkpoint's manifest; without it there is no checkpoint.
  void begin(const std::vector<size_t>& rows_per_cell, const std::vector<MetricColumn>& metrics,
             const RecordingMeta* meta = nullptr) override;
  /// True for a cell whose rows came from the checkpoint (--resume): nothing to compute.
  bool cell_done(size_t cell) const override;
  /// Cells taken from the checkpoint.
  size_t cells_resumed() const override;
  void write_cell(size_t cell, std::vector<std::vector<MetricRow>>&& rows) override;
  /// `r` carries meta, source, policy specs, wall time and threads (its rows are empty). Returns the
  /// summary table text (as summary_table()).
  std::string finish(const RunResult& r);
  /// After finish(): each policy's statistics over all its rows, [policy][metric column].
  const std::vector<std::vector<Stat>>& overall() const;
  /// --resume of a finished folder: when `out_dir` has no checkpoint and its results.h5 was written by
  /// the run `manifest` describes (its run_manifest attribute), each policy's statistics over all its
  /// rows, [policy][metric] (as overall()); nullopt when there is nothing there (compute the run).
  /// Throws kvsim::Error when the folder holds finished results of another run (naming the difference).
  static std::optional<std::vector<std::vector<Stat>>> finished(const std::string& out_dir, const std::string& manifest,
                                                                 const std::vector<MetricColumn>& metrics,
                                                                 size_t n_policies);

 private:
  struct State;
  std::unique_ptr<State> st_;
  void create_datasets();
};

}  // namespace kvsim
