// The offline scores of `kvsim task` (docs/tasks.md, "Offline scores"): the metrics topk_mass and
// topk_kept (sim/replay/metrics.cpp) on a hand-made row and through the engine, and the retrieval heads
// and per-policy aggregates of sim/cli/task_scores.cpp on a hand-made open loop, each with a negative
// control.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>

#include "helpers.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"

using namespace kvsim;

namespace {
double compute(const char* name, MetricContext& c) { return metric_registry()[metric_index(name)].compute(c); }
}  // namespace

TEST_CASE("metrics: topk_kept counts the exact row's top-k tokens in the cache, ties with the k-th included", "[metrics]") {
  const std::vector<double> probs = {0.4, 0.2, 0.2, 0.1, 0.1};
  Answer a;
  a.has_kept = true;
  MetricContext c;
  c.t = 5;
  c.probs = probs.data();
  c.answer = &a;
  c.topk = 2;  // the 2nd largest weight is 0.2, held by tokens 1 and 2: the top set is {0, 1, 2}
  CHECK(compute("topk_mass", c) == Approx(0.6));
  a.kept = {0, 1};
  CHECK(compute("topk_kept", c) == Approx(2.0 / 3.0));
  a.kept = {0, 1, 2, 3};
  CHECK(compute("topk_kept", c) == 1);
  a.kept = {3, 4};  // negative control: only the two smallest weights
  CHECK(compute("topk_kept", c) == 0);
  c.topk = 9;  // k beyond t: every token is in the top set
  CHECK(compute("topk_mass", c) == Approx(1.0));
  CHECK(compute("topk_kept", c) == Approx(2.0 / 5.0));
  a.has_kept = false;  // a policy with no token subset
  CHECK(std::isnan(compute("topk_kept", c)));
  // Off ([eval] topk = 0): the engine does not run them (compute_metrics' mask, below); called all the
  // same, both return NaN without touching the row (k − 1 = −1 would read before it).
  a.has_kept = true;
  c.topk = 0;
  CHECK(std::isnan(compute("topk_kept", c)));
  CHECK(std::isnan(compute("topk_mass", c)));
}

TEST_CASE("metrics: topk_kept is 1 for exact and oracle_topk at budget k, below 1 for a window, and off without eval.topk",
          "[metrics]") {
  Experiment ex;
  ex.data.synthetic = true;
  ex.data.synth = test::small_synth("heavy_hitter", 128, 8, 1, 2, 2);  // no GQA: oracle_topk ranks each head's own row
  ex.eval.every = 5;
  ex.eval.topk = 8;
  Params b;
  b.set("budget", int64_t(8));
  ex.policies = {PolicySpec{"exact", "exact", Params{}}, PolicySpec{"oracle_topk", "oracle_topk", b},
                 PolicySpec{"window", "window", b}};
  auto src = open_source(ex.data);
  const RunResult r = run_experiment(ex, *src, 1);
  REQUIRE(!r.policies[0].rows.empty());
  double window_min = 1;
  for (size_t i = 0; i < r.policies[0].rows.size(); ++i) {
    const MetricRow &e = r.policies[0].rows[i], &o = r.policies[1].rows[i], &w = r.policies[2].rows[i];
    CHECK(metric_of(e, "topk_kept") == 1);
    CHECK(metric_of(o, "topk_kept") == 1);
    // topk_mass is the oracle's top-8 mass: a property of the row, the same for every policy.
    CHECK(metric_of(o, "topk_mass") == Approx(metric_of(o, "oracle_mass")).epsilon(1e-12));
    CHECK(metric_of(w, "topk_mass") == metric_of(e, "topk_mass"));
    CHECK(metric_of(w, "topk_kept") <= 1);
    window_min = std::min(window_min, metric_of(w, "topk_kept"));
  }
  CHECK(window_min < 0.5);  // negative control: a window misses the heavy hitters
  ex.eval.topk = 0;
  const RunResult none = run_experiment(ex, *src, 1);
  for (const auto& m : none.metrics) CHECK(std::string(m.name).rfind("topk", 0) != 0);
}

