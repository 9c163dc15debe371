// GPU replays batched per layer (sim/replay/gpu_layer_batch.cpp), tested on the CPU with a stand-in
// that has cuda::replay_policy's contract and writes answers that name their inputs: each cell must get
// exactly what a replay of that cell alone returns, from one replay per (layer, policy).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <regex>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "../sim/replay/cell_policies.hpp"
#include "../sim/replay/gpu_layer_batch.hpp"
#include "../sim/replay/phase_clock.hpp"
#include "helpers.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/gpu_replay.hpp"
using namespace kvsim;

namespace {
/// Answers from the inputs: z = q_t + k_t + 2·v_t of each query head's stream at step t, log_sum =
/// the KV head's seed (mod 1e6) + t, kept slot s = ⌊1000·k_t[0]⌋ + s: every
/// value depends on the KV head's data or seed, so a wrong slice or a wrong seed shows.
void naming_stand_in(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads, int group,
                     int64_t n, int d, double, const std::vector<int64_t>& steps, std::vector<float>& z,
                     std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& cap) {
  cap = cuda::replay_capacity(p);
  const size_t rows = steps.size();
  z.assign(size_t(kv_heads) * group * rows * d, 0.f);
  log_sum.assign(size_t(kv_heads) * group * rows, 0.0);
  kept.assign(size_t(kv_heads) * rows * cap, -1);
  for (int kv = 0; kv < kv_heads; ++kv)
    for (size_t r = 0; r < rows; ++r) {
      const int64_t t = steps[r];
      const float* k = K + (size_t(kv) * n + size_t(t - 1)) * d;
      const float* v = V + (size_t(kv) * n + size_t(t - 1)) * d;
      for (int64_t s = 0; s < std::min<int64_t>(cap, t); ++s) kept[(size_t(kv) * rows + r) * cap + s] = int64_t(1e3 * k[0]) + s;
      for (int g = 0; g < group; ++g) {
        const size_t h = size_t(kv) * group + g;
        const float* q = Q + (h * n + size_t(t - 1)) * d;
        for (int i = 0; i < d; ++i) z[(h * rows + r) * d + i] = q[i] + k[i] + 2 * v[i];
        log_sum[h * rows + r] = double(p.seeds.empty() ? 0 : p.seeds[size_t(kv)] % 1000000) + double(t);
      }
    }
}

/// Counts reads (the batch reads each layer's streams once for all its policies).
class CountingSource final : public StreamSource {
 public:
  explicit CountingSource(const SynthParams& p) : src_(p) {}
  const RecordingMeta& meta() const override { return src_.meta(); }
  MatF read(int layer, Tensor which, int head) const override {
    ++reads;
    return src_.read(layer, which, head);
  }
  std::string describe() const override { return "counting " + src_.describe(); }
  mutable std::atomic<int> reads{0};

 private:
  SynthSource src_;
};

struct Setup {
  Experiment ex;
  std::unique_ptr<CountingSource> src;
  std::vector<Cell> cells;
  int64_t n = 120;
  Setup() {
    ex.data.synth = test::small_synth("heavy_hitter", n, 8, 2, 4, 2);
    ex.seed = 5;
    ex.eval.every = 7;
    ex.eval.device = Device::cuda;
    Params u, w;
    u.set("budget", int64_t(30));
    w.set("budget", int64_t(20));
    ex.policies = {{"uniform", "uniform", u}, {"window", "window", w}};
    src = std::make_unique<CountingSource>(ex.data.synth);
    for (int l = 0; l < 2; ++l)
      for (int kv = 0; kv < 2; ++kv) cells.push_back(Cell{l, kv, {2 * kv, 2 * kv + 1}});
  }
  struct Out {
    std::vector<float> z;
    std::vector<double> ls;
    std::vector<int64_t> kept;
    int64_t cap = 0;
    bool operator==(const Out& o) const { return z == o.z && ls == o.ls && kept == o.kept && cap == o.cap; }
  };
  /// The cell replayed alone: its own streams and instance (kv_heads = 1).
  Out alone(const Cell& c, size_t p) const {
    const int d = src->meta().head_dim;
    StreamInfo info = cell_stream(ex, c, n, src->meta());
    info.seed = cell::instance_seed(ex, c, src->meta().model_layer(c.layer), p, 0);
    const cuda::PolicyReplay spec = *gpu_replay(*make_policy(ex.policies[p].name, ex.policies[p].params, info));
    const MatF K = src->read(c.layer, Tensor::k, c.kv_head).topRows(n), V = src->read(c.layer, Tensor::v, c.kv_head).topRows(n);
    MatF Q(2 * n, d);
    Q.topRows(n) = src->read(c.layer, Tensor::q, c.heads[0]).topRows(n);
    Q.bottomRows(n) = src->read(c.layer, Tensor::q, c.heads[1]).topRows(n);
    Out o;
    naming_stand_in(spec, Q.data(), K.data(), V.data(), 1, 2, n, d, 0, eval_steps(ex.eval, n), o.z, o.ls, o.kept, o.cap);
    return o;
  }
  Out batched(cell::GpuLayerBatch& b, const Cell& c, size_t p) const {
    Out o;
    b.replay_fn(c, p)(cuda::PolicyReplay{}, nullptr, nullptr, nullptr, 1, 2, n, src->meta().head_dim, 0,
                      eval_steps(ex.eval, n), o.z, o.ls, o.kept, o.cap);
    return o;
  }
};
}  // namespace

