// Internal: the formatting and HDF5 helpers shared by the two result writers (sim/io/results.cpp:
// write_results and summary_table; sim/io/result_spill.cpp: ResultSpill).
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "kvsim/io/h5.hpp"
#include "kvsim/io/results.hpp"

namespace kvsim::results_detail {

/// "%.6g", or "nan".
std::string num(double x);
/// "/policy_NN".
std::string policy_group(size_t p);
void write_root_attrs(h5::File& f, const RunResult& r, const Experiment& ex);
void write_policy_group(h5::File& f, const std::string& g, const PolicySpec& spec);
/// The registry's unit, description and source as attributes of a metric dataset.
void describe_metric(h5::File& f, const std::string& g, const MetricColumn& m);
/// CSV lines (count, mean, median, p95, max) of one group of one policy, metric by metric.
/// Each line ends with the policy's value of every parameter in `keys` (empty where it has none).
void stat_lines(std::ostream& o, const PolicySpec& spec, const std::string& group,
                const std::vector<MetricColumn>& metrics, const std::vector<std::string>& keys,
                const std::function<Stat(size_t metric)>& stat_of, const std::string& flags = "");
/// The header of summary.csv / cells.csv after the key columns: metric, the statistics, the parameters.
/// `flag_header` names extra columns between the statistics and the parameters (summary.csv's
/// ",all_layers"); stat_lines' `flags` gives their values.
std::string stats_header(const std::vector<std::string>& keys, const std::string& flag_header = "");
/// summary.csv's layer cell of the all-layer aggregate (with all_layers = 1): an integer column stays integer.
inline constexpr const char* kAllLayers = "-1";
/// The `kvsim run` table from each policy's statistics over all rows: all_stats[p][metric index].
std::string format_table(const std::vector<std::string>& labels, const std::vector<MetricColumn>& metrics,
                         const std::vector<std::vector<Stat>>& all_stats);

}  // namespace kvsim::results_detail
