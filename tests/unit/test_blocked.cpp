// Blocked stepping (`[eval] stepping = "blocked"`, include/kvsim/policies/policy.hpp BlockStepper),
// driven by the registry: every registered policy × each of its examples is replayed by the engine per step and
// blocked — blocks of 5 steps (so blocks end between evaluated steps as well as on them, and cross the
// prompt's end) and the engine's own block size — on one GQA stream with a prompt, in both gqa modes and
// both policy precisions, evaluating every 3rd step and every step (a block then holds up to 5 or 256 of them). The properties:
//   - a policy that is a BlockStepper gives the per-step numbers: in float64 the same kept sets (kept_mass,
//     cache_tokens, cache_bytes to the bit) and rel_err / eps within 1e-12; in float32 rel_err within 1e-5,
//     and the kept sets equal except near-ties (rows whose kept_mass moved are counted, and must be rare);
//   - any other policy is untouched: the same bits;
//   - at least h2o, tova, scissorhands, buzz, kivi, quest, subgen, knorm and the slot-store answerers (keydiff,
//     lagkv, uniform, snapkv, pyramidkv, expected_attention) are BlockSteppers (the test is not vacuous; all but
//     the first four read only the evaluated queries and answer a block's evaluated steps together, quest's
//     loaded bytes per step too (loaded_bytes is compared with the kept set)).
// One block answers each of its evaluated steps (BlockAnswers): h2o and buzz stepped by one step_block over 48
// steps answer at 4 steps inside it as the per-step path does at those steps (not the block's last answer 4 times:
// the answers at different steps differ), and a block whose evaluated steps are outside it or unsorted is refused.
// Negative control: with the block's masking switched off (g_blocked_masking_off: a slot taken over inside a
// block keeps reading the evicted token's logit; kivi answers every step of a block from its last state; quest,
// keydiff, snapkv and knorm let every row read its block's whole union), their blocked numbers differ from the
// per-step ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"
#include "kvsim/io/synth.hpp"
#include "registry_examples.hpp"

using namespace kvsim;

namespace {

const char* kBase = R"(
name = "blocked"
seed = 4
[data]
synthetic = "heavy_hitter"
n = 160
d = 16
n_layers = 2
n_heads = 4
n_kv_heads = 2
prefill = 32
[eval]
every = 3
from = 33
[[policy]]
name = "exact"
)";

RunResult run(const PolicySpec& spec, const std::vector<std::string>& sets) {
  Experiment ex = parse_experiment(kBase, "inline", sets);
  ex.policies.push_back(spec);
  auto src = open_source(ex.data);
  return run_experiment(ex, *src, 1);
}

struct Diff {
  double worst = 0;     // largest |Δ| of rel_err and eps_spectral
  int kept_moved = 0;   // rows whose kept set (kept_mass, cache_tokens, bytes, clusters) moved
  int rows = 0;
  bool bits = true;     // every metric (but policy_ns) the same bits
};

Diff compare(const RunResult& a, const RunResult& b) {
  Diff d;
  const auto& ra = a.policies[1].rows;
  const auto& rb = b.policies[1].rows;
  REQUIRE(ra.size() == rb.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    REQUIRE(ra[i].step == rb[i].step);
    ++d.rows;
    for (const auto& c : a.metrics)
      if (c.name != "policy_ns") d.bits &= test::same_bits(ra[i][c.index], rb[i][c.index]);
    bool moved = false;
    for (const char* m : {"kept_mass", "cache_tokens", "cache_bytes", "loaded_bytes", "clusters"})
      moved |= !test::same_bits(metric_of(ra[i], m), metric_of(rb[i], m));
    d.kept_moved += moved;
    for (const char* m : {"rel_err", "eps_spectral"}) d.worst = std::max(d.worst, std::abs(metric_of(ra[i], m) - metric_of(rb[i], m)));
  }
  return d;
}

}  // namespace

TEST_CASE("blocked stepping: every registered policy gives its per-step numbers", "[blocked][registry]") {
  StreamInfo s = test::stream_info(160, 16, 2, false);
  s.prefill = 32;
  std::set<std::string> blocked_names;
  for (const test::Example& x : test::registry_examples(s)) {
    if (!x.refused.empty()) continue;
    const bool stepper = block_stepper(*make_policy(x.spec.name, x.spec.params, s)) != nullptr;
    if (stepper) blocked_names.insert(x.spec.name);
    for (const char* gqa : {"kv_head", "query_head"})
      for (const char* prec : {"float64", "float32"})
        for (const int every : {3, 1}) {
          const std::vector<std::string> common = {std::string("eval.gqa=\"") + gqa + "\"",
                                                   std::string("eval.policy_precision=\"") + prec + "\"",
                                                   "eval.every=" + std::to_string(every)};
          auto with = [&](const char* mode, int block) {
            auto o = common;
            o.push_back(std::string("eval.stepping=\"") + mode + "\"");
            o.push_back("eval.stepping_block=" + std::to_string(block));
            return run(x.spec, o);
          };
          const RunResult per_step = with("per_step", 0);
          for (int block : {5, 0}) {
            INFO(x.spec.label << " " << gqa << " " << prec << " every " << every << " block " << block);
            const Diff d = compare(with("blocked", block), per_step);
            if (!stepper) {
              CHECK(d.bits);
              continue;
            }
            if (std::string(prec) == "float64") {
              CHECK(d.kept_moved == 0);
              CHECK(d.worst <= 1e-12);
            } else {
              CHECK(d.kept_moved * 50 <= d.rows);  // near-ties only: ≤ 2% of the rows
              CHECK(d.worst <= 1e-5);
            }
          }
        }
  }
  // kivi, quest, subgen, knorm and the slot-store answerers (SlotAnswersStepper): evaluated steps only.
  for (const char* name : {"h2o", "tova", "scissorhands", "buzz", "kivi", "quest", "subgen", "knorm", "keydiff", "lagkv",
                           "uniform", "snapkv", "pyramidkv", "expected_attention"}) {
    INFO(name);
    CHECK(blocked_names.count(name) == 1);
  }
}

