// expected_attention (sim/policies/expected_attention.cpp): its RoPE handling and its keep rule. The kept
// sets at prefill are checked against kvpress's ExpectedAttentionPress on SmolLM2 by
// tests/real_model/kvpress_conformance_test.py.
#include <catch2/catch.hpp>
#include <cmath>

#include "helpers.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/registry.hpp"
using namespace kvsim;

namespace {
constexpr double kTheta = 10000.0;

/// The test's own RoPE: channels (k, k + d/2) (halves) or (2k, 2k + 1) turned by t·θ^(−2k/d), in double.
void rotate(Eigen::Ref<VecD> x, int64_t t, bool halves) {
  const int d = int(x.size());
  for (int k = 0; k < d / 2; ++k) {
    const double w = t * std::pow(kTheta, -2.0 * k / d), c = std::cos(w), s = std::sin(w);
    const int a = halves ? k : 2 * k, b = halves ? k + d / 2 : 2 * k + 1;
    const double u = x[a], v = x[b];
    x[a] = c * u - s * v;
    x[b] = s * u + c * v;
  }
}

StreamInfo info(int64_t n, int d, int64_t P, bool rope, bool halves) {
  StreamInfo s;
  s.n = n;
  s.head_dim = d;
  s.prefill = P;
  s.softmax_scale = 1.0 / std::sqrt(double(d));
  s.rope_applied = rope;
  s.rope_theta = rope ? kTheta : 0;
  s.rope_halves = halves;
  return s;
}

/// The prompt tokens `name` with `params` keeps after a prefill of P tokens (scaled queries q).
std::vector<int64_t> kept(const Params& params, const StreamInfo& s, const MatF& K, const MatF& V, const MatD& q) {
  auto p = make_policy("expected_attention", params, s);
  dynamic_cast<PromptCompressor&>(*p).prefill(s.prefill, K, V, {&q});
  std::vector<Answer> a(1);
  p->attend(s.prefill, MatD::Zero(1, s.head_dim), &a, nullptr);
  return a[0].kept;
}
}  // namespace

TEST_CASE("expected_attention: post-RoPE queries are turned back before their statistics", "[prefill][zoo]") {
  // With n_future = 1 the policy rotates its query statistics to position P. So a recording whose
  // queries are rotated at their own positions t (rope applied) must keep exactly the tokens of one
  // whose queries were all rotated to P and which says rope = "none" (the policy then leaves them).
  const int64_t P = 96;
  const int d = 16;
  SynthSource src(test::small_synth("heavy_hitter", P + 1, d, 1, 1, 1));
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  const MatD pre = src.read(0, Tensor::q, 0).cast<double>() / std::sqrt(double(d));  // scaled, before RoPE
  MatD at_t = pre, at_P = pre, wrong = pre;
  for (int64_t t = 0; t <= P; ++t) {
    rotate(at_t.row(t).transpose(), t, true);
    rotate(at_P.row(t).transpose(), P, true);
    rotate(wrong.row(t).transpose(), t, false);  // the other channel pairing
  }
  for (bool cov : {true, false}) {
    Params p;
    p.set("budget", int64_t(24), "test");
    p.set("n_future", int64_t(1), "test");
    p.set("covariance", cov, "test");
    const auto a = kept(p, info(P + 1, d, P, true, true), K, V, at_t);
    const auto b = kept(p, info(P + 1, d, P, false, true), K, V, at_P);
    CHECK(a.size() == 24);
    CHECK(a == b);
    // Negative control: queries rotated on adjacent pairs, read as halves, give another set.
    CHECK(kept(p, info(P + 1, d, P, true, true), K, V, wrong) != a);
  }
}

TEST_CASE("expected_attention: the mean query picks the keys, sinks stay, and the budget holds", "[prefill][zoo]") {
  // No RoPE, no covariance, no value norm: the score is softmax(μ·k/√d), so the kept tokens are the
  // keys with the largest component along the mean query (here e0), plus the 4 sinks.
  const int64_t P = 40;
  const int d = 8;
  MatF K = MatF::Zero(P + 1, d), V = MatF::Ones(P + 1, d);
  MatD q = MatD::Zero(P + 1, d);
  for (int64_t t = 0; t <= P; ++t) {
    K(t, 0) = float((t * 7) % 41);  // distinct
    K(t, 1) = float(100 - t);       // large, but orthogonal to the queries
    q(t, 0) = 1.0 + 0.01 * double(t % 3);
  }
  Params p;
  p.set("budget", int64_t(10), "test");
  p.set("covariance", false, "test");
  p.set("vnorm", false, "test");
  const auto k = kept(p, info(P + 1, d, P, false, true), K, V, q);
  std::vector<int64_t> expect{0, 1, 2, 3};  // the sinks
  std::vector<int64_t> rest;
  for (int64_t t = 4; t < P; ++t) rest.push_back(t);
  std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return K(a, 0) > K(b, 0); });
  expect.insert(expect.end(), rest.begin(), rest.begin() + 6);
  std::sort(expect.begin(), expect.end());
  CHECK(k == expect);
  // With the covariance term, query variance along e1 makes the large e1 components count.
  MatD q2 = q;
  for (int64_t t = 0; t <= P; ++t) q2(t, 1) = (t % 2 ? 3.0 : -3.0);
  p.set("covariance", true, "test");
  CHECK(kept(p, info(P + 1, d, P, false, true), K, V, q2) != expect);
}

TEST_CASE("expected_attention: decoding appends, or keeps B with decode_window, and refusals name the cause", "[prefill][zoo]") {
  const int64_t P = 64, n = 80;
  const int d = 8;
  SynthSource src(test::small_synth("heavy_hitter", n, d, 1, 1, 1));
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  const MatD q = src.read(0, Tensor::q, 0).cast<double>();
  for (int64_t D : {int64_t(-1), int64_t(3)}) {
    Params p;
    p.set("budget", int64_t(16), "test");
    p.set("decode_window", D, "test");
    auto pol = make_policy("expected_attention", p, info(n, d, P, false, true));
    dynamic_cast<PromptCompressor&>(*pol).prefill(P, K, V, {&q});
    for (int64_t t = P; t < n; ++t) pol->observe(t, K.row(t).data(), V.row(t).data());
    CHECK(pol->cache_tokens() == (D < 0 ? 16 + (n - P) : 16));
  }
  Params p;
  p.set("budget", int64_t(16), "test");
  StreamInfo no_theta = info(n, d, P, true, true);
  no_theta.rope_theta = 0;
  CHECK_THROWS_WITH(make_policy("expected_attention", p, no_theta), Catch::Contains("rope_theta"));
  p.set("decode_window", int64_t(0), "test");
  CHECK_THROWS_WITH(make_policy("expected_attention", p, info(n, d, P, false, true)), Catch::Contains("decode_window"));
}
