// kvsim: per-layer and per-(layer, KV head) budgets from a file (docs/cli.md, "Budgets per layer and head").
//
// A policy entry with `budgets_file = "alloc.json"` beside `memory = M` gives each cache its own budget:
// the cache of (layer l, KV head h) is built with `memory = b[l][h]` tokens, and the equal-memory checks
// hold that cache to b[l][h] instead of M. The budgets average exactly M over the caches the file covers
// (checked when the file is read), so the policy still spends M on average — bytes included.
//
// File (JSON, written by `kvsim allocate`):
//   {"kvsim_budgets": 1, "n_layers": 30, "n_kv_heads": 3,     // the model's shape
//    "layers": [0, 1, …],                                        // the model's layers it covers
//    "n": 2048,                                                  // the tokens the budgets are for
//    "granularity": "layer" | "head", "objective": "rel_err", "policy": "h2o", "source": "…",
//    "allocations": [{"memory": 0.2, "memory_tokens": 410,
//                     "budgets": [[b_00, b_01, b_02], …]}, …]}   // [len(layers)][n_kv_heads] tokens ≥ 1
// A stream of another length n' gets the budgets scaled by M(n')/M(n), rounded by largest remainder so
// that their sum stays (caches × M(n')) exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/core/params.hpp"

namespace kvsim {

struct StreamInfo;

/// One memory's allocation: budgets[i][h] tokens for the file's i-th layer and KV head h.
struct BudgetAllocation {
  double memory = 0;             ///< the declared memory as written (a fraction of n, or tokens)
  int64_t memory_tokens = 0;     ///< M at the file's n: the budgets' mean, exactly
  std::vector<std::vector<int64_t>> budgets;
};

struct BudgetsFile {
  int n_layers = 0;              ///< the model's layer count
  int n_kv_heads = 0;
  std::vector<int> layers;       ///< the model layers covered, in the order of budgets' rows
  int64_t n = 0;                 ///< stream length the budgets were found for
  std::string granularity = "head", objective, policy, source;
  std::vector<BudgetAllocation> allocations;
};

/// Reads and validates a budgets file. Throws kvsim::Error "PATH: …" naming the key at fault: not JSON,
/// a missing or mistyped key, a budgets shape other than [len(layers)][n_kv_heads], a budget that is not an
/// integer ≥ 1, a total other than len(layers) × n_kv_heads × memory_tokens, memory_tokens other than
/// `memory` at n, repeated or out-of-range layers.
BudgetsFile read_budgets_file(const std::string& path);

/// The allocation of `f` for a policy's `memory` parameter (matched in tokens at the file's n); throws
/// kvsim::Error naming the file and the memories it holds when there is none.
const BudgetAllocation& allocation_for(const std::string& path, const BudgetsFile& f, const Params& memory);

/// Writes `f` as JSON (atomically: a temporary file renamed into place); validates it first.
void write_budgets_file(const std::string& path, const BudgetsFile& f);

/// The budget (tokens) of the cache `s` describes (s.layer, s.kv_head; s.n its length) under a policy's
/// `memory` parameter, from budgets file `path`. Throws kvsim::Error naming the file when it holds another
/// model's shape (s.n_layers, s.n_kv_heads), lacks s.layer, or has no allocation for that memory.
int64_t cell_budget(const std::string& path, const Params& memory, const StreamInfo& s);

/// As above, with the file's allocation chosen by `allocation` (a Params holding "memory": the policy's
/// `budgets_memory`, matched at the file's n) and its budgets scaled to average `memory` at s.n. This is
/// how a budget pinned to whole tokens (`kvsim task` pins memory = 0.25 to round(0.25 · L) tokens) still
/// takes the 25% allocation's shape from a file fitted at another n.
int64_t cell_budget(const std::string& path, const Params& allocation, const Params& memory, const StreamInfo& s);

/// The budgets of `a` scaled from the file's M to `target` tokens per cache: floor of b·target/M, then
/// one more token to the largest remainders (ties: the earlier cache, row-major) so that the sum is
/// exactly caches × target.
std::vector<std::vector<int64_t>> scale_budgets(const BudgetAllocation& a, int64_t target);

}  // namespace kvsim
