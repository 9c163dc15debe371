// Results over several sequences: the bootstrap interval and the sequence specs.
#include <boost/random/normal_distribution.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "kvsim/analysis/bootstrap.hpp"
#include "kvsim/core/rng.hpp"
#include "kvsim/io/spec.hpp"

using namespace kvsim;

namespace {
std::vector<double> normal_sample(int n, uint64_t seed, double mu = 1.0, double sigma = 0.5) {
  Engine eng = make_engine({seed});
  boost::random::normal_distribution<double> N(mu, sigma);
  std::vector<double> x(static_cast<size_t>(n), 0.0);
  for (auto& e : x) e = N(eng);
  return x;
}
}  // namespace

TEST_CASE("bootstrap: the interval contains the mean, is reproducible, and shrinks with more sequences", "[results]") {
  const auto x8 = normal_sample(8, 1), x64 = normal_sample(64, 1);
  const Interval a = bootstrap_mean_ci(x8, 7), b = bootstrap_mean_ci(x8, 7), c = bootstrap_mean_ci(x64, 7);
  double m = 0;
  for (double e : x8) m += e;
  m /= 8;
  CHECK(a.mean == Approx(m).epsilon(1e-15));
  CHECK((a.low < a.mean && a.mean < a.high));
  CHECK((a.low == b.low && a.high == b.high));  // seeded: identical
  CHECK(a.n == 8);
  CHECK(c.high - c.low < 0.6 * (a.high - a.low));  // ~1/√8 of the width: 0.35 expected
  // Degenerate and not-applicable inputs.
  const Interval one = bootstrap_mean_ci({0.3}, 1);
  CHECK((one.low == 0.3 && one.high == 0.3 && one.n == 1));
  const Interval none = bootstrap_mean_ci({NAN, NAN}, 1);
  CHECK((none.n == 0 && std::isnan(none.mean)));
  CHECK(bootstrap_mean_ci({1.0, NAN, 3.0}, 1).n == 2);
  CHECK_THROWS(bootstrap_mean_ci(x8, 1, 1.5));
}

TEST_CASE("bootstrap: 95% intervals cover the true mean about 95% of the time and 50% ones do not", "[results]") {
  // 400 samples of 30 normal values: the percentile bootstrap covers ~93-95% at this size. The 50%
  // interval is the negative control: the same check must reject it.
  int cover95 = 0, cover50 = 0;
  const int trials = 400;
  for (int i = 0; i < trials; ++i) {
    const auto x = normal_sample(30, 1000 + uint64_t(i));
    const Interval a = bootstrap_mean_ci(x, uint64_t(i), 0.95, 1000), b = bootstrap_mean_ci(x, uint64_t(i), 0.50, 1000);
    cover95 += (a.low <= 1.0 && 1.0 <= a.high);
    cover50 += (b.low <= 1.0 && 1.0 <= b.high);
  }
  INFO("95% coverage " << cover95 << "/" << trials << ", 50% coverage " << cover50 << "/" << trials);
  CHECK(cover95 >= int(0.89 * trials));
  CHECK(cover95 <= int(0.99 * trials));
  CHECK(cover50 < int(0.62 * trials));  // a 95% check would fail on it
}

TEST_CASE("sequences: recordings are taken in order, synthetic seeds differ and sequence 0 is the config's", "[results]") {
  DataSpec d;
  d.path = "a.h5";
  CHECK(sequence_count(d) == 1);
  d.paths = {"a.h5", "b.h5", "c.h5"};
  CHECK(sequence_count(d) == 3);
  CHECK(sequence_spec(d, 2).path == "c.h5");
  CHECK(sequence_spec(d, 2).paths.empty());
  CHECK_THROWS(sequence_spec(d, 3));
  DataSpec s;
  s.synthetic = true;
  s.synth.seed = 11;
  s.sequences = 5;
  std::set<uint64_t> seeds;
  for (int i = 0; i < 5; ++i) seeds.insert(sequence_spec(s, i).synth.seed);
  CHECK(seeds.size() == 5);
  CHECK(sequence_spec(s, 0).synth.seed == 11);  // a one-sequence run keeps its numbers
  CHECK(sequence_spec(s, 3).sequences == 1);
}

#include "kvsim/cli/config.hpp"
#include "kvsim/replay/engine.hpp"
#include "helpers.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/io/results.hpp"
#include <cstdlib>

