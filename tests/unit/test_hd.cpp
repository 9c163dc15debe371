// The step logic shared by the CPU and CUDA paths (include/kvsim/core/hd.hpp), tested on the CPU: these
// are the functions the kernels run, so CPU/GPU parity of this logic holds by construction.
#include <catch2/catch.hpp>
#include <cmath>

#include "kvsim/core/hd.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/replay/reference.hpp"
#include "kvsim/core/rng.hpp"
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <algorithm>
#include <numeric>

using namespace kvsim;

TEST_CASE("hd: online softmax (any split and merge order) equals the exact reference", "[hd]") {
  Engine eng = make_engine({91});
  boost::random::normal_distribution<double> nd;
  const int64_t n = 300;
  const int d = 16;
  MatF Q(n, d), K(n, d), V(n, d);
  for (Eigen::Index i = 0; i < Q.size(); ++i) {
    Q.data()[i] = float(3 * nd(eng));  // logits up to ~±200 (exp would overflow a naive float sum)
    K.data()[i] = float(3 * nd(eng));
    V.data()[i] = float(nd(eng));
  }
  const std::vector<int64_t> steps{1, 2, 17, 128, 300};
  ReferenceBlock ref;
  exact_attention(Q, K.cast<double>(), V.cast<double>(), 1.0, steps, ref);
  for (size_t r = 0; r < steps.size(); ++r) {
    const int64_t t = steps[r];
    const VecD l = K.topRows(t).cast<double>() * Q.row(t - 1).transpose().cast<double>();
    for (int parts : {1, 3, 128}) {  // like `parts` threads, each taking every parts-th key, then merged
      std::vector<hd::OnlineSoftmax<double>> st(parts);
      for (int64_t j = 0; j < t; ++j) st[j % parts].add(l[j]);
      hd::OnlineSoftmax<double> tot;
      for (int p = parts - 1; p >= 0; --p) tot.merge(st[p]);
      INFO("t = " << t << ", parts = " << parts);
      REQUIRE(tot.log_tau() == Approx(ref.log_tau[r]).epsilon(1e-12));
      REQUIRE(tot.prob_norm() == Approx(ref.probs_norm[r]).epsilon(1e-10));
      double worst = 0;
      for (int64_t j = 0; j < t; ++j) worst = std::max(worst, std::abs(tot.prob(l[j]) - ref.probs(r, j)));
      REQUIRE(worst <= 1e-12);
    }
    // float32 (the kernel's type): same state within float rounding.
    hd::OnlineSoftmax<float> f;
    for (int64_t j = 0; j < t; ++j) f.add(float(l[j]));
    REQUIRE(double(f.log_tau()) == Approx(ref.log_tau[r]).epsilon(1e-5).margin(1e-5));
  }
  // add() returns the rescale factor of earlier weights: an accumulator following it equals Σ p_j v_j.
  const int64_t t = 64;
  const VecD l = K.topRows(t).cast<double>() * Q.row(t - 1).transpose().cast<double>();
  hd::OnlineSoftmax<double> st;
  VecD acc = VecD::Zero(d);
  for (int64_t j = 0; j < t; ++j) {
    const double f = st.add(l[j]);
    acc = acc * f + std::exp(l[j] - st.m) * V.row(j).transpose().cast<double>();
  }
  ReferenceBlock r64;
  exact_attention(Q, K.cast<double>(), V.cast<double>(), 1.0, {t}, r64);
  REQUIRE((acc / st.s1 - r64.out.row(0).transpose()).norm() <= 1e-12 * r64.out.row(0).norm());
}

TEST_CASE("hd: Philox4x32-10 matches the Random123 known-answer vectors", "[hd]") {
  // Random123 tests/kat_vectors, "philox4x32 10" lines: counter[4] key[2] -> result[4].
  struct Kat {
    hd::Philox4 c;
    uint32_t k0, k1;
    hd::Philox4 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const hd::Philox4 got = hd::philox4x32_10(k.c, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) REQUIRE(got.v[i] == k.want.v[i]);
  }
  // Uniforms in [0, 1) with the right mean and variance over 10^5 counters (4.5-sigma bands).
  const int N = 100000;
  double s = 0, s2 = 0;
  for (uint32_t i = 0; i < uint32_t(N); ++i) {
    const hd::Philox4 r = hd::philox4x32_10({{i, 0, 0, 0}}, 7, 11);
    const double u = hd::philox_uniform01(r.v[0], r.v[1]);
    REQUIRE((u >= 0 && u < 1));
    s += u;
    s2 += u * u;
  }
  const double mean = s / N, var = s2 / N - mean * mean;
  CHECK(std::abs(mean - 0.5) <= 4.5 * std::sqrt(1.0 / 12 / N));
  CHECK(var == Approx(1.0 / 12).epsilon(0.02));
}

