// The policy and metric registries: documentation that cannot drift from the code.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"
#include "registry_examples.hpp"

using namespace kvsim;

namespace {

StreamInfo small_stream() {
  StreamInfo s;
  s.n = 64;
  s.head_dim = 8;
  s.n_queries = 2;
  s.prefill = test::kPressPrompt;  // a prompt, for the prefill policies (snapkv, pyramidkv, press_replay)
  return s;
}

/// Distinct disagreements between `info`'s documented parameters and what its factory reads, over its examples.
std::set<std::string> doc_mismatches(const PolicyInfo& info) {
  std::set<std::string> bad;
  std::set<std::string> documented, asked_somewhere;
  for (const auto& p : info.params) documented.insert(p.name);
  for (const Params& ex : info.examples) {
    const Params given = test::with_files(ex);
    ParamReader params(given, &info.params);  // as make_policy reads them: the declared defaults and ranges
    try {
      info.make(params, small_stream());
    } catch (const Error& e) {  // e.g. a parameter it reads but does not declare
      bad.insert(info.name + ": " + e.what());
    }
    for (const auto& [key, def] : params.asked()) {
      asked_somewhere.insert(key);
      if (!documented.count(key)) {
        bad.insert(info.name + ": reads undocumented parameter '" + key + "'");
        continue;
      }
      for (const auto& p : info.params)
        if (p.name == key && def && literal_default(p) && *def != param_to_string(*literal_default(p)))
          bad.insert(info.name + ": '" + key + "' documented default " + p.default_value + ", factory uses " + *def);
    }
  }
  for (const auto& name : documented)
    if (!asked_somewhere.count(name)) bad.insert(info.name + ": documents '" + name + "', which no example reads");
  return bad;
}

}  // namespace

TEST_CASE("registry: every policy's documented parameters and defaults are the ones its factory uses", "[registry]") {
  REQUIRE(policy_registry().size() >= 9);
  for (const auto* info : policy_registry()) {
    INFO(info->name);
    REQUIRE_FALSE(info->examples.empty());
    REQUIRE_FALSE(info->source.empty());
    const auto bad = doc_mismatches(*info);
    for (const auto& b : bad) UNSCOPED_INFO(b);
    CHECK(bad.empty());
    // The registry is the one way in: make_policy finds it by name.
    CHECK(make_policy(info->name, test::with_files(info->examples.front()), small_stream()) != nullptr);
  }
}

TEST_CASE("registry: a declared default is the one the factory applies, and an undeclared or stale parameter is caught", "[registry]") {
  // The factory takes its default from the declaration: a copy of the sink entry declaring 8 builds
  // a policy that keeps 8 sink tokens where the real entry keeps 4 (the default is written once).
  PolicyInfo eight = policy_info("sink");
  for (auto& p : eight.params)
    if (p.name == "sink") p.default_value = "8";
  Params given;
  given.set("budget", int64_t(16), "test");
  ParamReader r8(given, &eight.params), r4(given, &policy_info("sink").params);
  eight.make(r8, small_stream());
  policy_info("sink").make(r4, small_stream());
  CHECK(r8.asked().at("sink") == std::optional<std::string>("8"));
  CHECK(r4.asked().at("sink") == std::optional<std::string>("4"));
  CHECK(doc_mismatches(eight).empty());
  // Negative controls: copies of real entries with their declarations broken.

  PolicyInfo missing = policy_info("h2o");
  missing.params.pop_back();  // `score` undeclared
  const auto m = doc_mismatches(missing);
  for (const auto& b : m) UNSCOPED_INFO(b);
  CHECK(m.size() == 1);

  PolicyInfo stale = policy_info("window");
  stale.params.push_back({"stride", "int", "5", "not a window parameter"});
  CHECK(doc_mismatches(stale).size() == 1);
}

TEST_CASE("registry: memory rules replace size parameters, and a policy without one refuses memory", "[registry]") {
  Params mem;
  mem.set("memory", int64_t(48), "test");  // 3/4 of n = 64: kivi needs 39 (its G − 1 = 31 newest in float32)
  for (const auto* info : policy_registry()) {
    INFO(info->name);
    if (!info->memory) {
      CHECK_THROWS_AS(make_policy(info->name, mem, small_stream()), Error);
      continue;
    }
    CHECK(make_policy(info->name, mem, small_stream()) != nullptr);
    for (const auto& key : info->memory->refuses) {  // giving a replaced parameter as well is an error
      Params both = mem;
      both.set(key, int64_t(8), "test");
      CHECK_THROWS_AS(make_policy(info->name, both, small_stream()), Error);
    }
  }
  CHECK_THROWS_AS(policy_info("no_such_policy"), Error);
}