TEST_CASE("resolved config: defaults filled in, parses back to the same run, and is a fixed point", "[results]") {
  const std::string text = R"(name = "r"
seed = 5
[data]
synthetic = "heavy_hitter"
n = 96
d = 8
n_heads = 2
n_kv_heads = 1
[eval]
every = 8
[[policy]]
name = "sink"
budget = 0.25
[[policy]]
name = "h2o"
memory = [0.2, 0.3]
[[policy]]
name = "buzz"
window = 8
threshold = 16
)";
  const Experiment ex = parse_experiment(text, "test");
  const std::string& resolved = ex.resolved_text;
  CHECK(resolved.find("sink = 4   # default") != std::string::npos);
  CHECK(resolved.find("heavy_ratio = 0.5   # default") != std::string::npos);
  CHECK(resolved.find("stride = 5   # default") != std::string::npos);
  CHECK(resolved.find("n_heavy = 4") != std::string::npos);      // a data default
  CHECK(resolved.find("group_agg = \"mean\"") != std::string::npos);  // an eval default
  const Experiment back = parse_experiment(resolved, "resolved");
  // A fixed point once the defaults are explicit (only the "# default" markers go).
  CHECK(parse_experiment(back.resolved_text, "again").resolved_text == back.resolved_text);
  std::string unmarked = resolved;
  for (size_t at; (at = unmarked.find("   # default")) != std::string::npos;) unmarked.erase(at, 12);
  CHECK(back.resolved_text == unmarked);
  REQUIRE(back.policies.size() == ex.policies.size());
  for (size_t p = 0; p < ex.policies.size(); ++p) CHECK(back.policies[p].label == ex.policies[p].label);
  // Same numbers: the filled-in defaults are the factories' defaults.
  SynthSource a(ex.data.synth), b(back.data.synth);
  const RunResult ra = run_experiment(ex, a, 1), rb = run_experiment(back, b, 1);
  for (size_t p = 0; p < ra.policies.size(); ++p) {
    REQUIRE(ra.policies[p].rows.size() == rb.policies[p].rows.size());
    for (size_t i = 0; i < ra.policies[p].rows.size(); ++i)
      REQUIRE(metric_of(ra.policies[p].rows[i], "rel_err") == metric_of(rb.policies[p].rows[i], "rel_err"));
  }
  // Negative control: a changed default is a different run.
  std::string wrong = resolved;
  wrong.replace(wrong.find("stride = 5"), 10, "stride = 3");
  SynthSource c(back.data.synth);
  const RunResult rc = run_experiment(parse_experiment(wrong, "wrong"), c, 1);
  bool differs = false;
  for (size_t i = 0; i < rc.policies.back().rows.size(); ++i)
    differs |= metric_of(rc.policies.back().rows[i], "rel_err") != metric_of(ra.policies.back().rows[i], "rel_err");
  CHECK(differs);
}

TEST_CASE("results: runtime_env records the KVSIM_* variables the run saw, and only those", "[results]") {
  const char* cfg = R"(
name = "runtime_env"
[data]
synthetic = "gaussian"
n = 40
d = 8
n_layers = 1
n_heads = 2
[[policy]]
name = "window"
budget = 8
)";
  test::TempDir dir;
  Experiment ex = parse_experiment(cfg, "inline");
  auto src = open_source(ex.data);
  auto env_of = [&](const std::string& sub) {
    write_results(run_experiment(ex, *src, 1), ex, dir.file(sub));
    return h5::File::open_read(dir.file(sub) + "/results.h5").attr_string("runtime_env");
  };
  ::setenv("KVSIM_TEST_RUNTIME_MARK", "on", 1);
  ::setenv("NOT_KVSIM_TEST_MARK", "x", 1);
  const std::string with = env_of("with");
  ::unsetenv("KVSIM_TEST_RUNTIME_MARK");
  const std::string without = env_of("without");
  ::unsetenv("NOT_KVSIM_TEST_MARK");
  CHECK(with.find("KVSIM_TEST_RUNTIME_MARK=on\n") != std::string::npos);
  CHECK(with.find("NOT_KVSIM") == std::string::npos);  // only the KVSIM_ prefix
  CHECK(without.find("KVSIM_TEST_RUNTIME_MARK") == std::string::npos);  // negative control: not a constant
}