TEST_CASE("hd: sink_window_slot keeps the sink and the most recent window tokens", "[hd]") {
  for (int64_t sink : {0, 1, 4})
    for (int64_t window : {1, 3, 8}) {
      std::vector<int64_t> slots(sink + window, -1);
      for (int64_t t = 0; t < 50; ++t) {
        const int64_t s = hd::sink_window_slot(t, sink, window);
        REQUIRE((s >= 0 && s < sink + window));
        slots[s] = t;
        // Invariant after token t: slots hold tokens 0..sink-1 and the last min(window, t+1-sink) ones.
        std::vector<int64_t> want;
        for (int64_t j = 0; j <= t; ++j)
          if (j < sink || j > t - window) want.push_back(j);
        std::vector<int64_t> have;
        for (int64_t x : slots)
          if (x >= 0) have.push_back(x);
        std::sort(have.begin(), have.end());
        REQUIRE(have == want);
        // The closed form the GPU answers from equals the ring's content after t + 1 tokens.
        std::vector<int64_t> closed;
        for (int64_t j = 0; j < hd::sink_window_count(t + 1, sink, window); ++j)
          closed.push_back(hd::sink_window_token(t + 1, sink, window, j));
        REQUIRE(closed == want);
      }
    }
}

TEST_CASE("hd: H2O victim rule is a total order, so any reduction order picks the same victim", "[hd]") {
  // The CPU scans slots in order; the GPU reduces them pairwise in a tree. Both must pick the
  // evictable slot with the lowest score, ties to the oldest position.
  Engine eng = make_engine({7});
  boost::random::uniform_int_distribution<int> small(0, 3);  // few distinct scores: many ties
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t B = 1 + trial % 17, t = 40, recent = trial % 5;
    std::vector<double> score(B);
    std::vector<int64_t> pos(B);
    std::vector<int64_t> all(t);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t i = t - 1; i > 0; --i)  // Fisher-Yates with a Boost.Random draw
      std::swap(all[i], all[boost::random::uniform_int_distribution<int64_t>(0, i)(eng)]);
    for (int64_t s = 0; s < B; ++s) {
      score[s] = 0.25 * small(eng);
      pos[s] = all[s];
    }
    auto better = [&](int64_t a, int64_t b) {  // -1 = none
      if (a < 0) return b;
      if (b < 0) return a;
      return hd::h2o_prefer(score[a], pos[a], score[b], pos[b]) ? a : b;
    };
    int64_t serial = -1;
    for (int64_t s = 0; s < B; ++s)
      if (hd::h2o_evictable(pos[s], t, recent)) serial = better(serial, s);
    // Tree reduction as a 128-thread block would do it (padding = not evictable).
    std::vector<int64_t> lane(128, -1);
    for (int64_t s = 0; s < B; ++s)
      if (hd::h2o_evictable(pos[s], t, recent)) lane[s % 128] = better(lane[s % 128], s);
    for (int off = 64; off > 0; off >>= 1)
      for (int i = 0; i < off; ++i) lane[i] = better(lane[i], lane[i + off]);
    REQUIRE(lane[0] == serial);
    // And the serial pick is the brute-force minimum.
    for (int64_t s = 0; s < B; ++s)
      if (hd::h2o_evictable(pos[s], t, recent) && serial >= 0) {
        REQUIRE(score[serial] <= score[s]);
        if (score[serial] == score[s]) REQUIRE(pos[serial] <= pos[s]);
      }
  }
}

TEST_CASE("hd: GroupAggregate equals folding group_combine element by element", "[hd]") {
  Engine eng = make_engine({11});
  boost::random::normal_distribution<double> nd(0, 1);
  for (const char* name : {"mean", "max", "sum"}) {
    const int agg = std::string(name) == "max" ? hd::kAggMax : std::string(name) == "sum" ? hd::kAggSum : hd::kAggMean;
    GroupAggregate ga(*parse_choice<GroupAgg>(name), 37);
    std::vector<double> fold(37, 0.0);
    for (int g = 0; g < 4; ++g) {
      VecD p(37);
      for (auto& x : p) x = std::abs(nd(eng));
      ga.add(p);
      for (int i = 0; i < 37; ++i) fold[i] = hd::group_combine(fold[i], p[i], agg);
    }
    const VecD r = ga.result();
    for (int i = 0; i < 37; ++i) REQUIRE(r[i] == hd::group_result(fold[i], agg, 4));  // bit for bit
  }
}

