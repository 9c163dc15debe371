// H2O (Zhang et al., 2023): Definition 2.1 invariants of the eviction policy at every step, eviction by
// lowest accumulated score against an independent re-implementation, and the greedy (1 − 1/e)
// guarantee for monotone submodular objectives built from attention (brute force, n ≤ 20, k ≤ 6),
// with a non-submodular negative control.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "helpers.hpp"
#include "submodular.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/analysis/objectives.hpp"
#include "kvsim/replay/reference.hpp"

using namespace kvsim;
using namespace kvsim::test;

namespace {

Params h2o(int64_t budget, double heavy = 0.5) {
  Params p;
  p.set("budget", budget);
  p.set("heavy_ratio", heavy);
  return p;
}

}  // namespace

namespace {

/// Replays `pol` over a 300-token stream (query heads 0 and 1 of KV head 0) and returns the first step
/// that breaks H2O Definition 2.1 (|S_t| ≤ B, |S_t \ S_{t−1}| ≤ 1), the recent window, or H2O's eviction
/// rule (the evicted token has the lowest accumulated group-mean attention among the non-recent ones of
/// S_{t−1}, ties: oldest — scores re-implemented here); −1 when none does.
int64_t def21_violation(Policy& pol, const SynthSource& src, int64_t B, int64_t recent) {
  MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  MatD Q(2, 8);
  MatF Q0 = src.read(0, Tensor::q, 0), Q1 = src.read(0, Tensor::q, 1);
  const double scale = src.meta().softmax_scale;
  std::vector<Answer> ans(2);
  std::set<int64_t> prev;
  std::map<int64_t, double> score;
  for (int64_t t = 0; t < 300; ++t) {
    pol.observe(t, K.row(t).data(), V.row(t).data());
    Q.row(0) = Q0.row(t).cast<double>() * scale;
    Q.row(1) = Q1.row(t).cast<double>() * scale;
    ans[0] = ans[1] = Answer{};
    pol.attend(t + 1, Q, &ans, nullptr);
    std::set<int64_t> cur(ans[0].kept.begin(), ans[0].kept.end());
    if (cur != std::set<int64_t>(ans[1].kept.begin(), ans[1].kept.end())) return t;  // one cache per KV head
    if (int64_t(cur.size()) > B) return t;                                              // |S_t| ≤ B
    int64_t added = 0;
    for (int64_t j : cur) added += !prev.count(j);
    if (added > 1) return t;                                                            // |S_t \ S_{t−1}| ≤ 1
    for (int64_t j = std::max<int64_t>(0, t - recent + 1); j <= t; ++j)
      if (!cur.count(j)) return t;                                                      // recent kept
    if (int64_t(prev.size()) == B) {
      int64_t evicted = -1;
      for (int64_t j : prev)
        if (!cur.count(j)) evicted = j;
      if (evicted < 0) return t;
      for (int64_t j : prev)
        if (j <= t - recent && j != evicted && !(score[evicted] < score[j] + 1e-12)) return t;
      score.erase(evicted);
    }
    std::vector<int64_t> ids(cur.begin(), cur.end());
    for (int g = 0; g < 2; ++g) {  // this step's attention over S_t, accumulated (group mean)
      std::vector<double> l;
      double mx = -INFINITY;
      for (int64_t j : ids) {
        l.push_back(K.row(j).cast<double>().dot(Q.row(g)));
        mx = std::max(mx, l.back());
      }
      double sum = 0;
      for (double& x : l) sum += (x = std::exp(x - mx));
      for (size_t r = 0; r < ids.size(); ++r) score[ids[r]] += l[r] / sum / 2.0;
    }
    prev = cur;
  }
  return -1;
}

}  // namespace

