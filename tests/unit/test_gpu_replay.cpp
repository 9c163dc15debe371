// The GPU replay adapter (sim/policies/gpu_replay.cpp), tested on the CPU with stand-in replays that
// have cuda::replay_policy's contract.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include "helpers.hpp"
#include "registry_examples.hpp"
#include "kvsim/policies/gpu_replay.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/core/rng.hpp"
using namespace kvsim;

// A CPU stand-in with cuda::replay_policy's contract (sink + window only: the closed form of
// include/kvsim/core/hd.hpp, attention in double): the adapter must return, at every evaluated step,
// the same kept set and output as the CPU sink policy fed token by token.
void sink_window_stand_in(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads, int group,
                       int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                       std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
  REQUIRE(kv_heads == 1);
  kept_cap = p.sink + p.window;
  const size_t rows = steps.size();
  z.assign(size_t(group) * rows * d, 0.f);
  log_sum.assign(size_t(group) * rows, 0.0);
  kept.assign(rows * size_t(kept_cap), -1);
  for (size_t r = 0; r < rows; ++r) {
    const int64_t t = steps[r], m = hd::sink_window_count(t, p.sink, p.window);
    for (int64_t j = 0; j < m; ++j) kept[r * kept_cap + j] = hd::sink_window_token(t, p.sink, p.window, j);
    for (int g = 0; g < group; ++g) {
      std::vector<double> l(m);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < m; ++j) {
        const float* k = K + kept[r * kept_cap + j] * d;
        double s = 0;
        for (int i = 0; i < d; ++i) s += scale * Q[(size_t(g) * n + size_t(t - 1)) * d + i] * double(k[i]);
        mx = std::max(mx, l[j] = s);
      }
      for (auto& x : l) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < m; ++j)
        for (int i = 0; i < d; ++i)
          z[(size_t(g) * rows + r) * d + i] += float(l[j] / sum * V[kept[r * kept_cap + j] * d + i]);
      log_sum[size_t(g) * rows + r] = mx + std::log(sum);
    }
  }
}

TEST_CASE("policies: the GPU replay adapter hands a replay's answers to the engine step by step", "[policies][cuda]") {
  SynthSource src(test::small_synth("heavy_hitter", 200, 16, 1, 4, 2));
  const auto& meta = src.meta();
  const MatF K = src.read(0, Tensor::k, 1), V = src.read(0, Tensor::v, 1);
  const MatF Q0 = src.read(0, Tensor::q, 2), Q1 = src.read(0, Tensor::q, 3);
  std::vector<int64_t> steps;
  for (int64_t t = 3; t <= 200; t += 9) steps.push_back(t);
  StreamInfo info;
  info.n = 200;
  info.head_dim = 16;
  info.n_queries = 2;
  Params prm;
  prm.set("budget", int64_t(40));
  prm.set("sink", int64_t(4));
  auto cpu = make_policy("sink", prm, info);
  const auto spec = gpu_replay(*cpu);
  REQUIRE(spec.has_value());
  CHECK(spec->kind == cuda::ReplayKind::sink);
  CHECK(spec->sink == 4);
  CHECK(spec->window == 36);
  auto gpu = make_gpu_replay(make_policy("sink", prm, info), {&Q0, &Q1}, K, V, meta.softmax_scale, steps, sink_window_stand_in);
  MatD q(2, 16);
  std::vector<Answer> a(2), b(2);
  size_t r = 0;
  for (int64_t t = 1; t <= 200; ++t) {
    cpu->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
    gpu->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
    REQUIRE(gpu->cache_tokens() == cpu->cache_tokens());
    if (r == steps.size() || steps[r] != t) continue;
    q.row(0) = Q0.row(t - 1).cast<double>() * meta.softmax_scale;
    q.row(1) = Q1.row(t - 1).cast<double>() * meta.softmax_scale;
    cpu->attend(t, q, &a, nullptr);
    gpu->attend(t, q, &b, nullptr);
    for (int g = 0; g < 2; ++g) {
      INFO("step " << t << " query " << g);
      std::vector<int64_t> ka = a[g].kept, kb = b[g].kept;
      std::sort(ka.begin(), ka.end());
      std::sort(kb.begin(), kb.end());
      REQUIRE(ka == kb);
      CHECK((a[g].z - b[g].z).norm() <= 1e-5 * a[g].z.norm());
    }
    ++r;
  }
  CHECK(r == steps.size());
  // A step that was not replayed is an error, not a silently wrong answer.
  auto gpu2 = make_gpu_replay(make_policy("sink", prm, info), {&Q0, &Q1}, K, V, meta.softmax_scale, steps, sink_window_stand_in);
  gpu2->observe(0, K.row(0).data(), V.row(0).data());
  CHECK_THROWS_WITH(gpu2->attend(2, q, &b, nullptr), Catch::Matchers::Contains("not replayed"));
}

