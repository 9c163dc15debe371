// Prefill then decode (`[data] prefill = P`) and the policies built on it: snapkv, pyramidkv, and
// quest with loaded_bytes. Each property is checked against an independent re-implementation of the
// paper's rule, with a negative control that the same check rejects.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "../sim/policies/factories.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

namespace {

constexpr int64_t kN = 160, kP = 96;
constexpr int kD = 8;

PolicySpec spec(const std::string& name, std::initializer_list<std::pair<std::string, ParamValue>> kv) {
  PolicySpec s{name, name, {}};
  for (const auto& [k, v] : kv) s.params.set(k, v, "test");
  return s;
}

RunResult replay(const SynthSource& src, std::vector<PolicySpec> pols, int64_t prefill, int64_t from) {
  Experiment ex;
  ex.data.prefill = prefill;
  ex.eval.from = from;
  ex.policies = std::move(pols);
  return run_experiment(ex, src, 1);
}

/// A policy that streams the prompt through observe() only: its scores miss the prompt's queries.
class ObserveOnlyPrefill final : public Policy, public PromptCompressor {
 public:
  explicit ObserveOnlyPrefill(std::unique_ptr<Policy> p) : p_(std::move(p)) {}
  void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>&) override {
    for (int64_t t = 0; t < P; ++t) p_->observe(t, K.row(t).data(), V.row(t).data());
  }
  void observe(int64_t t, const float* k, const float* v) override { p_->observe(t, k, v); }
  void attend(int64_t t, const MatD& q, std::vector<Answer>* a, const std::vector<const double*>* e) override {
    p_->attend(t, q, a, e);
  }
  bool needs_every_query() const override { return p_->needs_every_query(); }
  int64_t cache_tokens() const override { return p_->cache_tokens(); }

 private:
  std::unique_ptr<Policy> p_;
};

/// Everything a cell needs to drive one policy instance by hand: KV head 0, query heads 0 and 1.
struct Stream {
  MatF K, V;
  MatD Q0, Q1;
  explicit Stream(const SynthSource& src) {
    const double s = src.meta().softmax_scale;
    K = src.read(0, Tensor::k, 0);
    V = src.read(0, Tensor::v, 0);
    Q0 = src.read(0, Tensor::q, 0).cast<double>() * s;
    Q1 = src.read(0, Tensor::q, 1).cast<double>() * s;
  }
  StreamInfo info(int64_t prefill) const {
    StreamInfo i;
    i.n = kN;
    i.head_dim = kD;
    i.n_queries = 2;
    i.prefill = prefill;
    return i;
  }
  MatD q(int64_t t) const {
    MatD m(2, kD);
    m.row(0) = Q0.row(t);
    m.row(1) = Q1.row(t);
    return m;
  }
  /// The kept set answering query t (0-based) after a prefill of P and decoding up to t.
  std::vector<std::set<int64_t>> kept_sets(Policy& p, int64_t P) const {
    kvsim::prefill(p, P, K, V, {&Q0, &Q1});
    std::vector<std::set<int64_t>> out;
    for (int64_t t = P; t < kN; ++t) {
      p.observe(t, K.row(t).data(), V.row(t).data());
      std::vector<Answer> a(2);
      p.attend(t + 1, q(t), &a, nullptr);
      out.emplace_back(a[0].kept.begin(), a[0].kept.end());
    }
    return out;
  }
};

/// SnapKV's prompt selection written out from the paper (Algorithm 1): votes of the last w queries
/// (naive softmax per query), pooled (kernel k, "max" or "avg" with zero padding counted), mean over
/// the two heads, top B − w (ties: earlier) + the window.
std::set<int64_t> snapkv_reference(const Stream& s, int64_t P, int64_t B, int64_t w, int k, bool maxpool) {
  const int64_t prefix = P - w;
  std::vector<double> score(size_t(prefix), 0.0);
  for (const MatD* Q : {&s.Q0, &s.Q1}) {
    std::vector<double> vote(size_t(prefix), 0.0);
    for (int64_t i = P - w; i < P; ++i) {
      std::vector<double> l(size_t(i + 1));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, l[size_t(j)] = s.K.row(j).cast<double>().dot(Q->row(i)));
      for (auto& x : l) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < prefix; ++j) vote[size_t(j)] += l[size_t(j)] / sum;
    }
    for (int64_t j = 0; j < prefix; ++j) {
      double acc = maxpool ? -INFINITY : 0;
      for (int64_t u = j - k / 2; u <= j + k / 2; ++u) {
        const double x = (u < 0 || u >= prefix) ? (maxpool ? -INFINITY : 0.0) : vote[size_t(u)];
        acc = maxpool ? std::max(acc, x) : acc + x;
      }
      score[size_t(j)] += 0.5 * (maxpool ? acc : acc / k);
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(prefix));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[size_t(a)] > score[size_t(b)]; });
  std::set<int64_t> kept(order.begin(), order.begin() + (B - w));
  for (int64_t j = prefix; j < P; ++j) kept.insert(j);
  return kept;
}

}  // namespace