TEST_CASE("h2o: Definition 2.1 invariants and the recent window at every step", "[h2o]") {
  const StreamInfo info = test::stream_info(300, 8, 2);
  for (std::string preset : {"heavy_hitter", "gaussian"}) {
    SynthSource src(test::small_synth(preset, 300, 8, 1, 2, 1));
    for (int64_t B : {10, 33}) {
      for (double heavy : {0.5, 0.7}) {
        auto pol = make_policy("h2o", h2o(B, heavy), info);
        const int64_t recent = B - std::llround(heavy * B);
        REQUIRE(def21_violation(*pol, src, B, recent) == -1);
        // Negative controls, rejected by the same check: a window of B (Def. 2.1 holds, but it evicts
        // the oldest, not the lowest score) and uniform sampling at B (it redraws its set).
        Params w;
        w.set("budget", B);
        auto win = make_policy("window", w, info);
        CHECK(def21_violation(*win, src, B, recent) >= 0);
        auto uni = make_policy("uniform", w, info);
        CHECK(def21_violation(*uni, src, B, recent) >= 0);
      }
    }
  }
}

TEST_CASE("h2o objectives: the greedy check has power: top-k by column sum fails it where greedy passes", "[h2o][submodular]") {
  // Causal attention of 16 queries: 4 near-duplicate tokens D (columns 0-3: every query that sees
  // them gives each 0.06, so their columns have the largest sums, 0.78-0.96) and 4 block tokens E_b
  // (columns 4-7: 0.3 from queries 8 + 2b and 9 + 2b; column sum 0.6). Facility location: f(D) = 16·0.06
  // = 0.96, OPT = 2.4; greedy takes one D and three E's (2.4); top-k by column sum the four D's
  // (ratio 0.4 < 1 − 1/e).
  MatD A = MatD::Zero(16, 16);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j <= std::min(i, 3); ++j) A(i, j) = 0.06;
  for (int b = 0; b < 4; ++b) A(8 + 2 * b, 4 + b) = A(9 + 2 * b, 4 + b) = 0.3;
  const double c = 1 - std::exp(-1.0), opt = facility_brute(A, 16, 4), greedy = facility_greedy(A, 16, 4);
  CHECK(opt == Approx(2.4));
  CHECK(greedy >= c * opt);
  const double topk = facility_value(A, 16, {0, 1, 2, 3});  // the 4 largest column sums
  CHECK(topk == Approx(0.96));
  CHECK(topk < c * opt);
  CHECK(theorem44_verdict(topk, greedy, opt, 0, 0) == 0.0);
  CHECK(theorem44_verdict(greedy, greedy, opt, 0, 0) == 1.0);
  CHECK(theorem44_alpha(topk, greedy, opt).first == Approx(1 - 0.4 / c));  // the α top-k would need
}

TEST_CASE("h2o objectives: greedy reaches (1 - 1/e) OPT on attention-built submodular functions", "[h2o][submodular]") {
  const double bound = 1 - std::exp(-1.0);
  int instances = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const int n = 16 + trial % 5;  // ≤ 20 tokens
    auto p = test::small_synth(trial % 2 ? "heavy_hitter" : "gaussian", n, 8, 1, 1, 1);
    p.seed = 40 + trial;
    SynthSource src(p);
    MatF Q = src.read(0, Tensor::q, 0), Kf = src.read(0, Tensor::k, 0), Vf = src.read(0, Tensor::v, 0);
    MatD K = Kf.cast<double>(), V = Vf.cast<double>();
    std::vector<int64_t> steps;
    for (int t = 1; t <= n; ++t) steps.push_back(t);
    ReferenceBlock ref;
    exact_attention(Q, K, V, src.meta().softmax_scale, steps, ref);
    SetFn facility = facility_location(ref.probs, n);
    SetFn logmass = log_partition_mass(ref.probs, n - 1);
    for (auto* f : {&facility, &logmass}) {
      REQUIRE(looks_submodular(*f, n));
      for (int k = 1; k <= 6; ++k) {
        double g = greedy(*f, n, k), opt = brute(*f, n, k);
        REQUIRE(g >= bound * opt - 1e-12);
        REQUIRE(g <= opt + 1e-12);
        ++instances;
      }
    }
  }
  CHECK(instances == 72);
  // Negative control: a complementary (non-submodular) objective on which greedy falls below the
  // bound: token 0 alone is worth 0.4, tokens 1 and 2 are worth 1 only together.
  SetFn pair = [](const std::vector<int>& S) {
    bool has0 = std::count(S.begin(), S.end(), 0), has1 = std::count(S.begin(), S.end(), 1),
         has2 = std::count(S.begin(), S.end(), 2);
    if (has1 && has2) return 1.0;
    return has0 ? 0.4 : 0.0;
  };
  CHECK_FALSE(looks_submodular(pair, 3));
  CHECK(greedy(pair, 3, 2) < bound * brute(pair, 3, 2));
}

