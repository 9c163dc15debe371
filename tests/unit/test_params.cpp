// A policy's parameters: Params is pure, a ParamReader records what a factory asks, and a config's
// [[policy]] entries are checked once at load (names, keys, kinds) and once against the real stream.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "kvsim/analysis/clustering.hpp"
#include "kvsim/cli/closed_loop.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/core/params.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;

// Params is the config's value, pure: policies read it through a ParamReader (which records the keys
// asked), so nothing mutates while a config is checked or a policy built.
template <class T>
concept ReadsInt = requires(T& p) { p.get_int(std::string("k"), int64_t(0)); };
static_assert(!ReadsInt<const Params> && ReadsInt<ParamReader>);

TEST_CASE("params: a reader records what a factory asked, and the unused-key check names the rest", "[config]") {
  Params p;
  p.set("budget", int64_t(8), "c.toml:3");
  p.set("windw", int64_t(3), "c.toml:4");
  ParamReader r(p);
  CHECK(r.get_budget("budget", 100) == 8);
  CHECK(r.get_int("sink", 4) == 4);
  CHECK_THROWS_WITH(r.check_all_used("policy 'sink'"), Contains("unknown parameter 'windw'") && Contains("c.toml:4"));
  CHECK(r.asked().at("sink") == std::optional<std::string>("4"));
  CHECK(r.asked().at("budget") == std::nullopt);
  ParamReader all(p);  // negative control: every key read, nothing to report
  all.get_int("budget", 0);
  all.get_int("windw", 0);
  CHECK_NOTHROW(all.check_all_used("x"));
  CHECK(memory_target_tokens(p, 100) == -1);
}

TEST_CASE("params: with declarations, the reader applies the declared default and checks the declared range", "[config]") {
  const std::vector<ParamDecl> decls = {{"budget", "tokens", "required", "cache size"},
                                        {"ratio", "float", "0.5", "a share", "(0, 1)"},
                                        {"stride", "int", "5", "a count", "[2, 2^31]"},
                                        {"score", "string", "accumulated", "a rule", "accumulated|oracle"},
                                        {"window", "int", "min(32, budget / 2)", "a rule's default"}};
  Params none;
  ParamReader d(none, &decls);
  CHECK(d.get_double("ratio") == 0.5);
  CHECK(d.get_int("stride") == 5);
  CHECK(d.get_string("score") == "accumulated");
  CHECK_THROWS_WITH(d.get_budget("budget", 100), Contains("missing parameter 'budget'"));
  CHECK_THROWS_WITH(d.get_int("window"), Contains("is a rule, not a value"));  // the factory computes it
  CHECK(d.get_int("window", 7) == 7);
  CHECK_THROWS_WITH(d.get_int("undeclared", 1), Contains("reads parameter 'undeclared', which it does not declare"));
  Params bad;
  bad.set("ratio", 1.0, "c.toml:2");
  bad.set("stride", int64_t(1) << 32, "c.toml:3");
  bad.set("score", std::string("oracel"), "c.toml:4");
  ParamReader b(bad, &decls);
  CHECK_THROWS_WITH(b.get_double("ratio"), Contains("parameter 'ratio' = 1 must be in (0, 1)") && Contains("c.toml:2"));
  CHECK_THROWS_WITH(b.get_int("stride"), Contains("must be in [2, 2^31]") && Contains("c.toml:3"));
  CHECK_THROWS_WITH(b.get_string("score"), Contains("must be one of accumulated,oracle, not \"oracel\""));
  Params good;  // negative control: the bounds themselves pass
  good.set("ratio", 0.999, "c.toml:2");
  good.set("stride", int64_t(1) << 31, "c.toml:3");
  good.set("score", std::string("oracle"), "c.toml:4");
  ParamReader g(good, &decls);
  CHECK(g.get_double("ratio") == 0.999);
  CHECK(g.get_int("stride") == (int64_t(1) << 31));
  CHECK(g.get_string("score") == "oracle");
  // A real policy's declared range is checked when the config is read, naming the line.
  const std::string cfg = "[data]\npath='/nonexistent/rec.h5'\n[[policy]]\nname='h2o'\nbudget=8\n";
  CHECK_THROWS_WITH(parse_experiment(cfg + "heavy_ratio=1.5\n", "c.toml"),
                    Contains("parameter 'heavy_ratio' = 1.5 must be in (0, 1)") && Contains("c.toml:6"));
  CHECK_NOTHROW(parse_experiment(cfg + "heavy_ratio=0.25\n", "c.toml"));
}