TEST_CASE("registry: every policy file's KVSIM_POLICY definition is registered, in name order", "[registry]") {
  // The build collects the list (cmake/policy_list.cmake); here the policy files are scanned again, at
  // test time, so a definition the build's scan missed, a stale list, or a stray registration fails,
  // and a new policy file needs no edit here.
  const std::regex def(R"(^KVSIM_POLICY\(([a-z0-9_]+)\))");
  std::vector<std::string> in_files;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(KVSIM_SOURCE_DIR) + "/sim/policies")) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream f(entry.path());
    std::smatch m;
    for (std::string line; std::getline(f, line);)
      if (std::regex_search(line, m, def)) in_files.push_back(m[1]);
  }
  std::sort(in_files.begin(), in_files.end());
  CHECK(in_files.size() >= 20);  // the scan itself works (20 policy files when this was written)
  CHECK(policy_names() == in_files);
  for (const auto& name : policy_names()) CHECK(policy_info(name).name == name);
}

TEST_CASE("registry: figure colours are distinct #rrggbb, and bench entries construct", "[registry]") {
  std::set<std::string> colors;
  int benched = 0;
  for (const auto* info : policy_registry()) {
    INFO(info->name);
    REQUIRE(info->color.size() == 7);
    CHECK(info->color[0] == '#');
    CHECK(info->color.find_first_not_of("0123456789abcdef", 1) == std::string::npos);
    CHECK(colors.insert(info->color).second);
    if (info->bench.params.values().empty()) continue;
    ++benched;
    StreamInfo s = small_stream();  // at the shape `kvsim bench --quick` runs: n = 512, head_dim 128
    s.n = 512;
    s.head_dim = 128;
    s.prefill = info->bench.after_prefill ? 256 : 0;
    CHECK(make_policy(info->name, info->bench.params, s) != nullptr);
  }
  CHECK(benched >= 14);  // every policy but the two references (exact, oracle_topk)
  const std::string json = policy_colors_json();
  CHECK(json.find("\"h2o\": \"" + policy_info("h2o").color + "\"") != std::string::npos);
}

TEST_CASE("registry: metrics have unique names, units, descriptions and sources", "[registry]") {
  std::set<std::string> names;
  for (const auto& m : metric_registry()) {
    INFO(m.name);
    CHECK(names.insert(m.name).second);
    CHECK(std::string(m.unit).size() > 0);
    CHECK(std::string(m.description).size() > 10);
    CHECK(std::string(m.source).size() > 0);
    CHECK(m.compute != nullptr);
  }
  CHECK(metric_registry().size() <= kMaxMetrics);
  CHECK(metric_index("eps_spectral") < metric_registry().size());
  CHECK_THROWS_AS(metric_index("no_such_metric"), Error);
}

TEST_CASE("registry: a bench entry's float32 flag says whether the policy follows [eval] policy_precision",
          "[registry][precision]") {
  // `kvsim bench` times a policy again in float32 when its entry says so (PolicyInfo::Bench::float32). The flag
  // must be true exactly when the arithmetic follows the precision: replayed at its bench parameters in float64
  // and float32, a flagged policy's rel_err moves (float32 rounding is really in use) and an unflagged one gives
  // the same bits (it computes in double whatever the setting). Prompt-compressing policies (bench after a
  // prefill) are timed without the float32 row, so they are left out.
  const char* base = R"(
name = "precision"
seed = 2
[data]
synthetic = "heavy_hitter"
n = 96
d = 16
n_layers = 1
n_heads = 2
n_kv_heads = 1
[eval]
every = 4
[[policy]]
name = "exact"
)";
  int flagged = 0, unflagged = 0;
  for (const PolicyInfo* info : policy_registry()) {
    if (info->bench.params.values().empty() || info->bench.after_prefill) continue;
    INFO(info->name);
    auto run = [&](const char* prec) {
      Experiment ex = parse_experiment(base, "inline", {std::string("eval.policy_precision=\"") + prec + "\""});
      ex.policies.push_back(PolicySpec{info->name, info->name, info->bench.params});
      auto src = open_source(ex.data);
      return run_experiment(ex, *src, 1);
    };
    const RunResult r64 = run("float64"), r32 = run("float32");
    const auto& a = r64.policies[1].rows;
    const auto& b = r32.policies[1].rows;
    REQUIRE(a.size() == b.size());
    double moved = 0;
    for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(metric_of(a[i], "rel_err") - metric_of(b[i], "rel_err")));
    if (info->bench.float32) {
      ++flagged;
      CHECK(moved > 1e-12);
    } else {
      ++unflagged;
      CHECK(moved == 0.0);
    }
  }
  CHECK(flagged >= 10);   // window, sink, h2o, tova, scissorhands, knorm, uniform, buzz, kivi, keydiff, lagkv
  CHECK(unflagged >= 2);  // quest, subgen, subgen_kcenter
}