TEST_CASE("hd: group_combine gives mean max and sum of a KV group's attention", "[hd]") {
  const double p[3] = {0.2, 0.5, 0.1};
  for (int agg : {hd::kAggMean, hd::kAggMax, hd::kAggSum}) {
    double acc = 0;
    for (double x : p) acc = hd::group_combine(acc, x, agg);
    const double r = hd::group_result(acc, agg, 3);
    CHECK(r == Approx(agg == hd::kAggMean ? 0.8 / 3 : agg == hd::kAggMax ? 0.5 : 0.8));
  }
}

TEST_CASE("hd: philox_uniform_int is uniform below its range with rejections included", "[hd]") {
  // χ² over 16 equal bins (df 15: 37.7 is the 0.1% point) for a small range, a range that is not a
  // power of two, and 2³¹ + 1, where Lemire's rule rejects almost half of the words (so the
  // next-word and next-counter branches run). Each range is a multiple of 16 or checked by halves.
  for (uint64_t range : {uint64_t(16), uint64_t(16 * 1000003), (uint64_t(1) << 31) + 1}) {
    const int N = 64000, bins = 16;
    std::vector<double> cnt(bins, 0);
    for (uint32_t i = 0; i < uint32_t(N); ++i) {
      const uint32_t x = hd::philox_uniform_int(range, 5, 9, i, 0);
      REQUIRE(uint64_t(x) < range);
      cnt[size_t(double(x) / double(range) * bins)] += 1;
    }
    double chi2 = 0;
    for (double c : cnt) chi2 += (c - N / bins) * (c - N / bins) / (N / bins);
    INFO("range " << range << ": chi2 " << chi2);
    CHECK(chi2 < 37.7);
    // Reproducible: a pure function of (range, key, counter).
    REQUIRE(hd::philox_uniform_int(range, 5, 9, 123, 0) == hd::philox_uniform_int(range, 5, 9, 123, 0));
  }
  // A control that must fail the χ² test: the biased modulo reduction over a range near 2³²·2/3.
  const uint64_t range = 2863311531ull;  // ≈ 2³²·2/3: x mod range favours the lower half 2:1
  std::vector<double> cnt(2, 0);
  for (uint32_t i = 0; i < 20000; ++i) {
    const uint32_t w = hd::philox4x32_10({{i, 0, 0, 0}}, 5, 9).v[0];
    cnt[uint64_t(w % range) * 2 / range] += 1;
  }
  CHECK(std::abs(cnt[0] - cnt[1]) > 4 * std::sqrt(20000.0));  // modulo bias is detected
  std::vector<double> fair(2, 0);
  for (uint32_t i = 0; i < 20000; ++i) fair[uint64_t(hd::philox_uniform_int(range, 5, 9, i, 0)) * 2 / range] += 1;
  CHECK(std::abs(fair[0] - fair[1]) < 4 * std::sqrt(20000.0));
}

TEST_CASE("hd: reservoir_slot keeps each prefix token with probability budget / t", "[hd]") {
  const int64_t B = 8, n = 64;
  const int seeds = 4000;
  std::vector<double> kept(n, 0);
  for (int s = 0; s < seeds; ++s) {
    const uint64_t seed = derive_seed({2024, uint64_t(s)});
    std::vector<int64_t> slots(B, -1);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t j = hd::reservoir_slot(seed, t, B);
      REQUIRE(j >= -1);
      REQUIRE(j < B);
      if (t < B) REQUIRE(j == t);  // the first B tokens fill the slots in order
      if (j >= 0) slots[j] = t;
      REQUIRE(j == hd::reservoir_slot(seed, t, B));  // a pure function: the GPU draws the same
    }
    for (int64_t x : slots) kept[x] += 1;
  }
  // After n tokens each is kept with probability B/n = 1/8 (binomial, 4.5-sigma band).
  const double p = double(B) / n, sd = std::sqrt(seeds * p * (1 - p));
  for (int64_t t = 0; t < n; ++t) {
    INFO("token " << t);
    CHECK(std::abs(kept[t] - seeds * p) < 4.5 * sd);
  }
}

namespace {
struct BuzzTok {
  int64_t pos;
  double score;
};
}  // namespace

