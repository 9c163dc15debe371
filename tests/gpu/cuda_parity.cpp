// CPU/GPU parity of the CUDA path. The binary exits with 77 (ctest: SKIPPED, reason
// printed) when no CUDA device is usable, so machines without a GPU never report these as passed.
// Tolerance: ≤ 1e-4 relative on outputs and metrics (CPU vs CUDA), the GPU computing in fp32.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>

#include "helpers.hpp"
#include "registry_examples.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/replay/gpu_reference.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/replay/reference.hpp"
#include "kvsim/core/rng.hpp"
#include "kvsim/io/synth.hpp"

using namespace kvsim;

int main(int argc, char** argv) {
  // ctest registers the cases from this binary's tag listing at build time, with or without the files.
  if (kvsim::test::listing_only(argc, argv)) return Catch::Session().run(argc, argv);
  std::string why;
  if (cuda::device_count(&why) == 0) {
    std::cout << "SKIPPED: CPU/GPU parity needs a CUDA device (" << why << ")\n";
    return 77;
  }
  std::cout << "device: " << cuda::device_description() << "\n";
  return Catch::Session().run(argc, argv);
}

namespace {
double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

/// A layer's streams as the CUDA API takes them: Q [heads][n][d], K and V [kv_heads][n][d], float32.
void layer_streams(const StreamSource& src, int layer, std::vector<float>& Q, std::vector<float>& K,
                   std::vector<float>& V) {
  const auto& m = src.meta();
  const size_t nd = size_t(m.n_tokens) * m.head_dim;
  Q.assign(size_t(m.n_heads) * nd, 0.f);
  K.assign(size_t(m.n_kv_heads) * nd, 0.f);
  V.assign(K.size(), 0.f);
  for (int h = 0; h < m.n_heads; ++h) {
    MatF q = src.read(layer, Tensor::q, h);
    std::copy(q.data(), q.data() + q.size(), Q.begin() + size_t(h) * nd);
  }
  for (int h = 0; h < m.n_kv_heads; ++h) {
    MatF k = src.read(layer, Tensor::k, h), v = src.read(layer, Tensor::v, h);
    std::copy(k.data(), k.data() + k.size(), K.begin() + size_t(h) * nd);
    std::copy(v.data(), v.data() + v.size(), V.begin() + size_t(h) * nd);
  }
}

void compare_heads(const StreamSource& src, int layer, const std::vector<int64_t>& steps) {
  const auto& m = src.meta();
  const int64_t n = m.n_tokens;
  const int H = m.n_heads, Hkv = m.n_kv_heads, d = m.head_dim;
  std::vector<float> Q, K, V;
  layer_streams(src, layer, Q, K, V);
  std::vector<float> out, probs;
  std::vector<double> lt, pn;
  cuda::exact_attention(Q.data(), K.data(), V.data(), H, Hkv, n, d, m.softmax_scale, steps, out, lt, pn, &probs);
  const size_t rows = steps.size(), t_max = size_t(steps.back());
  double worst_out = 0, worst_lt = 0, worst_pn = 0, worst_p = 0;
  for (int h = 0; h < H; ++h) {
    ReferenceBlock ref;
    exact_attention(src.read(layer, Tensor::q, h), src.read(layer, Tensor::k, m.kv_head_of(h)).cast<double>(),
                    src.read(layer, Tensor::v, m.kv_head_of(h)).cast<double>(), m.softmax_scale, steps, ref);
    for (size_t r = 0; r < rows; ++r) {
      const Eigen::Map<const VecF> z(out.data() + (size_t(h) * rows + r) * d, d);
      worst_out = std::max(worst_out, (z.cast<double>() - ref.out.row(r).transpose()).norm() / ref.out.row(r).norm());
      // log τ can sit near 0: its error is relative to max(1, |log τ|).
      worst_lt = std::max(worst_lt, std::abs(lt[size_t(h) * rows + r] - ref.log_tau[r]) / std::max(1.0, std::abs(ref.log_tau[r])));
      worst_pn = std::max(worst_pn, rel(pn[size_t(h) * rows + r], ref.probs_norm[r]));
      for (size_t j = 0; j < t_max; ++j)
        worst_p = std::max(worst_p, std::abs(double(probs[(size_t(h) * rows + r) * t_max + j]) - ref.probs(r, j)));
    }
  }
  INFO("worst relative: out " << worst_out << ", log tau " << worst_lt << ", |a| " << worst_pn << "; abs prob " << worst_p);
  CHECK(worst_out <= 1e-4);
  CHECK(worst_lt <= 1e-4);
  CHECK(worst_pn <= 1e-4);
  CHECK(worst_p <= 1e-4);
}
}  // namespace

