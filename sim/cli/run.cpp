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

/// Progress on stderr (a terminal, not --quiet): cells done, elapsed and estimated time left.
Progress progress_printer(const std::string& prefix) {
  const auto t0 = std::chrono::steady_clock::now();
  return [t0, prefix](int done, int total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = done > 0 ? s * double(total - done) / double(done) : 0.0;
    std::fprintf(stderr, "\r  %scells %d/%d, %.1f s, ~%.0f s left   ", prefix.c_str(), done, total, s, eta);
    if (done == total) std::fprintf(stderr, "\n");
  };
}

/// `kvsim run`'s output (run_config's SequenceOutput): each sequence's rows spilled to OUT (one
/// sequence) or OUT/seq_NN with a checkpoint, finished into results.h5, summary.csv and cells.csv;
/// each sequence's statistics kept for sequences.csv. On MPI ranks other than 0 nothing is written.
class SpillOutput final : public SequenceOutput {
 public:
  SpillOutput(std::string out, bool quiet, const ResumeMode& mode, int threads)
      : out_(std::move(out)), quiet_(quiet), mode_(mode), threads_(threads) {}

  RowSink* open(const Experiment& one, int s, int S, const StreamSource& src) override {
    const std::string dir = S == 1 ? out_ : (std::filesystem::path(out_) / sequence_folder(s)).string();
    const bool quiet = quiet_ || mpi::rank() > 0;  // rank 0 reports, and alone writes (include/kvsim/replay/mpi.hpp)
    spill_.reset();
    worker_rows_.reset();
    if (mode_.resume) {
      std::optional<std::vector<std::vector<Stat>>> done;
      if (mpi::rank() == 0)
        done = ResultSpill::finished(dir, checkpoint_manifest(one, src.meta()), metric_columns(one.eval), one.policies.size());
      if (mpi::agree(bool(done))) {  // nothing to resume: these results are this run's
        if (!quiet) std::cerr << "kvsim run: " << dir << " holds this run's finished results (nothing to resume)\n";
        metrics = metric_columns(one.eval);
        overall.push_back(*done);
        return nullptr;
      }
    }
    if (!quiet)
      std::cerr << "kvsim run: " << one.name << " on " << src.describe() << " (" << one.policies.size() << " policies, "
                << threads_ << " threads)\n";
    if (mpi::rank() > 0) {  // a worker rank: computes the cells rank 0 hands out, writes nothing
      worker_rows_ = std::make_unique<MemoryRows>();
      return worker_rows_.get();
    }
    // Rows go to disk cell by cell, each finished cell durable at once (the checkpoint); nothing final until close().
    spill_ = std::make_unique<ResultSpill>(dir, one, &mode_);
    dir_ = dir;
    return spill_.get();
  }

  Progress progress(int s, int S) override {
    if (quiet_ || mpi::rank() > 0 || !isatty(STDERR_FILENO)) return {};
    return progress_printer(S == 1 ? std::string() : "sequence " + std::to_string(s + 1) + "/" + std::to_string(S) + ": ");
  }

  void close(const Experiment&, int, RunResult&& r) override {
    wall_seconds += r.wall_seconds;
    metrics = r.metrics;
    last = std::move(r);
    if (!spill_) return;  // a worker rank
    if (!quiet_ && spill_->cells_resumed() > 0)
      std::cerr << "kvsim run: resumed " << spill_->cells_resumed() << " checkpointed cells from " << checkpoint_dir(dir_) << "\n";
    table = spill_->finish(last);
    overall.push_back(spill_->overall());
    spill_.reset();
  }

  double wall_seconds = 0;                              // the sequences' replays, summed
  std::string table;                                    // the last sequence's summary table
  RunResult last;                                       // the last sequence's result (no rows)
  std::vector<MetricColumn> metrics;
  std::vector<std::vector<std::vector<Stat>>> overall;  // [sequence][policy][metric]

 private:
  std::string out_, dir_;
  bool quiet_;
  ResumeMode mode_;
  int threads_;
  std::unique_ptr<ResultSpill> spill_;
  std::unique_ptr<MemoryRows> worker_rows_;
};

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
  SpillOutput output(out, opt.quiet, ResumeMode{opt.resume, opt.force}, threads);
  run_config(ex, threads, output);  // the one road: sim/replay/engine.cpp
  if (mpi::rank() > 0) return 0;  // rank 0 reports and writes sequences.csv
  if (S == 1) {
    const RunResult& r = output.last;
    if (!opt.quiet && !output.table.empty())
      std::cout << "experiment " << ex.name << ": " << r.n_tokens << " tokens, " << r.layers.size() << " layers, "
                << r.meta.n_heads << " query heads (" << r.meta.n_kv_heads << " kv), gqa=" << to_string(ex.eval.gqa) << "; "
                << r.wall_seconds << " s\n"
                << "means over every evaluated (layer, head, step); p95 likewise\n\n"
                << output.table << "\nwrote " << out << "/results.h5 and " << out << "/summary.csv\n";
    return 0;
  }
  std::string means;
  const std::string csv = sequences_csv(ex, output.metrics, output.overall, &means);
  write_file_atomically((std::filesystem::path(out) / "sequences.csv").string(), csv);
  if (!opt.quiet)
    std::cout << "experiment " << ex.name << ": " << S << " sequences, " << output.wall_seconds << " s\n"
              << "per sequence: the mean over its evaluated (layer, head, step); below: the mean over sequences\n\n"
              << means << "\nwrote " << out << "/seq_NN/{results.h5,summary.csv,cells.csv} and " << out << "/sequences.csv\n";
  return 0;
}

}  // namespace kvsim