TEST_CASE("h2o oracle: global scores are attention column sums and eviction keeps their top tokens", "[h2o]") {
  SynthSource src(test::small_synth("heavy_hitter", 120, 8, 1, 1, 1));
  MatF Q = src.read(0, Tensor::q, 0), K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  const double scale = src.meta().softmax_scale;
  // global_attention_scores == naive column sums of the causal attention matrix.
  VecD g = global_attention_scores(Q, K.cast<double>(), scale);
  VecD naive = VecD::Zero(120);
  for (int64_t t = 0; t < 120; ++t) {
    VecD l = (K.topRows(t + 1).cast<double>() * Q.row(t).cast<double>().transpose()) * scale;
    VecD p = (l.array() - l.maxCoeff()).exp().matrix();
    naive.head(t + 1) += p / p.sum();
  }
  REQUIRE((g - naive).norm() <= 1e-10 * naive.norm());
  CHECK(g.sum() == Approx(120.0).epsilon(1e-12));  // every query's attention sums to 1
  // With fixed scores, the heavy part of the cache ends as the top-B_heavy global scores among the
  // tokens that have left the recent window.
  const int64_t B = 20, recent = 10;
  const StreamInfo info = test::stream_info(120, 8);
  Params p = h2o(B);
  p.set("score", std::string("oracle"));
  auto pol = make_policy("h2o", p, info);
  REQUIRE(needs_global_scores(*pol));
  REQUIRE_FALSE(pol->needs_every_query());
  set_global_scores(*pol, {&g});
  for (int64_t t = 0; t < 120; ++t) pol->observe(t, K.row(t).data(), V.row(t).data());
  std::vector<Answer> ans(1);
  pol->attend(120, MatD::Zero(1, 8), &ans, nullptr);
  std::set<int64_t> kept(ans[0].kept.begin(), ans[0].kept.end());
  std::vector<int64_t> old(120 - recent);
  for (int64_t j = 0; j < 120 - recent; ++j) old[j] = j;
  std::sort(old.begin(), old.end(), [&](int64_t a, int64_t b) { return g[a] != g[b] ? g[a] > g[b] : a < b; });
  std::set<int64_t> want(old.begin(), old.begin() + (B - recent));
  for (int64_t j = 120 - recent; j < 120; ++j) want.insert(j);
  CHECK(kept == want);
}

