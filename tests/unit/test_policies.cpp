// Baseline policy semantics on hand-made streams (window, sink, exact, oracle_topk, uniform; the scorers' victim rule via knorm).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "helpers.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/core/rng.hpp"

using namespace kvsim;

namespace {

StreamInfo info(int64_t n, int d, int nq = 1, uint64_t seed = 1) {
  StreamInfo s = test::stream_info(n, d, nq);
  s.seed = seed;
  return s;
}

Params params(std::initializer_list<std::pair<std::string, ParamValue>> kv) {
  Params p;
  for (auto& [k, v] : kv) p.set(k, v);
  return p;
}

/// Feed a stream of n distinct tokens; return the kept set after each step t.
std::vector<std::vector<int64_t>> kept_sets(Policy& pol, int64_t n, int d) {
  std::vector<std::vector<int64_t>> out;
  MatD q = MatD::Ones(1, d);
  std::vector<Answer> ans(1);
  for (int64_t t = 0; t < n; ++t) {
    VecF k = VecF::Constant(d, float(t % 5) * 0.1f), v = VecF::Constant(d, float(t));
    pol.observe(t, k.data(), v.data());
    ans[0] = Answer{};
    pol.attend(t + 1, q, &ans, nullptr);
    REQUIRE(ans[0].has_kept);
    auto s = ans[0].kept;
    std::sort(s.begin(), s.end());
    out.push_back(s);
  }
  return out;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> r;
  for (int64_t i = a; i < b; ++i) r.push_back(i);
  return r;
}

}  // namespace

TEST_CASE("policies: window keeps exactly the w most recent tokens", "[policies]") {
  auto pol = make_policy("window", params({{"budget", int64_t(5)}}), info(30, 4));
  auto sets = kept_sets(*pol, 30, 4);
  for (int64_t t = 1; t <= 30; ++t) REQUIRE(sets[t - 1] == range(std::max<int64_t>(0, t - 5), t));
  CHECK(pol->cache_tokens() == 5);
  CHECK(pol->cache_vectors() == 10);
}

TEST_CASE("policies: sink keeps the first k tokens plus the most recent window", "[policies]") {
  auto pol = make_policy("sink", params({{"budget", int64_t(7)}, {"sink", int64_t(3)}}), info(40, 4));
  auto sets = kept_sets(*pol, 40, 4);
  for (int64_t t = 1; t <= 40; ++t) {
    std::vector<int64_t> want = range(0, std::min<int64_t>(3, t));
    for (int64_t i = std::max<int64_t>(3, t - 4); i < t; ++i) want.push_back(i);
    REQUIRE(sets[t - 1] == want);
  }
}

TEST_CASE("policies: budgets as fractions of n and bad parameters", "[policies]") {
  auto pol = make_policy("window", params({{"budget", 0.25}}), info(100, 4));
  auto sets = kept_sets(*pol, 100, 4);
  CHECK(sets.back().size() == 25);
  CHECK_THROWS_WITH(make_policy("window", params({{"budget", 1.5}}), info(100, 4)),
                    Catch::Contains("fractional budget must be in (0, 1]"));
  CHECK_THROWS_WITH(make_policy("window", params({{"budget", int64_t(5)}, {"bugdet", int64_t(3)}}), info(100, 4)),
                    Catch::Contains("unknown parameter 'bugdet'"));
  CHECK_THROWS_WITH(make_policy("sink", params({{"budget", int64_t(4)}, {"sink", int64_t(4)}}), info(100, 4)),
                    Catch::Contains("must exceed 'sink'"));
  CHECK_THROWS_WITH(make_policy("window", Params{}, info(100, 4)), Catch::Contains("missing parameter 'budget'"));
  CHECK_THROWS_WITH(make_policy("h2x", Params{}, info(100, 4)), Catch::Contains("unknown policy 'h2x'"));
}