TEST_CASE("policies: h2o's GPU replay spec carries its sizes and group_agg and its oracle form has none", "[policies][cuda]") {
  SynthSource src(test::small_synth("heavy_hitter", 200, 16, 1, 4, 2));
  const auto& meta = src.meta();
  const MatF K = src.read(0, Tensor::k, 1), V = src.read(0, Tensor::v, 1);
  const MatF Q0 = src.read(0, Tensor::q, 2), Q1 = src.read(0, Tensor::q, 3);
  const std::vector<int64_t> steps{3, 12, 200};
  StreamInfo info;
  info.n = 200;
  info.head_dim = 16;
  info.n_queries = 2;
  Params hp;
  hp.set("budget", int64_t(40));
  info.group_agg = GroupAgg::max;
  const auto hs = gpu_replay(*make_policy("h2o", hp, info));
  REQUIRE(hs.has_value());
  CHECK((hs->budget == 40 && hs->recent == 20 && hs->group_agg == hd::kAggMax));
  hp.set("score", std::string("oracle"));
  CHECK_FALSE(gpu_replay(*make_policy("h2o", hp, info)).has_value());
  CHECK_THROWS_WITH(make_gpu_replay(make_policy("h2o", hp, info), {&Q0, &Q1}, K, V, meta.softmax_scale, steps, sink_window_stand_in),
                    Catch::Matchers::Contains("no GPU replay"));
}

/// Parameters of the stepping stand-in test for each policy with a GPU replay.
Params replay_test_params(const std::string& name) {
  Params prm;
  if (name == "uniform") prm.set("budget", int64_t(40));
  else if (name == "subgen") {
    prm.set("memory", int64_t(60));  // fixed-memory variant: s = 30, t = 3, clusters ≤ 7
    prm.set("t", int64_t(3));
  }
  else if (name == "subgen_kcenter") {
    prm.set("recent", int64_t(30));
    prm.set("centers", int64_t(12));
    prm.set("mode", std::string("streaming"));
    prm.set("weighted", true);
  } else {
    prm.set("window", int64_t(20));
    prm.set("threshold", int64_t(30));
    prm.set("stride", int64_t(3));
    prm.set("log_scale", true);
  }
  return prm;
}

/// The replay descriptors carry the parameters of replay_test_params (seed 4242).
void check_replay_spec(const std::string& name, const cuda::PolicyReplay& spec) {
  INFO(name);
  if (name == "uniform") CHECK((spec.budget == 40 && spec.seeds == std::vector<uint64_t>{4242}));
  else if (name == "subgen_kcenter") CHECK((spec.recent == 30 && spec.budget == 12 && spec.weighted));
  else if (name == "subgen") CHECK((spec.s == 30 && spec.t == 3 && spec.max_clusters > 0 && spec.seeds == std::vector<uint64_t>{4242}));
  else CHECK((spec.sink == 4 && spec.window == 20 && spec.threshold == 30 && spec.stride == 3 && spec.log_scale));
}