TEST_CASE("config: a policy's names, keys and kinds are checked at load, its values once against the real stream", "[config]") {
  // At load, before any data is read (the recording does not exist): one line naming policy, key and line.
  const std::string head = "[data]\npath='/nonexistent/rec.h5'\n[[policy]]\n";
  auto load = [&](const std::string& policy) { return parse_experiment(head + policy, "c.toml"); };
  CHECK_THROWS_WITH(load("name='window'\nbudget='a'\n"),
                    Contains("policy 'window'") && Contains("'budget' must be a number of tokens") && Contains("c.toml:5"));
  CHECK_THROWS_WITH(load("name='h2o'\nbudget=8\nheavy_ratio=true\n"), Contains("'heavy_ratio' must be a number") && Contains("c.toml:6"));
  CHECK_THROWS_WITH(load("name='buzz'\nwindow=8\nthreshold=16\nstride=2.5\n"), Contains("'stride' must be an integer"));
  CHECK_THROWS_WITH(load("name='h2o'\nscore='oracle'\n"), Contains("policy 'h2o'") && Contains("missing parameter 'budget'"));
  CHECK_THROWS_WITH(load("name='h2o'\nmemory=8\nbudget=8\n"), Contains("not both"));
  CHECK_THROWS_WITH(load("name='exact'\nmemory=8\n"), Contains("no equal-memory rule"));
  CHECK_THROWS_WITH(load("name='sink'\nbudget=8\nsinks=4\n"), Contains("unknown parameter 'sinks'") && Contains("c.toml:6"));
  CHECK_THROWS_WITH(load("name='window'\nbudget=-3\n"), Contains("'budget' must be ≥ 0 tokens"));
  CHECK_NOTHROW(load("name='h2o'\nmemory=0.2\n"));  // negative control: memory supplies the required budget

  // What depends on n is checked once, against the real stream. buzz's threshold as a fraction of n must
  // reach the stride: 0.001 of n = 8000 is 8 tokens (valid), of 2000 it is 2 (< stride 5). A check with a
  // stand-in n (the former config-time pass used 4096: 4 tokens) would wrongly refuse the first.
  const std::string cfg = "[data]\nsynthetic='gaussian'\nn=8000\nd=4\nn_layers=1\nn_heads=1\n[eval]\nevery=4000\n"
                          "[[policy]]\nname='buzz'\nwindow=8\nthreshold=0.001\nstride=5\n";
  Experiment ok = parse_experiment(cfg, "c.toml");
  auto src = open_source(ok.data);
  RunResult r = run_experiment(ok, *src, 1);
  CHECK(r.policies.at(0).rows.size() == 3);  // t = 1, 4001, 8000
  Experiment short_run = parse_experiment(cfg, "c.toml", {"data.tokens=2000"});
  CHECK_THROWS_WITH(run_experiment(short_run, *src, 1), Contains("'threshold' must be ≥ stride") && Contains("c.toml:12"));
}


TEST_CASE("config: every shipped config in experiments/ loads with the loader of its kind", "[config]") {
  namespace fs = std::filesystem;
  int loaded = 0;
  for (const auto& e : fs::directory_iterator(fs::path(KVSIM_SOURCE_DIR) / "experiments")) {
    if (e.path().extension() != ".toml") continue;
    const std::string path = e.path().string();
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto has = [&](const char* table) { return text.find(std::string("\n") + table) != std::string::npos || text.rfind(table, 0) == 0; };
    INFO(path);
    if (has("[task]")) CHECK_NOTHROW(load_task(path));
    else if (has("[clusters]") || (has("[data]") && !has("[[policy]]"))) CHECK_NOTHROW(load_cluster_study(path));
    else if (has("[model]")) CHECK_NOTHROW(load_closed_loop(path));
    else CHECK_NOTHROW(load_experiment(path));
    ++loaded;
  }
  CHECK(loaded >= 30);
  // Negative control: a key the parser does not read is refused (every table's keys are those its code reads).
  CHECK_THROWS_WITH(parse_experiment("[data]\nsynthetic='gaussian'\nclusterc=2\n[[policy]]\nname='window'\nbudget=8\n", "c.toml"),
                    Contains("unknown key 'clusterc' in [data]") && Contains("cluster_c"));
  CHECK_THROWS_WITH(parse_experiment("[data]\npath='r.h5'\ncluster_c=2\n[[policy]]\nname='window'\nbudget=8\n", "c.toml"),
                    Contains("data.cluster_c only applies to synthetic data"));
}