TEST_CASE("metrics: compute_metrics runs only the metrics that apply under the eval, as the writers' columns", "[metrics]") {
  EvalSpec eval;
  eval.topk = 0;
  const std::vector<char> on = metrics_applying(eval);
  const auto& reg = metric_registry();
  REQUIRE(on.size() == reg.size());
  std::set<std::string> columns;
  for (const auto& col : metric_columns(eval)) columns.insert(col.name);
  for (size_t i = 0; i < reg.size(); ++i) CHECK(bool(on[i]) == (columns.count(reg[i].name) > 0));
  CHECK(!on[metric_index("topk_mass")]);
  CHECK(on[metric_index("rel_err")]);
  // A row whose context would give topk_mass 0.6: the mask decides whether it runs, not the metric's
  // own guard (the negative control: masked off, it is NaN although c.topk = 2).
  const std::vector<double> probs = {0.4, 0.2, 0.2, 0.1, 0.1};
  Answer a;
  MetricContext c;
  c.t = 5, c.probs = probs.data(), c.answer = &a, c.topk = 2;
  std::vector<char> only(reg.size(), 0);
  only[metric_index("topk_mass")] = 1;
  MetricRow row;
  compute_metrics(c, row, only);
  CHECK(row.value[metric_index("topk_mass")] == Approx(0.6));
  for (size_t i = 0; i < reg.size(); ++i)
    if (!only[i]) CHECK(std::isnan(row.value[i]));
  only[metric_index("topk_mass")] = 0;
  compute_metrics(c, row, only);
  CHECK(std::isnan(row.value[metric_index("topk_mass")]));
  CHECK_THROWS_WITH(compute_metrics(c, row, std::vector<char>(3, 1)), Catch::Contains("an applies mask of 3 metrics"));
}

namespace {
MetricRow row(int layer, int head, double rel_err, double kept_mass, double topk_kept, double topk_mass) {
  MetricRow r;
  r.value.fill(NAN);
  r.layer = layer, r.head = head;
  r.value[metric_index("rel_err")] = rel_err;
  r.value[metric_index("kept_mass")] = kept_mass;
  r.value[metric_index("topk_kept")] = topk_kept;
  r.value[metric_index("topk_mass")] = topk_mass;
  return r;
}
}  // namespace

TEST_CASE("task: retrieval heads are the most concentrated tenth of (layer, head), and the scores aggregate over them and per layer",
          "[task]") {
  // 2 layers × 10 query heads, two steps each: ⌈10%⌉ = 2 retrieval heads, (1, 3) and (0, 7), whose
  // topk_mass is largest; rel_err 0.5 there, 0.1 elsewhere; layer 1's kept mass lower.
  PolicyResult pol;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 10; ++h)
      for (int s = 0; s < 2; ++s) {
        const bool rh = (l == 1 && h == 3) || (l == 0 && h == 7);
        pol.rows.push_back(row(l, h, rh ? 0.5 : 0.1, l == 1 ? 0.6 : 0.9, rh ? 0.25 : 1.0, rh ? 0.9 : 0.3 + 0.01 * h));
      }
  RunResult res;
  res.policies = {pol};
  const auto rheads = retrieval_heads(res);
  CHECK(rheads == std::set<std::pair<int, int>>{{0, 7}, {1, 3}});
  TaskRow r;
  offline_scores(pol, rheads, r);
  CHECK(r.rel_err_rheads == Approx(0.5));
  CHECK(r.topk_kept_rheads == Approx(0.25));
  CHECK(r.kept_mass_rheads == Approx(0.75));  // one head in each layer
  CHECK(r.topk_kept == Approx((0.25 * 2 + 18) / 20));
  CHECK(r.rel_err_worst_layer == Approx((0.5 + 9 * 0.1) / 10));  // both layers alike: either one
  CHECK(r.kept_mass_worst_layer == Approx(0.6));                    // layer 1
  CHECK(r.topk_kept_worst_layer == Approx((0.25 + 9) / 10));
  // Negative controls: other heads give other scores; a policy with no token subset has none.
  TaskRow other;
  offline_scores(pol, {{0, 0}, {1, 0}}, other);
  CHECK(other.rel_err_rheads == Approx(0.1));
  PolicyResult subgen;
  for (const auto& x : pol.rows) subgen.rows.push_back(row(x.layer, x.head, 0.2, NAN, NAN, x.value[metric_index("topk_mass")]));
  TaskRow s;
  offline_scores(subgen, rheads, s);
  CHECK(s.rel_err_rheads == Approx(0.2));
  CHECK(std::isnan(s.topk_kept));
  CHECK(std::isnan(s.kept_mass_worst_layer));
  CHECK(offline_score_columns().size() == 7);
  // Without topk_mass (eval.topk = 0) there are no retrieval heads.
  RunResult bare;
  bare.policies = {subgen};
  for (auto& x : bare.policies[0].rows) x.value[metric_index("topk_mass")] = NAN;
  CHECK(retrieval_heads(bare).empty());
}