TEST_CASE("cuda: exact attention matches the CPU reference on synthetic GQA heads", "[cuda]") {
  for (std::string preset : {"gaussian", "heavy_hitter", "clustered"}) {
    INFO(preset);
    SynthSource src(test::small_synth(preset, 700, 64, 1, 8, 2));
    compare_heads(src, 0, {1, 2, 63, 64, 65, 255, 256, 512, 700});
    // Many rows: the gemm implementation's chunks of 64 / group = 16 rows, so 9 chunks, the last partial.
    std::vector<int64_t> dense;
    for (int64_t t = 3; t <= 700; t += 5) dense.push_back(t);
    compare_heads(src, 0, dense);
  }
}

TEST_CASE("cuda: a replay with the GPU reference matches the CPU replay for every policy", "[cuda]") {
  // Every registered example whose instance has a GPU twin (tests/unit/registry_examples.hpp), so a new
  // policy with a twin is compared here without editing a list.
  const char* cfg = R"(
[data]
synthetic = "heavy_hitter"
n = 512
d = 64
n_heads = 4
n_kv_heads = 2
[eval]
every = 7
policy_precision = "float32"  # h2o on the GPU mirrors the CPU's float32 products
[[policy]]
name = "exact"
)";
  Experiment cpu = parse_experiment(cfg, "parity.toml");
  Experiment gpu = parse_experiment(cfg, "parity.toml", {"eval.device=\"cuda\""});
  const StreamInfo s = test::stream_info(512, 64, 2, true);
  int twins = 0;
  for (const auto& x : test::registry_examples(s))
    if (x.gpu) {
      cpu.policies.push_back(x.spec);
      gpu.policies.push_back(x.spec);
      ++twins;
    }
  REQUIRE(twins >= 8);  // window, sink, h2o, buzz, uniform, oracle_topk, subgen, subgen_kcenter when written
  auto src = open_source(cpu.data);
  RunResult a = run_experiment(cpu, *src, 2);
  // The GPU replays once per cell and once batched per layer (sim/replay/gpu_layer_batch.hpp): the
  // same kernels on the same data, so the same rows to the bit.
  setenv("KVSIM_CUDA_LAYER_BATCH", "0", 1);
  RunResult b = run_experiment(gpu, *src, 2);
  setenv("KVSIM_CUDA_LAYER_BATCH", "1", 1);
  RunResult bb = run_experiment(gpu, *src, 2);
  unsetenv("KVSIM_CUDA_LAYER_BATCH");
  REQUIRE(bb.policies.size() == b.policies.size());
  for (size_t p = 0; p < b.policies.size(); ++p) {
    INFO(b.policies[p].spec.label << " batched per layer vs per cell");
    REQUIRE(bb.policies[p].rows.size() == b.policies[p].rows.size());
    for (size_t i = 0; i < b.policies[p].rows.size(); ++i)
      for (const char* m : {"rel_err", "eps_spectral", "cache_tokens", "kept_mass", "tau_rel_err"}) {
        const double x = metric_of(b.policies[p].rows[i], m), y = metric_of(bb.policies[p].rows[i], m);
        REQUIRE(((x == y) || (std::isnan(x) && std::isnan(y))));
      }
  }
  REQUIRE(a.policies.size() == b.policies.size());
  // Relative errors and ε near fp32's rounding floor (a policy still holding every token: ~1e-7 on
  // both paths, each against its own reference) are compared with an absolute floor of 5e-6; above
  // it, within 1e-4 relative. Every row is checked; the report gives each (policy, metric)'s count
  // of violations and the worst one.
  for (size_t p = 0; p < a.policies.size(); ++p) {
    INFO(a.policies[p].spec.label);
    REQUIRE(a.policies[p].rows.size() == b.policies[p].rows.size());
    std::map<std::string, std::pair<int, std::string>> bad;
    auto expect = [&](const char* metric, size_t i, double x, double y, double tol) {
      if (std::abs(y - x) <= tol) return;
      auto& [count, first] = bad[metric];
      if (count++ == 0) first = "row " + std::to_string(i) + ": CPU " + std::to_string(x) + ", GPU " + std::to_string(y);
    };
    for (size_t i = 0; i < a.policies[p].rows.size(); ++i) {
      const MetricRow &x = a.policies[p].rows[i], &y = b.policies[p].rows[i];
      // every policy but exact runs on the GPU in the cuda run (GpuReplayable).
      expect("cache_tokens", i, metric_of(x, "cache_tokens"), metric_of(y, "cache_tokens"), 0);
      expect("cache_bytes", i, metric_of(x, "cache_bytes"), metric_of(y, "cache_bytes"), 0);
      for (const char* m : {"rel_err", "eps_spectral"})
        expect(m, i, metric_of(x, m), metric_of(y, m), 1e-4 * std::abs(metric_of(x, m)) + 5e-6);
      if (!std::isnan(metric_of(x, "kept_mass"))) expect("kept_mass", i, metric_of(x, "kept_mass"), metric_of(y, "kept_mass"), 1e-4);
      if (!std::isnan(metric_of(x, "tau_rel_err")))
        expect("tau_rel_err", i, metric_of(x, "tau_rel_err"), metric_of(y, "tau_rel_err"), 1e-4 * (1 + metric_of(x, "tau_rel_err")));
    }
    for (const auto& [metric, v] : bad) {
      INFO(metric << ": " << v.first << " rows differ; first: " << v.second);
      CHECK(v.first == 0);
    }
  }
}

