// What one replay cell records at an evaluated step (sim/replay/cell_metrics.hpp).
#include "cell_metrics.hpp"

#include <cmath>

#include "kvsim/core/error.hpp"

namespace kvsim::cell {

void Metrics::check_memory(size_t p, int64_t memory_tokens, const Policy& first, size_t instances, int64_t t,
                           double bytes) const {
  if (memory_tokens <= 0) return;
  const bool capacity = first.capacity_matched();
  const double per_token = 2.0 * d_ * sizeof(float) * double(instances);
  const int64_t M = int64_t(std::llround(double(memory_tokens) * memory_share(first)));
  const double target = double(capacity ? M : std::min(M, t)) * per_token;
  if (capacity ? bytes > 1.02 * target : std::abs(bytes - target) > 0.02 * target)
    throw Error("policy '" + ex_.policies[p].label + "' cannot be matched on memory" +
                (capacity ? std::string(" (capacity rule: never above the target)") : std::string(" at every step")) +
                ": at step " + std::to_string(t) + " (layer " + std::to_string(cell_.layer) + ", KV head " +
                std::to_string(cell_.kv_head) + ") it stores " + std::to_string(int64_t(bytes)) + " bytes vs the target " +
                std::to_string(int64_t(target)) + " (±2%); compare it with 'budget'-style parameters instead");
}

MetricContext Metrics::context(const Evaluated& e, int g) {
  const ReferenceBlock& ref = ref_.block(g);
  MetricContext c;
  c.t = e.t;
  c.n = n_;
  c.answer = &(*e.answers)[size_t(g)];
  c.policy = e.answered_by[size_t(g)];
  c.cache_tokens_at = e.cache_tokens.empty() ? -1 : e.cache_tokens[size_t(g)];
  if (!e.clusters.empty()) c.clusters_at = e.clusters[size_t(g)];
  c.exact_out = ref.out.row(Eigen::Index(e.r)).data();
  c.head_dim = d_;
  c.probs = ref_.probs_row(g, e.r);
  c.probs_norm = ref.probs_norm[Eigen::Index(e.r)];
  c.log_tau = ref.log_tau[Eigen::Index(e.r)];
  c.v_opnorm = ref_.v_opnorm(e.r);
  c.cache_bytes = e.cache_bytes;
  c.loaded_bytes = e.loaded_bytes;
  c.policy_ns = e.policy_ns;
  c.needle_spans = &ex_.eval.needle_spans;
  c.topk = ex_.eval.topk;
  c.objectives = ex_.eval.objectives;
  c.objectives_due = is_objective_step(ex_.eval, e.t, n_);
  c.theorem44_alpha = ex_.eval.theorem44_alpha;
  c.theorem44_beta = ex_.eval.theorem44_beta;
  c.attn_all = &ref_.full_attention(g);
  c.group_index = g;
  c.greedy_cache = &greedy_cache_;
  c.powerlaw_cache = &powerlaw_cache_;
  c.row_cache = &row_cache_;
  c.scratch = &scratch_;
  c.digit_cache = &digit_cache_;
  return c;
}

void Metrics::record(size_t p, const Evaluated& e, std::vector<MetricRow>& out) {
  for (int g = 0; g < int(cell_.heads.size()); ++g) {
    if ((*e.answers)[size_t(g)].z.size() != d_)
      throw Error("policy '" + ex_.policies[p].label + "' returned an answer of the wrong size");
    MetricContext c = context(e, g);
    MetricRow m;
    m.layer = cell_.layer;
    m.head = cell_.heads[size_t(g)];
    m.step = e.t;
    compute_metrics(c, m, applies_);
    out.push_back(m);
  }
}

}  // namespace kvsim::cell