TEST_CASE("prefill: the default prefill streams the prompt, so every streaming policy's decoded steps are unchanged",
          "[prefill]") {
  const SynthSource src(test::small_synth("clustered", kN, kD, 2, 4, 2));
  const std::vector<PolicySpec> pols = {spec("window", {{"memory", 0.25}}), spec("h2o", {{"memory", 0.25}}),
                                        spec("tova", {{"memory", 0.25}}), spec("buzz", {{"memory", 0.3}}),
                                        spec("subgen", {{"memory", 0.3}}), spec("kivi", {{"memory", 0.5}}),
                                        spec("quest", {{"memory", 0.5}})};
  const RunResult a = replay(src, pols, kP, kP + 1), b = replay(src, pols, 0, kP + 1);
  // The kept sets match exactly (kept_mass sums the exact attention over them; cache_bytes counts them). The
  // outputs match up to summation order: a blocked stepper (h2o, tova) meets the decoded steps at other rows of
  // its block's products when the prompt is streamed from step 1, and a GEMM's rounding may depend on a row's
  // place in the kernel's register block (≤ 1.2e-15 relative on an AVX2 EPYC; earlier machines matched bit for bit).
  const size_t rel = metric_index("rel_err"), bytes = metric_index("cache_bytes"), mass = metric_index("kept_mass");
  for (size_t p = 0; p < pols.size(); ++p) {
    INFO(pols[p].name);
    REQUIRE(a.policies[p].rows.size() == b.policies[p].rows.size());
    REQUIRE(a.policies[p].rows.front().step == kP + 1);
    for (size_t r = 0; r < a.policies[p].rows.size(); ++r) {
      const double ra = a.policies[p].rows[r][rel], rb = b.policies[p].rows[r][rel];
      REQUIRE(std::abs(ra - rb) <= 1e-12 * std::abs(ra));
      REQUIRE(a.policies[p].rows[r][bytes] == b.policies[p].rows[r][bytes]);
      const double ma = a.policies[p].rows[r][mass], mb = b.policies[p].rows[r][mass];
      REQUIRE(((std::isnan(ma) && std::isnan(mb)) || ma == mb));
    }
  }
  // Negative control: h2o given the prompt without its queries (observe only) decodes differently.
  const Stream s(src);
  auto full = make_policy("h2o", spec("h2o", {{"budget", int64_t(32)}}).params, s.info(kP));
  ObserveOnlyPrefill blind(make_policy("h2o", spec("h2o", {{"budget", int64_t(32)}}).params, s.info(kP)));
  REQUIRE(s.kept_sets(*full, kP) != s.kept_sets(blind, kP));
}

TEST_CASE("prefill: config and engine refuse a prompt that leaves nothing to decode or evaluates inside it", "[prefill]") {
  const std::string base = "[data]\nsynthetic = \"gaussian\"\nn = 64\nd = 8\nprefill = 32\n";
  const Experiment ok = parse_experiment(base + "[[policy]]\nname = \"snapkv\"\nbudget = 16\n", "t.toml");
  REQUIRE(ok.data.prefill == 32);
  REQUIRE(ok.eval.from == 33);  // evaluation starts after the prompt
  REQUIRE_THROWS_WITH(parse_experiment(base + "[eval]\nfrom = 32\n[[policy]]\nname = \"exact\"\n", "t.toml"),
                      Catch::Contains("eval.from (32) must be > data.prefill (32)"));
  REQUIRE_THROWS_WITH(parse_experiment("[data]\nsynthetic = \"gaussian\"\nprefill = -1\n[[policy]]\nname = \"exact\"\n", "t.toml"),
                      Catch::Contains("data.prefill must be ≥ 0"));
  const SynthSource src(test::small_synth("gaussian", 64, kD, 1, 2, 1));
  REQUIRE_THROWS_WITH(replay(src, {spec("exact", {})}, 64, 65), Catch::Contains("data.prefill (64) must be in [0, 64)"));
  REQUIRE_THROWS_WITH(replay(src, {spec("snapkv", {{"budget", int64_t(16)}})}, 0, 1),
                      Catch::Contains("needs a prompt: set [data] prefill"));
}

