// Internal to the replay (sim/replay/cell.cpp): what one cell records for a policy at an evaluated
// step — the equal-memory rule checked, then one row of the metric registry per query head.
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cell_reference.hpp"
#include "kvsim/replay/metrics.hpp"

namespace kvsim::cell {

/// A policy's state at an evaluated step t (block row r): its answers (one per query head of the
/// cell), the instance that gave each, the bytes it stores and loads (all instances), its mean time
/// per step since the last evaluated step.
struct Evaluated {
  int64_t t = 0;
  size_t r = 0;
  const std::vector<Answer>* answers = nullptr;
  std::vector<const Policy*> answered_by;
  /// Per query head, the answering instance's cache_tokens() at step t when recorded then (blocked
  /// stepping answers after the block); empty: ask the instance.
  std::vector<int64_t> cache_tokens;
  /// Per query head, the answering instance's clusters() at step t when recorded then (as cache_tokens).
  std::vector<double> clusters;
  double cache_bytes = 0, loaded_bytes = 0, policy_ns = 0;
};

class Metrics {
 public:
  Metrics(const Experiment& ex, const Cell& cell, int64_t n, int head_dim, Reference& reference)
      : ex_(ex), cell_(cell), n_(n), d_(head_dim), ref_(reference), applies_(metrics_applying(ex.eval)) {}

  /// The equal-memory rule (docs/policies.md) of policy p, whose `memory = M` is `memory_tokens` (−1:
  /// none): min(M, t) tokens' worth at every step (±2%), or never more than M tokens' worth (+2%) when
  /// capacity-matched; `bytes` is what it is matched on (cache_bytes, or loaded_bytes for quest) and M
  /// is scaled by the cache's memory_share (PyramidKV's layer budgets). `instances` caches of the cell
  /// share the target. Throws kvsim::Error naming the policy, step, layer and KV head.
  void check_memory(size_t p, int64_t memory_tokens, const Policy& first, size_t instances, int64_t t, double bytes) const;

  /// A new block of evaluated steps: the per-row top_mass digits of the last one are dropped (32 KB a row).
  void begin_block() { digit_cache_.clear(); }

  /// One row per query head for policy p at an evaluated step: the metric registry over its context.
  void record(size_t p, const Evaluated& e, std::vector<MetricRow>& out);

 private:
  /// Everything a metric may read for query head g (include/kvsim/replay/metrics.hpp), in one place.
  MetricContext context(const Evaluated& e, int g);

  const Experiment& ex_;
  const Cell& cell_;
  const int64_t n_;
  const int d_;
  Reference& ref_;
  const std::vector<char> applies_;  // per registry metric: computed under ex_.eval (else NaN, never run)
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<double, double>> greedy_cache_;  // (g, t, m) -> greedy, opt
  std::map<std::pair<int, int64_t>, PowerLawFit> powerlaw_cache_;                        // (g, t) -> H2O Fig. 2 fit
  std::map<std::tuple<int, int64_t, int64_t>, double> row_cache_;  // (g, t, key) -> MetricContext::row_memo
  std::vector<double> scratch_;
  std::map<std::pair<int, int64_t>, TopMassDigit> digit_cache_;  // (g, t) -> top_mass's first digit, this block
};

}  // namespace kvsim::cell
