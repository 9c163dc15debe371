// The one road from a config to its results (include/kvsim/replay/engine.hpp, docs/architecture.md
// "A replay, step by step"): run_config's sequences, the plan, the row sink.
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <set>

#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

namespace {
const char* kConfig = R"(
name = "road"
seed = 5
[data]
synthetic = "clustered"
n = 160
d = 8
n_layers = 2
n_heads = 4
n_kv_heads = 2
[eval]
every = 4
[[policy]]
name = "exact"
[[policy]]
name = "h2o"
budget = 0.25
[[policy]]
name = "uniform"
budget = 0.25
)";

using test::same_bits;
}  // namespace

namespace {
/// A SequenceOutput that records what the road does: each sequence's sink (cells written, in memory),
/// which sequences it was asked to skip, and each closed sequence's source.
struct RecordingOutput final : SequenceOutput {
  std::set<int> skip;
  std::vector<int> opened, closed;
  std::vector<std::string> sources;
  std::vector<RunResult> results;
  MemoryRows rows;
  RowSink* open(const Experiment&, int s, int, const StreamSource&) override {
    opened.push_back(s);
    return skip.count(s) ? nullptr : &rows;
  }
  void close(const Experiment&, int s, RunResult&& r) override {
    closed.push_back(s);
    sources.push_back(r.source);
    rows.take(r.policies);
    results.push_back(std::move(r));
  }
};
}  // namespace

TEST_CASE("engine: run_config takes every sequence down one road into its sink, and computes none whose sink is null",
          "[engine][results]") {
  const Experiment ex = parse_experiment(kConfig, "inline", {"data.sequences=3"});
  RecordingOutput all;
  run_config(ex, 2, all);
  CHECK(all.opened == std::vector<int>{0, 1, 2});
  CHECK(all.closed == std::vector<int>{0, 1, 2});
  // Each sequence's rows equal run_experiment's on its own spec (the in-memory road of the tests).
  for (int s = 0; s < 3; ++s) {
    Experiment one = ex;
    one.data = sequence_spec(ex.data, s);
    auto src = open_source(one.data);
    const RunResult direct = run_experiment(one, *src, 1);
    CHECK(all.sources[size_t(s)] == src->describe());
    REQUIRE(all.results[size_t(s)].policies.size() == direct.policies.size());
    for (size_t p = 0; p < direct.policies.size(); ++p) {
      const auto &a = all.results[size_t(s)].policies[p].rows, &b = direct.policies[p].rows;
      REQUIRE(a.size() == b.size());
      REQUIRE_FALSE(a.empty());
      for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE((a[i].layer == b[i].layer && a[i].head == b[i].head && a[i].step == b[i].step));
        for (const auto& m : direct.metrics)
          if (m.name != "policy_ns") REQUIRE(same_bits(a[i][m.index], b[i][m.index]));
      }
    }
  }
  // Negative control: the sequences differ (seeded apart), so equal rows above are not vacuous.
  CHECK(all.sources[0] != all.sources[1]);
  // A null sink (--resume of finished results): the sequence is opened but neither replayed nor closed.
  RecordingOutput some;
  some.skip = {1};
  run_config(ex, 1, some);
  CHECK(some.opened == std::vector<int>{0, 1, 2});
  CHECK(some.closed == std::vector<int>{0, 2});
}

TEST_CASE("engine: a run's sink is begun with the plan's rows per cell and receives every cell once", "[engine][results]") {
  const Experiment ex = parse_experiment(kConfig, "inline");
  auto src = open_source(ex.data);
  const RunPlan plan = plan_run(ex, *src);
  struct Counting final : RowSink {
    std::vector<size_t> expected;
    std::vector<int> writes;
    std::mutex mu;
    void begin(const std::vector<size_t>& per_cell, const std::vector<MetricColumn>&, const RecordingMeta*) override {
      expected = per_cell;
      writes.assign(per_cell.size(), 0);
    }
    void write_cell(size_t c, std::vector<std::vector<MetricRow>>&& rows) override {
      std::lock_guard<std::mutex> lk(mu);
      ++writes.at(c);
      for (const auto& r : rows) REQUIRE(r.size() == expected[c]);
    }
  } sink;
  const RunResult r = run_experiment(ex, *src, 3, {}, &sink);
  CHECK(sink.expected == plan.rows_per_cell());
  CHECK(sink.writes == std::vector<int>(plan.cells.size(), 1));
  CHECK(plan.cells.size() == 4);  // 2 layers × 2 KV heads
  for (const auto& pr : r.policies) CHECK(pr.rows.empty());  // the rows went to the sink
}