TEST_CASE("cuda: exact attention matches the CPU reference on stories260K", "[cuda]") {
  const std::string data = std::getenv("KVSIM_SHARED_DATA") ? std::getenv("KVSIM_SHARED_DATA") : KVSIM_SHARED_DATA;
  if (!std::filesystem::exists(data + "/stories260K/stories260K.bin")) {
    std::cout << "SKIPPED: needs " << data << "/stories260K (../shared/data beside the checkout)\n";
    std::exit(77);
  }
  test::TempDir tmp;
  RecordOptions o;
  o.checkpoint = data + "/stories260K/stories260K.bin";
  o.tokenizer = data + "/stories260K/tok512.bin";
  o.text_path = data + "/tinystories-sample/tinystories.txt";
  o.tokens = 512;
  o.out = tmp.file("rec.h5");
  record_model(o);
  RecordingReader rec(o.out);
  std::vector<int64_t> steps;
  for (int64_t t = 1; t <= 512; t += 3) steps.push_back(t);
  steps.push_back(512);
  for (int l = 0; l < rec.meta().n_layers; ++l) compare_heads(rec, l, steps);
}

namespace {
/// softmax(q_g · K[0, t)ᵀ) in double for each row g of the scaled queries `qgroup` (an oracle's input).
std::vector<VecD> exact_probs(const MatD& qgroup, const MatF& K, int64_t t) {
  const MatD logits = qgroup * K.topRows(t).cast<double>().transpose();
  std::vector<VecD> out;
  for (Eigen::Index g = 0; g < logits.rows(); ++g) {
    const VecD e = (logits.row(g).array() - logits.row(g).maxCoeff()).exp().transpose();
    out.push_back(e / e.sum());
  }
  return out;
}

/// CPU policy (float32 policy precision, kv_head mode) vs cuda::replay_policy on every KV head of
/// layer 0, the replay's spec taken from the CPU instances' own gpu_replay() (one instance per KV
/// head, seeded as the engine seeds them: their seeds are the spec's per-KV-head seeds): answers
/// ≤ 1e-4 relative, identical kept sets (in the same order for all but window/sink), the cluster
/// count and τ̂ where the twin answers them (cuda::kReplayKindTable).
void compare_policy(const StreamSource& src, const std::string& name, const Params& params, const std::string& agg,
                    const std::vector<int64_t>& steps, int64_t step_block = 0) {
  const auto& m = src.meta();
  const int64_t n = m.n_tokens;
  const int Hkv = m.n_kv_heads, G = m.n_heads / m.n_kv_heads, d = m.head_dim;
  std::vector<std::unique_ptr<Policy>> pols;
  cuda::PolicyReplay gp;
  for (int kvh = 0; kvh < Hkv; ++kvh) {
    StreamInfo info = test::stream_info(n, d, G, true);
    info.group_agg = *parse_choice<GroupAgg>(agg);
    info.seed = derive_seed({99, uint64_t(kvh)});
    pols.push_back(make_policy(name, params, info));
    const std::optional<cuda::PolicyReplay> spec = gpu_replay(*pols.back());
    REQUIRE(spec.has_value());
    if (kvh == 0) gp = *spec;
    else gp.seeds.insert(gp.seeds.end(), spec->seeds.begin(), spec->seeds.end());
  }
  REQUIRE((gp.seeds.empty() || gp.seeds.size() == size_t(Hkv)));
  gp.step_block = step_block;
  const cuda::ReplayKindInfo& twin = cuda::replay_kind_info(gp.kind);
  std::vector<float> Q, K, V;
  layer_streams(src, 0, Q, K, V);
  std::vector<float> z;
  std::vector<double> ls;
  std::vector<int64_t> kept;
  int64_t cap = 0;
  cuda::replay_policy(gp, Q.data(), K.data(), V.data(), Hkv, G, n, d, m.softmax_scale, steps, z, ls, kept, cap);
  REQUIRE(cap == cuda::replay_capacity(gp));
  const size_t rows = steps.size();
  double worst = 0;
  for (int kvh = 0; kvh < Hkv; ++kvh) {
    Policy& pol = *pols[size_t(kvh)];
    const MatF Kc = src.read(0, Tensor::k, kvh), Vc = src.read(0, Tensor::v, kvh);
    std::vector<MatF> Qg(G);
    for (int g = 0; g < G; ++g) Qg[g] = src.read(0, Tensor::q, kvh * G + g);
    MatD qgroup(G, d);
    std::vector<Answer> answers(G);
    size_t r = 0;
    for (int64_t t = 1; t <= n; ++t) {
      pol.observe(t - 1, Kc.row(t - 1).data(), Vc.row(t - 1).data());
      for (int g = 0; g < G; ++g) qgroup.row(g) = Qg[g].row(t - 1).cast<double>() * m.softmax_scale;
      const bool eval = r < rows && steps[r] == t;
      // An ExactProbsOracle (oracle_topk) gets each query's exact attention over tokens 0..t−1.
      const std::vector<VecD> probs = eval && needs_exact_probs(pol) ? exact_probs(qgroup, Kc, t) : std::vector<VecD>{};
      std::vector<const double*> probs_of;
      for (const VecD& p : probs) probs_of.push_back(p.data());
      pol.attend(t, qgroup, eval ? &answers : nullptr, probs_of.empty() ? nullptr : &probs_of);
      if (!eval) continue;
      std::vector<int64_t> gk;
      for (int64_t s = 0; s < cap; ++s) {
        const int64_t x = kept[(size_t(kvh) * rows + r) * cap + s];
        if (x >= 0) gk.push_back(x);
      }
      for (int g = 0; g < G; ++g) {
        const Answer& a = answers[g];
        std::vector<int64_t> ck = a.kept;
        INFO(name << " KV head " << kvh << " step " << t << " query " << g);
        const int h = kvh * G + g;
        if (twin.kept == cuda::KeptRow::cluster_count) {  // no subset: the same clusters (count)
          REQUIRE(kept[(size_t(kvh) * rows + r) * cap] == int64_t(pol.clusters()));
        } else if (gp.kind == cuda::ReplayKind::window || gp.kind == cuda::ReplayKind::sink) {
          // a ring on the CPU, the closed form (ascending) on the GPU: the same set
          std::sort(ck.begin(), ck.end());
          REQUIRE(gk == ck);
        } else {
          REQUIRE(gk == ck);  // same slots in the same order
        }
        if (twin.tau == cuda::Tau::log_sum) worst = std::max(worst, std::abs(std::expm1(ls[size_t(h) * rows + r] - a.log_tau)));
        if (twin.tau == cuda::Tau::uniform) {
          const double lt = hd::uniform_log_tau(ls[size_t(h) * rows + r], t, int64_t(gk.size()));
          worst = std::max(worst, std::abs(std::expm1(lt - a.log_tau)));
        }
        const Eigen::Map<const VecF> zg(z.data() + (size_t(h) * rows + r) * d, d);
        worst = std::max(worst, (zg.cast<double>() - a.z).norm() / std::max(a.z.norm(), 1e-30));
      }
      ++r;
    }
  }
  INFO(name << ": worst relative answer difference " << worst);
  CHECK(worst <= 1e-4);
}

std::vector<int64_t> steps_every(int64_t every, int64_t n) {
  std::vector<int64_t> steps;
  for (int64_t t = 1; t <= n; t += every) steps.push_back(t);
  if (steps.back() != n) steps.push_back(n);
  return steps;
}
}  // namespace

