#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <cmath>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <mutex>
#include <thread>

#include "kvsim/core/error.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/io/results.hpp"
#include "gpu_layer_batch.hpp"
#include "phase_clock.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/mpi.hpp"

namespace kvsim {

std::vector<int64_t> eval_steps(const EvalSpec& e, int64_t n) {
  std::vector<int64_t> s;
  for (int64_t t = std::max<int64_t>(1, e.from); t <= n; t += e.every) s.push_back(t);
  if (s.empty() || s.back() != n) s.push_back(n);
  return s;
}

bool is_objective_step(const EvalSpec& e, int64_t t, int64_t n) {
  return e.objectives && t <= std::min(n, e.objectives_max_t) && (t % e.objectives_every == 0 || t == n);
}

void check_objective_steps(const EvalSpec& e, int64_t n) {
  if (!e.objectives) return;
  for (int64_t t : eval_steps(e, n))
    if (is_objective_step(e, t, n)) return;
  throw Error("eval.objectives = true, but no evaluated step is an objective step: eval.every = " + std::to_string(e.every) +
              " from eval.from = " + std::to_string(e.from) + " never meets a multiple of eval.objectives_every = " +
              std::to_string(e.objectives_every) + " up to eval.objectives_max_t = " + std::to_string(e.objectives_max_t) +
              " (n = " + std::to_string(n) + "), so every H2O objective would be missing");
}

std::unique_ptr<StreamSource> open_source(const DataSpec& d) {
  if (d.synthetic) return std::make_unique<SynthSource>(d.synth);
  if (!std::filesystem::exists(d.path)) {
    // The recipe (a shell command run from the repository root) only when it makes this file:
    // it names the file, or, for `kvsim record --windows`, the file without its `_wNN` suffix.
    std::string file = std::filesystem::path(d.path).filename().string();
    const size_t w = file.rfind("_w");
    if (d.recipe.find(file) == std::string::npos && w != std::string::npos && file.size() == w + 7 &&
        file.compare(w + 4, 3, ".h5") == 0)
      file = file.substr(0, w) + ".h5";
    throw Error(d.path + ": no such recording" +
                (file.empty() || d.recipe.find(file) == std::string::npos
                     ? std::string(" (make one with kvsim record, kvsim synth or datasets/export_hf.py)")
                     : "; make it with: " + d.recipe));
  }
  return std::make_unique<RecordingReader>(d.path);
}

namespace {
using Clock = std::chrono::steady_clock;

void validate_eval(const Experiment& ex) {
  if (ex.policies.empty()) throw Error("experiment '" + ex.name + "': no [[policy]] entries");
  if (ex.eval.every < 1) throw Error("eval.every must be ≥ 1");
}

/// `data.layers` / `data.heads` (empty = all layers, or the global ones when the recording has
/// local sliding-window layers shorter than itself and `data.local_layers` is "exact": cache policies
/// matter on global layers), range-checked; the (layer, KV head) cells they select. A local layer is
/// replayed only with `data.local_layers = "replay"` (its exact reference is then window attention).
std::vector<Cell> plan_cells(const DataSpec& data, const RecordingMeta& meta, std::vector<int>& layers) {
  layers = data.layers;
  if (layers.empty())
    for (int l = 0; l < meta.n_layers; ++l)
      if (data.replay_local || !meta.is_local(l)) layers.push_back(l);
  if (layers.empty()) throw Error("the recording has no global layer (layer_windows: every layer is local)");
  for (int l : layers) {
    if (l < 0 || l >= meta.n_layers)
      throw Error("data.layers: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(meta.n_layers) + ")");
    if (meta.is_local(l) && !data.replay_local)
      throw Error("data.layers: layer " + std::to_string(l) + " is a local layer (sliding window of " +
                  std::to_string(meta.layer_window(l)) + " tokens); set data.local_layers = \"replay\" to replay it against window attention");
  }
  std::vector<int> heads = data.heads;
  if (heads.empty())
    for (int h = 0; h < meta.n_heads; ++h) heads.push_back(h);
  for (int h : heads)
    if (h < 0 || h >= meta.n_heads)
      throw Error("data.heads: head " + std::to_string(h) + " is out of range [0, " + std::to_string(meta.n_heads) + ")");
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  std::vector<Cell> cells;
  for (int l : layers)
    for (int kv = 0; kv < meta.n_kv_heads; ++kv) {
      Cell c{l, kv, {}};
      for (int h : heads)
        if (meta.kv_head_of(h) == kv) c.heads.push_back(h);
      if (!c.heads.empty()) cells.push_back(std::move(c));
    }
  return cells;
}

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

/// Runs every cell on `threads` workers (cells are independent: results do not depend on the
/// schedule). A spilled cell's rows go to disk and are freed; the first error stops the others.
void run_cells(const Experiment& ex, const StreamSource& src, const std::vector<Cell>& cells, int64_t n, int threads,
               const std::function<void(int, int)>& progress, ResultSpill* spill,
               std::vector<std::vector<std::vector<MetricRow>>>& cell_out) {
  cell_out.assign(cells.size(), {});
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr err;
  std::mutex mu;
  int done = spill ? int(spill->cells_resumed()) : 0;
  // GPU replays of a layer's cells in one launch per policy (kv_head mode; sim/replay/gpu_layer_batch.hpp)
  // when there are more cells to run than workers: with fewer, every cell's own launch runs at once
  // anyway and batching only adds waiting (on the H200: SmolLM2, 9 cells on 16 threads, 13.1 s per
  // cell vs 17.0 s batched; 32 × 32 synthetic cells, over 231 s per cell vs 91 s batched).
  // runtime.cuda_layer_batch = "on" or "off" decides instead (the numbers are the same either way).
  std::unique_ptr<cell::GpuLayerBatch> batch;
  if (ex.eval.device == Device::cuda && ex.eval.gqa == GqaMode::kv_head) {
    std::vector<bool> will_run(cells.size());
    size_t to_run = 0;
    for (size_t i = 0; i < cells.size(); ++i) to_run += will_run[i] = !(spill && spill->cell_done(i));
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
      if (spill && spill->cell_done(i)) continue;  // resumed from the checkpoint
      try {
        cell_out[i].resize(ex.policies.size());
        replay_cell(ex, src, cells[i], n, cell_out[i], batch.get());
        if (spill) {
          spill->write_cell(i, cell_out[i]);
          std::vector<std::vector<MetricRow>>().swap(cell_out[i]);
        }
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

RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads,
                         const std::function<void(int, int)>& progress, ResultSpill* spill) {
  const auto& meta = src.meta();
  validate_eval(ex);
  RunResult res;
  res.meta = meta;
  res.source = src.describe();
  res.n_tokens = ex.data.tokens > 0 ? std::min(ex.data.tokens, meta.n_tokens) : meta.n_tokens;
  res.threads = std::max(1, threads);
  if (ex.data.prefill < 0 || ex.data.prefill >= res.n_tokens)
    throw Error("data.prefill (" + std::to_string(ex.data.prefill) + ") must be in [0, " + std::to_string(res.n_tokens) +
                "): the stream has " + std::to_string(res.n_tokens) + " tokens and at least one must be decoded");
  if (ex.data.prefill > 0 && ex.eval.from <= ex.data.prefill)
    throw Error("eval.from (" + std::to_string(ex.eval.from) + ") must be > data.prefill (" +
                std::to_string(ex.data.prefill) + "): the prompt's steps are not decoded");
  res.metrics = metric_columns(ex.eval);
  phase::set_enabled(ex.runtime.profile);
  if (ex.eval.device == Device::cuda) cuda::configure(ex.runtime);  // the exact pass, kernels' state, deadline
  check_objective_steps(ex.eval, res.n_tokens);
  const std::vector<Cell> cells = plan_cells(ex.data, meta, res.layers);
  if (ex.eval.device == Device::cuda)
    for (int l : res.layers)
      if (meta.is_local(l))
        throw Error("data.local_layers = \"replay\": layer " + std::to_string(l) +
                    " is local, and window attention is not on the GPU path yet (use [eval] device = \"cpu\")");
  // The policies' parameters checked once against the real stream, before any work: one instance of
  // each policy per planned cell shape (its layer and group size), as the cells will build them.
  {
    std::set<std::pair<int, size_t>> shapes;
    for (const auto& c : cells)
      if (shapes.insert({c.layer, c.heads.size()}).second)
        for (const auto& p : ex.policies) make_policy(p.name, p.params, cell_stream(ex, c, res.n_tokens, meta));
  }
  if (spill) {
    const size_t per_head = eval_steps(ex.eval, res.n_tokens).size();
    std::vector<size_t> rows_per_cell;
    for (const auto& c : cells) rows_per_cell.push_back(c.heads.size() * per_head);
    spill->begin(rows_per_cell, res.metrics, &meta);
  }
  std::vector<std::vector<std::vector<MetricRow>>> cell_out;
  const auto t0 = Clock::now();
  if (mpi::size() > 1) mpi::run_cells(ex, src, cells, res.n_tokens, res.threads, progress, spill, cell_out);
  else run_cells(ex, src, cells, res.n_tokens, res.threads, progress, spill, cell_out);
  res.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (const std::string prof = phase::report_and_reset(); !prof.empty()) std::cerr << prof << std::flush;

  res.policies.resize(ex.policies.size());
  for (size_t p = 0; p < ex.policies.size(); ++p) {
    res.policies[p].spec = ex.policies[p];
    // Exact reservation, then each cell's rows are moved and freed at once: the rows exist once in
    // memory (not twice, nor in a doubling vector's spare capacity).
    size_t total = 0;
    for (auto& c : cell_out) total += c.empty() ? 0 : c[p].size();
    auto& rows = res.policies[p].rows;
    rows.reserve(total);
    for (auto& c : cell_out) {
      if (c.empty()) continue;  // spilled to disk
      rows.insert(rows.end(), std::make_move_iterator(c[p].begin()), std::make_move_iterator(c[p].end()));
      std::vector<MetricRow>().swap(c[p]);
    }
  }
  return res;
}

}  // namespace kvsim