TEST_CASE("gpu layer batch: each cell gets its own replay from one replay per layer and policy", "[replay][cuda]") {
  Setup s;
  cell::GpuLayerBatch batch(s.ex, *s.src, s.cells, std::vector<bool>(s.cells.size(), true), s.n, naming_stand_in);
  std::vector<std::vector<Setup::Out>> got(2);
  for (size_t p = 0; p < 2; ++p)
    for (const Cell& c : s.cells) got[p].push_back(s.batched(batch, c, p));
  CHECK(batch.replays() == 4);  // 2 layers × 2 policies, not one per cell (8)
  CHECK(s.src->reads == 16);    // per layer 2 cells × (2 query heads, k, v), once for both policies
  for (size_t p = 0; p < 2; ++p)
    for (size_t i = 0; i < s.cells.size(); ++i) {
      INFO("policy " << p << " layer " << s.cells[i].layer << " KV head " << s.cells[i].kv_head);
      CHECK(got[p][i] == s.alone(s.cells[i], p));
    }
  // Negative control: the two KV heads of a layer get different answers (and uniform different seeds),
  // so the comparison above could not hold with slices swapped.
  CHECK_FALSE(s.alone(s.cells[0], 0).z == s.alone(s.cells[1], 0).z);
  CHECK_FALSE(s.alone(s.cells[0], 0).ls == s.alone(s.cells[1], 0).ls);
}

TEST_CASE("gpu layer batch: a layer's results are freed after its last running cell, errors reach every cell", "[replay][cuda]") {
  Setup s;
  // Cell 1 (layer 0, KV head 1) is resumed from a checkpoint: layer 0's replay serves cell 0 only and
  // is then freed, so asking again for cell 1 replays the layer again.
  std::vector<bool> will_run{true, false, true, true};
  cell::GpuLayerBatch batch(s.ex, *s.src, s.cells, will_run, s.n, naming_stand_in);
  CHECK(s.batched(batch, s.cells[0], 1) == s.alone(s.cells[0], 1));
  CHECK(batch.replays() == 1);
  const int reads = s.src->reads;  // layer 0's streams, kept for its other policy
  CHECK(s.batched(batch, s.cells[1], 1) == s.alone(s.cells[1], 1));
  CHECK(batch.replays() == 2);
  CHECK(s.src->reads == reads + 4);  // + alone()'s reads only: the layer's streams were kept
  // Two replays over layer 0's streams (its two policies): freed, so the next replay reads them again.
  const int before = s.src->reads;
  s.batched(batch, s.cells[0], 0);
  CHECK(s.src->reads == before + 8);

  int calls = 0;
  auto failing = [&](const cuda::PolicyReplay&, const float*, const float*, const float*, int, int, int64_t, int, double,
                     const std::vector<int64_t>&, std::vector<float>&, std::vector<double>&, std::vector<int64_t>&, int64_t&) {
    ++calls;
    throw Error("CUDA: out of memory (stand-in)");
  };
  cell::GpuLayerBatch bad(s.ex, *s.src, s.cells, std::vector<bool>(s.cells.size(), true), s.n, failing);
  CHECK_THROWS_WITH(s.batched(bad, s.cells[0], 0), Catch::Matchers::Contains("out of memory (stand-in)"));
  CHECK_THROWS_WITH(s.batched(bad, s.cells[1], 0), Catch::Matchers::Contains("out of memory (stand-in)"));
  CHECK(calls == 1);  // the layer's replay was tried once
}