TEST_CASE("cuda: every registered GPU twin replays as its CPU policy, example by example", "[cuda]") {
  // The registry's examples (tests/unit/registry_examples.hpp) whose instance has a GPU twin, at both
  // group aggregations: a new policy with a twin is compared here without editing a list.
  const StreamInfo s = test::stream_info(600, 64, 4, true);
  int twins = 0;
  for (const auto& x : test::registry_examples(s)) {
    if (!x.gpu) continue;
    ++twins;
    for (std::string preset : {"gaussian", "heavy_hitter"}) {
      SynthSource src(test::small_synth(preset, 600, 64, 1, 8, 2));
      for (const char* agg : {"mean", "max"}) {
        INFO(x.spec.label << " on " << preset << ", group_agg " << agg);
        compare_policy(src, x.spec.name, x.spec.params, agg, steps_every(7, 600));
      }
    }
  }
  CHECK(twins >= 8);  // window, sink, h2o, buzz, uniform, oracle_topk, subgen, subgen_kcenter when written
}

TEST_CASE("cuda: GPU twins in their other modes match the CPU policies", "[cuda]") {
  // Modes the registry's examples do not reach: SubGen Algorithm 1 published (fixed δ) and fixed-memory
  // (cluster cap, merges); streaming k-center weighted or not; buzz with log_scale; h2o at head_dim 30
  // (not a multiple of 4: the state kernels' one-warp-per-key logits instead of the float4 path).
  for (std::string preset : {"clustered", "heavy_hitter"}) {
    INFO(preset);
    SynthSource src(test::small_synth(preset, 600, 64, 1, 8, 2));
    for (int64_t cap : {int64_t(0), int64_t(24)}) {
      Params sp;
      sp.set("s", int64_t(48));
      sp.set("t", int64_t(4));
      if (cap > 0) sp.set("max_clusters", cap);
      else sp.set("delta", 8.0);
      compare_policy(src, "subgen", sp, "mean", steps_every(11, 600));
    }
    for (bool weighted : {false, true}) {  // streaming k-center: 64 recent + 32 centers
      Params kc;
      kc.set("recent", int64_t(64));
      kc.set("centers", int64_t(32));
      kc.set("mode", std::string("streaming"));
      kc.set("weighted", weighted);
      compare_policy(src, "subgen_kcenter", kc, "mean", steps_every(5, 600));
    }
    for (const char* agg : {"mean", "max"}) {
      Params b;  // sink 4 + window 40 + T 60, stride 5: evictions every few dozen tokens
      b.set("window", int64_t(40));
      b.set("threshold", int64_t(60));
      b.set("stride", int64_t(5));
      b.set("log_scale", true);
      compare_policy(src, "buzz", b, agg, steps_every(5, 600));
    }
  }
  SynthSource odd(test::small_synth("heavy_hitter", 600, 30, 1, 8, 2));
  Params h;
  h.set("budget", int64_t(96));
  compare_policy(odd, "h2o", h, "mean", steps_every(7, 600));
}

