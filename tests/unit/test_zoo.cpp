// The field's score-based eviction policies (tova, knorm, scissorhands): at every step of a
// synthetic stream the cache holds ≤ B tokens, changes by ≤ 1 token, keeps its protected recent
// tokens, and evicts exactly the token an independent re-implementation of the paper's rule ranks
// lowest. Negative controls: each rule's check rejects a policy that follows another rule (or the
// same rule with another parameter).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "helpers.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

namespace {

constexpr int64_t kN = 300;

/// One run of a policy over KV head 0 of a synthetic stream (2 query heads per KV head): the cached
/// set answering each query and the group's mean attention weights over it, computed here.
struct Run {
  MatF K;
  std::vector<std::set<int64_t>> sets;
  std::vector<std::map<int64_t, double>> weights;
};

Run run_policy(const std::string& name, const Params& params, const std::string& preset) {
  SynthSource src(test::small_synth(preset, kN, 8, 1, 2, 1));
  Run r;
  r.K = src.read(0, Tensor::k, 0);
  const MatF V = src.read(0, Tensor::v, 0), Q0 = src.read(0, Tensor::q, 0), Q1 = src.read(0, Tensor::q, 1);
  const double scale = src.meta().softmax_scale;
  StreamInfo info;
  info.n = kN;
  info.head_dim = 8;
  info.n_queries = 2;
  auto pol = make_policy(name, params, info);
  MatD Q(2, 8);
  std::vector<Answer> ans(2);
  for (int64_t t = 0; t < kN; ++t) {
    pol->observe(t, r.K.row(t).data(), V.row(t).data());
    Q.row(0) = Q0.row(t).cast<double>() * scale;
    Q.row(1) = Q1.row(t).cast<double>() * scale;
    ans[0] = ans[1] = Answer{};
    pol->attend(t + 1, Q, &ans, nullptr);
    std::set<int64_t> cur(ans[0].kept.begin(), ans[0].kept.end());
    REQUIRE(cur == std::set<int64_t>(ans[1].kept.begin(), ans[1].kept.end()));  // one cache per KV head
    std::map<int64_t, double> w;
    for (int g = 0; g < 2; ++g) {
      double mx = -INFINITY, sum = 0;
      std::map<int64_t, double> l;
      for (int64_t j : cur) mx = std::max(mx, l[j] = r.K.row(j).cast<double>().dot(Q.row(g)));
      for (auto& [j, x] : l) sum += (x = std::exp(x - mx));
      for (auto& [j, x] : l) w[j] += x / sum / 2.0;
    }
    r.sets.push_back(cur);
    r.weights.push_back(w);
  }
  return r;
}

/// Score of cached token j when token t joins (lower = evicted first).
using RefScore = std::function<double(const Run&, int64_t j, int64_t t)>;

/// The first step that breaks the rule "|S_t| ≤ B, |S_t \ S_{t−1}| ≤ 1, t ∈ S_t, the `recent` newest
/// kept, and the evicted token has the lowest reference score among S_{t−1}'s evictable tokens"; −1
/// when none does.
int64_t first_violation(const Run& r, int64_t B, int64_t recent, const RefScore& ref) {
  for (int64_t t = 0; t < kN; ++t) {
    const auto& cur = r.sets[size_t(t)];
    if (int64_t(cur.size()) > B || !cur.count(t)) return t;
    for (int64_t j = std::max<int64_t>(0, t - recent + 1); j <= t; ++j)
      if (!cur.count(j)) return t;
    if (t == 0) continue;
    const auto& prev = r.sets[size_t(t - 1)];
    int64_t added = 0, evicted = -1;
    for (int64_t j : cur) added += !prev.count(j);
    for (int64_t j : prev)
      if (!cur.count(j)) evicted = evicted < 0 ? j : -2;
    if (added > 1 || evicted == -2) return t;
    if (evicted < 0) continue;
    const double e = ref(r, evicted, t);
    for (int64_t j : prev)
      if (j <= t - recent && j != evicted && ref(r, j, t) < e - 1e-9) return t;
  }
  return -1;
}

Params budget(int64_t b) {
  Params p;
  p.set("budget", b);
  return p;
}

const RefScore kTova = [](const Run& r, int64_t j, int64_t t) { return r.weights[size_t(t - 1)].at(j); };
const RefScore kKnorm = [](const Run& r, int64_t j, int64_t) { return -r.K.row(j).cast<double>().norm(); };
/// Scissorhands: −(how often j's weight was below 1/|S_s| over the last `history` queries).
RefScore scissorhands_ref(int64_t history) {
  return [history](const Run& r, int64_t j, int64_t t) {
    int64_t low = 0;
    for (int64_t s = std::max<int64_t>(0, t - history); s < t; ++s) {
      const auto& w = r.weights[size_t(s)];
      auto it = w.find(j);
      if (it != w.end() && it->second < 1.0 / double(w.size())) ++low;
    }
    return -double(low);
  };
}

}  // namespace

