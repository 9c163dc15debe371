// Replay engine, configs and result files: determinism across thread counts, config errors,
// sweeps and overrides, atomic result writing.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/io/results.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;

namespace {

const char* kConfig = R"(
name = "t"
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
name = "window"
budget = [0.1, 0.25]
[[policy]]
name = "sink"
budget = 0.25
sink = 2
[[policy]]
name = "uniform"
budget = 0.25
[[policy]]
name = "oracle_topk"
budget = 0.25
[[policy]]
name = "h2o"
budget = 0.25
[[policy]]
name = "h2o"
score = "oracle"
budget = 0.25
[[policy]]
name = "buzz"
window = 8
threshold = 20
stride = 3
[[policy]]
name = "subgen"
delta = 1.0
s = 16
t = 2
[[policy]]
name = "subgen_kcenter"
recent = 8
centers = 8
mode = "streaming"
)";

using test::same_bits;

}  // namespace

TEST_CASE("engine: identical results at 1 2 and 3 threads", "[engine]") {
  Experiment ex = parse_experiment(kConfig, "inline");
  auto src = open_source(ex.data);
  RunResult r1 = run_experiment(ex, *src, 1);
  for (int threads : {2, 3}) {
    RunResult rn = run_experiment(ex, *src, threads);
    REQUIRE(rn.policies.size() == r1.policies.size());
    for (size_t p = 0; p < r1.policies.size(); ++p) {
      const auto &a = r1.policies[p].rows, &b = rn.policies[p].rows;
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(a[i].layer == b[i].layer);
        REQUIRE(a[i].head == b[i].head);
        REQUIRE(a[i].step == b[i].step);
        for (size_t m = 0; m < r1.metrics.size(); ++m) {
          if (r1.metrics[m].name == "policy_ns") continue;  // wall-clock time, not a result
          INFO(r1.policies[p].spec.label << " " << r1.metrics[m].name << " row " << i);
          REQUIRE(same_bits(a[i][r1.metrics[m].index], b[i][r1.metrics[m].index]));
        }
      }
    }
  }
}

TEST_CASE("engine: evaluated steps and row counts", "[engine]") {
  EvalSpec e;
  e.every = 4;
  e.from = 2;
  CHECK(eval_steps(e, 11) == std::vector<int64_t>{2, 6, 10, 11});
  CHECK(eval_steps(e, 10) == std::vector<int64_t>{2, 6, 10});
  Experiment ex = parse_experiment(kConfig, "inline", {"data.tokens=100", "data.layers=[1]", "data.heads=[0,3]"});
  auto src = open_source(ex.data);
  RunResult r = run_experiment(ex, *src, 2);
  CHECK(r.n_tokens == 100);
  for (const auto& p : r.policies) {
    CHECK(p.rows.size() == 2 * 26);  // 2 heads × steps {1, 5, ..., 97} ∪ {100}
    for (const auto& row : p.rows) {
      CHECK(row.layer == 1);
      CHECK((row.head == 0 || row.head == 3));
    }
  }
}

TEST_CASE("config: sweeps expand and labels are unique and overrides apply", "[config]") {
  Experiment ex = parse_experiment(kConfig, "inline");
  REQUIRE(ex.policies.size() == 11);
  CHECK(ex.policies[1].label == "window(budget=0.1)");
  CHECK(ex.policies[2].label == "window(budget=0.25)");
  CHECK(ex.data.synthetic);
  CHECK(ex.data.synth.preset == "clustered");
  CHECK(ex.data.synth.seed == 5);
  Experiment o = parse_experiment(kConfig, "inline", {"eval.every=7", "policy.2.sink=3", "eval.gqa=query_head"});
  CHECK(o.eval.every == 7);
  CHECK(o.eval.gqa == GqaMode::query_head);
  CHECK(o.policies[3].label == "sink(budget=0.25,sink=3)");
}

