// Budgets per unit (include/kvsim/analysis/allocation.hpp) and the budgets file
// (include/kvsim/policies/budgets.hpp): the greedy rule against brute force, the file's refusals.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "kvsim/analysis/allocation.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/policies/budgets.hpp"
#include "kvsim/policies/policy.hpp"

using namespace kvsim;

namespace {

/// The minimum of Σ_u h_u(b_u) over every integer split with Σ b_u = total, lo_u ≤ b_u ≤ hi_u.
double brute_force(const std::vector<BudgetCurve>& hulls, int64_t total, size_t u = 0) {
  if (u == hulls.size()) return total == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  double best = std::numeric_limits<double>::infinity();
  for (int64_t b = hulls[u].tokens.front(); b <= std::min(total, hulls[u].tokens.back()); ++b)
    best = std::min(best, minorant_value(hulls[u], double(b)) + brute_force(hulls, total - b, u + 1));
  return best;
}

BudgetCurve random_convex(std::mt19937_64& rng) {
  // Decreasing, convex: slopes drawn negative, then sorted ascending (steepest first).
  std::uniform_int_distribution<int> len(1, 6);
  std::uniform_real_distribution<double> slope(-1.0, 0.0);
  BudgetCurve c;
  std::vector<double> s(3);
  for (auto& x : s) x = slope(rng);
  std::sort(s.begin(), s.end());
  c.tokens = {2};
  c.value = {5.0};
  for (double x : s) {
    const int l = len(rng);
    c.tokens.push_back(c.tokens.back() + l);
    c.value.push_back(c.value.back() + x * l);
  }
  return c;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kvsim_test_" + name;
  std::ofstream(path) << text;
  return path;
}

std::string budgets_json(const std::string& budgets, const std::string& extra = "", int64_t memory_tokens = 10) {
  return "{\"kvsim_budgets\": 1, \"n_layers\": 4, \"n_kv_heads\": 2, \"n\": 100, \"layers\": [1, 3]" + extra +
         ", \"allocations\": [{\"memory\": 0.1, \"memory_tokens\": " + std::to_string(memory_tokens) +
         ", \"budgets\": " + budgets + "}]}";
}

}  // namespace

TEST_CASE("convex_minorant: monotone, then the lower convex hull") {
  // 30 → 40 rises (made flat by rule 1); (20, 6) lies above the chord (10, 8)–(30, 2) (removed by rule 2).
  const BudgetCurve h = convex_minorant({{10, 20, 30, 40}, {8.0, 6.0, 2.0, 3.0}});
  CHECK(h.tokens == std::vector<int64_t>{10, 30, 40});
  CHECK(h.value == std::vector<double>{8.0, 2.0, 2.0});
  CHECK(minorant_value(h, 20) == Approx(5.0));
  CHECK(minorant_value(h, 5) == 8.0);  // clamped
  // Negative control: a convex decreasing curve keeps every point.
  CHECK(convex_minorant({{1, 2, 3}, {4.0, 2.0, 1.0}}).tokens.size() == 3);
  CHECK_THROWS_AS(convex_minorant({{2, 1}, {1.0, 0.0}}), Error);
}

TEST_CASE("allocate_budgets: a known optimum, and brute force on random convex curves") {
  // Unit 0 falls by 1 per token over [10, 20], then 0.1 per token to 40; unit 1 by 0.5 per token over [10, 40].
  // At a mean of 30 the optimum gives unit 0 its steep 10 tokens and unit 1 the rest: (20, 40).
  const std::vector<BudgetCurve> known = {{{10, 20, 40}, {30.0, 20.0, 18.0}}, {{10, 40}, {30.0, 15.0}}};
  const auto r = allocate_budgets(known, 30);
  CHECK(r.budgets == std::vector<int64_t>{20, 40});
  CHECK(r.objective == Approx(35.0));
  CHECK(r.uniform_objective == Approx(19.0 + 20.0));  // the uniform split (30, 30) is worse: not vacuous
  CHECK(r.objective == Approx(brute_force({convex_minorant(known[0]), convex_minorant(known[1])}, 60)));
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<BudgetCurve> cs = {random_convex(rng), random_convex(rng), random_convex(rng)};
    int64_t lo = 0, hi = 0;
    for (const auto& c : cs) lo += c.tokens.front(), hi += c.tokens.back();
    for (int64_t mean = (lo + 2) / 3; mean * 3 <= hi; ++mean) {
      const auto a = allocate_budgets(cs, mean);
      CHECK(std::accumulate(a.budgets.begin(), a.budgets.end(), int64_t(0)) == 3 * mean);
      CHECK(a.objective == Approx(brute_force(cs, 3 * mean)).margin(1e-9));
      CHECK(a.objective <= a.uniform_objective + 1e-9);
    }
  }
}