TEST_CASE("gpu layer batch: cells on worker threads get their own answers from one replay per layer and policy", "[replay][cuda]") {
  for (int workers : {2, 3, 5}) {
    INFO(workers << " workers");
    Setup s;
    cell::GpuLayerBatch batch(s.ex, *s.src, s.cells, std::vector<bool>(s.cells.size(), true), s.n, naming_stand_in);
    // As run_cells does: each worker takes the next cell, then each policy's replay (the first cell of a
    // layer to ask runs it, the others wait for it).
    std::atomic<size_t> next{0};
    std::vector<std::vector<Setup::Out>> got(s.cells.size(), std::vector<Setup::Out>(2));
    auto worker = [&] {
      for (size_t i; (i = next++) < s.cells.size();)
        for (size_t p = 0; p < 2; ++p) got[i][p] = s.batched(batch, s.cells[i], p);
    };
    std::vector<std::thread> pool;
    for (int w = 0; w < workers; ++w) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
    CHECK(batch.replays() == 4);  // 2 layers × 2 policies
    for (size_t i = 0; i < s.cells.size(); ++i)
      for (size_t p = 0; p < 2; ++p) {
        INFO("policy " << p << " layer " << s.cells[i].layer << " KV head " << s.cells[i].kv_head);
        CHECK(got[i][p] == s.alone(s.cells[i], p));
        // Negative control: another cell's answer differs, so a wrong slice would show.
        CHECK_FALSE(got[i][p] == s.alone(s.cells[(i + 1) % s.cells.size()], p));
      }
  }
}

TEST_CASE("gpu layer batch: a replay gets the run's step block, and the profile lists it by policy", "[replay][cuda]") {
  // [eval] stepping reaches the state kernels as PolicyReplay::step_block: 0 per step, 64 blocked by
  // default, stepping_block when set (gpu_step_block).
  for (auto [mode, block, want] : {std::tuple{SteppingMode::per_step, int64_t(0), int64_t(0)},
                                   std::tuple{SteppingMode::blocked, int64_t(0), int64_t(64)},
                                   std::tuple{SteppingMode::blocked, int64_t(7), int64_t(7)}}) {
    Setup s;
    s.ex.eval.stepping = mode;
    s.ex.eval.stepping_block = block;
    std::vector<int64_t> seen;
    auto spy = [&seen](const cuda::PolicyReplay& p, auto&&... rest) {
      seen.push_back(p.step_block);
      naming_stand_in(p, rest...);
    };
    for (bool profile : {false, true}) {
      phase::set_enabled(profile);
      (void)phase::report_and_reset();
      cell::GpuLayerBatch batch(s.ex, *s.src, s.cells, std::vector<bool>(s.cells.size(), true), s.n, spy);
      for (size_t p = 0; p < 2; ++p)
        for (const Cell& c : s.cells) s.batched(batch, c, p);
      const std::string report = phase::report_and_reset();
      INFO(report);
      // One line per policy label with its 2 replays (one per layer); none when profiling is off.
      CHECK((report.find("uniform") != std::string::npos) == profile);
      CHECK((report.find("window") != std::string::npos) == profile);
      if (profile) {
        CHECK(std::regex_search(report, std::regex("\n    uniform +[0-9.]+ s +2 calls\n")));
        CHECK(std::regex_search(report, std::regex("\n    window +[0-9.]+ s +2 calls\n")));
      }
    }
    phase::set_enabled(false);
    REQUIRE(seen.size() == 8);
    for (int64_t b : seen) CHECK(b == want);
  }
}