TEST_CASE("config: errors name the key and the line", "[config]") {
  CHECK_THROWS_WITH(parse_experiment("name='x'\n[data]\nsynthetic='gaussian'\n[eval]\nevry = 3\n[[policy]]\nname='exact'\n", "c.toml"),
                    Contains("unknown key 'evry'") && Contains("5"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[[policy]]\nname='window'\nbudget=0.2\nwindw=3\n", "c.toml"),
                    Contains("unknown parameter 'windw'") && Contains("c.toml:6"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[[policy]]\nname='window'\nbudget=2.5\n", "c.toml"),
                    Contains("budget") && Contains("c.toml:5"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gausian'\n[[policy]]\nname='exact'\n", "c.toml"),
                    Contains("unknown synthetic preset 'gausian'"));
  CHECK_THROWS_WITH(parse_experiment("[data]\npath='a.h5'\nsynthetic='gaussian'\n[[policy]]\nname='exact'\n", "c.toml"),
                    Contains("exactly one of 'path'"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n", "c.toml"), Contains("no [[policy]]"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[eval]\nevery=0\n[[policy]]\nname='exact'\n", "c.toml"),
                    Contains("eval.every must be"));
  CHECK_THROWS_WITH(parse_experiment("[data\nsynthetic='gaussian'\n", "c.toml"), Contains("syntax error"));
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"novalue"}), Contains("expected key=value"));
  CHECK_THROWS_WITH(load_experiment("/nonexistent/x.toml"), Contains("/nonexistent/x.toml: cannot open"));
  Experiment bad = parse_experiment("[data]\npath='/nonexistent/rec.h5'\n[[policy]]\nname='exact'\n", "c.toml");
  CHECK_THROWS_WITH(open_source(bad.data), Contains("/nonexistent/rec.h5"));
}

TEST_CASE("results: files are written whole and summaries are consistent", "[results]") {
  test::TempDir tmp;
  Experiment ex = parse_experiment(kConfig, "inline");
  auto src = open_source(ex.data);
  RunResult r = run_experiment(ex, *src, 2);
  std::string out = tmp.file("out");
  write_results(r, ex, out);
  CHECK(std::filesystem::exists(out + "/results.h5"));
  CHECK(std::filesystem::exists(out + "/summary.csv"));
  CHECK_FALSE(std::filesystem::exists(out + "/results.h5.tmp"));
  CHECK_FALSE(std::filesystem::exists(out + "/summary.csv.tmp"));
  CHECK_FALSE(std::filesystem::exists(out + "/cells.csv.tmp"));
  {
    // cells.csv: one rel_err row per (policy, layer, head) cell with that cell's step count.
    std::ifstream cells(out + "/cells.csv");
    std::string l;
    int rel_rows = 0;
    while (std::getline(cells, l))
      if (l.rfind("window,window(budget=0.25),1,3,rel_err,", 0) == 0) {
        ++rel_rows;
        CHECK(l.find(",rel_err,41,") != std::string::npos);  // steps 1, 5, ..., 157, 160
      }
    CHECK(rel_rows == 1);
  }
  auto f = h5::File::open_read(out + "/results.h5");
  CHECK(f.attr_string("label", "/policy_02") == "window(budget=0.25)");
  auto rel = f.read_double_vector("/policy_02/rel_err");
  REQUIRE(rel.size() == r.policies[2].rows.size());
  for (size_t i = 0; i < rel.size(); ++i) REQUIRE(rel[i] == metric_of(r.policies[2].rows[i], "rel_err"));
  // summary.csv's all-layer row (layer -1, all_layers = 1) mean of rel_err equals the mean of the rows.
  std::ifstream csv(out + "/summary.csv");
  std::string line;
  bool found = false;
  double sum = 0;
  for (double x : rel) sum += x;
  while (std::getline(csv, line)) {
    if (line.rfind("window,window(budget=0.25),-1,rel_err,", 0) == 0) {
      found = true;
      std::stringstream ss(line);
      std::string cell;
      std::vector<std::string> cells;
      while (std::getline(ss, cell, ',')) cells.push_back(cell);
      // the label contains a comma inside quotes? No: "window(budget=0.25)" has none.
      CHECK(std::stod(cells[5]) == Approx(sum / double(rel.size())).epsilon(1e-5));
      CHECK(cells[9] == "1");  // all_layers
    }
  }
  CHECK(found);
  // An output folder that cannot be created fails with its name and leaves nothing behind.
  std::ofstream(tmp.file("blocker")) << "x";
  CHECK_THROWS_WITH(write_results(r, ex, tmp.file("blocker") + "/sub"), Contains("blocker"));
}

TEST_CASE("results: summarize skips NaN and interpolates quantiles", "[results]") {
  Stat s = summarize({1, 2, NAN, 3, 4, 5});
  CHECK(s.count == 5);
  CHECK(s.mean == 3);
  CHECK(s.median == 3);
  CHECK(s.max == 5);
  CHECK(s.p95 == Approx(4.8));
  CHECK(std::isnan(summarize({NAN}).mean));
}