TEST_CASE("policies: uniform keeps every prefix token with probability B/t", "[policies]") {
  // 4000 independent seeds; each position's inclusion count is Binomial(4000, B/t). A 4.5-sigma
  // band per position gives a family-wise false-alarm rate < 2e-4 over the 20 positions.
  const int64_t n = 20, B = 5;
  const int trials = 4000;
  std::vector<int> count(n, 0);
  for (int s = 0; s < trials; ++s) {
    auto pol = make_policy("uniform", params({{"budget", B}}), info(n, 2, 1, derive_seed({99, uint64_t(s)})));
    auto sets = kept_sets(*pol, n, 2);
    REQUIRE(int64_t(sets.back().size()) == B);
    for (int64_t j : sets.back()) ++count[j];
  }
  const double p = double(B) / n, sd = std::sqrt(trials * p * (1 - p));
  for (int64_t j = 0; j < n; ++j) {
    INFO("position " << j << " kept " << count[j] << " times");
    CHECK(std::abs(count[j] - trials * p) <= 4.5 * sd);
  }
  // Negative control: a biased reservoir (always replacing the first slot) fails the same band.
  std::vector<int> biased(n, 0);
  for (int s = 0; s < trials; ++s)
    for (int64_t j : range(n - B, n)) ++biased[j];  // "keep the last B" = a window, not a sample
  bool rejected = false;
  for (int64_t j = 0; j < n; ++j) rejected |= std::abs(biased[j] - trials * p) > 4.5 * sd;
  CHECK(rejected);
}

namespace {

Experiment experiment_for(const std::string& gqa) {
  Experiment ex;
  ex.seed = 3;
  ex.eval.every = 3;
  ex.eval.gqa = *parse_choice<GqaMode>(gqa);
  auto add = [&](const std::string& name, Params p) { ex.policies.push_back(PolicySpec{name, name, std::move(p)}); };
  add("exact", Params{});
  add("window", params({{"budget", int64_t(12)}}));
  add("sink", params({{"budget", int64_t(12)}, {"sink", int64_t(2)}}));
  add("uniform", params({{"budget", int64_t(12)}}));
  add("oracle_topk", params({{"budget", int64_t(12)}}));
  add("h2o", params({{"budget", int64_t(12)}}));
  return ex;
}

}  // namespace

