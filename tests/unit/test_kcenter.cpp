// subgen_kcenter (SubGen §3.2): budget at every step, greedy k-center's 2-approximation, and the
// streaming doubling algorithm's bound on the number of centers.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "helpers.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/core/rng.hpp"

using namespace kvsim;

namespace {

Params kc(int64_t recent, int64_t centers, const std::string& mode, bool weighted = false, int64_t prefill = -1) {
  Params p;
  p.set("recent", recent);
  p.set("centers", centers);
  p.set("mode", mode);
  p.set("weighted", weighted);
  if (prefill > 0) p.set("prefill", prefill);
  return p;
}

StreamInfo info(int64_t n, int d) {
  StreamInfo s;
  s.n = n;
  s.head_dim = d;
  return s;
}

double radius(const MatF& K, const std::vector<int64_t>& pts, const std::vector<int64_t>& centers) {
  double r = 0;
  for (int64_t p : pts) {
    double best = INFINITY;
    for (int64_t c : centers) best = std::min(best, double((K.row(p) - K.row(c)).norm()));
    r = std::max(r, best);
  }
  return r;
}

/// Brute-force optimal k-center radius with centers among the points.
double opt_radius(const MatF& K, const std::vector<int64_t>& pts, int k) {
  double best = INFINITY;
  std::vector<int64_t> cur;
  std::function<void(size_t)> rec = [&](size_t from) {
    if (int(cur.size()) == k) {
      best = std::min(best, radius(K, pts, cur));
      return;
    }
    for (size_t i = from; i < pts.size(); ++i) {
      cur.push_back(pts[i]);
      rec(i + 1);
      cur.pop_back();
    }
  };
  rec(0);
  return best;
}

}  // namespace

TEST_CASE("subgen_kcenter: prefill mode keeps everything until the prefill point, then recent + k", "[kcenter]") {
  SynthSource src(test::small_synth("clustered", 200, 8, 1, 1, 1));
  MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  auto pol = make_policy("subgen_kcenter", kc(16, 8, "prefill", false, 100), info(200, 8));
  MatD q = MatD::Ones(1, 8) * 0.1;
  std::vector<Answer> ans(1);
  for (int64_t t = 0; t < 200; ++t) {
    pol->observe(t, K.row(t).data(), V.row(t).data());
    if (t + 1 < 100) REQUIRE(pol->cache_tokens() == t + 1);
    else REQUIRE(pol->cache_tokens() == 24);
    ans[0] = Answer{};
    pol->attend(t + 1, q, &ans, nullptr);
    REQUIRE(int64_t(ans[0].kept.size()) == pol->cache_tokens());
    // The most recent token is always kept exactly.
    REQUIRE(std::find(ans[0].kept.begin(), ans[0].kept.end(), t) != ans[0].kept.end());
  }
  CHECK(pol->clusters() == 8);
}

TEST_CASE("subgen_kcenter: greedy k-center is within 2x of the optimal radius (brute force)", "[kcenter]") {
  for (int trial = 0; trial < 20; ++trial) {
    auto p = test::small_synth("gaussian", 13, 3, 1, 1, 1);
    p.seed = 100 + trial;
    SynthSource src(p);
    MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
    for (int k : {2, 3, 4}) {
      // recent = 1: at the prefill point (13 tokens) the 12 older tokens are clustered into k centers.
      auto pol = make_policy("subgen_kcenter", kc(1, k, "prefill", false, 13), info(13, 3));
      for (int64_t t = 0; t < 13; ++t) pol->observe(t, K.row(t).data(), V.row(t).data());
      std::vector<Answer> ans(1);
      pol->attend(13, MatD::Zero(1, 3), &ans, nullptr);
      std::vector<int64_t> centers;
      for (int64_t i : ans[0].kept)
        if (i != 12) centers.push_back(i);
      REQUIRE(int(centers.size()) == k);
      std::vector<int64_t> old;
      for (int64_t i = 0; i < 12; ++i) old.push_back(i);
      double greedy = radius(K, old, centers), opt = opt_radius(K, old, k);
      REQUIRE(greedy <= 2 * opt + 1e-9);
    }
  }
}

TEST_CASE("subgen_kcenter: streaming mode holds the budget at every step", "[kcenter]") {
  SynthSource src(test::small_synth("clustered", 600, 8, 1, 1, 1));
  MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  for (bool weighted : {false, true}) {
    auto pol = make_policy("subgen_kcenter", kc(20, 10, "streaming", weighted), info(600, 8));
    for (int64_t t = 0; t < 600; ++t) {
      pol->observe(t, K.row(t).data(), V.row(t).data());
      REQUIRE(pol->cache_tokens() <= 30);
      REQUIRE(pol->clusters() <= 10);
    }
    CHECK(pol->clusters() >= 1);
  }
  CHECK_THROWS_WITH(make_policy("subgen_kcenter", kc(20, 10, "stream"), info(600, 8)), Catch::Contains("'mode'"));
}

TEST_CASE("subgen_kcenter: weighted centers recover attention over duplicated keys exactly", "[kcenter]") {
  // 30 old tokens that are 3 exact keys repeated 10 times each: 3 centers with counts 10 represent
  // the old part of the softmax exactly when weighted, and not when unweighted.
  const int d = 2;
  const int64_t n = 31;
  MatF K(n, d), V(n, d);
  for (int64_t i = 0; i < 30; ++i) {
    int c = int(i % 3);
    K.row(i) << float(c), float(2 * c);
    V.row(i) << float(c + 1), float(-c);
  }
  K.row(30) << 0.5f, 0.5f;
  V.row(30) << 0.f, 1.f;
  MatD q(1, d);
  q << 0.3, -0.2;
  // Exact output.
  VecD logits = K.cast<double>() * q.row(0).transpose();
  VecD w = (logits.array() - logits.maxCoeff()).exp().matrix();
  VecD exact = V.cast<double>().transpose() * w / w.sum();
  for (bool weighted : {true, false}) {
    auto pol = make_policy("subgen_kcenter", kc(1, 3, "prefill", weighted, n), info(n, d));
    for (int64_t t = 0; t < n; ++t) pol->observe(t, K.row(t).data(), V.row(t).data());
    std::vector<Answer> ans(1);
    pol->attend(n, q, &ans, nullptr);
    double err = (ans[0].z - exact).norm() / exact.norm();
    if (weighted) CHECK(err <= 1e-12);
    else CHECK(err > 1e-3);
  }
}
