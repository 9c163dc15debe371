// `kvsim run`: one sequence → results.h5, summary.csv, cells.csv in the output folder; several
// sequences ([data] path = [...] or [data] sequences = N) → each sequence's files in seq_NN/, and
// sequences.csv: per policy and metric the mean over sequences with a 95% percentile-bootstrap
// interval (include/kvsim/analysis/bootstrap.hpp, seeded by the config seed).
#include "kvsim/cli/run.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "kvsim/analysis/bootstrap.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/io/cell_checkpoint.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/mpi.hpp"

namespace kvsim {
namespace {

/// Progress on stderr when it is a terminal and not --quiet: cells done, elapsed and estimated time left.
std::function<void(int, int)> progress_printer(bool quiet, const std::string& prefix) {
  if (quiet || !isatty(STDERR_FILENO)) return {};
  const auto t0 = std::chrono::steady_clock::now();
  return [t0, prefix](int done, int total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = done > 0 ? s * double(total - done) / double(done) : 0.0;
    std::fprintf(stderr, "\r  %scells %d/%d, %.1f s, ~%.0f s left   ", prefix.c_str(), done, total, s, eta);
    if (done == total) std::fprintf(stderr, "\n");
  };
}

struct SequenceRun {
  RunResult result;
  std::string table;
  std::vector<std::vector<Stat>> overall;  // [policy][metric]
};

SequenceRun run_one(const Experiment& ex, const std::string& out, int threads, bool quiet, const std::string& prefix,
                    const ResumeMode& mode) {
  auto src = open_source(ex.data);
  quiet = quiet || mpi::rank() > 0;  // rank 0 reports, and alone writes (include/kvsim/replay/mpi.hpp)
  if (mode.resume) {
    std::optional<std::vector<std::vector<Stat>>> done;
    if (mpi::rank() == 0)
      done = ResultSpill::finished(out, checkpoint_manifest(ex, src->meta()), metric_columns(ex.eval), ex.policies.size());
    if (mpi::agree(bool(done))) {  // nothing to resume: these results are this run's
      if (!quiet) std::cerr << "kvsim run: " << out << " holds this run's finished results (nothing to resume)\n";
      SequenceRun s;
      s.result.metrics = metric_columns(ex.eval);
      s.overall = *done;
      return s;
    }
  }
  if (!quiet)
    std::cerr << "kvsim run: " << ex.name << " on " << src->describe() << " (" << ex.policies.size() << " policies, "
              << threads << " threads)\n";
  // Rows go to disk cell by cell, each finished cell durable at once (the checkpoint); nothing final until finish().
  SequenceRun s;
  if (mpi::rank() > 0) {  // a worker rank: computes the cells rank 0 hands out, writes nothing
    s.result = run_experiment(ex, *src, threads, {}, nullptr);
    return s;
  }
  ResultSpill spill(out, ex, &mode);
  s.result = run_experiment(ex, *src, threads, progress_printer(quiet, prefix), &spill);
  if (!quiet && spill.cells_resumed() > 0)
    std::cerr << "kvsim run: resumed " << spill.cells_resumed() << " checkpointed cells from " << checkpoint_dir(out) << "\n";
  s.table = spill.finish(s.result);
  s.overall = spill.overall();
  return s;
}

}  // namespace

std::string sequences_csv(const Experiment& ex, const std::vector<MetricColumn>& metrics,
                          const std::vector<std::vector<std::vector<Stat>>>& overall, std::string* table_out) {
  const std::vector<std::string> keys = param_keys(ex.policies);  // parameter columns, as in summary.csv
  std::ostringstream o;
  o << "policy,label,metric,sequences,mean,ci_low,ci_high,interval";
  for (const auto& k : keys) o << ',' << k;
  o << '\n';
  std::ostringstream table;
  size_t w = 6;  // full labels: k-center rows differ only at their end
  for (const auto& p : ex.policies) w = std::max(w, p.label.size());
  char buf[160];
  std::snprintf(buf, sizeof buf, " %-12s %11s %23s\n", "metric", "mean", "95% CI (bootstrap)");
  table << "policy" << std::string(w - 6, ' ') << buf;
  for (size_t p = 0; p < ex.policies.size(); ++p)
    for (size_t m = 0; m < metrics.size(); ++m) {
      std::vector<double> per_seq;
      for (const auto& r : overall) per_seq.push_back(r[p][m].mean);
      const Interval ci = bootstrap_mean_ci(per_seq, derive_seed({ex.seed, 0xc1, p, m}));
      if (ci.n == 0) continue;  // the metric does not apply to this policy
      char line[512];
      std::snprintf(line, sizeof line, ",%s,%d,%.6g,%.6g,%.6g,percentile bootstrap 95%% (4000 resamples)",
                    metrics[m].name.c_str(), ci.n, ci.mean, ci.low, ci.high);
      o << csv_field(ex.policies[p].name) << ',' << csv_field(ex.policies[p].label) << line
        << param_cells(ex.policies[p], keys) << '\n';
      const std::string& name = metrics[m].name;
      if (name == "rel_err" || name == "eps_spectral" || name == "kept_mass") {
        std::snprintf(buf, sizeof buf, " %-12s %11.4g   [%9.4g, %9.4g]\n", name.c_str(), ci.mean, ci.low, ci.high);
        table << ex.policies[p].label << std::string(w - ex.policies[p].label.size(), ' ') << buf;
      }
    }
  if (table_out) *table_out = table.str();
  return o.str();
}

int cmd_run(const RunOptions& opt) {
  std::vector<std::string> sets = opt.sets;
  if (!opt.device.empty()) sets.push_back("eval.device=\"" + opt.device + "\"");
  Experiment ex = load_experiment(opt.config, sets);
  if (ex.eval.device == Device::cuda) {
    if (mpi::size() > 1) mpi::pin_gpu();  // rank r: GPU local_rank mod visible
    cuda::require_device();  // a clear error before anything is computed or written
    if (!opt.quiet) std::cerr << "kvsim run: exact reference and policy replays on " << cuda::device_description() << "\n";
  }
  const std::string out = opt.out.empty() ? "results/" + ex.name : opt.out;
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const int S = sequence_count(ex.data);
  const ResumeMode mode{opt.resume, opt.force};
  if (S == 1) {
    const SequenceRun s = run_one(ex, out, threads, opt.quiet, "", mode);
    const RunResult& r = s.result;
    if (!opt.quiet && !s.table.empty())
      std::cout << "experiment " << ex.name << ": " << r.n_tokens << " tokens, " << r.layers.size() << " layers, "
                << r.meta.n_heads << " query heads (" << r.meta.n_kv_heads << " kv), gqa=" << to_string(ex.eval.gqa) << "; "
                << r.wall_seconds << " s\n"
                << "means over every evaluated (layer, head, step); p95 likewise\n\n"
                << s.table << "\nwrote " << out << "/results.h5 and " << out << "/summary.csv\n";
    return 0;
  }
  std::vector<SequenceRun> runs;
  double wall = 0;
  for (int i = 0; i < S; ++i) {
    Experiment one = ex;
    one.data = sequence_spec(ex.data, i);
    char dir[32];
    std::snprintf(dir, sizeof dir, "seq_%02d", i);
    char prefix[48];
    std::snprintf(prefix, sizeof prefix, "sequence %d/%d: ", i + 1, S);
    runs.push_back(run_one(one, (std::filesystem::path(out) / dir).string(), threads, opt.quiet, prefix, mode));
    wall += runs.back().result.wall_seconds;
  }
  if (mpi::rank() > 0) return 0;  // rank 0 writes sequences.csv
  std::vector<std::vector<std::vector<Stat>>> overall;
  for (const auto& r : runs) overall.push_back(r.overall);
  std::string table;
  const std::string csv = sequences_csv(ex, runs.front().result.metrics, overall, &table);
  write_file_atomically((std::filesystem::path(out) / "sequences.csv").string(), csv);
  if (!opt.quiet)
    std::cout << "experiment " << ex.name << ": " << S << " sequences, " << wall << " s\n"
              << "per sequence: the mean over its evaluated (layer, head, step); below: the mean over sequences\n\n"
              << table << "\nwrote " << out << "/seq_NN/{results.h5,summary.csv,cells.csv} and " << out
              << "/sequences.csv\n";
  return 0;
}

}  // namespace kvsim