TEST_CASE("tova: evicts the token the previous query attended to least", "[zoo]") {
  for (std::string preset : {"heavy_hitter", "gaussian"})
    for (int64_t B : {10, 33}) {
      INFO(preset << " B=" << B);
      const Run r = run_policy("tova", budget(B), preset);
      CHECK(first_violation(r, B, 0, kTova) == -1);
      // Negative control: H2O (accumulated scores) breaks TOVA's rule.
      CHECK(first_violation(run_policy("h2o", budget(B), preset), B, 0, kTova) >= 0);
    }
}

TEST_CASE("knorm: evicts the largest key norm outside the recent window", "[zoo]") {
  for (double recent_ratio : {0.0, 0.5}) {
    Params p = budget(20);
    p.set("recent_ratio", recent_ratio);
    const int64_t recent = std::llround(recent_ratio * 20);
    const Run r = run_policy("knorm", p, "heavy_hitter");
    CHECK(first_violation(r, 20, recent, kKnorm) == -1);
    CHECK(first_violation(run_policy("tova", budget(20), "heavy_hitter"), 20, recent, kKnorm) >= 0);
  }
  // The kept set is the B − recent smallest-norm old tokens (a window of 0: exactly the lowest norms).
  const Run r = run_policy("knorm", budget(20), "gaussian");
  std::vector<std::pair<double, int64_t>> norms;
  for (int64_t j = 0; j < kN; ++j) norms.push_back({r.K.row(j).cast<double>().norm(), j});
  std::sort(norms.begin(), norms.begin() + kN - 1);  // every token but the newest, which always joins
  std::set<int64_t> lowest{kN - 1};
  for (int i = 0; i < 19; ++i) lowest.insert(norms[size_t(i)].second);
  CHECK(r.sets.back() == lowest);
}

TEST_CASE("scissorhands: evicts the token most often below average attention in the history window", "[zoo]") {
  for (int64_t history : {8, 32}) {
    Params p = budget(24);
    p.set("history", history);
    p.set("recent_ratio", 0.25);
    INFO("history " << history);
    const Run r = run_policy("scissorhands", p, "heavy_hitter");
    CHECK(first_violation(r, 24, 6, scissorhands_ref(history)) == -1);
    // Negative controls: another history length, and H2O's accumulated scores, break the rule.
    CHECK(first_violation(r, 24, 6, scissorhands_ref(history == 8 ? 32 : 8)) >= 0);
    CHECK(first_violation(run_policy("h2o", budget(24), "heavy_hitter"), 24, 6, scissorhands_ref(history)) >= 0);
  }
}

namespace {

/// KIVI's dequantization re-implemented from the paper (§3.2): groups of G tokens of rows
/// [0, quantized) of X, asymmetric b-bit min/max quantization per column (keys: `per_channel`) or per
/// G-column group of each row (values; also the broken per-token key variant).
MatD kivi_dequant(MatD X, int64_t quantized, int G, int bits, bool per_channel) {
  const double levels = (1 << bits) - 1;
  auto q = [&](std::vector<double*> xs) {
    double mn = INFINITY, mx = -INFINITY;
    for (double* x : xs) mn = std::min(mn, *x), mx = std::max(mx, *x);
    const double s = (mx - mn) / levels;
    for (double* x : xs) *x = s > 0 ? mn + std::clamp(std::nearbyint((*x - mn) / s), 0.0, levels) * s : mn;
  };
  const int d = int(X.cols()), vg = std::min(G, d);
  for (int64_t g0 = 0; g0 < quantized; g0 += G) {
    if (per_channel) {
      for (int c = 0; c < d; ++c) {
        std::vector<double*> xs;
        for (int i = 0; i < G; ++i) xs.push_back(&X(g0 + i, c));
        q(xs);
      }
    } else {
      for (int i = 0; i < G; ++i)
        for (int c0 = 0; c0 < d; c0 += vg) {
          std::vector<double*> xs;
          for (int c = c0; c < std::min(d, c0 + vg); ++c) xs.push_back(&X(g0 + i, c));
          q(xs);
        }
    }
  }
  return X.cast<float>().cast<double>();  // the cache stores float32
}

VecD softmax_attend(const MatD& K, const MatD& V, const VecD& q) {
  VecD l = K * q;
  l = (l.array() - l.maxCoeff()).exp();
  return V.transpose() * l / l.sum();
}

}  // namespace

