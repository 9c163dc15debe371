// The replay's schedule and its one road (include/kvsim/replay/engine.hpp): run_config → per sequence
// plan_run (sim/replay/plan.cpp) → the job's CellScheduler (threads here, MPI ranks in mpi.cpp) →
// replay_cell (sim/replay/cell.cpp) per cell → the RowSink (sim/io/result_spill.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <thread>

#include "kvsim/core/error.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/io/results.hpp"
#include "gpu_layer_batch.hpp"
#include "phase_clock.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/mpi.hpp"

namespace kvsim {
namespace {
using Clock = std::chrono::steady_clock;

/// Workers for run_cells.
int worker_count(bool batch, int threads, const Runtime& rt) {
  // With the batch, a cell spends much of its time waiting for its layer's GPU replays, with no host
  // work to do: twice as many workers as threads keep the cores busy with other cells' streams,
  // references and metrics meanwhile. runtime.cuda_workers = N sets the count (no number depends on it).
  if (batch && rt.cuda_workers > 0) return rt.cuda_workers;
  return batch ? 2 * threads : threads;
}

/// The error a cell's replay is throwing (call inside a catch block), named: out of memory says what
/// was being allocated (never "internal error"), a device error (e.g. KVSIM_CUDA_DEADLINE) gets the
/// layer and KV head of the cell that met it; others pass unchanged.
std::exception_ptr cell_error(const Experiment& ex, const Cell& c) {
  const std::string cell = "layer " + std::to_string(c.layer) + ", KV head " + std::to_string(c.kv_head);
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(Error("out of memory replaying " + cell + " (the stream, exact reference and " +
                                         std::to_string(ex.policies.size()) + " policy caches of one cell did not fit)"));
  } catch (const Error& e) {
    const std::string what = e.what();
    return what.rfind("CUDA: ", 0) == 0 ? std::make_exception_ptr(Error(cell + ": " + what)) : std::current_exception();
  } catch (...) {
    return std::current_exception();
  }
}

/// Every cell on `threads` workers (cells are independent: results do not depend on the schedule).
/// A finished cell's rows go to the sink at once; the first error stops the others.
class ThreadScheduler final : public CellScheduler {
 public:
  void run(const RunPlan& plan, RowSink& sink, int threads, const Progress& progress) override;
};

void ThreadScheduler::run(const RunPlan& plan, RowSink& sink, int threads, const Progress& progress) {
  const Experiment& ex = *plan.ex;
  const StreamSource& src = *plan.src;
  const std::vector<Cell>& cells = plan.cells;
  const int64_t n = plan.n;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr err;
  std::mutex mu;
  int done = int(sink.cells_resumed());
  // GPU replays of a layer's cells in one launch per policy (kv_head mode; sim/replay/gpu_layer_batch.hpp)
  // when there are more cells to run than workers: with fewer, every cell's own launch runs at once
  // anyway and batching only adds waiting (on the H200: SmolLM2, 9 cells on 16 threads, 13.1 s per
  // cell vs 17.0 s batched; 32 × 32 synthetic cells, over 231 s per cell vs 91 s batched).
  // runtime.cuda_layer_batch = "on" or "off" decides instead (the numbers are the same either way).
  std::unique_ptr<cell::GpuLayerBatch> batch;
  if (ex.eval.device == Device::cuda && ex.eval.gqa == GqaMode::kv_head) {
    std::vector<bool> will_run(cells.size());
    size_t to_run = 0;
    for (size_t i = 0; i < cells.size(); ++i) to_run += will_run[i] = !sink.cell_done(i);
    const std::string& choice = ex.runtime.cuda_layer_batch;
    const bool on = choice == "auto" ? to_run > size_t(std::max(1, threads)) : choice == "on";
    if (on) batch = std::make_unique<cell::GpuLayerBatch>(ex, src, cells, will_run, n);
  }
  // The order workers take cells in (results are stored by cell, so it changes no number): by layer,
  // except with a batch, where the layers take turns (each layer's first KV head, then
  // each second…) so that the workers start the replays of several layers at once and the GPU runs
  // them side by side.
  std::vector<size_t> order(cells.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (batch) {
    std::map<int, int> seen;
    std::vector<int> rank(cells.size());
    for (size_t i = 0; i < cells.size(); ++i) rank[i] = seen[cells[i].layer]++;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  }
  auto worker = [&] {
    for (;;) {
      const size_t k = next++;
      if (k >= cells.size() || failed) return;
      const size_t i = order[k];
      if (sink.cell_done(i)) continue;  // resumed from the checkpoint
      try {
        std::vector<std::vector<MetricRow>> rows(ex.policies.size());
        replay_cell(ex, src, cells[i], n, rows, batch.get());
        sink.write_cell(i, std::move(rows));
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!err) err = cell_error(ex, cells[i]);
        failed = true;
        return;
      }
      std::lock_guard<std::mutex> lk(mu);
      ++done;
      if (progress) progress(done, int(cells.size()));
    }
  };
  std::vector<std::thread> pool;
  const int workers = worker_count(batch != nullptr, threads, ex.runtime);
  int nt = std::min<int>(workers, std::max<size_t>(1, cells.size()));
  for (int i = 1; i < nt; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace

std::unique_ptr<CellScheduler> thread_scheduler() { return std::make_unique<ThreadScheduler>(); }

std::unique_ptr<CellScheduler> job_scheduler() { return mpi::size() > 1 ? mpi::scheduler() : thread_scheduler(); }

RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads, const Progress& progress,
                         RowSink* sink) {
  const RunPlan plan = plan_run(ex, src);
  phase::set_enabled(ex.runtime.profile);
  if (ex.eval.device == Device::cuda) cuda::configure(ex.runtime);  // the exact pass, kernels' state, deadline
  RunResult res;
  res.meta = src.meta();
  res.source = src.describe();
  res.n_tokens = plan.n;
  res.layers = plan.layers;
  res.metrics = plan.metrics;
  res.threads = std::max(1, threads);
  res.policies.resize(ex.policies.size());
  for (size_t p = 0; p < ex.policies.size(); ++p) res.policies[p].spec = ex.policies[p];
  MemoryRows in_memory;
  RowSink& to = sink ? *sink : in_memory;
  to.begin(plan.rows_per_cell(), plan.metrics, &res.meta);
  const auto t0 = Clock::now();
  job_scheduler()->run(plan, to, res.threads, progress);
  res.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (const std::string prof = phase::report_and_reset(); !prof.empty()) std::cerr << prof << std::flush;
  if (!sink) in_memory.take(res.policies);
  return res;
}

void run_config(const Experiment& ex, int threads, SequenceOutput& out) {
  const int S = sequence_count(ex.data);
  for (int s = 0; s < S; ++s) {
    Experiment one = ex;
    if (S > 1) one.data = sequence_spec(ex.data, s);
    const auto src = open_source(one.data);
    RowSink* sink = out.open(one, s, S, *src);
    if (!sink) continue;  // nothing to compute (--resume of finished results)
    out.close(one, s, run_experiment(one, *src, threads, out.progress(s, S), sink));
  }
}

}  // namespace kvsim
