// Internal: factory functions of the built-in policies (registered in sim/policies/policy.cpp).
#pragma once
#include <memory>

#include "kvsim/core/hd.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::policies {

/// `group_agg` ("mean" | "max" | "sum", validated by the engine) as the hd::GroupAgg code the GPU
/// replays take.
inline int group_agg_code(const std::string& agg) {
  return agg == "max" ? hd::kAggMax : agg == "sum" ? hd::kAggSum : hd::kAggMean;
}

std::unique_ptr<Policy> make_exact(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_window(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_sink(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_oracle_topk(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_uniform(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_subgen(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_subgen_kcenter(const Params&, const StreamInfo&);
std::unique_ptr<Policy> make_h2o(const Params&, const StreamInfo&);

}  // namespace kvsim::policies

namespace kvsim::policies {
std::unique_ptr<Policy> make_buzz(const Params&, const StreamInfo&);
/// Body sizes after each eviction of a `buzz` policy instance (tests).
const std::vector<int64_t>& buzz_body_history(const Policy& p);
}  // namespace kvsim::policies