TEST_CASE("hd: buzz_evict keeps every s-hat-th old token and each full segment's first maximum", "[hd]") {
  Engine eng = make_engine({13});
  boost::random::uniform_int_distribution<int> few(0, 3);  // many tied scores
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t s = 2 + trial % 6, n_old = trial % 23, n_new = trial % 31;
    std::vector<BuzzTok> old(n_old + n_new), neu(n_new);
    for (int64_t i = 0; i < n_old; ++i) old[i] = {i, double(few(eng))};
    for (int64_t i = 0; i < n_new; ++i) neu[i] = {100 + i, double(few(eng))};
    // Expected, written from BUZZ §3.3 directly: old positions ŝ−1, 2ŝ−1, ...; for each full
    // segment [b, b+s) of new tokens the first index of its maximum.
    const int64_t sh = (s + 1) / 2;
    std::vector<int64_t> want;
    for (int64_t i = sh - 1; i < n_old; i += sh) want.push_back(i);
    for (int64_t b = 0; b + s <= n_new; b += s) {
      double mx = -1;
      int64_t at = -1;
      for (int64_t i = b; i < b + s; ++i) mx = std::max(mx, neu[i].score);
      for (int64_t i = b; i < b + s && at < 0; ++i)
        if (neu[i].score == mx) at = i;
      want.push_back(100 + at);
    }
    std::vector<int64_t> dropped;
    const int64_t k = hd::buzz_evict(old.data(), n_old, neu.data(), n_new, s, [&](const BuzzTok& x) { dropped.push_back(x.pos); });
    std::vector<int64_t> got;
    for (int64_t i = 0; i < k; ++i) got.push_back(old[i].pos);
    INFO("s " << s << ", old " << n_old << ", new " << n_new);
    REQUIRE(got == want);
    // Every token is kept or dropped, exactly once.
    std::vector<int64_t> all = got;
    all.insert(all.end(), dropped.begin(), dropped.end());
    std::sort(all.begin(), all.end());
    REQUIRE(int64_t(all.size()) == n_old + n_new);
    REQUIRE(std::adjacent_find(all.begin(), all.end()) == all.end());
  }
}

TEST_CASE("hd: a bitonic network under topk_prefer selects the CPU oracle's top set", "[hd]") {
  // The GPU's oracle_topk selection (sim/cuda/policies.cu, oracle_select_kernel) run stage by stage
  // on the CPU: sort indices by hd::topk_prefer over a power-of-two padding (padding last), take the
  // first min(B, t), sort those by position. It must equal std::nth_element under the same order
  // (OracleTopK::attend), ties included.
  Engine eng = make_engine({17});
  boost::random::uniform_int_distribution<int> few(0, 5);
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t t = 1 + trial * 7 % 300, B = 1 + trial * 13 % 80;
    std::vector<double> sc(t);
    for (auto& x : sc) x = trial % 2 ? 0.125 * few(eng) : std::ldexp(double(few(eng) + 1), -few(eng));  // many ties
    int64_t P = 1;
    while (P < t) P <<= 1;
    std::vector<int64_t> idx(P);
    std::iota(idx.begin(), idx.end(), 0);
    auto by_score = [&](int64_t a, int64_t b) {
      if (a >= t || b >= t) return a < b;
      return hd::topk_prefer(sc[a], a, sc[b], b);
    };
    for (int64_t k = 2; k <= P; k <<= 1)
      for (int64_t j = k >> 1; j > 0; j >>= 1)
        for (int64_t i = P - 1; i >= 0; --i) hd::bitonic_compare_swap(idx.data(), i, j, k, by_score);  // any order
    const int64_t b = std::min(B, t);
    int64_t P2 = 1;
    while (P2 < b) P2 <<= 1;
    for (int64_t i = b; i < P2; ++i) idx[i] = P + i;
    for (int64_t k = 2; k <= P2; k <<= 1)
      for (int64_t j = k >> 1; j > 0; j >>= 1)
        for (int64_t i = 0; i < P2; ++i) hd::bitonic_compare_swap(idx.data(), i, j, k, [](int64_t x, int64_t y) { return x < y; });
    std::vector<int64_t> gpu(idx.begin(), idx.begin() + b);
    // The CPU policy's selection.
    std::vector<int64_t> cpu(t);
    std::iota(cpu.begin(), cpu.end(), 0);
    std::nth_element(cpu.begin(), cpu.begin() + (b - 1), cpu.end(),
                     [&](int64_t x, int64_t y) { return hd::topk_prefer(sc[x], x, sc[y], y); });
    cpu.resize(b);
    std::sort(cpu.begin(), cpu.end());
    INFO("t " << t << ", B " << B);
    REQUIRE(gpu == cpu);
  }
}

