// Test helper: the registry's examples as [[policy]] entries, for tests that iterate every policy
// instead of a hand-written list (tests/test_contract.cpp, tests/cuda_parity.cpp).
#pragma once
#include <string>
#include <vector>

#include "kvsim/core/error.hpp"
#include "kvsim/core/params.hpp"
#include "kvsim/policies/gpu_replay.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::test {

/// Every registered policy × each of its examples, as a PolicySpec labelled "name#k" (k: the example's
/// index), and whether its instance, built for `s`, has a GPU twin (gpu_replay() non-empty).
struct Example {
  PolicySpec spec;
  bool gpu = false;
  std::string refused;  ///< why the instance could not be built for the stream (e.g. no prompt); empty: built
};

/// `s`: the stream the instances are built for (its n, head_dim, group size and prompt). Examples that
/// need a file (press_replay) are left out.
inline std::vector<Example> registry_examples(const StreamInfo& s) {
  std::vector<Example> out;
  for (const auto* info : policy_registry())
    for (size_t e = 0; e < info->examples.size(); ++e) {
      const Params& p = info->examples[e];
      if (p.has("file")) continue;
      Example x{{info->name, info->name + "#" + std::to_string(e), p}, false, {}};
      try {
        x.gpu = gpu_replay(*make_policy(info->name, p, s)).has_value();
      } catch (const Error& err) {
        x.refused = err.what();
      }
      out.push_back(std::move(x));
    }
  return out;
}

}  // namespace kvsim::test
