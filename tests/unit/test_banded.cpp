// Closed-form caches replayed in blocks (include/kvsim/replay/banded.hpp): the banded masked GEMM
// answers equal the per-step policy's (window, sink) within 1e-12 in double and 1e-5 in float32, the
// kept lists are the per-step cache's, and the engine's two replays of a config agree.
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <set>

#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/banded.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

namespace {

struct Stream {
  MatF Kf, Vf;
  MatD K, V;
  std::vector<MatD> qs;  // scaled queries, per head
};

Stream make_stream(int64_t n, int d, int H, uint64_t seed) {
  SynthParams p = test::small_synth("heavy_hitter", n, d, 1, H, 1);
  p.seed = seed;
  SynthSource src(p);
  Stream s;
  s.Kf = src.read(0, Tensor::k, 0);
  s.Vf = src.read(0, Tensor::v, 0);
  s.K = s.Kf.cast<double>();
  s.V = s.Vf.cast<double>();
  for (int h = 0; h < H; ++h) s.qs.push_back(src.read(0, Tensor::q, h).cast<double>() * src.meta().softmax_scale);
  return s;
}

/// The per-step path: the registered policy stepped token by token, answers at `steps`.
std::vector<Answer> per_step(const Stream& s, const std::string& name, const Params& params, bool f32,
                             const std::vector<int64_t>& steps) {
  StreamInfo info;
  info.n = s.K.rows();
  info.head_dim = int(s.K.cols());
  info.n_queries = int(s.qs.size());
  info.policy_f32 = f32;
  auto pol = make_policy(name, params, info);
  std::vector<Answer> all;
  MatD q(Eigen::Index(s.qs.size()), s.K.cols());
  size_t r = 0;
  for (int64_t t = 1; t <= steps.back(); ++t) {
    pol->observe(t - 1, s.Kf.row(t - 1).data(), s.Vf.row(t - 1).data());
    if (t != steps[r]) continue;
    for (size_t h = 0; h < s.qs.size(); ++h) q.row(Eigen::Index(h)) = s.qs[h].row(t - 1);
    std::vector<Answer> out(s.qs.size());
    pol->attend(t, q, &out, nullptr);
    for (auto& a : out) all.push_back(std::move(a));
    ++r;
  }
  return all;
}

/// The closed form of `name`'s instance for the stream, if it has one.
std::optional<ClosedFormCache> form_of(const Stream& s, const std::string& name, const Params& params) {
  StreamInfo info;
  info.n = s.K.rows();
  info.head_dim = int(s.K.cols());
  info.n_queries = int(s.qs.size());
  return closed_form(*make_policy(name, params, info));
}

/// Largest ‖z_banded − z_step‖ / ‖z_step‖ over every answer, and the largest |Δ log τ̂| where the closed
/// form reports log τ (the per-step answer must then have one, and must not otherwise); checks the kept
/// lists are identical. Answers in double where the closed form says double_only, as the engine does.
struct Worst {
  double z = 0, log_tau = 0;
};
Worst worst_rel(const Stream& s, const std::string& name, const Params& params, bool f32,
                const std::vector<int64_t>& steps, const ClosedFormCache* override_form = nullptr) {
  const auto form = form_of(s, name, params);
  REQUIRE(form);
  const ClosedFormCache c = override_form ? *override_form : *form;
  std::vector<const MatD*> qs;
  for (const auto& q : s.qs) qs.push_back(&q);
  MatD Z;
  VecD ls;
  if (f32 && !c.double_only) closed_form_answers(qs, s.Kf, s.Vf, c, steps, Z, &ls);
  else closed_form_answers(qs, s.K, s.V, c, steps, Z, &ls);
  const auto want = per_step(s, name, params, f32, steps);
  REQUIRE(Z.rows() == Eigen::Index(want.size()));
  REQUIRE(ls.size() == Z.rows());
  Worst worst;
  std::vector<int64_t> kept;
  for (size_t i = 0; i < want.size(); ++i) {
    const VecD z = Z.row(Eigen::Index(i)).transpose();
    worst.z = std::max(worst.z, (z - want[i].z).norm() / want[i].z.norm());
    REQUIRE(std::isnan(want[i].log_tau) == !form->log_tau);
    if (form->log_tau) worst.log_tau = std::max(worst.log_tau, std::abs(ls[Eigen::Index(i)] - want[i].log_tau));
    if (override_form) continue;
    closed_form_kept(c, steps[i / s.qs.size()], kept);
    REQUIRE(kept == want[i].kept);  // the per-step cache's slot order, element for element
  }
  return worst;
}

Params budget_params(int64_t budget, int64_t sink = -1) {
  Params p;
  p.set("budget", budget);
  if (sink >= 0) p.set("sink", sink);
  return p;
}

std::vector<int64_t> every(int64_t from, int64_t n, int64_t k) {
  std::vector<int64_t> st;
  for (int64_t t = from; t <= n; t += k) st.push_back(t);
  if (st.back() != n) st.push_back(n);
  return st;
}

}  // namespace