TEST_CASE("policies: exact keeps all mass and oracle_topk beats every policy of its size",
          "[policies]") {
  SynthSource src(test::small_synth("heavy_hitter", 96, 8, 2, 4, 2));
  for (std::string gqa : {"query_head", "kv_head"}) {
    INFO("gqa = " << gqa);
    Experiment ex = experiment_for(gqa);
    RunResult r = run_experiment(ex, src, 1);
    const auto& exact = r.policies[0].rows;
    for (const auto& row : exact) {
      REQUIRE(metric_of(row, "kept_mass") == Approx(1.0).epsilon(1e-12));
      REQUIRE(metric_of(row, "rel_err") <= 1e-12);
      REQUIRE(metric_of(row, "tau_rel_err") <= 1e-12);
      REQUIRE(metric_of(row, "cache_tokens") == double(row.step));
    }
    const auto& oracle = r.policies[4].rows;
    for (size_t p : {size_t(1), size_t(2), size_t(3), size_t(5)}) {  // window, sink, uniform, h2o
      const auto& rows = r.policies[p].rows;
      REQUIRE(rows.size() == oracle.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        REQUIRE(rows[i].step == oracle[i].step);
        REQUIRE(rows[i].head == oracle[i].head);
        REQUIRE(metric_of(rows[i], "cache_tokens") == metric_of(oracle[i], "cache_tokens"));
        // Every policy's kept mass is bounded by the top-|S| mass of the same query.
        REQUIRE(metric_of(rows[i], "kept_mass") <= metric_of(rows[i], "oracle_mass") + 1e-12);
        if (gqa == "query_head") REQUIRE(metric_of(oracle[i], "kept_mass") >= metric_of(rows[i], "kept_mass") - 1e-12);
      }
      if (gqa == "kv_head") {
        // The shared (group) oracle set maximizes the group's total kept mass at each step.
        for (size_t i = 0; i + 1 < rows.size(); i += 2) {
          REQUIRE(rows[i].head / 2 == rows[i + 1].head / 2);
          REQUIRE(metric_of(oracle[i], "kept_mass") + metric_of(oracle[i + 1], "kept_mass") >= metric_of(rows[i], "kept_mass") + metric_of(rows[i + 1], "kept_mass") - 1e-12);
        }
      }
    }
    if (gqa == "query_head")
      for (const auto& row : oracle) REQUIRE(metric_of(row, "mass_ratio") == Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("policies: kv_head and query_head modes agree for score-free policies and memory is per KV head",
          "[policies]") {
  SynthSource src(test::small_synth("gaussian", 80, 8, 1, 4, 2));
  RunResult a = run_experiment(experiment_for("kv_head"), src, 1);
  RunResult b = run_experiment(experiment_for("query_head"), src, 1);
  for (size_t p : {size_t(1), size_t(2)}) {  // window, sink: same set whatever the grouping
    REQUIRE(a.policies[p].rows.size() == b.policies[p].rows.size());
    for (size_t i = 0; i < a.policies[p].rows.size(); ++i) {
      const auto &x = a.policies[p].rows[i], &y = b.policies[p].rows[i];
      REQUIRE(metric_of(x, "rel_err") == metric_of(y, "rel_err"));
      REQUIRE(metric_of(x, "kept_mass") == metric_of(y, "kept_mass"));
      // query_head mode stores one copy per query head: twice the bytes at group size 2.
      REQUIRE(metric_of(y, "cache_bytes") == 2 * metric_of(x, "cache_bytes"));
      REQUIRE(metric_of(x, "cache_bytes") == 2 * metric_of(x, "cache_tokens") * 8 * 4);
    }
  }
}

TEST_CASE("policies: hand-made stream - a far sink token is lost by window and kept by sink", "[policies]") {
  // Token 0 carries a key aligned with every query (an attention sink); the rest are orthogonal.
  const int d = 4;
  const int64_t n = 32;
  test::MemorySource src(1, 1, 1, n, d, 1.0);
  for (int64_t i = 0; i < n; ++i) {
    src.q(0, 0).row(i) << 5, 0, 0, 0;
    src.k(0, 0).row(i) << (i == 0 ? 1.f : 0.f), 1, 0, 0;
    src.v(0, 0).row(i) << (i == 0 ? 1.f : 0.f), 0, 1, 0;
  }
  Experiment ex = experiment_for("kv_head");
  ex.policies = {PolicySpec{"window", "window", params({{"budget", int64_t(8)}})},
                 PolicySpec{"sink", "sink", params({{"budget", int64_t(8)}, {"sink", int64_t(1)}})}};
  ex.eval.every = 1;
  RunResult r = run_experiment(ex, src, 1);
  const auto& w = r.policies[0].rows.back();
  const auto& s = r.policies[1].rows.back();
  // a_n(0) = e^5 / (e^5 + 31): the sink keeps it, the window does not.
  const double a0 = std::exp(5.0) / (std::exp(5.0) + 31);
  const double b0 = std::exp(5.0) / (std::exp(5.0) + 7);  // token 0's weight inside the sink cache
  CHECK(metric_of(w, "kept_mass") == Approx(8 * (1 - a0) / 31).epsilon(1e-12));
  CHECK(metric_of(s, "kept_mass") == Approx(a0 + 7 * (1 - a0) / 31).epsilon(1e-12));
  // Attn_n = (a0, 0, 1, 0); the window answers (0, 0, 1, 0), the sink (b0, 0, 1, 0).
  CHECK(metric_of(w, "rel_err") == Approx(a0 / std::sqrt(1 + a0 * a0)).epsilon(1e-12));
  CHECK(metric_of(s, "rel_err") == Approx((b0 - a0) / std::sqrt(1 + a0 * a0)).epsilon(1e-9));
}

TEST_CASE("policies: float32 policy arithmetic stays within 1e-5 of float64 with the same kept sets", "[policies][precision]") {
  // The documented accuracy of `[eval] policy_precision = "float32"` (sim/policies/slot_cache.hpp).
  SynthSource src(test::small_synth("heavy_hitter", 160, 64, 1, 4, 2));
  Experiment ex = experiment_for("kv_head");
  ex.policies.push_back({"buzz", "buzz", params({{"window", int64_t(12)}, {"threshold", int64_t(20)}, {"stride", int64_t(3)}})});
  ex.policies.push_back({"window", "window_all", Params()});
  ex.policies.back().params.set("budget", int64_t(160));  // keeps everything: rel_err is pure rounding
  RunResult d = run_experiment(ex, src, 1);
  ex.eval.policy_precision = Precision::float32;
  RunResult f = run_experiment(ex, src, 1);
  double worst = 0;
  for (size_t p = 0; p < d.policies.size(); ++p) {
    INFO(d.policies[p].spec.label);
    REQUIRE(d.policies[p].rows.size() == f.policies[p].rows.size());
    for (size_t i = 0; i < d.policies[p].rows.size(); ++i) {
      const auto &x = d.policies[p].rows[i], &y = f.policies[p].rows[i];
      REQUIRE(metric_of(x, "kept_mass") == Approx(metric_of(y, "kept_mass")).margin(1e-12));  // same kept set (probabilities from the reference)
      const double diff = std::abs(metric_of(x, "rel_err") - metric_of(y, "rel_err"));        // ≤ ‖z32 − z64‖ / ‖Attn‖
      worst = std::max(worst, diff);
      REQUIRE(diff <= 1e-5);
      // τ̂ sums the exponentials of float32 logits, so a logit's rounding (up to ~d·2⁻²⁴·Σ_i|k_i q_i|) moves log τ̂ by
      // as much: measured ≤ 1.1e-5 on this stream once uniform's blocked logits come from one SGEMM per group of
      // steps (≤ 1e-5 from a matrix–vector product per step).
      if (!std::isnan(metric_of(x, "tau_rel_err"))) REQUIRE(std::abs(metric_of(x, "tau_rel_err") - metric_of(y, "tau_rel_err")) <= 2e-5);
    }
  }
  // The full-budget window is exact up to rounding in both modes; float32 rounding is visible but small.
  for (const auto& row : f.policies.back().rows) REQUIRE(metric_of(row, "rel_err") <= 1e-5);
  double max32 = 0;
  for (const auto& row : f.policies.back().rows) max32 = std::max(max32, metric_of(row, "rel_err"));
  for (const auto& row : d.policies.back().rows) REQUIRE(metric_of(row, "rel_err") <= 1e-12);
  INFO("worst |rel_err(float32) − rel_err(float64)| = " << worst << ", full window float32 rel_err " << max32);
  CHECK(max32 > 1e-12);  // float32 arithmetic is really in use
}


namespace {

/// The kept positions (sorted) after each step of a cache of B tokens whose token t has score −norm[t]: when
/// full, the largest norm outside the `recent` newest (after t joins) leaves, ties to the oldest position, or to
/// the newest with ties_to_newest (the negative control's wrong rule). An independent re-implementation of
/// ScorerPolicy's victim (sim/policies/scorer.hpp).
std::vector<std::vector<int64_t>> norm_evictor(const std::vector<int>& norm, int64_t B, int64_t recent, bool ties_to_newest) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> set;
  for (int64_t t = 0; t < int64_t(norm.size()); ++t) {
    if (int64_t(set.size()) == B) {
      int64_t victim = -1;
      for (size_t i = 0; i < set.size(); ++i) {
        const int64_t p = set[i], vp = victim < 0 ? -1 : set[size_t(victim)];
        if (p > t - recent) continue;
        if (victim < 0 || norm[size_t(p)] > norm[size_t(vp)] ||
            (norm[size_t(p)] == norm[size_t(vp)] && (ties_to_newest ? p > vp : p < vp)))
          victim = int64_t(i);
      }
      if (victim < 0) throw Error("norm_evictor: nothing evictable");
      set.erase(set.begin() + victim);
    }
    set.push_back(t);
    out.push_back(set);
    std::sort(out.back().begin(), out.back().end());
  }
  return out;
}

}  // namespace

TEST_CASE("policies: a scorer's victim is the lowest score, ties to the oldest (knorm on tied key norms)", "[policies]") {
  // knorm's score is −‖k‖, fixed when a token joins. Keys of norm 1, 2 or 3 make many exact ties; the kept sets
  // must equal norm_evictor's at every step. Budgets cover the victim scan's 8 lanes, its tail and both at once.
  const int64_t n = 160;
  const int d = 4;
  std::vector<int> norm(n);
  for (int64_t t = 0; t < n; ++t) norm[size_t(t)] = 1 + int(mix64(uint64_t(t) + 11) % 3);
  for (const int64_t B : {5, 8, 13, 40}) {
    for (const double recent_ratio : {0.0, 0.25}) {
      auto pol = make_policy("knorm", params({{"budget", B}, {"recent_ratio", recent_ratio}}), info(n, d));
      const int64_t recent = std::min<int64_t>(std::llround(recent_ratio * double(B)), B - 1);
      const auto want = norm_evictor(norm, B, recent, false), wrong = norm_evictor(norm, B, recent, true);
      MatD q = MatD::Ones(1, d);
      std::vector<Answer> ans(1);
      int64_t differs_from_wrong = 0;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> k(d, 0.0f), v(d, 1.0f);
        k[0] = float(norm[size_t(t)]);
        pol->observe(t, k.data(), v.data());
        ans[0] = Answer{};
        pol->attend(t + 1, q, &ans, nullptr);
        std::vector<int64_t> kept = ans[0].kept;
        std::sort(kept.begin(), kept.end());
        INFO("B = " << B << ", recent_ratio = " << recent_ratio << ", step " << t);
        REQUIRE(kept == want[size_t(t)]);
        differs_from_wrong += kept != wrong[size_t(t)];
      }
      // Negative control: the ties-to-newest rule gives other kept sets on this stream, so the check has power.
      CHECK(differs_from_wrong > 0);
    }
  }
}

TEST_CASE("policies: oracle_topk answers attention over its kept set, the top-B of the group's exact rows",
          "[policies]") {
  // oracle_topk takes its answer from the exact rows it is handed (a_t renormalized over its set S); here it
  // is checked against attention over S formed from the keys (softmax of q·k over S, then Σ p v), and S
  // against the top-B of the group's summed rows found by sorting, ties to the older token (keys 3 and 4
  // are equal, so their weights tie).
  const int64_t n = 40, b = 10;
  const int d = 8, G = 2;
  Engine eng = make_engine({7});
  std::normal_distribution<double> normal;
  MatF K(n, d), V(n, d);
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < d; ++c) K(j, c) = float(normal(eng)), V(j, c) = float(normal(eng));
  K.row(4) = K.row(3);
  MatD Q(G, d);
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < d; ++c) Q(g, c) = normal(eng);
  auto pol = make_policy("oracle_topk", params({{"budget", b}}), info(n, d, G));
  for (int64_t j = 0; j < n; ++j) pol->observe(j, K.row(j).data(), V.row(j).data());
  const MatD Kd = K.cast<double>(), Vd = V.cast<double>();
  std::vector<VecD> rows(G);
  std::vector<const double*> probs;
  for (int g = 0; g < G; ++g) {
    VecD l = Kd * Q.row(g).transpose();
    rows[g] = (l.array() - l.maxCoeff()).exp().matrix();
    rows[g] /= rows[g].sum();
    probs.push_back(rows[g].data());
  }
  std::vector<Answer> out(G);
  pol->attend(n, Q, &out, &probs);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const VecD score = rows[0] + rows[1];
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return score[x] > score[y]; });
  std::vector<int64_t> want(order.begin(), order.begin() + b);
  std::sort(want.begin(), want.end());
  for (int g = 0; g < G; ++g) {
    INFO("query head " << g);
    REQUIRE(out[g].has_kept);
    CHECK(out[g].kept == want);
    VecD l(b);
    for (int64_t r = 0; r < b; ++r) l[r] = Kd.row(want[r]).dot(Q.row(g));
    VecD p = (l.array() - l.maxCoeff()).exp().matrix();
    p /= p.sum();
    VecD z = VecD::Zero(d);
    for (int64_t r = 0; r < b; ++r) z += p[r] * Vd.row(want[r]).transpose();
    CHECK((out[g].z - z).norm() <= 1e-12 * z.norm());
    // Negative control: the whole row's answer is not the kept set's.
    const VecD full = Vd.transpose() * rows[g];
    CHECK((out[g].z - full).norm() > 1e-3 * full.norm());
  }
}