TEST_CASE("snapkv: the prompt's kept set is the paper's pooled top-(B − w) plus the observation window", "[prefill][zoo]") {
  const Stream s(SynthSource(test::small_synth("clustered", kN, kD, 1, 2, 1)));
  const int64_t B = 40, w = 8;
  for (const bool maxpool : {true, false}) {
    INFO((maxpool ? "max" : "avg"));
    auto p = make_policy("snapkv", spec("snapkv", {{"budget", B}, {"window", w}, {"pooling", std::string(maxpool ? "max" : "avg")}}).params,
                         s.info(kP));
    std::set<int64_t> first = s.kept_sets(*p, kP).front();
    first.erase(kP);  // the first decoded token joins; the paper's cache grows (decode_window = -1)
    REQUIRE(first == snapkv_reference(s, kP, B, w, 7, maxpool));
    // Negative control: the same votes without pooling (kernel 1) select another set.
    REQUIRE(first != snapkv_reference(s, kP, B, w, 1, maxpool));
    auto k1 = make_policy("snapkv", spec("snapkv", {{"budget", B}, {"window", w}, {"kernel", int64_t(1)}}).params, s.info(kP));
    std::set<int64_t> first1 = s.kept_sets(*k1, kP).front();
    first1.erase(kP);
    REQUIRE(first1 == snapkv_reference(s, kP, B, w, 1, true));
  }
}

TEST_CASE("snapkv: a decode window keeps min(B, t) tokens: the D newest decoded plus the best-scored prompt tokens",
          "[prefill][zoo]") {
  const Stream s(SynthSource(test::small_synth("clustered", kN, kD, 1, 2, 1)));
  const int64_t B = 40, w = 8, D = 12;
  const std::set<int64_t> prompt = snapkv_reference(s, kP, B, w, 7, true);
  auto p = make_policy("snapkv", spec("snapkv", {{"budget", B}, {"window", w}, {"decode_window", D}}).params, s.info(kP));
  const auto sets = s.kept_sets(*p, kP);
  auto grow = make_policy("snapkv", spec("snapkv", {{"budget", B}, {"window", w}}).params, s.info(kP));
  const auto grown = s.kept_sets(*grow, kP);
  for (size_t i = 0; i < sets.size(); ++i) {
    const int64_t t = kP + int64_t(i);  // 0-based position of the newest token
    REQUIRE(int64_t(sets[i].size()) == B);
    REQUIRE(int64_t(grown[i].size()) == B + int64_t(i) + 1);  // control: the paper's cache grows
    for (int64_t j = std::max(kP, t - D + 1); j <= t; ++j) REQUIRE(sets[i].count(j));  // the D newest decoded
    int64_t decoded = 0;
    for (int64_t j : sets[i]) decoded += j >= kP;
    REQUIRE(decoded == std::min<int64_t>(D, int64_t(i) + 1));
    for (int64_t j : sets[i]) REQUIRE((j >= kP || prompt.count(j)));  // prompt tokens only from the selection
  }
  // After D decoded tokens the window's w tokens went first, then the lowest-scored selected ones: the
  // window (positions P − w..P − 1) is gone, B − D selected tokens remain.
  for (int64_t j = kP - w; j < kP; ++j) REQUIRE_FALSE(sets.back().count(j));
}

