// Test helper: the registry's examples as [[policy]] entries, for tests that iterate every policy
// instead of a hand-written list (tests/unit/test_contract.cpp, tests/gpu/cuda_parity.cpp).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kvsim/core/error.hpp"
#include "kvsim/core/params.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/policies/gpu_replay.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::test {

/// The prompt the press file of with_files() compressed (tokens): a stream built for press_replay's
/// example needs [data] prefill = kPressPrompt.
inline constexpr int64_t kPressPrompt = 32;

/// A policy's example with its input files made: press_replay's `file` becomes a press file for a
/// prompt of kPressPrompt tokens (layers 0–1, KV heads 0–1: the prompt's even positions), written once
/// per process.
inline Params with_files(const Params& ex) {
  if (!ex.has("file")) return ex;
  static const std::string path = [] {
    const std::string p =
        (std::filesystem::temp_directory_path() / ("kvsim_test_press_" + std::to_string(::getpid()) + ".h5")).string();
    h5::File f = h5::File::create(p);
    f.set_attr("/", "kvsim_press", int64_t(1));
    f.set_attr("/", "prompt", kPressPrompt);
    std::vector<int64_t> even;
    for (int64_t j = 0; j < kPressPrompt; j += 2) even.push_back(j);
    for (int l = 0; l < 2; ++l) {
      const std::string g = "/layer_00" + std::to_string(l);
      f.create_group(g);
      for (int kv = 0; kv < 2; ++kv) f.write_vector(g + "/kv_head_0" + std::to_string(kv), even);
    }
    return p;
  }();
  Params out = ex;
  out.set("file", path, "test");
  return out;
}

/// Every registered policy × each of its examples, as a PolicySpec labelled "name#k" (k: the example's
/// index), and whether its instance, built for `s`, has a GPU twin (gpu_replay() non-empty).
struct Example {
  PolicySpec spec;
  bool gpu = false;
  std::string refused;  ///< why the instance could not be built for the stream (e.g. no prompt); empty: built
};

/// `s`: the stream the instances are built for (its n, head_dim, group size and prompt); files an
/// example needs are made by with_files.
inline std::vector<Example> registry_examples(const StreamInfo& s) {
  std::vector<Example> out;
  for (const auto* info : policy_registry())
    for (size_t e = 0; e < info->examples.size(); ++e) {
      const Params p = with_files(info->examples[e]);
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