TEST_CASE("results: the [runtime] table is read, overridden by its environment variables, and recorded", "[results]") {
  const char* cfg = R"(
name = "runtime_table"
[data]
synthetic = "gaussian"
n = 40
d = 8
n_layers = 1
n_heads = 2
[runtime]
cuda_exact = "gemm"
cuda_exact_rows = 32
cuda_deadline_s = 90
[[policy]]
name = "window"
budget = 8
)";
  const Experiment ex = parse_experiment(cfg, "inline");
  CHECK(ex.runtime.cuda_exact == "gemm");
  CHECK(ex.runtime.cuda_exact_rows == 32);
  CHECK(ex.runtime.cuda_deadline_s == 90.0);
  CHECK(ex.runtime.cuda_layer_batch == "auto");  // absent keys keep their defaults
  // The resolved config carries the table: parsing it gives the same runtime.
  const Experiment back = parse_experiment(ex.resolved_text, "resolved");
  CHECK(runtime_toml(back.runtime) == runtime_toml(ex.runtime));
  // The environment overrides the config; without the variable the config's value holds (negative control).
  ::setenv("KVSIM_CUDA_EXACT_ROWS", "7", 1);
  const Experiment env = parse_experiment(cfg, "inline");
  ::unsetenv("KVSIM_CUDA_EXACT_ROWS");
  CHECK(env.runtime.cuda_exact_rows == 7);
  CHECK(parse_experiment(cfg, "inline").runtime.cuda_exact_rows == 32);
  // results.h5 keeps the resolved table, and no number depends on it.
  test::TempDir dir;
  auto src = open_source(ex.data);
  const RunResult a = run_experiment(ex, *src, 1), b = run_experiment(env, *src, 1);
  write_results(a, ex, dir.file("a"));
  const std::string attr = h5::File::open_read(dir.file("a") + "/results.h5").attr_string("runtime");
  CHECK(attr == runtime_toml(ex.runtime));
  CHECK(attr.find("cuda_exact_rows = 32\n") != std::string::npos);
  REQUIRE(a.policies[0].rows.size() == b.policies[0].rows.size());
  for (size_t i = 0; i < a.policies[0].rows.size(); ++i)
    CHECK(metric_of(a.policies[0].rows[i], "rel_err") == metric_of(b.policies[0].rows[i], "rel_err"));
}

TEST_CASE("results: a bad [runtime] key or value is refused in one line naming it", "[results]") {
  const std::string base = "name = \"r\"\n[data]\nsynthetic = \"gaussian\"\nn = 40\nd = 8\nn_layers = 1\nn_heads = 2\n[[policy]]\nname = \"window\"\nbudget = 8\n[runtime]\n";
  auto error_of = [&](const std::string& line) {
    try {
      parse_experiment(base + line + "\n", "cfg.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("cuda_exact = \"flsh\""), Catch::Matchers::Contains("runtime.cuda_exact = 'flsh': not one of"));
  CHECK_THAT(error_of("cuda_exact_rows = 0"), Catch::Matchers::Contains("runtime.cuda_exact_rows = '0'"));
  CHECK_THAT(error_of("cuda_deadline_s = -1"), Catch::Matchers::Contains("not a positive number of seconds"));
  CHECK_THAT(error_of("profile = 1"), Catch::Matchers::Contains("runtime.profile must be a boolean"));
  CHECK_THAT(error_of("cuda_workrs = 2"), Catch::Matchers::Contains("unknown key 'cuda_workrs' in [runtime]"));
  CHECK(error_of("cuda_workers = 2").empty());  // negative control: a good value passes
  for (const std::string& e : {error_of("cuda_exact = \"flsh\""), error_of("cuda_workrs = 2")}) {
    CHECK(e.rfind("cfg.toml:", 0) == 0);  // FILE:LINE first
    CHECK(e.find('\n') == std::string::npos);
  }
  ::setenv("KVSIM_CUDA_DEADLINE", "soon", 1);
  const std::string env = error_of("");
  ::unsetenv("KVSIM_CUDA_DEADLINE");
  CHECK(env == "KVSIM_CUDA_DEADLINE = 'soon': not a positive number of seconds");
}

TEST_CASE("results: every [runtime] key of the table is read, written and overridden by its own variable", "[results]") {
  std::set<std::string> envs;
  for (const auto& k : runtime_keys()) {
    INFO(k.key);
    CHECK(std::string(k.env).rfind("KVSIM_", 0) == 0);
    CHECK(envs.insert(k.env).second);  // one variable per key
    Runtime r;
    std::string text = runtime_value_toml(r, k.key);
    if (text.front() == '"') text = text.substr(1, text.size() - 2);
    set_runtime_key(r, k.key, text, k.key);  // the default's own text reads back
    CHECK(runtime_value_toml(r, k.key) == runtime_value_toml(Runtime{}, k.key));
    // The variable moves the value (a non-default value of each type), and only while it is set.
    const std::string type = k.type;
    const std::string other = type == "boolean" ? (text == "true" ? "false" : "true")
                              : type == "string" ? (text == "auto" ? "off" : "auto") : "3";
    std::string value = other;
    if (std::string(k.key) == "cuda_exact") value = "gemm";
    ::setenv(k.env, value.c_str(), 1);
    const Runtime moved = runtime_from_environment();
    ::unsetenv(k.env);
    CHECK(runtime_value_toml(moved, k.key) != runtime_value_toml(Runtime{}, k.key));
    CHECK(runtime_toml(runtime_from_environment()) == runtime_toml(Runtime{}));
  }
  Runtime r;
  CHECK_THROWS_WITH(set_runtime_key(r, "cuda_workerz", "1", "x"), Catch::Matchers::Contains("unknown [runtime] key 'cuda_workerz'"));
}