TEST_CASE("pyramidkv: layer budgets fall with depth and average exactly the uniform budget", "[prefill][zoo]") {
  for (const int L : {1, 2, 5, 8, 32}) {
    for (const int64_t B : {int64_t(40), int64_t(154), int64_t(1000)}) {
      const int64_t w = std::min<int64_t>(32, B / 2);
      const auto b = policies::pyramidkv_layer_budgets(B, w, 20.0, L);
      REQUIRE(int64_t(b.size()) == L);
      REQUIRE(std::accumulate(b.begin(), b.end(), int64_t(0)) == int64_t(L) * B);
      for (int l = 1; l < L; ++l) REQUIRE(b[size_t(l)] <= b[size_t(l - 1)]);
      for (int64_t x : b) REQUIRE(x >= w);
      if (L > 1) REQUIRE(b.front() > B);  // control: not uniform
      else REQUIRE(b.front() == B);
    }
  }
  // In a replay each layer holds its own B_l (checked by the engine's memory rule), averaging M.
  const SynthSource src(test::small_synth("clustered", kN, kD, 4, 2, 1));
  const RunResult r = replay(src, {spec("pyramidkv", {{"memory", int64_t(40)}})}, kP, kP + 1);
  const size_t tok = metric_index("cache_tokens");
  std::vector<double> last(4, 0);
  for (const auto& row : r.policies[0].rows)
    if (row.step == kN) last[size_t(row.layer)] = row[tok];
  REQUIRE(last[0] > last[3]);
  REQUIRE(std::accumulate(last.begin(), last.end(), 0.0) == Approx(4 * 40));
}

TEST_CASE("pyramidkv: budgets = kvpress gives kvpress's PyramidKVPress layer budgets", "[prefill][zoo]") {
  // kvpress 0.5.5 on SmolLM2-135M (30 layers), P = 512, compression_ratio 0.5, window 64, β = 20: the
  // kept tokens per layer its PyramidKVPress left in the cache (read back by kvsim.kvpress.capture).
  const std::vector<int64_t> kvpress{448, 435, 422, 408, 395, 382, 369, 355, 342, 329, 316, 302, 289, 276, 263,
                                     249, 236, 223, 210, 196, 183, 170, 157, 143, 130, 117, 104, 90, 77, 64};
  CHECK(policies::pyramidkv_kvpress_budgets(256, 64, 20.0, 30, 512) == kvpress);
  CHECK(policies::pyramidkv_layer_budgets(256, 64, 20.0, 30) != kvpress);  // control: the paper's rule differs
  // Where the bottom layer would fall below the window kvpress keeps SnapKV's uniform budget.
  const auto flat = policies::pyramidkv_kvpress_budgets(40, 64, 20.0, 30, 512);
  CHECK(std::all_of(flat.begin(), flat.end(), [](int64_t b) { return b == 40; }));
}

TEST_CASE("quest: page bounds are upper bounds, answers are exact over the chosen pages, loaded bytes ≤ memory",
          "[zoo]") {
  const Stream s(SynthSource(test::small_synth("clustered", kN, kD, 1, 2, 1)));
  const int64_t S = 8, M = 60;
  StreamInfo info = s.info(0);
  auto p = make_policy("quest", spec("quest", {{"memory", M}, {"page_size", S}}).params, info);
  int64_t violations_maxonly = 0;
  for (int64_t t = 0; t < kN; ++t) {
    p->observe(t, s.K.row(t).data(), s.V.row(t).data());
    std::vector<Answer> a(2);
    const MatD q = s.q(t);
    p->attend(t + 1, q, &a, nullptr);
    REQUIRE(loaded_bytes(*p, kD) <= double(M) * 2 * kD * 4);
    const int64_t pages = t / S + 1;
    REQUIRE(p->cache_bytes(kD) == double(2 * (t + 1) + 2 * pages) * kD * 4);
    // Reference: bounds per page (mean over the two heads), top pages + the current one.
    std::set<int64_t> want;
    if (t + 1 <= M) {
      for (int64_t j = 0; j <= t; ++j) want.insert(j);
    } else {
      const int64_t last = pages - 1, others = (M - pages - (t + 1 - last * S)) / S;
      std::vector<std::pair<double, int64_t>> u;
      for (int64_t pg = 0; pg < last; ++pg) {
        double bound = 0;
        for (int g = 0; g < 2; ++g) {
          double ub = 0, maxonly = 0, best = -INFINITY;
          for (int i = 0; i < kD; ++i) {
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t j = pg * S; j < (pg + 1) * S; ++j) lo = std::min(lo, s.K(j, i)), hi = std::max(hi, s.K(j, i));
            ub += std::max(q(g, i) * lo, q(g, i) * hi);
            maxonly += q(g, i) * hi;
          }
          for (int64_t j = pg * S; j < (pg + 1) * S; ++j) best = std::max(best, s.K.row(j).cast<double>().dot(q.row(g)));
          REQUIRE(ub >= best - 1e-12);               // Quest's bound holds
          violations_maxonly += maxonly < best - 1e-12;  // control: the max key alone is no bound
          bound += ub / 2;
        }
        u.push_back({-bound, pg});
      }
      std::sort(u.begin(), u.end());
      for (int64_t i = 0; i < std::min<int64_t>(others, last); ++i)
        for (int64_t j = u[size_t(i)].second * S; j < (u[size_t(i)].second + 1) * S; ++j) want.insert(j);
      for (int64_t j = last * S; j <= t; ++j) want.insert(j);
    }
    REQUIRE(std::set<int64_t>(a[0].kept.begin(), a[0].kept.end()) == want);
    // The answer is exact attention over the loaded tokens.
    VecD z = VecD::Zero(kD);
    double mx = -INFINITY, sum = 0;
    for (int64_t j : want) mx = std::max(mx, s.K.row(j).cast<double>().dot(q.row(0)));
    for (int64_t j : want) {
      const double e = std::exp(s.K.row(j).cast<double>().dot(q.row(0)) - mx);
      sum += e;
      z += e * s.V.row(j).cast<double>().transpose();
    }
    REQUIRE((a[0].z - z / sum).norm() <= 1e-12 * (1 + z.norm() / sum));
  }
  REQUIRE(violations_maxonly > 0);
  // Too little memory for the metadata and the current page is refused up front.
  REQUIRE_THROWS_WITH(make_policy("quest", spec("quest", {{"memory", int64_t(20)}, {"page_size", S}}).params, info),
                      Catch::Contains("too small for quest"));
}