TEST_CASE("hd: kcenter_insert keeps at most k weighted centers more than 2R apart", "[hd]") {
  // Charikar et al.'s invariants after every insertion: n ≤ k, distinct ids, weights summing to the
  // tokens inserted, every pair of centers more than 2R apart (a new center is > 2R from all; each
  // doubling round re-establishes it), R never shrinks.
  Engine eng = make_engine({23});
  boost::random::normal_distribution<double> nd(0, 1);
  for (int trial = 0; trial < 20; ++trial) {
    const int d = 3 + trial % 6;
    const int64_t k = trial % 9, n = 400;
    MatF keys(n, d);
    for (int64_t i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c) keys(i, c) = float(nd(eng) + 4 * (i % 5));  // 5 loose clusters
    auto sq = [&](int64_t a, int64_t b) { return hd::key_sqdist(&keys(a, 0), &keys(b, 0), d); };
    std::vector<int64_t> id(k + 1, -1);
    std::vector<double> cnt(k + 1, 0);
    int64_t m = 0;
    double R = 0, last_R = 0;
    for (int64_t t = 0; t < n; ++t) {
      int64_t joined = -2;
      m = hd::kcenter_insert(id.data(), cnt.data(), m, R, k, t, 1.0, &joined, sq);
      REQUIRE(m <= k);
      REQUIRE(R >= last_R);
      last_R = R;
      if (k == 0) continue;
      REQUIRE(joined >= -1);
      REQUIRE(joined < m);
      double total = 0;
      for (int64_t i = 0; i < m; ++i) {
        total += cnt[i];
        for (int64_t j = 0; j < i; ++j) {
          REQUIRE(id[i] != id[j]);
          if (R > 0) REQUIRE(std::sqrt(sq(id[i], id[j])) > 2 * R);
        }
      }
      REQUIRE(total == double(t + 1));
    }
  }
  // key_sqdist: symmetric, zero on itself, and the exact squared distance up to double rounding.
  MatF a = MatF::Random(2, 37);
  const double ex = (a.row(0).cast<long double>() - a.row(1).cast<long double>()).squaredNorm();
  CHECK(hd::key_sqdist(&a(0, 0), &a(1, 0), 37) == hd::key_sqdist(&a(1, 0), &a(0, 0), 37));
  CHECK(hd::key_sqdist(&a(0, 0), &a(0, 0), 37) == 0.0);
  CHECK(std::abs(hd::key_sqdist(&a(0, 0), &a(1, 0), 37) - ex) <= 1e-14 * ex);
}

TEST_CASE("hd: kcenter_window_token is the ring's content", "[hd]") {
  for (int64_t recent : {1, 3, 8}) {
    std::vector<int64_t> ring(recent, -1);
    for (int64_t t = 0; t < 40; ++t) {
      ring[t % recent] = t;
      const int64_t T = t + 1, w = std::min(T, recent);
      for (int64_t j = 0; j < w; ++j) REQUIRE(hd::kcenter_window_token(T, recent, j) == ring[j]);
    }
  }
}

TEST_CASE("hd: kcenter_nearest equals the GPU's block tree under (distance, index)", "[hd]") {
  // block_argmin (sim/cuda/common.cuh: k-center and SubGen) finds the nearest center/representative by per-thread
  // first minima then a pairwise tree; with many tied distances it must give the serial first minimum.
  Engine eng = make_engine({29});
  boost::random::uniform_int_distribution<int> few(0, 3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + trial % 300;
    std::vector<double> dist(n);
    for (auto& x : dist) x = double(few(eng));  // heavy ties
    std::vector<int64_t> id(n);
    std::iota(id.begin(), id.end(), 0);
    auto sq = [&](int64_t a, int64_t) { return dist[a]; };
    double bd = 0;
    const int64_t serial = hd::kcenter_nearest(id.data(), n, -1, &bd, sq);
    std::vector<double> ld(128, INFINITY);
    std::vector<int64_t> li(128, -1);
    for (int tid = 0; tid < 128; ++tid)
      for (int64_t i = tid; i < n; i += 128)
        if (dist[i] < ld[tid]) {
          ld[tid] = dist[i];
          li[tid] = i;
        }
    for (int off = 64; off > 0; off >>= 1)
      for (int tid = 0; tid < off; ++tid)
        if (li[tid + off] >= 0 && (li[tid] < 0 || ld[tid + off] < ld[tid] || (ld[tid + off] == ld[tid] && li[tid + off] < li[tid]))) {
          ld[tid] = ld[tid + off];
          li[tid] = li[tid + off];
        }
    REQUIRE(li[0] == serial);
    REQUIRE(ld[0] == bd);
  }
}