TEST_CASE("banded: every closed-form policy's answers equal its per-step path (double 1e-12, float32 1e-5)",
          "[banded][registry]") {
  const int64_t n = 700;
  const Stream s = make_stream(n, 16, 2, 3);
  const auto steps_sets = {every(1, n, 1), every(3, n, 7), every(450, n, 1), every(1, n, 200)};
  // Driven by the registry: every registered policy whose instance is a ClosedFormPolicy, at budgets
  // shorter than a chunk, longer than one and longer than the stream (where it takes a budget).
  std::set<std::string> closed_names;
  for (const auto* reg : policy_registry()) {
    for (const Params& example : reg->examples) {
      bool closed = false;
      try {
        closed = form_of(s, reg->name, example).has_value();
      } catch (const Error&) {  // a policy this stream cannot build (press_replay: no prompt) is no closed form
      }
      if (!closed) continue;
      closed_names.insert(reg->name);
      std::vector<Params> variants{example};
      if (example.has("budget"))
        for (int64_t b : {1, 5, 96, 300, 1000}) {
          Params p = example;
          p.set("budget", b);
          try {
            form_of(s, reg->name, p);  // sink: a budget within its sink tokens is refused
            variants.push_back(p);
          } catch (const Error&) {
          }
        }
      for (const Params& p : variants)
        for (const auto& steps : steps_sets)
          for (const bool f32 : {false, true}) {
            INFO(reg->name << " " << p.to_string() << ", " << steps.size() << " steps, " << (f32 ? "float32" : "float64"));
            const Worst w = worst_rel(s, reg->name, p, f32, steps);
            const bool in_float = f32 && !form_of(s, reg->name, p)->double_only;
            CHECK(w.z < (in_float ? 1e-5 : 1e-12));
            CHECK(w.log_tau < (in_float ? 1e-5 : 1e-12));
          }
    }
  }
  // The registry holds at least these closed forms (a registry that lost them would pass vacuously).
  for (const char* name : {"window", "sink", "exact"}) {
    INFO(name);
    CHECK(closed_names.count(name) == 1);
  }
}

TEST_CASE("banded: a long window is answered in chunks of at most 2^22 logits, equally", "[banded]") {
  // window 20000, 2 query heads: 2^22 / (2 × (20000 + 5000)) = 83 steps per chunk instead of 128.
  const int64_t n = 20500;
  const Stream s = make_stream(n, 8, 2, 6);
  const auto steps = every(20300, n, 1);
  CHECK(worst_rel(s, "window", budget_params(20000), false, steps).z < 1e-12);
  CHECK(worst_rel(s, "sink", budget_params(20000, 4), true, steps).z < 1e-5);
  // exact: a window as long as the stream, with its log τ.
  const Worst w = worst_rel(s, "exact", Params{}, true, steps);
  CHECK(w.z < 1e-12);
  CHECK(w.log_tau < 1e-12);
}

TEST_CASE("banded: a wrong closed form is caught (negative control)", "[banded]") {
  const Stream s = make_stream(400, 16, 2, 4);
  const auto steps = every(1, 400, 1);
  // One token fewer in the window, or sinks the policy does not keep: the answers move well beyond
  // the tolerances above, so the equality checks can fail.
  const ClosedFormCache shorter{0, 63}, sinks{4, 60};
  CHECK(worst_rel(s, "window", budget_params(64), false, steps, &shorter).z > 1e-6);
  CHECK(worst_rel(s, "window", budget_params(64), false, steps, &sinks).z > 1e-6);
  // exact's log τ over one token fewer than the prefix moves well beyond 1e-12 too.
  ClosedFormCache short_exact{0, 399};
  short_exact.log_tau = short_exact.double_only = true;
  CHECK(worst_rel(s, "exact", Params{}, false, steps, &short_exact).log_tau > 1e-6);
}