TEST_CASE("allocate_budgets: on a non-convex curve at most one unit is off a hull vertex") {
  const std::vector<BudgetCurve> cs = {{{10, 20, 30, 40}, {10.0, 9.5, 2.0, 1.5}}, {{10, 20, 30, 40}, {10.0, 6.0, 4.0, 3.0}},
                                       {{10, 40}, {10.0, 4.0}}};
  for (int64_t mean = 10; mean <= 40; ++mean) {
    const auto a = allocate_budgets(cs, mean);
    int off = 0;
    for (size_t u = 0; u < cs.size(); ++u) {
      const auto h = convex_minorant(cs[u]);
      off += std::find(h.tokens.begin(), h.tokens.end(), a.budgets[u]) == h.tokens.end();
    }
    CHECK(off <= 1);
  }
  // Unit 0's point (20, 9.5) lies above its hull: the hull skips it, so no budget of unit 0 ends there.
  CHECK(convex_minorant(cs[0]).tokens == std::vector<int64_t>{10, 30, 40});
  CHECK_THROWS_WITH(allocate_budgets(cs, 41), Catch::Contains("outside what the measured curves hold"));
}

TEST_CASE("budgets file: round trip, scaling, and one-line refusals naming the key") {
  const std::string good = write_temp("good.json", budgets_json("[[5, 15], [12, 8]]"));
  const BudgetsFile f = read_budgets_file(good);
  CHECK(f.layers == std::vector<int>{1, 3});
  CHECK(f.allocations[0].budgets[0][1] == 15);
  const std::string copy = write_temp("copy.json", "");
  write_budgets_file(copy, f);
  CHECK(read_budgets_file(copy).allocations[0].budgets == f.allocations[0].budgets);
  // Scaled to another n: the sum stays caches × M exactly (here 4 × 7 = 28), each near b·7/10.
  const auto s = scale_budgets(f.allocations[0], 7);
  CHECK(s[0][0] + s[0][1] + s[1][0] + s[1][1] == 28);
  CHECK(std::abs(double(s[0][1]) - 10.5) <= 1.0);
  auto bad = [](const std::string& name, const std::string& text, const std::string& needle) {
    CHECK_THROWS_WITH(read_budgets_file(write_temp(name, text)), Catch::Contains(needle));
  };
  bad("shape.json", budgets_json("[[5, 15, 3], [12, 8]]"), "budgets[0] has 3 entries, not one per KV head (2)");
  bad("rows.json", budgets_json("[[5, 15]]"), "budgets has 1 rows, not one per layer (2)");
  bad("neg.json", budgets_json("[[-5, 25], [12, 8]]"), "budgets[0][0]' must be ≥ 1");
  bad("float.json", budgets_json("[[5.5, 14.5], [12, 8]]"), "budgets[0][0]' must be an integer");
  bad("total.json", budgets_json("[[5, 16], [12, 8]]"), "budgets sum to 41 tokens, not 4 caches × 10");
  bad("mtok.json", budgets_json("[[5, 15], [12, 8]]", "", 11), "memory_tokens = 11, but memory 0.1 at n = 100 is 10 tokens");
  bad("layer.json", budgets_json("[[5, 15], [12, 8]]", ", \"granularity\": \"layer\""), "gives every KV head of a layer one budget");
  bad("notjson.json", "{budgets", "not JSON");
  bad("nokey.json", "{\"kvsim_budgets\": 1}", "missing key 'n_layers'");
  // A cache of another model's shape, or a layer the file does not cover, is refused by cell_budget.
  Params mem;
  mem.set("memory", 0.1);
  StreamInfo st;
  st.n = 100, st.n_layers = 4, st.n_kv_heads = 2, st.layer = 3, st.kv_head = 1;
  CHECK(cell_budget(good, mem, st) == 8);
  CHECK(cell_memory_tokens([&] { Params p = mem; p.set("budgets_file", good); return p; }(), st) == 8);
  CHECK(cell_memory_tokens(mem, st) == 10);  // negative control: without the file, M
  st.layer = 2;
  CHECK_THROWS_WITH(cell_budget(good, mem, st), Catch::Contains("no budgets for layer 2"));
  st.layer = 3, st.n_kv_heads = 3;
  CHECK_THROWS_WITH(cell_budget(good, mem, st), Catch::Contains("a model of 4 layers × 2 KV heads"));
  st.n_kv_heads = 2;
  Params other;
  other.set("memory", 0.2);
  CHECK_THROWS_WITH(cell_budget(good, other, st), Catch::Contains("no allocation for memory"));
  // budgets_memory picks the allocation; memory (here pinned to 20 tokens, which the file does not hold at
  // n = 100) is the mean it is scaled to: kvsim task's pinning. Layer 3, head 1 has 8 of 10: 16 of 20.
  Params pinned;
  pinned.set("memory", int64_t(20));
  pinned.set("budgets_file", good);
  CHECK_THROWS_WITH(cell_memory_tokens(pinned, st), Catch::Contains("no allocation for memory"));  // without it
  pinned.set("budgets_memory", 0.1);
  CHECK(cell_memory_tokens(pinned, st) == 16);
  CHECK(cell_budget(good, mem, pinned, st) == 16);
  check_policy_spec("h2o", pinned);
  Params lone;
  lone.set("memory", 0.1);
  lone.set("budgets_memory", 0.1);
  CHECK_THROWS_WITH(check_policy_spec("h2o", lone), Catch::Contains("'budgets_memory' needs 'budgets_file'"));
}
