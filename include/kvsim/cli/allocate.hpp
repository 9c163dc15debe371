// kvsim: `kvsim allocate` — budgets per layer or per (layer, KV head) from a budget sweep's results
// (include/kvsim/analysis/allocation.hpp for the rule; include/kvsim/policies/budgets.hpp for the file).
#pragma once
#include <string>
#include <vector>

namespace kvsim {

struct AllocateOptions {
  std::vector<std::string> sweeps;   ///< run folders (results.h5, or seq_NN/results.h5) or results.h5 files
  std::string policy;                ///< the policy whose curves are read (its registry name)
  std::vector<std::string> memory;   ///< mean memories to allocate: fractions of n ("0.2") or tokens ("410")
  std::string out;                   ///< the budgets file to write (JSON)
  std::string objective = "rel_err"; ///< rel_err | eps | kept_mass (1 − kept_mass is minimized)
  std::string granularity = "head";  ///< head: per (layer, KV head); layer: one budget per layer
};

/// Reads every results.h5 of `o.sweeps` (one model shape and n; the policy's entries at ≥ 2 memories),
/// averages the objective per (layer, KV head) and memory (pooled over query heads and evaluated steps,
/// then equal weight per sequence), allocates each requested memory, writes `o.out` and returns a report
/// (per memory: the summed objective of the allocation and of the uniform split, the budgets' range).
/// Throws kvsim::Error naming the file, option or policy on bad input; nothing is written then.
std::string cmd_allocate(const AllocateOptions& o);

}  // namespace kvsim