TEST_CASE("h2o objectives: lazy greedy equals plain greedy and respects the brute-force optimum", "[h2o][submodular]") {
  for (int trial = 0; trial < 8; ++trial) {
    auto p = test::small_synth(trial % 2 ? "heavy_hitter" : "gaussian", 18, 8, 1, 1, 1);
    p.seed = 300 + trial;
    SynthSource src(p);
    MatF Q = src.read(0, Tensor::q, 0);
    MatD K = src.read(0, Tensor::k, 0).cast<double>(), V = src.read(0, Tensor::v, 0).cast<double>();
    std::vector<int64_t> steps;
    for (int t = 1; t <= 18; ++t) steps.push_back(t);
    ReferenceBlock ref;
    exact_attention(Q, K, V, src.meta().softmax_scale, steps, ref);
    for (int64_t t : {6, 12, 18}) {
      SetFn f = facility_location(ref.probs, int(t));
      for (int64_t m = 1; m <= 5; ++m) {
        const double lazy = facility_greedy(ref.probs, t, m);
        const double plain = greedy(f, int(t), int(m));
        const double opt = facility_brute(ref.probs, t, m);
        REQUIRE(lazy == Approx(plain).epsilon(1e-12));
        REQUIRE(opt == Approx(brute(f, int(t), int(m))).epsilon(1e-12));
        REQUIRE(lazy <= opt + 1e-12);
        REQUIRE(lazy >= (1 - std::exp(-1.0)) * opt - 1e-12);
        std::vector<int64_t> S;
        for (int64_t j = 0; j < m; ++j) S.push_back(j);
        REQUIRE(facility_value(ref.probs, t, S) <= opt + 1e-12);
      }
    }
  }
  CHECK(std::isnan(facility_brute(MatD::Zero(200, 200), 200, 10)));  // C(200, 10) is beyond the limit
  // C(t, t) = 1 and C(t, t − 1) = t are feasible at any t: OPT is the whole set's (every column kept)
  // value, and the best (t − 1)-subset's by enumeration (control: C(40, 20) ≈ 1.4e11 is refused).
  {
    MatD A = MatD::Zero(40, 40);
    for (int i = 0; i < 40; ++i)
      for (int j = 0; j <= i; ++j) A(i, j) = 1.0 / (i + 1);
    std::vector<int64_t> all(40);
    for (int64_t j = 0; j < 40; ++j) all[size_t(j)] = j;
    CHECK(facility_brute(A, 40, 40) == facility_value(A, 40, all));
    CHECK_FALSE(std::isnan(facility_brute(A, 40, 39)));
    CHECK(std::isnan(facility_brute(A, 40, 20)));
  }
}

TEST_CASE("h2o objectives: Theorem 4.4 verdicts", "[h2o]") {
  const double c = 1 - std::exp(-1.0);
  CHECK(theorem44_verdict(1.0, 1.0, NAN, 0, 0) == 1.0);          // f ≥ greedy ≥ (1-1/e)·OPT always
  CHECK(theorem44_verdict(0.5 * c, 1.0, NAN, 0, 0) == 0.0);      // f < (1-1/e)·greedy ≤ (1-1/e)·OPT
  CHECK(std::isnan(theorem44_verdict(0.8, 1.0, NAN, 0, 0)));     // depends on where OPT lies
  CHECK(theorem44_verdict(0.8, 1.0, 1.2, 0, 0) == 1.0);          // OPT known: 0.8 ≥ 0.632·1.2
  CHECK(theorem44_verdict(0.7, 1.0, 1.2, 0.2, 0) == 1.0);        // α loosens the bound
  CHECK(theorem44_verdict(0.1, 1.0, 1.2, 0, 0.05) == 0.0);
  // Rounding: f equal to the bound up to a few ulps holds, in either summation order.
  const double opt = 0.1 + 0.2 + 0.3, f = c * (0.3 + 0.2 + 0.1);
  CHECK(theorem44_verdict(f, f / c, opt, 0, 0) == 1.0);
  CHECK(theorem44_alpha(f, f / c, opt).first == 0.0);
  // α read backwards: exact with OPT, a bracket without; zero exactly when the verdict at α = 0 holds.
  CHECK(theorem44_alpha(0.5 * c, 1.0, 1.0).first == Approx(0.5));
  const auto br = theorem44_alpha(0.55, 1.0, NAN);
  CHECK(br.first == Approx(1 - 0.55 / c));
  CHECK(br.second == Approx(1 - 0.55));
  CHECK(br.first < br.second);
  CHECK(theorem44_alpha(1.0, 1.0, NAN).second == 0.0);
}