TEST_CASE("engine: equal-memory matching holds cache_bytes at the target or its capacity or refuses", "[engine][memory]") {
  const char* cfg = R"(
name = "m"
[data]
synthetic = "heavy_hitter"
n = 200
d = 8
n_heads = 4
n_kv_heads = 2
[eval]
every = 3
[[policy]]
name = "window"
memory = [0.1, 0.3]
[[policy]]
name = "sink"
memory = 0.3
[[policy]]
name = "h2o"
memory = 0.3
[[policy]]
name = "uniform"
memory = 0.3
[[policy]]
name = "oracle_topk"
memory = 0.3
)";
  for (std::string gqa : {"kv_head", "query_head"}) {
    Experiment ex = parse_experiment(cfg, "inline", {"eval.gqa=" + gqa});
    auto src = open_source(ex.data);
    RunResult r = run_experiment(ex, *src, 2);
    const double copies = gqa == "query_head" ? 2 : 1;  // group size 2
    for (const auto& pr : r.policies) {
      const int64_t M = memory_target_tokens(pr.spec.params, 200);
      REQUIRE((M == 20 || M == 60));
      for (const auto& row : pr.rows) {
        const double target = double(std::min<int64_t>(M, row.step)) * 2 * 8 * 4 * copies;
        REQUIRE(std::abs(metric_of(row, "cache_bytes") - target) <= 0.02 * target);
      }
    }
  }
  // Capacity-matched policies (sizes oscillate by design): never above the target at any evaluated
  // step, and at least 95% of it at their fullest.
  const char* cap_cfg = R"(
[data]
synthetic = "clustered"
n = 400
d = 8
n_heads = 4
n_kv_heads = 2
[eval]
every = 1
[[policy]]
name = "buzz"
memory = [0.1, 0.3]
log_scale = [false, true]
[[policy]]
name = "subgen_kcenter"
memory = 0.2
weighted = [false, true]
[[policy]]
name = "subgen"
delta = 0.05
memory = [0.1, 0.3]
)";
  Experiment cx = parse_experiment(cap_cfg, "cap.toml");
  auto csrc = open_source(cx.data);
  RunResult cr = run_experiment(cx, *csrc, 2);
  REQUIRE(cr.policies.size() == 8);
  for (const auto& pr : cr.policies) {
    const double target = double(memory_target_tokens(pr.spec.params, 400)) * 2 * 8 * 4;
    double peak = 0;
    for (const auto& row : pr.rows) {
      REQUIRE(metric_of(row, "cache_bytes") <= 1.02 * target);
      peak = std::max(peak, metric_of(row, "cache_bytes"));
      // The per-query best set of the same size (oracle_topk) keeps at least as much attention.
      if (!std::isnan(metric_of(row, "kept_mass"))) REQUIRE(metric_of(row, "attention_loss") >= 1 - metric_of(row, "oracle_mass") - 1e-12);
    }
    INFO(pr.spec.label << ": peak " << peak << " target " << target);
    CHECK(peak >= 0.95 * target);
  }
  // Negative control: k-center in prefill mode holds the whole prefix until its prefill point, above
  // the capacity — the run refuses it by name.
  Experiment kp = parse_experiment("[data]\nsynthetic='gaussian'\nn=200\nd=8\n[[policy]]\nname='subgen_kcenter'\n"
                                   "memory=0.1\nmode='prefill'\n", "k.toml");
  auto ksrc = open_source(kp.data);
  CHECK_THROWS_WITH(run_experiment(kp, *ksrc, 1), Contains("capacity rule"));
  Experiment tiny = parse_experiment("[data]\nsynthetic='gaussian'\nn=128\nd=8\n[[policy]]\nname='buzz'\nmemory=0.05\n", "z.toml");
  auto tsrc = open_source(tiny.data);
  CHECK_THROWS_WITH(run_experiment(tiny, *tsrc, 1), Contains("too small for buzz"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[[policy]]\nname='exact'\nmemory=0.3\n", "e.toml"),
                    Contains("'memory' cannot be matched for 'exact'"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[[policy]]\nname='subgen'\nmemory=0.3\ndelta=1\ns=4\n", "s.toml"),
                    Contains("give 'memory'"));
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\n[[policy]]\nname='window'\nmemory=0.3\nbudget=0.2\n", "w.toml"),
                    Contains("give 'memory'"));
}

namespace {
std::string read_without_timing(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string line, out;
  while (std::getline(in, line))
    if (line.find(",policy_ns,") == std::string::npos) out += line + "\n";  // wall-clock: not a result
  return out;
}
}  // namespace