TEST_CASE("prefill: a prompt streamed without answers skips only the values' products, in float64 and float32",
          "[prefill]") {
  // kvsim::prefill attends the prompt's queries with no answers requested, and the slot cache then
  // skips Vᵀp (a third of a trial of `kvsim task` at 4096 tokens). The scores, the kept sets and
  // every later answer must be those of a policy asked for its answers at every prompt step.
  const Stream s(SynthSource(test::small_synth("clustered", kN, kD, 2, 4, 2)));
  for (const bool f32 : {false, true})
    for (const std::string name : {"h2o", "tova"}) {
      INFO(name << (f32 ? " float32" : " float64"));
      StreamInfo info = s.info(kP);
      info.policy_f32 = f32;
      const auto params = spec(name, {{"budget", int64_t(24)}}).params;
      auto skipped = make_policy(name, params, info), answered = make_policy(name, params, info);
      kvsim::prefill(*skipped, kP, s.K, s.V, {&s.Q0, &s.Q1});
      for (int64_t t = 0; t < kP; ++t) {
        answered->observe(t, s.K.row(t).data(), s.V.row(t).data());
        std::vector<Answer> a(2);
        answered->attend(t + 1, s.q(t), &a, nullptr);
        REQUIRE(a[0].z.norm() > 0);  // the answered stream did compute the values' products
      }
      for (int64_t t = kP; t < kN; ++t) {
        std::vector<Answer> a(2), b(2);
        for (Policy* p : {skipped.get(), answered.get()}) p->observe(t, s.K.row(t).data(), s.V.row(t).data());
        skipped->attend(t + 1, s.q(t), &a, nullptr);
        answered->attend(t + 1, s.q(t), &b, nullptr);
        REQUIRE(a[0].kept == b[0].kept);
        for (int g = 0; g < 2; ++g) REQUIRE((a[size_t(g)].z - b[size_t(g)].z).cwiseAbs().maxCoeff() == 0.0);
      }
    }
  // The group product itself: P and log Σ exp unchanged bit for bit, Z left zero without values.
  const MatD K = s.K.topRows(40).cast<double>(), V = s.V.topRows(40).cast<double>(), Q = s.q(50);
  ProbsD P1, P2;
  MatD Z1, Z2;
  VecD l1, l2;
  attend_cached_group(K, V, 40, Q, P1, Z1, l1, true);
  attend_cached_group(K, V, 40, Q, P2, Z2, l2, false);
  REQUIRE(P1 == P2);
  REQUIRE(l1 == l2);
  REQUIRE(Z1.norm() > 0);
  REQUIRE(Z2.norm() == 0.0);
}
