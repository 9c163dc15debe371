// The policy contract, driven by the registry: every registered policy × each of its registered
// examples (PolicyInfo::examples) is replayed by the engine on one small GQA stream, with and without a
// prompt, and every metric row must hold what any cache policy promises. A new policy is tested here
// without editing a list. The properties:
//   - the same numbers at 1 and 3 threads, bit for bit (the reproducibility rule);
//   - rel_err finite and ≥ 0; kept_mass, where defined, in [0, 1] and ≤ oracle_mass, the best any set of
//     the cache's size keeps (H2O Fig. 2's oracle: the bound cannot be beaten); attention_loss = 1 − kept_mass;
//   - a cache never holds more tokens than it has seen (cache_tokens ≤ t), except subgen, whose stored
//     vectors are not tokens (cache_tokens counts them / 2);
//   - the exact policy's rel_err is at rounding level and its kept_mass 1.
// Negative controls: some policy's rel_err exceeds 1e-3 and some kept_mass is strictly below its oracle,
// so neither inequality holds only because every value is equal.
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"
#include "registry_examples.hpp"

using namespace kvsim;

namespace {

constexpr int64_t kPrompt = test::kPressPrompt;  // press_replay's example needs its press file's prompt

const char* kBase = R"(
name = "contract"
seed = 3
[data]
synthetic = "clustered"
n = 96
d = 16
n_layers = 2
n_heads = 4
n_kv_heads = 2
[eval]
every = 3
[[policy]]
name = "exact"
)";

using test::same_bits;

struct Seen {
  bool rel_err_above = false, below_oracle = false;
  int runs = 0, refused_without_prompt = 0;
};

/// The contract on one run's rows (policy 1; policy 0 is the exact reference).
void check_rows(const RunResult& r, const std::string& name, Seen& seen) {
  const size_t re = metric_index("rel_err"), km = metric_index("kept_mass"), om = metric_index("oracle_mass"),
               al = metric_index("attention_loss"), ct = metric_index("cache_tokens");
  for (const MetricRow& row : r.policies[0].rows) {
    CHECK(row[re] <= 1e-10);
    CHECK(std::abs(row[km] - 1) <= 1e-12);
  }
  for (const MetricRow& row : r.policies[1].rows) {
    INFO(r.policies[1].spec.label << " layer " << row.layer << " head " << row.head << " step " << row.step);
    CHECK(std::isfinite(row[re]));
    CHECK(row[re] >= 0);
    seen.rel_err_above |= row[re] > 1e-3;
    if (!std::isnan(row[km])) {
      CHECK(row[km] >= -1e-12);
      CHECK(row[km] <= 1 + 1e-12);
      CHECK(row[km] <= row[om] + 1e-12);
      CHECK(std::abs(row[al] - (1 - row[km])) <= 1e-12);
      seen.below_oracle |= row[km] < row[om] - 1e-6;
    }
    if (name != "subgen") CHECK(row[ct] <= double(row.step));
  }
}

/// Runs `spec` beside exact at 1 and 3 threads (with a prompt of kPrompt tokens when `prompt`); false
/// when the policy refuses to run without a prompt (a prompt compressor).
bool run_and_check(const PolicySpec& spec, bool prompt, Seen& seen) {
  std::vector<std::string> sets;
  if (prompt) sets = {"data.prefill=" + std::to_string(kPrompt), "eval.from=" + std::to_string(kPrompt + 1)};
  Experiment ex = parse_experiment(kBase, "inline", sets);
  ex.policies.push_back(spec);
  auto src = open_source(ex.data);
  RunResult r1;
  try {
    r1 = run_experiment(ex, *src, 1);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (!prompt && (what.find("prefill") != std::string::npos || what.find("prompt") != std::string::npos)) return false;
    FAIL(spec.label << (prompt ? " with a prompt: " : ": ") << what);
  }
  const RunResult r3 = run_experiment(ex, *src, 3);
  REQUIRE(r1.policies.size() == 2);
  REQUIRE(r3.policies[1].rows.size() == r1.policies[1].rows.size());
  REQUIRE_FALSE(r1.policies[1].rows.empty());
  for (size_t i = 0; i < r1.policies[1].rows.size(); ++i)
    for (const auto& c : r1.metrics) {
      if (c.name == "policy_ns") continue;  // wall-clock time, not a result
      INFO(spec.label << " " << c.name << " row " << i);
      REQUIRE(same_bits(r1.policies[1].rows[i][c.index], r3.policies[1].rows[i][c.index]));
    }
  check_rows(r1, spec.name, seen);
  ++seen.runs;
  return true;
}

}  // namespace

TEST_CASE("contract: every registered policy and example keeps the cache-policy contract, with and without a prompt",
          "[contract][registry]") {
  Seen seen;
  size_t examples = 0;
  for (const auto* info : policy_registry()) {
    for (size_t e = 0; e < info->examples.size(); ++e) {
      ++examples;
      const PolicySpec spec{info->name, info->name + "#" + std::to_string(e), test::with_files(info->examples[e])};
      INFO(spec.label);
      if (!run_and_check(spec, false, seen)) ++seen.refused_without_prompt;
      run_and_check(spec, true, seen);
    }
  }
  CHECK(examples >= policy_registry().size());  // every policy has at least one example
  CHECK(seen.runs >= int(examples));
  CHECK(seen.refused_without_prompt < int(examples));  // most policies run on a plain stream too
  // Negative controls: the inequalities are not vacuous on this stream.
  CHECK(seen.rel_err_above);
  CHECK(seen.below_oracle);
}

TEST_CASE("contract: a policy's GPU twin is what the registry says, for every example", "[contract][registry]") {
  // PolicyInfo::gpu is documentation ("no", "yes", "yes (mode = …)"); gpu_replay() is what the engine
  // uses. They must agree: "no" never has a twin, "yes" always, "yes (…)" for some example. The exact
  // policy is answered from the GPU reference instead (ReferenceAnswered), with no replay.
  StreamInfo s = test::stream_info(96, 16, 2, true);
  s.prefill = kPrompt;
  const std::vector<test::Example> all = test::registry_examples(s);
  int twins = 0;
  for (const auto* info : policy_registry()) {
    INFO(info->name << ": GPU replay documented as '" << info->gpu << "'");
    int with = 0, without = 0;
    for (const auto& x : all)
      if (x.spec.name == info->name) {
        CHECK(x.refused.empty());  // with a prompt, every example builds
        (x.gpu ? with : without)++;
      }
    twins += with;
    if (info->name == "exact") {
      CHECK(with == 0);
    } else if (info->gpu == "no") {
      CHECK(with == 0);
    } else if (info->gpu == "yes") {
      CHECK(with > 0);
      CHECK(without == 0);
    } else {
      CHECK(info->gpu.rfind("yes (", 0) == 0);
      CHECK(with > 0);
    }
  }
  CHECK(twins >= 8);  // window, sink, h2o, buzz, uniform, oracle_topk, subgen, subgen_kcenter when written
}