TEST_CASE("banded: errors name the problem", "[banded]") {
  const Stream s = make_stream(50, 8, 1, 5);
  std::vector<const MatD*> qs{&s.qs[0]};
  MatD Z;
  CHECK_THROWS_WITH(closed_form_answers(qs, s.K, s.V, ClosedFormCache{0, 0}, {1, 2}, Z), Catch::Contains("sink + window"));
  CHECK_THROWS_WITH(closed_form_answers(qs, s.K, s.V, ClosedFormCache{0, 8}, {0, 2}, Z), Catch::Contains("steps"));
  CHECK_THROWS_WITH(closed_form_answers(qs, s.K, s.V, ClosedFormCache{0, 8}, {3, 3}, Z), Catch::Contains("steps"));
  CHECK_THROWS_WITH(closed_form_answers(qs, s.K, s.V, ClosedFormCache{0, 8}, {5, 51}, Z), Catch::Contains("steps"));
  // The two-part chunk under it (kivi calls it directly): a mask beyond its rows, an empty one, too few masks,
  // output rows that do not fit.
  const MatD Q = s.qs[0].topRows(2);
  Z.resize(2, 8);
  VecD ls(2);
  const auto Ka = s.K.topRows(10), Va = s.V.topRows(10), Kb = s.K.middleRows(10, 5), Vb = s.V.middleRows(10, 5);
  CHECK_NOTHROW(two_part_attention(Q, Ka, Va, Kb, Vb, {{10, 0, 5}, {3, 1, 2}}, Z, 0, &ls));
  CHECK_THROWS_WITH(two_part_attention(Q, Ka, Va, Kb, Vb, {{11, 0, 5}, {3, 1, 2}}, Z, 0, &ls), Catch::Contains("outside its columns"));
  CHECK_THROWS_WITH(two_part_attention(Q, Ka, Va, Kb, Vb, {{0, 2, 2}, {3, 1, 2}}, Z, 0, &ls), Catch::Contains("empty"));
  CHECK_THROWS_WITH(two_part_attention(Q, Ka, Va, Kb, Vb, {{3, 1, 2}}, Z, 0, &ls), Catch::Contains("one mask per query row"));
  CHECK_THROWS_WITH(two_part_attention(Q, Ka, Va, Kb, Vb, {{10, 0, 5}, {3, 1, 2}}, Z, 1, &ls), Catch::Contains("do not fit"));
}

TEST_CASE("banded: the engine's blocked and per-step replays give the same metrics", "[banded][engine]") {
  const char* config = R"(
name = "b"
seed = 5
[data]
synthetic = "heavy_hitter"
n = 300
d = 16
n_layers = 1
n_heads = 4
n_kv_heads = 2
prefill = 40
[eval]
every = 3
from = 41
[[policy]]
name = "window"
budget = [0.1, 0.3]
[[policy]]
name = "sink"
memory = 0.25
sink = 3
[[policy]]
name = "exact"
)";
  for (const char* gqa : {"kv_head", "query_head"})
    for (const char* prec : {"float64", "float32"}) {
      INFO(gqa << " " << prec);
      const std::vector<std::string> common = {std::string("eval.gqa=\"") + gqa + "\"",
                                               std::string("eval.policy_precision=\"") + prec + "\""};
      auto with = [&](const char* mode) {
        auto o = common;
        o.push_back(std::string("eval.closed_form=\"") + mode + "\"");
        return parse_experiment(config, "inline", o);
      };
      const Experiment blocked = with("blocked"), stepped = with("per_step");
      auto src = open_source(blocked.data);
      const RunResult a = run_experiment(blocked, *src, 2), b = run_experiment(stepped, *src, 1);
      const double tol = std::string(prec) == "float64" ? 1e-12 : 1e-5;
      double worst = 0;
      for (size_t p = 0; p < a.policies.size(); ++p) {
        REQUIRE(a.policies[p].rows.size() == b.policies[p].rows.size());
        for (size_t i = 0; i < a.policies[p].rows.size(); ++i) {
          const auto &ra = a.policies[p].rows[i], &rb = b.policies[p].rows[i];
          REQUIRE(ra.step == rb.step);
          REQUIRE(ra.head == rb.head);
          for (const char* exact : {"cache_bytes", "cache_tokens", "kept_mass", "oracle_mass"})
            REQUIRE(metric_of(ra, exact) == metric_of(rb, exact));
          for (const char* close : {"rel_err", "eps_spectral", "tau_rel_err"}) {
            if (std::isnan(metric_of(rb, close))) {  // window and sink estimate no τ, by either path
              REQUIRE(std::isnan(metric_of(ra, close)));
              continue;
            }
            const double x = metric_of(ra, close), y = metric_of(rb, close);
            worst = std::max(worst, std::abs(x - y));
          }
        }
      }
      // |Δ rel_err| ≤ ‖Δz‖/‖Attn‖ ≈ the answers' relative difference (and likewise for ε, since
      // ‖z‖ ≤ ‖a‖·‖V‖_op up to the kept set's mass): an absolute bound, as errors may be ~1e-16.
      CHECK(worst < 10 * tol);
      // Negative control: the comparison sees real differences (budget 0.1 vs 0.3 of the same run).
      CHECK(metric_of(b.policies[0].rows.back(), "rel_err") != metric_of(b.policies[1].rows.back(), "rel_err"));
      // exact reports its τ (so tau_rel_err was compared above, not skipped as NaN) in both paths.
      CHECK(!std::isnan(metric_of(a.policies[3].rows.back(), "tau_rel_err")));
      CHECK(metric_of(a.policies[3].rows.back(), "tau_rel_err") < 1e-12);
    }
  CHECK_THROWS_WITH(parse_experiment(config, "inline", {"eval.closed_form=\"fast\""}), Catch::Contains("eval.closed_form"));
}