TEST_CASE("blocked stepping: a block with its masking switched off differs (negative control)", "[blocked]") {
  // The ScorerPolicy walk, buzz's slot-store walk, and kivi's masks (a group quantized inside a block must
  // not answer dequantized at the block's earlier evaluated steps; groups of 8 behind 16 full-precision tokens),
  // and quest's (a row must read only the pages its own step loads, not every page its block loads).
  // And the slot-store answerers' (a row must read only its own step's slots: keydiff and knorm evict inside a
  // block, snapkv's decoded tokens join after the block's earlier steps).
  for (const char* name : {"h2o", "buzz", "kivi", "quest", "keydiff", "snapkv", "knorm"}) {
    INFO(name);
    Params params;
    if (std::string(name) == "kivi") {
      params.set("bits", int64_t(2));
      params.set("group", int64_t(8));
      params.set("residual", int64_t(16));
    } else if (std::string(name) == "quest") {
      params.set("budget", int64_t(32));
      params.set("page_size", int64_t(4));
    } else {
      params.set("memory", 0.25);
    }
    const PolicySpec spec{name, name, params};
    const RunResult per_step = run(spec, {"eval.stepping=\"per_step\""});
    g_blocked_masking_off = true;
    const RunResult off = run(spec, {"eval.stepping=\"blocked\"", "eval.stepping_block=8"});
    g_blocked_masking_off = false;
    const RunResult on = run(spec, {"eval.stepping=\"blocked\"", "eval.stepping_block=8"});
    CHECK(compare(on, per_step).worst <= 1e-12);
    CHECK(compare(off, per_step).worst > 1e-6);
  }
  CHECK_THROWS_WITH(parse_experiment(kBase, "inline", {"eval.stepping=\"fast\""}), Catch::Contains("eval.stepping"));
  CHECK_THROWS_WITH(parse_experiment(kBase, "inline", {"eval.stepping_block=-1"}), Catch::Contains("eval.stepping_block"));
}

TEST_CASE("blocked stepping: one block answers at each of its evaluated steps", "[blocked]") {
  const int64_t n = 60, d = 16, G = 2;
  SynthSource src(test::small_synth("heavy_hitter", n, d, 1, G, 1));
  const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  std::vector<MatD> Q(G);
  for (int g = 0; g < G; ++g) Q[g] = src.read(0, Tensor::q, g).cast<double>() * src.meta().softmax_scale;
  std::vector<const MatD*> qs = {&Q[0], &Q[1]};
  const std::vector<int64_t> steps = {17, 30, 31, 58};
  for (const bool f32 : {false, true})
    for (const char* name : {"h2o", "buzz"}) {
      INFO(name << (f32 ? " float32" : " float64"));
      Params params;
      params.set("memory", 0.25);
      StreamInfo s = test::stream_info(n, d, G, f32);
      auto per_step = make_policy(name, params, s), blocked = make_policy(name, params, s);
      // Steps 1..10 one block without answers, then steps 11..58 in one block answering at `steps`.
      BlockStepper& b = *block_stepper(*blocked);
      b.step_block(1, 10, K, V, qs, nullptr);
      BlockAnswers out;
      out.reset(steps, G);
      b.step_block(11, 58, K, V, qs, &out);
      MatD q(G, d);
      std::vector<Answer> want(G);
      for (int64_t t = 1; t <= 58; ++t) {
        per_step->observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
        for (int g = 0; g < G; ++g) q.row(g) = Q[g].row(t - 1);
        const int64_t k = out.index_of(t);
        per_step->attend(t, q, k >= 0 ? &want : nullptr, nullptr);
        if (k < 0) continue;
        CHECK(out.cache_bytes[size_t(k)] == per_step->cache_bytes(int(d)));
        for (int g = 0; g < G; ++g) {
          const Answer& got = out.answers[size_t(k)][size_t(g)];
          CHECK(got.kept == want[size_t(g)].kept);
          CHECK((got.z - want[size_t(g)].z).norm() <= (f32 ? 1e-5 : 1e-12) * want[size_t(g)].z.norm());
        }
      }
      CHECK((out.answers[0][0].z - out.answers[3][0].z).norm() > 1e-3 * out.answers[3][0].z.norm());
      BlockAnswers bad;
      bad.reset({70}, G);
      CHECK_THROWS_WITH(b.step_block(59, 60, K, V, qs, &bad), Catch::Contains("evaluated steps"));
      bad.reset({60, 59}, G);
      CHECK_THROWS_WITH(b.step_block(59, 60, K, V, qs, &bad), Catch::Contains("evaluated steps"));
    }
}
