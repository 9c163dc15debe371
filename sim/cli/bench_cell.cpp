// `kvsim bench --cell CONFIG`: one config replayed at one thread, each policy's time beside the FMA
// bound of the products its cache implies (the performance issue's "the cell's own FMA bound": the sum
// over its policies of their products), and the whole run's wall time beside the sum of the bounds.
#include <map>

#include "bench_detail.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::bench {

/// The products a policy must do, per query head (every row is one query head at one evaluated step):
/// with m = the row's cache_tokens, head_dim d and E = steps since the head's previous evaluated row,
/// d·m multiply-adds for the logits of each query it reads — E of them for a policy that reads every
/// query (Policy::needs_every_query: the score-based evictors), 1 for the others (exact, window and sink
/// as closed forms, oracle_topk, quest, kivi, subgen, …) — and d·m for the answer (Vᵀp). m is taken
/// as constant over the E steps (it is the budget once the cache is full). A cache that loads part of what it
/// stores per query (PartialLoad: quest) does one multiply-add per float it loads instead — its loaded_bytes / 4:
/// d per loaded key (logit) and value (answer), 2·d per page of min/max keys (the bound max(q,0)·M + min(q,0)·m,
/// Quest §3.2), the same d·m + d·m for a cache that loads what it stores. Time: policy_ns per step
/// × E, counted once per instance (kv_head mode: one instance answers the G heads of the group). A policy whose
/// own rule does products at every step (PolicyInfo::Bench::rule_products = r: r·d·m in double per KV head and step,
/// keydiff's cosines with the anchor) adds r·d·m·E per instance (/ G per row in kv_head mode), at the DGEMM rate.
CellPolicy cell_policy(const Experiment& ex, const StreamSource& src, const RunResult& r, size_t p) {
  const RecordingMeta& meta = src.meta();
  const int G = meta.n_heads / meta.n_kv_heads;
  Cell cell{r.layers.front(), 0, {}};
  for (int g = 0; g < G; ++g) cell.heads.push_back(g);
  const auto inst = make_cell_policy(ex, meta, cell, r.n_tokens, p, 0);
  CellPolicy c;
  c.every = inst->needs_every_query();
  const auto form = closed_form(*inst);
  // A cache whose arithmetic ignores policy_precision (its bench entry's float32 flag is false: quest, oracle_topk,
  // subgen, k-center; the registry test holds the flag to the arithmetic) is held to the DGEMM rate. The
  // prompt-compressing caches' flag is false only because the bench times their float32 row without the prompt.
  const PolicyInfo::Bench& bench = policy_info(ex.policies[p].name).bench;
  const bool follows = bench.float32 || bench.after_prefill;
  c.in_double = ex.eval.policy_precision == Precision::float64 || (form && form->double_only) || !follows;
  const size_t k_ns = metric_index("policy_ns"), k_tok = metric_index("cache_tokens"), k_load = metric_index("loaded_bytes");
  const bool partial = matched_on_loaded(*inst);
  const double per_instance = ex.eval.gqa == GqaMode::kv_head ? double(G) : 1.0;
  std::map<std::pair<int, int>, int64_t> last;  // (layer, head) -> its previous evaluated step
  for (const MetricRow& row : r.policies[p].rows) {
    int64_t& prev = last[{row.layer, row.head}];
    const double E = double(row.step - prev), m = row[k_tok];
    prev = row.step;
    c.seconds += row[k_ns] * E * 1e-9 / per_instance;
    c.fmas += partial ? row[k_load] / double(sizeof(float)) : double(meta.head_dim) * m * ((c.every ? E : 1.0) + 1.0);
    c.rule_fmas += double(bench.rule_products) * double(meta.head_dim) * m * E / per_instance;
    c.tokens += m;
    ++c.rows;
  }
  return c;
}

void bench_cell(const BenchOptions& o, BenchOut& b) {
  const Experiment ex = load_experiment(o.cell, o.cell_set);
  const auto src = open_source(ex.data);
  const auto t0 = Clock::now();
  const RunResult r = run_experiment(ex, *src, 1);
  const double wall = seconds_since(t0);
  b.out << "\ncell " << o.cell << " (n = " << r.n_tokens << ", " << r.layers.size() << " layer(s), policy precision "
        << to_string(ex.eval.policy_precision) << ", 1 thread): each policy's time beside its FMA bound\n"
        << "  (multiply-adds of the products its cache implies, at the SGEMM rate, DGEMM where it answers in\n"
        << "  double; reads = the queries it reads: every step, or only the evaluated ones;\n"
        << "  docs/performance.md \"The cell's FMA bound\"):\n"
        << "policy                          reads  mean tokens   seconds   bound s  x bound\n";
  double total = 0, bound = 0;
  for (size_t p = 0; p < r.policies.size(); ++p) {
    const CellPolicy c = cell_policy(ex, *src, r, p);
    const double bs = c.bound_seconds(b);
    total += c.seconds;
    bound += bs;
    std::snprintf(b.buf, sizeof b.buf, "%-30s %6s %12.0f %9.3f %9.3f %8.1fx\n", r.policies[p].spec.label.c_str(),
                  c.every ? "every" : "eval", c.tokens / double(std::max<int64_t>(1, c.rows)), c.seconds, bs,
                  c.seconds / bs);
    b.out << b.buf;
  }
  std::snprintf(b.buf, sizeof b.buf,
                "policies: %.2f s against a bound of %.2f s (%.1fx); the whole run %.2f s wall (%.1fx the bound; the\n"
                "  rest is the exact reference, the metrics and reading the stream)\n",
                total, bound, total / bound, wall, wall / bound);
  b.out << b.buf;
  b.js.add("cell_policy_seconds", total);
  b.js.add("cell_bound_seconds", bound);
  b.js.add("cell_wall_seconds", wall);
}

}  // namespace kvsim::bench