TEST_CASE("cuda: h2o and buzz stepped in blocks match the CPU policies", "[cuda]") {
  // Blocked stepping (PolicyReplay::step_block, sim/cuda/block_logits.cuh): blocks of one step, of 7
  // (blocks end between evaluated steps and evictions), of 64 (the default) and longer than the
  // stream (one tile for all of it), with query groups of 4 and 1, both aggregations, head_dim 64 and
  // 30 (the tiles' partial key chunks). A logit read from the wrong column (a token evicted during
  // the block, or one that entered it) changes the kept sets these compare.
  for (int64_t bk : {int64_t(1), int64_t(7), int64_t(64), int64_t(1000)}) {
    for (int kv : {2, 8}) {
      INFO("step_block " << bk << ", " << kv << " KV heads");
      SynthSource src(test::small_synth("heavy_hitter", 600, 64, 1, 8, kv));
      Params h;
      h.set("budget", int64_t(96));
      h.set("heavy_ratio", 0.75);  // 72 heavy hitters + 24 recent: evictions reach deep into the block-start cache
      Params b;  // sink 4 + window 40 + T 60, stride 5: evictions every few dozen tokens
      b.set("window", int64_t(40));
      b.set("threshold", int64_t(60));
      b.set("stride", int64_t(5));
      b.set("log_scale", true);
      for (const char* agg : {"mean", "max"}) {
        compare_policy(src, "h2o", h, agg, steps_every(7, 600), bk);
        compare_policy(src, "buzz", b, agg, steps_every(5, 600), bk);
      }
    }
  }
  SynthSource odd(test::small_synth("heavy_hitter", 600, 30, 1, 8, 2));
  Params h;
  h.set("budget", int64_t(96));
  compare_policy(odd, "h2o", h, "mean", steps_every(7, 600), 64);
}