TEST_CASE("results: rows streamed to disk cell by cell give the in-memory writer's files at any thread count",
          "[engine][results]") {
  Experiment ex = parse_experiment(kConfig, "inline");
  auto src = open_source(ex.data);
  test::TempDir tmp;
  RunResult r = run_experiment(ex, *src, 1);
  write_results(r, ex, tmp.file("mem"));
  for (int threads : {1, 3}) {
    const std::string dir = tmp.file("spill" + std::to_string(threads));
    ResultSpill spill(dir, ex);
    RunResult rs = run_experiment(ex, *src, threads, {}, &spill);
    for (const auto& pr : rs.policies) REQUIRE(pr.rows.empty());  // nothing kept in memory
    REQUIRE_FALSE(std::filesystem::exists(dir + "/results.h5"));   // nothing final before finish()
    const std::string table = spill.finish(rs);
    CHECK(table.substr(0, table.find('\n')) == summary_table(r).substr(0, summary_table(r).find('\n')));
    for (const char* csv : {"/summary.csv", "/cells.csv"}) {
      INFO(csv << " at " << threads << " threads");
      CHECK(read_without_timing(dir + csv) == read_without_timing(tmp.file("mem") + csv));
    }
    auto a = h5::File::open_read(tmp.file("mem") + "/results.h5"), b = h5::File::open_read(dir + "/results.h5");
    for (size_t p = 0; p < r.policies.size(); ++p) {
      char g[32];
      std::snprintf(g, sizeof g, "/policy_%02zu/", p);
      CHECK(a.attr_string("label", g) == b.attr_string("label", g));
      for (const char* ic : {"layer", "head"}) CHECK(a.read_int_vector(g + std::string(ic)) == b.read_int_vector(g + std::string(ic)));
      for (const auto& col : metric_columns()) {
        const std::string& m = col.name;
        if (m == "policy_ns") continue;
        // A metric that does not apply (all NaN) is left out by both writers alike.
        REQUIRE(a.exists(g + m) == b.exists(g + m));
        if (!a.exists(g + m)) continue;
        const auto x = a.read_double_vector(g + m), y = b.read_double_vector(g + m);
        REQUIRE(x.size() == y.size());
        for (size_t i = 0; i < x.size(); ++i) REQUIRE(same_bits(x[i], y[i]));
      }
    }
  }
  // An unfinished run (an error mid-way) leaves neither files nor the folder it created.
  {
    ResultSpill spill(tmp.file("aborted"), ex);
    spill.begin({3, 3}, metric_columns());
  }
  CHECK_FALSE(std::filesystem::exists(tmp.file("aborted")));
}

TEST_CASE("engine: the float32 reference gives the float64 run's metrics within float rounding", "[engine][reference]") {
  Experiment ex = parse_experiment(kConfig, "inline");
  Experiment ex32 = parse_experiment(kConfig, "inline", {"eval.reference_precision=\"float32\""});
  REQUIRE(ex32.eval.reference_precision == Precision::float32);
  auto src = open_source(ex.data);
  RunResult a = run_experiment(ex, *src, 2), b = run_experiment(ex32, *src, 2);
  REQUIRE(a.policies.size() == b.policies.size());
  double worst_exact = 0;
  for (size_t p = 0; p < a.policies.size(); ++p) {
    const auto &ra = a.policies[p].rows, &rb = b.policies[p].rows;
    REQUIRE(ra.size() == rb.size());
    for (size_t i = 0; i < ra.size(); ++i) {
      INFO(a.policies[p].spec.label << " row " << i);
      REQUIRE(ra[i].step == rb[i].step);
      if (a.policies[p].spec.name == "exact") {
        worst_exact = std::max(worst_exact, metric_of(rb[i], "rel_err"));
        continue;
      }
      // Policy errors are ≥ 1e-3 here; the reference's rounding (~1e-6) moves them by far less.
      CHECK(metric_of(rb[i], "rel_err") == Approx(metric_of(ra[i], "rel_err")).epsilon(1e-3).margin(1e-5));
      CHECK(metric_of(rb[i], "eps_spectral") == Approx(metric_of(ra[i], "eps_spectral")).epsilon(1e-3).margin(1e-5));
      if (!std::isnan(metric_of(ra[i], "kept_mass"))) CHECK(metric_of(rb[i], "kept_mass") == Approx(metric_of(ra[i], "kept_mass")).margin(1e-5));
    }
  }
  // The exact policy (double arithmetic) now measures the float32 reference's own rounding.
  CHECK(worst_exact < 1e-4);
  CHECK(worst_exact > 0);
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"eval.reference_precision=\"half\""}),
                    Contains("eval.reference_precision must be \"float64\" or \"float32\", not \"half\""));
  // Every enumerated [eval] choice is checked once, at config load, naming the key and the choices.
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"eval.group_agg=\"median\""}),
                    Contains("eval.group_agg must be \"mean\", \"max\" or \"sum\""));
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"eval.gqa=\"mqa\""}), Contains("eval.gqa must be \"kv_head\" or \"query_head\""));
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"eval.device=\"tpu\""}), Contains("eval.device must be \"cpu\" or \"cuda\""));
  CHECK_THROWS_WITH(parse_experiment(kConfig, "inline", {"eval.closed_form=\"banded\""}),
                    Contains("eval.closed_form must be \"blocked\" or \"per_step\""));
}
