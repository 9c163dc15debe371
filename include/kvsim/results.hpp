// kvsim: result files. `results.h5` holds every evaluated row; `summary.csv` the aggregates.
//
// results.h5: root attributes experiment, source, config (the resolved TOML), n_tokens, seed,
//   n_layers, n_heads, n_kv_heads, head_dim, threads, wall_seconds; one group per policy
//   /policy_{i:02d} with attributes name, label, params and 1-D datasets layer, head, step and one
//   per metric (rel_err, eps_spectral, tau_rel_err, kept_mass, oracle_mass, mass_ratio,
//   attention_loss, cache_tokens, cache_bytes, policy_ns). NaN = not applicable.
// summary.csv: policy,label,layer,metric,count,mean,median,p95,max — one row per policy, layer
//   ("all" for every layer together) and metric, NaN rows skipped in the statistics.
// cells.csv: policy,label,layer,head,metric,count,mean,median,p95,max — the same per (layer, query
//   head) cell, over its evaluated steps.
// All files are written to a temporary name and renamed into place (never half-written).
#pragma once
#include <string>
#include <vector>

#include "kvsim/experiment.hpp"

namespace kvsim {

struct Stat {
  int64_t count = 0;
  double mean = NAN, median = NAN, p95 = NAN, max = NAN;
};

/// Statistics over the finite values of `v` (NaN entries are skipped).
Stat summarize(std::vector<double> v);

void write_results(const RunResult& r, const Experiment& ex, const std::string& out_dir);

/// The human-readable table printed by `kvsim run` (policy × key metrics, means and p95 over all rows).
std::string summary_table(const RunResult& r);

}  // namespace kvsim