TEST_CASE("kivi: answers equal attention over per-channel-quantized keys and per-token-quantized values", "[zoo]") {
  const int d = 16, G = 8, n = 100;
  const int64_t R = 20;
  std::mt19937 rng(5);
  std::normal_distribution<double> N(0, 1);
  MatD K(n, d), V(n, d);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) K(i, c) = N(rng) * (c == 3 ? 40.0 : 1.0), V(i, c) = N(rng);  // an outlier key channel
  K = K.cast<float>().cast<double>();
  V = V.cast<float>().cast<double>();
  StreamInfo info;
  info.n = n;
  info.head_dim = d;
  info.n_queries = 1;
  double err2 = 0, err4 = 0, err_token = 0, key_chan = 0;
  for (int bits : {2, 4}) {
    Params p;
    p.set("bits", int64_t(bits));
    p.set("group", int64_t(G));
    p.set("residual", R);
    auto pol = make_policy("kivi", p, info);
    std::vector<Answer> ans(1);
    for (int64_t t = 0; t < n; ++t) {
      const MatF k = K.row(t).cast<float>(), v = V.row(t).cast<float>();
      pol->observe(t, k.data(), v.data());
      MatD q(1, d);
      for (int c = 0; c < d; ++c) q(0, c) = N(rng) * 0.3;
      ans[0] = Answer{};
      pol->attend(t + 1, q, &ans, nullptr);
      const int64_t quantized = std::max<int64_t>(0, (t + 1 - R) / G * G);
      const MatD Kt = K.topRows(t + 1), Vt = V.topRows(t + 1);
      const VecD want = softmax_attend(kivi_dequant(Kt, quantized, G, bits, true), kivi_dequant(Vt, quantized, G, bits, false),
                                       q.row(0).transpose());
      REQUIRE((ans[0].z - want).norm() <= 1e-6 * want.norm() + 1e-9);
      REQUIRE_FALSE(ans[0].has_kept);
      // Bytes: float32 full tokens + codes, key scales/zeros per channel per group, value ones per token.
      const double bytes = double(t + 1 - quantized) * 2 * d * 4 + double(quantized) * (2.0 * d * bits / 8 + 8.0 * d / G + 8.0 * ((d + G - 1) / G));
      REQUIRE(pol->cache_bytes(d) == Approx(bytes));
      const VecD exact = softmax_attend(Kt, Vt, q.row(0).transpose());
      (bits == 2 ? err2 : err4) += (ans[0].z - exact).norm() / exact.norm();
      if (bits == 2) {  // the broken variant: keys quantized per token, as values are
        const VecD tok = softmax_attend(kivi_dequant(Kt, quantized, G, bits, false), kivi_dequant(Vt, quantized, G, bits, false),
                                        q.row(0).transpose());
        if (quantized > 0) REQUIRE((tok - ans[0].z).norm() > 0);  // the check above would reject it
        // Key error alone (exact values): per-channel vs per-token key quantization.
        const VecD chan = softmax_attend(kivi_dequant(Kt, quantized, G, bits, true), Vt, q.row(0).transpose());
        const VecD per_tok = softmax_attend(kivi_dequant(Kt, quantized, G, bits, false), Vt, q.row(0).transpose());
        key_chan += (chan - exact).norm() / exact.norm();
        err_token += (per_tok - exact).norm() / exact.norm();
      }
    }
  }
  INFO("mean rel_err: 2-bit " << err2 / n << ", 4-bit " << err4 / n << "; key error alone (2-bit): per channel "
                               << key_chan / n << ", per token " << err_token / n);
  CHECK(err4 < err2);
  CHECK(key_chan < err_token);  // per-channel keys (KIVI §3.1) beat per-token keys on an outlier channel
}

TEST_CASE("kivi: memory = M sizes the full-precision residual so the cache never exceeds M tokens of float32", "[zoo]") {
  StreamInfo info;
  info.n = 2000;
  info.head_dim = 32;
  info.n_queries = 1;
  for (double frac : {0.25, 0.5}) {
    Params p;
    p.set("memory", frac);
    p.set("bits", int64_t(4));
    auto pol = make_policy("kivi", p, info);
    const double budget = frac * 2000 * 2 * 32 * 4;
    std::vector<float> k(32), v(32);
    double peak = 0;
    for (int64_t t = 0; t < 2000; ++t) {
      for (int c = 0; c < 32; ++c) k[size_t(c)] = float(std::sin(0.1 * double(t * 32 + c))), v[size_t(c)] = float(c);
      pol->observe(t, k.data(), v.data());
      peak = std::max(peak, pol->cache_bytes(32));
      REQUIRE(pol->cache_bytes(32) <= budget);
    }
    INFO("memory " << frac << ": peak " << peak << " of " << budget << " bytes");
    CHECK(peak >= 0.9 * budget);  // the residual fills what the codes leave
  }
  Params tiny;
  tiny.set("memory", 0.05);
  tiny.set("bits", int64_t(4));
  CHECK_THROWS_WITH(make_policy("kivi", tiny, info), Catch::Contains("cannot fit memory"));
}