/// A stand-in with cuda::replay_policy's contract that steps a fresh CPU instance of policy `name`
/// and writes its answers in the replay's layout.
PolicyReplayFn stepping_stand_in(const std::string& name, const Params& prm, const StreamInfo& info, const MatF& K,
                                 const MatF& V, const MatF& Q0, const MatF& Q1) {
return [=, &K, &V, &Q0, &Q1](const cuda::PolicyReplay& p, const float*, const float*, const float*, int kv_heads, int group,
                      int64_t n, int d, double scale, const std::vector<int64_t>& st, std::vector<float>& z,
                      std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
    REQUIRE(kv_heads == 1);
    REQUIRE(group == 2);
    kept_cap = cuda::replay_capacity(p);
    const size_t rows = st.size();
    z.assign(size_t(group) * rows * d, 0.f);
    log_sum.assign(size_t(group) * rows, 0.0);
    kept.assign(rows * size_t(kept_cap), -1);
    auto pol = make_policy(name, prm, info);
    MatD q(2, d);
    std::vector<Answer> a(2);
    size_t r = 0;
    for (int64_t t = 1; t <= n; ++t) {
      pol->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
      q.row(0) = Q0.row(t - 1).cast<double>() * scale;
      q.row(1) = Q1.row(t - 1).cast<double>() * scale;
      const bool ev = r < rows && st[r] == t;
      pol->attend(t, q, ev ? &a : nullptr, nullptr);
      if (!ev) continue;
      REQUIRE(int64_t(a[0].kept.size()) <= kept_cap);
      if (name == "subgen") kept[r * kept_cap] = int64_t(pol->clusters());  // the replay's encoding
      else std::copy(a[0].kept.begin(), a[0].kept.end(), kept.begin() + r * kept_cap);
      for (int g = 0; g < 2; ++g) {
        for (int i = 0; i < d; ++i) z[(size_t(g) * rows + r) * d + i] = float(a[g].z[i]);
        if (name == "uniform") log_sum[size_t(g) * rows + r] = a[g].log_tau - std::log(double(t) / a[g].kept.size());
        if (name == "subgen") log_sum[size_t(g) * rows + r] = a[g].log_tau;
      }
      ++r;
    }
  };
}

TEST_CASE("policies: GPU replays of uniform buzz k-center and subgen carry tau, cache sizes, clusters and kept order", "[policies][cuda]") {
  // A stand-in with cuda::replay_policy's contract that steps a fresh CPU instance of the same policy
  // and writes its answers in the replay's layout (kept in answer order, padded to
  // replay_capacity; log_sum from uniform's τ̂ inverted). Through the adapter they must come back
  // identical: τ̂ for uniform, buzz's varying cache size, the kept order, capacity_matched.
  SynthSource src(test::small_synth("heavy_hitter", 300, 16, 1, 4, 2));
  const auto& meta = src.meta();
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  const MatF Q0 = src.read(0, Tensor::q, 0), Q1 = src.read(0, Tensor::q, 1);
  std::vector<int64_t> steps;
  for (int64_t t = 1; t <= 300; t += 7) steps.push_back(t);
  StreamInfo info;
  info.n = 300;
  info.head_dim = 16;
  info.n_queries = 2;
  info.seed = 4242;
  for (const std::string name : {"uniform", "buzz", "subgen_kcenter", "subgen"}) {
    const Params prm = replay_test_params(name);
    const PolicyReplayFn stand_in = stepping_stand_in(name, prm, info, K, V, Q0, Q1);
    auto cpu = make_policy(name, prm, info);
    auto gpu = make_gpu_replay(make_policy(name, prm, info), {&Q0, &Q1}, K, V, meta.softmax_scale, steps, stand_in);
    CHECK(gpu->capacity_matched() == cpu->capacity_matched());
    const auto spec = gpu_replay(*cpu);
    REQUIRE(spec.has_value());
    check_replay_spec(name, *spec);
    MatD q(2, 16);
    std::vector<Answer> a(2), b(2);
    size_t r = 0;
    bool sizes_varied = false;
    for (int64_t t = 1; t <= 300; ++t) {
      cpu->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
      gpu->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
      q.row(0) = Q0.row(t - 1).cast<double>() * meta.softmax_scale;
      q.row(1) = Q1.row(t - 1).cast<double>() * meta.softmax_scale;
      const bool ev = r < steps.size() && steps[r] == t;
      cpu->attend(t, q, ev ? &a : nullptr, nullptr);
      if (!ev) continue;
      gpu->attend(t, q, &b, nullptr);
      INFO(name << " step " << t);
      REQUIRE(gpu->cache_tokens() == cpu->cache_tokens());
      REQUIRE(gpu->cache_vectors() == cpu->cache_vectors());
      if (name == "subgen_kcenter" || name == "subgen") REQUIRE(gpu->clusters() == cpu->clusters());
      else REQUIRE(std::isnan(gpu->clusters()));
      sizes_varied |= cpu->cache_tokens() != std::min<int64_t>(t, cuda::replay_capacity(*spec));
      for (int g = 0; g < 2; ++g) {
        REQUIRE(b[g].kept == a[g].kept);
        CHECK((a[g].z - b[g].z).norm() <= 1e-6 * a[g].z.norm());
        if (name == "uniform" || name == "subgen") CHECK(b[g].log_tau == Approx(a[g].log_tau).epsilon(1e-12));
        else CHECK(std::isnan(b[g].log_tau));
        CHECK(b[g].has_kept == a[g].has_kept);
      }
      ++r;
    }
    CHECK(r == steps.size());
    if (name != "uniform") CHECK(sizes_varied);  // the adapter must not assume a fixed-size cache
  }
}

