// SubGen's blocked forms (sim/analysis/subgen_algorithm.cpp): line 12's distances for a block of keys from one
// product (begin_block), and line 7 for a KV group's query rows at once (query_rows). Both must leave Algorithm 1
// as it is: the same clusters, samples and slots token for token, the same answers up to summation order.
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/io/synth.hpp"

using namespace kvsim;

namespace {

/// Every piece of state a token changes: assignment, representatives, counts, samples, product slots, μ.
bool same_state(const SubGen& a, const SubGen& b) {
  if (a.clusters() != b.clusters() || a.assignment() != b.assignment() || a.delta() != b.delta() || a.mu() != b.mu())
    return false;
  for (int64_t i = 0; i < a.clusters(); ++i)
    if (a.representative_index(i) != b.representative_index(i) || a.cluster_count(i) != b.cluster_count(i) ||
        a.cluster_samples(i) != b.cluster_samples(i))
      return false;
  for (int64_t j = 0; j < a.config().s; ++j)
    if (a.slot_index(j) != b.slot_index(j)) return false;
  return true;
}

struct Stream {
  MatF K, V, Q;
};

Stream clustered(int64_t n, int d, uint64_t seed) {
  auto p = test::small_synth("clustered", n, d, 1, 4, 1);
  p.seed = seed;
  p.cluster_diameter = 0.5;
  SynthSource src(p);
  return {src.read(0, Tensor::k, 0), src.read(0, Tensor::v, 0), src.read(0, Tensor::q, 0)};
}

SubGenConfig config(double delta, int64_t s, int64_t t, int64_t max_clusters = 0) {
  SubGenConfig c;
  c.delta = delta;
  c.s = s;
  c.t = t;
  c.max_clusters = max_clusters;
  return c;
}

}  // namespace

TEST_CASE("subgen begin_block: blocked distances keep every cluster, sample and slot, merges included", "[subgen][blocked]") {
  const Stream st = clustered(600, 8, 7);
  for (const int64_t cap : {int64_t(0), int64_t(6)}) {  // Algorithm 1 as published, and the cap whose merges end a block
    for (const double delta : {0.3, 0.6}) {
      INFO("max_clusters " << cap << ", delta " << delta);
      const SubGenConfig c = config(delta, 12, 3, cap);
      SubGen per_token(c, 8, 21), blocked(c, 8, 21);
      int64_t b = 1;
      for (int64_t i = 0; i < st.K.rows();) {
        const int64_t e = std::min<int64_t>(st.K.rows(), i + b);
        blocked.begin_block(st.K, i, e - i);
        for (; i < e; ++i) {
          per_token.update(i, st.K.row(i).data(), st.V.row(i).data());
          blocked.update(i, st.K.row(i).data(), st.V.row(i).data());
          REQUIRE(same_state(per_token, blocked));
        }
        blocked.end_block();
        b = b % 37 + 5;  // blocks of 1, 6, 11, … 37 tokens
      }
      if (cap > 0) CHECK(blocked.delta() > delta);  // merge rounds happened inside blocks
      CHECK(blocked.clusters() > 1);
    }
  }
  SubGen sg(SubGenConfig{}, 8, 1);
  CHECK_THROWS_WITH(sg.begin_block(st.K, 590, 20), Catch::Contains("outside the stream"));
}

TEST_CASE("subgen begin_block: the state comparison sees another draw (negative control)", "[subgen][blocked]") {
  // same_state would hold vacuously if it compared nothing that a token changes: another seed's coin flips
  // (samples and slots) and another δ (clusters) must each fail it.
  const Stream st = clustered(200, 8, 7);
  const SubGenConfig c = config(0.3, 12, 3), wide = config(0.6, 12, 3);
  SubGen a(c, 8, 21), seed(c, 8, 22), radius(wide, 8, 21);
  for (int64_t i = 0; i < st.K.rows(); ++i)
    for (SubGen* sg : {&a, &seed, &radius}) sg->update(i, st.K.row(i).data(), st.V.row(i).data());
  CHECK_FALSE(same_state(a, seed));
  CHECK_FALSE(same_state(a, radius));
  CHECK(same_state(a, a));
}

TEST_CASE("subgen query_rows: a group's rows answered together equal query() row by row", "[subgen]") {
  const Stream st = clustered(400, 8, 11);
  SubGen sg(config(0.4, 16, 4), 8, 9);
  MatD Z;
  std::vector<double> log_tau;
  MatD Q = st.Q.topRows(4).cast<double>();
  sg.query_rows(Q, Z, log_tau);  // nothing stored yet: −∞ and zeros, as query()
  for (int g = 0; g < 4; ++g) {
    CHECK(std::isinf(log_tau[size_t(g)]));
    CHECK(Z.row(g).isZero(0));
  }
  for (int64_t i = 0; i < st.K.rows(); ++i) {
    sg.update(i, st.K.row(i).data(), st.V.row(i).data());
    if (i % 50 != 49) continue;
    Q = st.Q.middleRows(i - 3, 4).cast<double>() * 0.35;
    sg.query_rows(Q, Z, log_tau);
    for (int g = 0; g < 4; ++g) {
      VecD z;
      const double lt = sg.query(Q.row(g).transpose(), z);
      CHECK(std::abs(log_tau[size_t(g)] - lt) <= 1e-12 * std::max(1.0, std::abs(lt)));
      CHECK((Z.row(g).transpose() - z).norm() <= 1e-12 * z.norm());
      // Negative control: another row's answer is not this one's.
      if (g > 0) CHECK((Z.row(g - 1).transpose() - z).norm() > 1e-6 * z.norm());
    }
  }
}
