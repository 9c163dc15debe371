// kvsim: the policy registry. Each policy lives in one file under sim/policies/ and describes itself
// with a PolicyInfo — its parameters (name, kind, default, meaning), paper source, factory, its
// equal-memory rule, whether it replays on the GPU, its figure colour and its bench entry — defined
// by `KVSIM_POLICY(name) { ... }` in that file. The build collects every such definition
// (cmake/policy_list.cmake), so adding a policy edits no other file. `kvsim policies`, the docs'
// policy table (docs/policies.md, checked by a test), config validation, `memory = M` matching,
// `kvsim bench` and the figures' colours all read this registry; the engine, the config code and
// the memory code name no policy.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvsim/core/params.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {

/// One parameter of a policy: its declaration (include/kvsim/core/params.hpp), the one place its
/// type, default, doc and range live.
using ParamInfo = ParamDecl;

/// Equal-memory matching (docs/policies.md): how `memory = M` tokens sizes the policy. `refuses` are the
/// parameters `memory` replaces (giving one of them together with it is an error); `apply` adds the
/// derived ones to `out` (which already holds every other given parameter). A policy without a rule refuses
/// `memory`. Whether the size is exact at every step or a capacity is Policy::capacity_matched().
struct MemoryRule {
  std::string doc;
  std::vector<std::string> refuses;
  std::function<void(int64_t M, const Params& given, Params& out, const std::string& where)> apply;
};

struct PolicyInfo {
  std::string name;
  std::string summary;  ///< what the cache keeps, one or two sentences
  std::string source;   ///< paper, section, algorithm / equation
  std::vector<ParamInfo> params;
  std::function<std::unique_ptr<Policy>(ParamReader&, const StreamInfo&)> make;
  std::optional<MemoryRule> memory;
  std::string gpu;      ///< GPU replay coverage ("yes", "no", or which modes)
  /// Parameter sets that construct the policy (one per mode), used by `kvsim policies --check`-style
  /// tests: every mode's parameters must be documented and its defaults must match `params`.
  std::vector<Params> examples;
  /// The colour of this policy in every figure ("#rrggbb"; plots/policy_colors.json is generated
  /// from it by `kvsim policies --colors`, and a test keeps them equal). Empty: a neutral grey.
  std::string color;
  /// `kvsim bench`'s entry (sim/cli/bench.cpp): the parameters its per-step table times this policy
  /// with (about a quarter of the stream's memory); whether it decodes after a prompt of n/2 tokens
  /// (policies that compress a prompt at prefill); whether it is timed again with
  /// `[eval] policy_precision = "float32"`. No parameters: not benchmarked. `rule_products`: the
  /// products the policy's own rule does at every step, in d·m multiply-adds in double over its m cached
  /// tokens, once per KV head (keydiff: 1, each cached key's cosine with the anchor); the cell's FMA bound
  /// counts them beside the logits and answers (sim/cli/bench_cell.cpp).
  struct Bench {
    Params params;
    bool after_prefill = false;
    bool float32 = false;
    int rule_products = 0;
  } bench;
};

/// A built-in policy's description is a function `kvsim_policy_<name>()` in namespace
/// kvsim::policies returning a static PolicyInfo. Define it in the policy's own file under
/// sim/policies/ as
///
///     KVSIM_POLICY(h2o) {
///       static const PolicyInfo info{...};
///       return info;
///     }
///
/// at the start of a line: the build finds these lines (cmake/policy_list.cmake) and registers
/// every one, in name order. `id` is the policy's registry name.
#define KVSIM_POLICY(id) const ::kvsim::PolicyInfo& kvsim_policy_##id()
namespace policies {
using PolicyInfoFn = const PolicyInfo& (*)();
}

/// Every registered policy, in registration order: the built-in ones, then those added by
/// register_policy. Not to be iterated while another thread registers (the Python API registers
/// only between runs).
const std::vector<const PolicyInfo*>& policy_registry();
/// Adds a policy at run time (the Python API's kvsim.register_policy, sim/python/): afterwards
/// `info.name` works in configs like a built-in policy. Registering a name again replaces the
/// earlier registration; a built-in name or a name that is not one word throws kvsim::Error.
void register_policy(PolicyInfo info);
/// The policy named `name`; throws kvsim::Error listing the known names.
const PolicyInfo& policy_info(const std::string& name);

/// `kvsim policies`: every policy with its parameters, defaults, memory rule, GPU coverage and source.
std::string policies_text();
/// The same as a Markdown document (docs/policies.md is this text; a test compares them).
std::string policies_markdown();
/// Each policy's figure colour as a JSON object {"name": "#rrggbb", ...} in registration order
/// (plots/policy_colors.json is this text; a test compares them). Policies without one are left out.
std::string policy_colors_json();


}  // namespace kvsim