TEST_CASE("policies: every replay kind's table row names the registered policy whose twin gives it, and checks its sizes",
          "[policies][cuda][registry]") {
  // cuda::kReplayKindTable is the one place a GPU twin's capacity, size checks and answer form live;
  // each policy's gpu_replay() (its own file) picks the row. Every example's spec must have a capacity
  // ≥ 1 that its row's size check accepts, and every row must be reached by an example of the policy
  // it names.
  StreamInfo s;
  s.n = 256;
  s.head_dim = 16;
  s.n_queries = 2;
  s.policy_f32 = true;
  std::vector<int> reached(cuda::kReplayKindCount, 0);
  for (const auto& x : test::registry_examples(s)) {
    if (!x.gpu) continue;
    const auto spec = gpu_replay(*make_policy(x.spec.name, x.spec.params, s));
    REQUIRE(spec.has_value());
    const cuda::ReplayKindInfo& row = cuda::replay_kind_info(spec->kind);
    INFO(x.spec.label << " → replay kind " << row.name);
    CHECK(row.kind == spec->kind);
    CHECK(row.capacity(*spec) >= 1);
    CHECK(row.sizes_ok(*spec, int(std::max<size_t>(1, spec->seeds.size())), s.n));
    // Another policy may reuse a kind (its cache is one an existing kernel computes); the kind's own
    // policy must reach it.
    if (std::string(row.name) == x.spec.name) ++reached[int(spec->kind)];
  }
  for (int k = 0; k < cuda::kReplayKindCount; ++k) {
    INFO("replay kind " << cuda::kReplayKindTable[k].name);
    CHECK(reached[size_t(k)] > 0);
  }
  // Negative controls: the size checks refuse what the kernels cannot run.
  cuda::PolicyReplay h;
  h.kind = cuda::ReplayKind::h2o;
  h.budget = 8;
  h.recent = 8;  // no heavy slot left
  CHECK_FALSE(cuda::replay_kind_info(h.kind).sizes_ok(h, 1, 64));
  h.recent = 4;
  CHECK(cuda::replay_kind_info(h.kind).sizes_ok(h, 1, 64));
  cuda::PolicyReplay u;
  u.kind = cuda::ReplayKind::uniform;
  u.budget = 8;
  u.seeds = {1};
  CHECK_FALSE(cuda::replay_kind_info(u.kind).sizes_ok(u, 2, 64));  // one seed for two KV heads
  CHECK(cuda::replay_kind_info(u.kind).sizes_ok(u, 1, 64));
}
