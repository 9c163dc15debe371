// lagkv (sim/policies/lagkv.cpp): LagKV's scores and the policy's cache. Its kept sets at prefill are
// checked against kvpress's LagKVPress on SmolLM2 by tests/real_model/kvpress_conformance_test.py.
#include <catch2/catch.hpp>
#include <algorithm>
#include <set>

#include "../sim/policies/factories.hpp"
#include "helpers.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/registry.hpp"
using namespace kvsim;

namespace {
StreamInfo lag_info(int64_t n, int d) {
  StreamInfo info;
  info.n = n;
  info.head_dim = d;
  info.n_queries = 1;
  return info;
}
/// The kept positions of `p` answering at step t.
std::vector<int64_t> kept_at(Policy& p, int64_t t, int d) {
  std::vector<Answer> a(1);
  p.attend(t, MatD::Zero(1, d), &a, nullptr);
  return a[0].kept;
}
}  // namespace

TEST_CASE("lagkv: scores are 1 for sinks and tail, a rank per partition, and a recency ramp when too short", "[prefill][zoo]") {
  SynthSource src(test::small_synth("heavy_hitter", 300, 16, 1, 1, 1));
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  // 4 sinks, L = 32: 296 tokens after them are 9 partitions (288) + 8; partitions 0..7 are scored.
  const VecD s = policies::lagkv_scores(K, V, 300, 4, 32);
  for (int64_t j = 0; j < 4; ++j) CHECK(s[j] == 1.0);
  for (int64_t j = 4 + 8 * 32; j < 300; ++j) CHECK(s[j] == 1.0);  // the last partition and the remainder
  for (int64_t p = 0; p < 8; ++p) {
    std::vector<double> ranks(s.data() + 4 + 32 * p, s.data() + 4 + 32 * (p + 1));
    std::sort(ranks.begin(), ranks.end());
    for (int r = 0; r < 32; ++r) REQUIRE(ranks[size_t(r)] == double(r) / 32);
  }
  // Shorter than sink + 2L: sinks 1, then (j − sink)/(m − sink), so the most recent rank highest.
  const VecD t = policies::lagkv_scores(K, V, 50, 4, 32);
  CHECK(t[3] == 1.0);
  CHECK(t[4] == 0.0);
  CHECK(t[49] == Approx(45.0 / 46.0));
}

TEST_CASE("lagkv: the token that varies most against its reference partition ranks first", "[prefill][zoo]") {
  // L = 4, d = 4, no sinks: partition 0 rows 0..3, its reference rows 4..7 spanning [0, 1] in every
  // dimension (so x̂ = x). Row 2's key and value spread over the whole span, row 1 a little, rows 0
  // and 3 are flat (std 0: the lowest ranks, the earlier first).
  MatF K = MatF::Constant(12, 4, 0.5f), V = K;
  K.row(4).setZero();
  K.row(5).setOnes();
  V = K;
  K.row(2) = V.row(2) = (VecF(4) << 0, 1, 0, 1).finished().transpose();
  K.row(1) = V.row(1) = (VecF(4) << 0.4f, 0.6f, 0.5f, 0.5f).finished().transpose();
  const VecD s = policies::lagkv_scores(K, V, 12, 0, 4);
  CHECK(s[2] == 0.75);  // the highest rank, (L − 1)/L
  CHECK(s[1] == 0.5);
  CHECK(s[0] == 0.0);
  CHECK(s[3] == 0.25);
}

TEST_CASE("lagkv: prefill keeps B tokens with sinks and tail, decoding never exceeds B and keeps the newest", "[prefill][zoo]") {
  const int d = 16;
  SynthSource src(test::small_synth("heavy_hitter", 600, d, 1, 1, 1));
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  const MatD Q = src.read(0, Tensor::q, 0).cast<double>();
  Params prm;
  prm.set("budget", int64_t(120));
  prm.set("lag", int64_t(32));
  prm.set("interval", int64_t(20));
  auto p = make_policy("lagkv", prm, lag_info(600, d));
  CHECK(p->capacity_matched());
  prefill(*p, 300, K, V, {&Q});
  std::vector<int64_t> kept = kept_at(*p, 300, d);
  REQUIRE(kept.size() == 120);
  const VecD s = policies::lagkv_scores(K, V, 300, 4, 32);
  // Sinks and the 40-token tail 260..299 (score 1) stay; of the rest, the highest scores.
  const std::set<int64_t> ks(kept.begin(), kept.end());
  for (int64_t j : {0, 1, 2, 3, 260, 299}) CHECK(ks.count(j) == 1);
  double lowest_kept = 2, best_dropped = -1;
  for (int64_t j = 0; j < 300; ++j) (ks.count(j) ? lowest_kept = std::min(lowest_kept, s[j]) : best_dropped = std::max(best_dropped, s[j]));
  CHECK(lowest_kept >= best_dropped);
  std::set<int64_t> sizes;
  for (int64_t t = 301; t <= 600; ++t) {
    p->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
    kept = kept_at(*p, t, d);
    REQUIRE(int64_t(kept.size()) == p->cache_tokens());
    REQUIRE(kept.size() <= 120);
    REQUIRE(std::find(kept.begin(), kept.end(), t - 1) != kept.end());
    sizes.insert(int64_t(kept.size()));
  }
  CHECK(*sizes.begin() == 101);  // B + 1 − interval after each rescoring
  CHECK(sizes.size() == 20);     // then back up to B one token at a time

  // Negative control: another partition size keeps another prompt set.
  Params other = prm;
  other.set("lag", int64_t(16));
  auto q = make_policy("lagkv", other, lag_info(600, d));
  prefill(*q, 300, K, V, {&Q});
  auto p2 = make_policy("lagkv", prm, lag_info(600, d));
  prefill(*p2, 300, K, V, {&Q});
  CHECK(kept_at(*q, 300, d) != kept_at(*p2, 300, d));
}

TEST_CASE("lagkv: bad parameters are refused naming them", "[prefill][zoo]") {
  Params prm;
  prm.set("budget", int64_t(50));
  prm.set("interval", int64_t(60));
  CHECK_THROWS_WITH(make_policy("lagkv", prm, lag_info(600, 16)), Catch::Matchers::Contains("'interval'"));
  prm.set("interval", int64_t(10));
  prm.set("lag", int64_t(1));
  CHECK_THROWS_WITH(make_policy("lagkv", prm, lag_info(600, 16)), Catch::Matchers::Contains("'lag'"));
}