TEST_CASE("h2o objectives: engine reports them per evaluated step", "[h2o][engine]") {
  SynthSource src(test::small_synth("heavy_hitter", 96, 8, 1, 2, 1));
  Experiment ex;
  ex.eval.every = 4;
  ex.eval.from = 4;  // evaluated steps 4, 8, ..., 96; objectives at the multiples of 8
  ex.eval.gqa = GqaMode::query_head;
  ex.eval.objectives = true;
  ex.eval.objectives_every = 8;
  ex.policies = {PolicySpec{"h2o", "h2o", h2o(12)}, PolicySpec{"oracle_topk", "oracle", [] {
                               Params p;
                               p.set("budget", int64_t(12));
                               return p;
                             }()},
                 PolicySpec{"window", "window", [] {
                               Params p;
                               p.set("budget", int64_t(12));
                               return p;
                             }()}};
  RunResult r = run_experiment(ex, src, 1);
  int due = 0;
  for (const auto& pr : r.policies) {
    for (const auto& row : pr.rows) {
      REQUIRE(metric_of(row, "log_value") <= metric_of(row, "log_opt") + 1e-12);
      if (pr.spec.name == "oracle_topk") REQUIRE(metric_of(row, "log_value") == Approx(metric_of(row, "log_opt")).epsilon(1e-12));
      const bool is_due = row.step % 8 == 0 || row.step == 96;
      REQUIRE(std::isnan(metric_of(row, "fl_value")) != is_due);
      if (!is_due) continue;
      ++due;
      REQUIRE(metric_of(row, "fl_value") <= row.step + 1e-9);  // each query contributes at most 1
      REQUIRE(metric_of(row, "fl_greedy") > 0);
      if (!std::isnan(metric_of(row, "fl_opt"))) {
        REQUIRE(metric_of(row, "fl_value") <= metric_of(row, "fl_opt") + 1e-12);
        REQUIRE(metric_of(row, "fl_greedy") >= (1 - std::exp(-1.0)) * metric_of(row, "fl_opt") - 1e-12);
      }
      REQUIRE(metric_of(row, "fl_ratio") == Approx(metric_of(row, "fl_value") / metric_of(row, "fl_greedy")));
      const double lo = metric_of(row, "thm44_alpha_lo"), hi = metric_of(row, "thm44_alpha_hi");
      REQUIRE(lo <= hi);
      if (!std::isnan(metric_of(row, "fl_opt"))) REQUIRE(lo == hi);
      if (metric_of(row, "thm44") == 1.0) REQUIRE(hi == 0.0);  // the α = 0 verdict and α agree
      if (metric_of(row, "thm44") == 0.0) REQUIRE(lo > 0.0);
    }
  }
  CHECK(due == 3 * 2 * 12);  // 3 policies × 2 heads × steps {8, 16, ..., 96}
}

TEST_CASE("h2o objectives: settings whose evaluated steps never meet an objective step are refused", "[h2o][engine]") {
  SynthSource src(test::small_synth("heavy_hitter", 96, 8, 1, 2, 1));
  Experiment ex;
  ex.eval.every = 16;  // evaluated steps 1, 17, 33, 49, 65, 81 and the last, 96
  ex.eval.objectives = true;
  ex.eval.objectives_every = 32;
  ex.eval.objectives_max_t = 64;  // the last step is past it: no objective step at all
  ex.policies = {PolicySpec{"h2o", "h2o", h2o(12)}};
  try {
    run_experiment(ex, src, 1);
    FAIL("expected an error naming eval.every and eval.objectives_every");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("eval.every = 16") != std::string::npos);
    CHECK(msg.find("eval.objectives_every = 32") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK_THROWS_AS(check_objective_steps(ex.eval, 96), Error);
  // Negative controls: a step that meets a multiple (from = 32 evaluates 32, 48, 64), or the last
  // step within objectives_max_t, or objectives off, runs.
  EvalSpec ok = ex.eval;
  ok.from = 32;
  CHECK_NOTHROW(check_objective_steps(ok, 96));
  CHECK_NOTHROW(check_objective_steps(ex.eval, 64));
  ok = ex.eval;
  ok.objectives = false;
  CHECK_NOTHROW(check_objective_steps(ok, 96));
  ok.objectives = true;
  ok.every = 1;  // every step evaluated: 32 and 64 are objective steps
  CHECK_NOTHROW(run_experiment([&] { Experiment e = ex; e.eval = ok; return e; }(), src, 1));
}
