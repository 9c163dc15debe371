// kvsim: the metric registry (docs/metrics.md). Every metric the engine reports is one entry of the list
// in sim/replay/metrics.cpp: its name (the results.h5 dataset and CSV `metric` value), unit,
// one-line description, source (paper, section, equation) and a small function computing it for one
// evaluated (policy, query head, step) from a MetricContext. Results files, summary tables and the
// docs' metric table all come from this list; adding a metric is adding one entry there.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvsim/analysis/objectives.hpp"
#include "kvsim/core/types.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {

/// top_mass's first radix digit over one exact row (counts and sums per bucket), kept per row across a cell's
/// policies so that each policy's top-m mass reads the row once instead of twice.
struct TopMassDigit {
  std::vector<int64_t> count;
  std::vector<double> sum;
};

/// Everything a metric may look at for one evaluated step t of one query head: the policy's answer,
/// the exact reference at t, the cache's size, and (when [eval] objectives = true) the full causal
/// attention of the first objectives_max_t queries. Shared intermediate values (‖z − Attn‖, the kept
/// mass, the best-m mass, the facility-location triple) are computed once, on first use.
class MetricContext {
 public:
  int64_t t = 0, n = 0;              ///< step (1-based) and stream length
  const Answer* answer = nullptr;    ///< the policy's answer: z [head_dim], log τ̂, kept tokens
  const Policy* policy = nullptr;    ///< the instance that answered (cache size, clusters)
  const double* exact_out = nullptr; ///< Attn(q_t, K, V) [head_dim]
  int head_dim = 0;
  const double* probs = nullptr;     ///< the exact attention row a_t [t]
  double probs_norm = 0;             ///< ‖a_t‖₂
  double log_tau = 0;                ///< log τ_t = log Σ_{j ≤ t} e^{<k_j, q̃_t>}
  double v_opnorm = 0;               ///< ‖V_{1..t}‖_op
  double cache_bytes = 0;            ///< the cell's stored vectors × head_dim × 4 bytes (all instances)
  double loaded_bytes = 0;           ///< bytes read to answer the query (all instances; PartialLoad)
  double policy_ns = 0;              ///< mean policy time per step since the last evaluated step
  const std::vector<std::pair<int64_t, int64_t>>* needle_spans = nullptr;  ///< EvalSpec::needle_spans
  int64_t topk = 0;                  ///< EvalSpec::topk (topk_mass, topk_kept; 0: off)
  // H2O objectives (H2O §4.1): on when `objectives`; the facility-location triple only at steps
  // `objectives_due`. `attn_all` is [T_obj, T_obj] full causal attention; `greedy_cache` memoizes
  // (greedy, OPT) per (query head, t, |S|) across policies of a cell.
  bool objectives = false, objectives_due = false;
  double theorem44_alpha = 0, theorem44_beta = 0;
  const MatD* attn_all = nullptr;
  int group_index = 0;
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<double, double>>* greedy_cache = nullptr;
  /// Memoizes the accumulated-attention power-law fit per (query head, t) across policies of a cell.
  std::map<std::pair<int, int64_t>, PowerLawFit>* powerlaw_cache = nullptr;
  /// Memoizes functions of the exact row alone per (query head, t, key) across the policies of a cell
  /// (row_memo): oracle_mass's top-m sum (key = m ≥ 0: most policies at one memory share a cache
  /// size, and its partial sort over t entries was ~10% of a SmolLM2 run), attn_sparsity (−1),
  /// sink_mass (−2), topk_kept's k-th largest weight (−3) and the count of weights at or above it (−4).
  std::map<std::tuple<int, int64_t, int64_t>, double>* row_cache = nullptr;
  std::vector<double>* scratch = nullptr;
  /// top_mass_digit per (query head, t) across the policies of a block of evaluated steps (row_digit).
  std::map<std::pair<int, int64_t>, TopMassDigit>* digit_cache = nullptr;
  const TopMassDigit* row_digit();  ///< this row's digit (null without digit_cache)

