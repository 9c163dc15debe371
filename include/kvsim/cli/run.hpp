// kvsim: `kvsim run` (sim/cli/run.cpp).
#pragma once
#include <string>
#include <vector>

#include "kvsim/replay/engine.hpp"

namespace kvsim {

struct RunOptions {
  std::string config;             ///< experiment TOML
  std::string out;                ///< output folder (default results/<name>)
  int threads = 0;                ///< 0 = all cores
  std::vector<std::string> sets;  ///< --set key=value overrides
  bool quiet = false;             ///< print nothing but errors
  std::string device;             ///< "", "cpu" or "cuda" (= --set eval.device=...)
  /// --resume: continue the unfinished run in `out` (include/kvsim/io/cell_checkpoint.hpp); --force:
  /// discard it. Without either, an unfinished run in `out` is refused; finished results are replaced.
  bool resume = false, force = false;
};

/// Runs an experiment config: one sequence writes results.h5, summary.csv and cells.csv into the
/// output folder; several sequences write each into seq_NN/ and sequences.csv (mean over sequences
/// with a 95% bootstrap interval per policy and metric). Returns the exit status; throws
/// kvsim::Error on bad input.
int cmd_run(const RunOptions& opt);

/// sequences.csv's text for a multi-sequence run: per policy and metric the mean over sequences of
/// each sequence's mean (`overall[s][policy][metric]`, as overall_stats / ResultSpill::overall give)
/// with a 95% percentile-bootstrap interval seeded by the config seed, the policy and the metric's
/// registry position. `table_out`, when given, receives the printed table.
std::string sequences_csv(const Experiment& ex, const std::vector<MetricColumn>& metrics,
                          const std::vector<std::vector<std::vector<Stat>>>& overall, std::string* table_out = nullptr);

}  // namespace kvsim
