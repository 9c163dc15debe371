// Internal to the replay: with `[eval] device = "cuda"`, the `exact` policy (a ReferenceAnswered
// policy, include/kvsim/policies/gpu_replay.hpp) answered from the cell's exact reference.
#pragma once
#include <memory>
#include <vector>

#include "cell_reference.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::cell {

/// `cpu` (a ReferenceAnswered policy: never stepped, kept for its properties) answering query heads
/// `heads` (indices into the cell's query heads, in the order attend() gets their queries) from
/// `ref`: at an evaluated step t, head g's answer is Attn_t and log τ_t of ref.block(g)'s row for t,
/// with every token 0..t−1 kept, as the exact policy's own answer. The cache holds every token seen.
/// attend() at a step that the reference's current block does not hold throws kvsim::Error. `ref`
/// must outlive it.
std::unique_ptr<Policy> reference_answers(std::unique_ptr<Policy> cpu, const Reference& ref, std::vector<int> heads);

}  // namespace kvsim::cell