  /// The policy's cache_tokens() at this step: cache_tokens_at when the engine recorded it then (blocked
  /// stepping), else the policy's own.
  int64_t cache_tokens_at = -1;
  int64_t policy_tokens() const { return cache_tokens_at >= 0 ? cache_tokens_at : policy->cache_tokens(); }
  /// The policy's clusters() at this step: clusters_at when the engine recorded it then (blocked stepping), else
  /// the policy's own.
  std::optional<double> clusters_at;
  double policy_clusters() const { return clusters_at ? *clusters_at : policy->clusters(); }
  bool has_kept() const { return answer->has_kept; }
  double diff_norm();     ///< ‖z − Attn‖₂
  double kept_mass();     ///< Σ_{j ∈ kept} a_t(j) (requires has_kept)
  double oracle_mass();   ///< the largest mass any |kept| (or cache_tokens) tokens can hold
  /// f() (a function of probs and t alone), computed once per (group_index, t, key) when row_cache is set.
  template <class F>
  double row_memo(int64_t key, F f) {
    if (!row_cache) return f();
    const auto k = std::make_tuple(group_index, t, key);
    const auto it = row_cache->find(k);
    return it != row_cache->end() ? it->second : ((*row_cache)[k] = f());
  }
  double fl_value();      ///< f_t(kept)
  double fl_greedy();     ///< lazy-greedy f_t at |kept|
  double fl_opt();        ///< brute-force OPT (NaN when too many subsets)
  const PowerLawFit& accumulated();  ///< H2O Fig. 2's fit over the first t queries (objective steps)

 private:
  double diff_ = -1, kept_ = -1, oracle_ = -1, flv_ = -1;
  const std::pair<double, double>* greedy_ = nullptr;
  const std::pair<double, double>& greedy_opt();
};

/// One metric. `compute` returns NaN where the metric does not apply (e.g. kept_mass for a policy
/// that keeps no token subset).
struct Metric {
  const char* name;
  const char* unit;
  const char* description;
  const char* source;
  double (*compute)(MetricContext&);
  /// Whether the metric is computed under these settings (null: always); results leave it out otherwise.
  bool (*applies)(const EvalSpec&) = nullptr;
};

/// Every metric, in results order (the list in sim/replay/metrics.cpp). At most kMaxMetrics.
const std::vector<Metric>& metric_registry();
/// The registry as result columns (name, unit, description, source, row slot) for the writers: every
/// metric, or with `eval` those that apply under it.
std::vector<MetricColumn> metric_columns();
std::vector<MetricColumn> metric_columns(const EvalSpec& eval);
/// Position of `name` in the registry; throws kvsim::Error naming the known metrics if absent.
size_t metric_index(std::string_view name);
/// A row's value of metric `name` (tests, tools).
double metric_of(const MetricRow& row, std::string_view name);

/// Top-m sum of p[0..t) (the best any set of m tokens can keep); `scratch` is reused storage. `digit`:
/// top_mass_digit(p, t) formed once for the row (many m per row: one pass over it instead of two each).
double top_mass(const double* p, int64_t t, int64_t m, std::vector<double>& scratch, const TopMassDigit* digit = nullptr);
/// The radix select's first digit over a row: counts and sums of p[0..t) per bucket of the order key's top bits.
void top_mass_digit(const double* p, int64_t t, TopMassDigit& h);

/// `kvsim metrics --markdown`: docs/metrics.md, the registry as a Markdown table with its notation.
std::string metrics_markdown();

/// Per registry metric, whether it is computed under `eval` (Metric::applies; the writers' columns).
std::vector<char> metrics_applying(const EvalSpec& eval);
/// Fills row[i] for every registry metric i with applies[i] (metrics_applying); the others are NaN and
/// never run, so a metric switched off (e.g. topk_kept at [eval] topk = 0) cannot read what its
/// setting did not prepare.
void compute_metrics(MetricContext& c, MetricRow& row, const std::vector<char>& applies);

}  // namespace kvsim
