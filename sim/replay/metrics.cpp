// The metric registry: one entry per metric, in results order. Notation (docs/metrics.md): q̃_t =
// softmax_scale·q_t, a_t = softmax(K_t q̃_t), Attn_t = a_tᵀV_t, τ_t = Σ_{i≤t} exp(⟨k_i, q̃_t⟩), z the
// policy's output, S its kept token set. To add a metric, add an entry to kMetrics below.
#include "kvsim/replay/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "kvsim/analysis/objectives.hpp"
#include "kvsim/core/error.hpp"

namespace kvsim {

double MetricContext::diff_norm() {
  if (diff_ < 0) {
    const VecD diff = answer->z - Eigen::Map<const VecD>(exact_out, head_dim);
    diff_ = diff.norm();
  }
  return diff_;
}

const TopMassDigit* MetricContext::row_digit() {
  if (!digit_cache) return nullptr;
  auto [it, fresh] = digit_cache->try_emplace(std::make_pair(group_index, t));
  if (fresh) top_mass_digit(probs, t, it->second);
  return &it->second;
}

double MetricContext::kept_mass() {
  if (kept_ < 0) {
    double km = 0;
    for (int64_t j : answer->kept) km += probs[j];
    kept_ = km;
  }
  return kept_;
}

double MetricContext::oracle_mass() {
  if (oracle_ < 0) {
    const int64_t m = has_kept() ? int64_t(answer->kept.size()) : policy_tokens();
    oracle_ = row_memo(std::max<int64_t>(m, 0), [&] { return top_mass(probs, t, m, *scratch, row_digit()); });
  }
  return oracle_;
}

double MetricContext::fl_value() {
  if (flv_ < 0) flv_ = facility_value(*attn_all, t, answer->kept);
  return flv_;
}

const std::pair<double, double>& MetricContext::greedy_opt() {
  if (!greedy_) {
    const int64_t size = int64_t(answer->kept.size());
    const auto key = std::make_tuple(group_index, t, size);
    auto it = greedy_cache->find(key);
    if (it == greedy_cache->end())
      it = greedy_cache->emplace(key, std::make_pair(facility_greedy(*attn_all, t, size),
                                                     facility_brute(*attn_all, t, size))).first;
    greedy_ = &it->second;
  }
  return *greedy_;
}

double MetricContext::fl_greedy() { return greedy_opt().first; }
double MetricContext::fl_opt() { return greedy_opt().second; }

const PowerLawFit& MetricContext::accumulated() {
  const auto key = std::make_pair(group_index, t);
  auto it = powerlaw_cache->find(key);
  if (it == powerlaw_cache->end()) it = powerlaw_cache->emplace(key, accumulated_powerlaw(*attn_all, t)).first;
  return it->second;
}

namespace {

/// x / y with 0/0 = 0 and x/0 = ∞ (an error against a zero reference).
double ratio_or_inf(double x, double y) { return y > 0 ? x / y : (x == 0 ? 0 : INFINITY); }
/// The H2O objective metrics exist only with `[eval] objectives = true`.
bool objectives_on(const EvalSpec& e) { return e.objectives; }
bool needle_on(const EvalSpec& e) { return !e.needle_spans.empty(); }

/// The needle's tokens before step t (the spans clipped to [0, t)): how many there are.
int64_t needle_tokens(const MetricContext& c) {
  int64_t n = 0;
  if (c.needle_spans)
    for (const auto& [b, e] : *c.needle_spans) n += std::max<int64_t>(0, std::min(e, c.t) - std::max<int64_t>(b, 0));
  return n;
}

/// True when token j < t is one of the needle's (binary search over the ascending spans).
bool in_needle(const MetricContext& c, int64_t j) {
  const auto& s = *c.needle_spans;
  auto it = std::upper_bound(s.begin(), s.end(), j, [](int64_t x, const std::pair<int64_t, int64_t>& sp) { return x < sp.first; });
  return it != s.begin() && j < std::prev(it)->second && j < c.t;
}

/// Σ a_t(j) over the needle's tokens j < t, all of them or only those the cache kept (`kept_only`);
/// NaN before the needle is in the stream, and for kept_only when the policy keeps no token subset.
double needle_mass(const MetricContext& c, bool kept_only) {
  if (needle_tokens(c) == 0 || (kept_only && !c.has_kept())) return NAN;
  double s = 0;
  if (!kept_only) {
    for (const auto& [b, e] : *c.needle_spans)
      for (int64_t j = std::max<int64_t>(b, 0); j < std::min(e, c.t); ++j) s += c.probs[j];
  } else {
    for (int64_t j : c.answer->kept)
      if (in_needle(c, j)) s += c.probs[j];
  }
  return s;
}

/// |kept ∩ needle| / |needle|: the share of the needle's tokens the cache holds.
double needle_kept(const MetricContext& c) {
  const int64_t n = needle_tokens(c);
  if (n == 0 || !c.has_kept()) return NAN;
  int64_t k = 0;
  for (int64_t j : c.answer->kept) k += in_needle(c, j);
  return double(k) / double(n);
}

bool topk_on(const EvalSpec& e) { return e.topk > 0; }

/// The k-th largest weight of the exact row a_t (k = min([eval] topk, t)), memoized per row across a
/// cell's policies (row_memo key −3).
double topk_threshold(MetricContext& c) {
  return c.row_memo(-3, [&] {
    const int64_t k = std::min(c.topk, c.t);
    std::vector<double> own;
    std::vector<double>& v = c.scratch ? *c.scratch : own;
    v.assign(c.probs, c.probs + c.t);
    std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<double>());
    return v[size_t(k - 1)];
  });
}

/// |{j ∈ S : a_t(j) ≥ v_k}| / |{j ≤ t : a_t(j) ≥ v_k}|, v_k the k-th largest weight of a_t: the share
/// of the exact row's top-k tokens (all tokens tied with the k-th) the cache keeps. NaN for policies
/// that keep no token subset.
double topk_kept(MetricContext& c) {
  if (c.topk <= 0 || !c.has_kept()) return NAN;  // off ([eval] topk = 0): every metric is computed, not written
  const double v = topk_threshold(c);
  const int64_t top = c.row_memo(-4, [&] {
    int64_t m = 0;
    for (int64_t j = 0; j < c.t; ++j) m += c.probs[j] >= v;
    return double(m);
  });
  int64_t kept = 0;
  for (int64_t j : c.answer->kept) kept += j >= 0 && j < c.t && c.probs[j] >= v;
  return double(kept) / double(top);
}

/// The facility-location metrics apply at objective steps of subset-keeping policies.
bool fl_applies(const MetricContext& c) { return c.objectives && c.objectives_due && c.has_kept(); }

const std::vector<Metric> kMetrics = {
    {"rel_err", "1", "‖z − Attn_t‖₂ / ‖Attn_t‖₂: relative error of the attention output",
     "kvsim (the plain counterpart of SubGen Eq. 3)",
     [](MetricContext& c) { return ratio_or_inf(c.diff_norm(), Eigen::Map<const VecD>(c.exact_out, c.head_dim).norm()); }},
    {"eps_spectral", "1",
     "‖z − Attn_t‖₂ / (‖a_t‖₂·‖V_t‖_op): the ε of SubGen's spectral guarantee (‖V‖_op by Lanczos, warm-started)",
     "SubGen §1 Eq. (3)",
     [](MetricContext& c) { return ratio_or_inf(c.diff_norm(), c.probs_norm * c.v_opnorm); }},
    {"tau_rel_err", "1", "|τ̂ − τ_t| / τ_t for policies that estimate the partition function τ; NaN otherwise",
     "SubGen Alg. 1 line 30; Thm. 1 proof Eq. (5)",
     [](MetricContext& c) {
       return std::isnan(c.answer->log_tau) ? NAN : std::abs(std::expm1(c.answer->log_tau - c.log_tau));
     }},
    {"kept_mass", "1", "Σ_{j∈S} a_t(j): exact attention mass on the kept tokens (subset policies)",
     "H2O §4.1, Def. 4.3 (F_score: the set's sum in the attention matrix)", [](MetricContext& c) { return c.has_kept() ? c.kept_mass() : NAN; }},
    {"oracle_mass", "1", "the largest Σ_{j∈S'} a_t(j) over |S'| = |S| (or the cache's token count)",
     "H2O Fig. 2 (oracle)", [](MetricContext& c) { return c.oracle_mass(); }},
    {"mass_ratio", "1", "kept_mass / oracle_mass", "H2O Fig. 2",
     [](MetricContext& c) {
       if (!c.has_kept()) return double(NAN);
       const double om = c.oracle_mass();
       return om > 0 ? c.kept_mass() / om : NAN;
     }},
    {"attention_loss", "1", "1 − kept_mass: attention mass outside the cache", "H2O §5.1",
     [](MetricContext& c) { return c.has_kept() ? 1 - c.kept_mass() : NAN; }},
    {"cache_tokens", "tokens", "tokens in the cache answering this query head (subgen: stored vectors / 2)",
     "kvsim's equal-memory rule (docs/policies.md)",
     [](MetricContext& c) { return c.has_kept() ? double(c.answer->kept.size()) : double(c.policy_tokens()); }},
    {"cache_bytes", "bytes",
     "bytes the KV head's cache(s) store: stored vectors × head_dim × 4 (float32), or for a quantized cache (kivi) its "
     "codes, scales, zero points and float32 tokens; query_head mode adds the group's copies",
     "kvsim's equal-memory rule (docs/policies.md)", [](MetricContext& c) { return c.cache_bytes; }},
    {"clusters", "clusters", "key clusters the policy maintains (SubGen's m', k-center's centers); NaN otherwise",
     "SubGen Def. 1, Lemma 2", [](MetricContext& c) { return c.policy_clusters(); }},
    {"policy_ns", "ns/step", "wall time of the policy's observe + attend per step since the last evaluated step (blocked stepping: the time per step of the blocks since then, shared by the evaluated steps of a block)",
     "—", [](MetricContext& c) { return c.policy_ns; }},
    {"log_value", "nats", "g_t(S) = log(1 + Σ_{j∈S} a_t(j)) of the kept set (with [eval] objectives)",
     "H2O §4.1, Appendix D",
     [](MetricContext& c) { return c.objectives && c.has_kept() ? std::log1p(c.kept_mass()) : NAN; }, objectives_on},
    {"log_opt", "nats", "max of g_t over sets of the kept set's size (the top tokens)", "H2O §4.1",
     [](MetricContext& c) { return c.objectives ? std::log1p(c.oracle_mass()) : NAN; }, objectives_on},
    {"fl_value", "1", "facility location f_t(S) = Σ_{i≤t} max_{j∈S} a_i(j) of the kept set: kvsim's monotone submodular "
     "attention objective (H2O defines F_score, the attention mass, not this)", "kvsim; H2O Theorem 4.4's greedy bound applied to it",
     [](MetricContext& c) { return fl_applies(c) ? c.fl_value() : NAN; }, objectives_on},
    {"fl_greedy", "1", "lazy-greedy f_t for sets of the kept set's size (≥ (1 − 1/e)·OPT)", "H2O Theorem 4.4",
     [](MetricContext& c) { return fl_applies(c) ? c.fl_greedy() : NAN; }, objectives_on},
    {"fl_opt", "1", "brute-force max f_t over sets of that size when C(t, |S|) ≤ 2·10⁴; NaN otherwise",
     "H2O Theorem 4.4", [](MetricContext& c) { return fl_applies(c) ? c.fl_opt() : NAN; }, objectives_on},
    {"fl_ratio", "1", "fl_value / fl_greedy", "H2O Theorem 4.4",
     [](MetricContext& c) {
       if (!fl_applies(c)) return double(NAN);
       const double g = c.fl_greedy();
       return g > 0 ? c.fl_value() / g : NAN;
     }, objectives_on},
    {"thm44", "verdict",
     "H2O Theorem 4.4's f(S̃_t) ≥ (1 − α)(1 − 1/e)·OPT − β: 1 holds, 0 fails, NaN undecidable", "H2O Theorem 4.4",
     [](MetricContext& c) {
       if (!fl_applies(c)) return double(NAN);
       return theorem44_verdict(c.fl_value(), c.fl_greedy(), c.fl_opt(), c.theorem44_alpha, c.theorem44_beta);
     }, objectives_on},
    // Appended last: a metric's position seeds its bootstrap interval in sequences.csv (sim/cli/run.cpp),
    // so new metrics go at the end and every earlier interval keeps its value.
    {"attn_sparsity", "1",
     "fraction of the exact row a_t's t entries below 1% of its maximum (a property of the data, the same for every "
     "policy)", "H2O §3 (\"> 95% sparse\")",
     [](MetricContext& c) { return c.row_memo(-1, [&] { return attention_sparsity(c.probs, c.t); }); }},
    {"accum_slope", "1",
     "power-law exponent of the accumulated attention Σ_{i≤t} a_i(j) ranked by size: least-squares slope of log "
     "score vs log rank over the t tokens (objective steps; data property)", "H2O §3, Fig. 2",
     [](MetricContext& c) { return c.objectives_due ? c.accumulated().slope : NAN; }, objectives_on},
    {"accum_r2", "1", "R² of that log-log fit (1 = an exact power law)", "H2O §3, Fig. 2",
     [](MetricContext& c) { return c.objectives_due ? c.accumulated().r2 : NAN; }, objectives_on},
    {"accum_top10", "1", "share of the accumulated attention held by the top 10% of tokens", "H2O §3, Fig. 2",
     [](MetricContext& c) { return c.objectives_due ? c.accumulated().top10_share : NAN; }, objectives_on},
    {"thm44_alpha_lo", "1",
     "smallest α (β = 0) with f(S) ≥ (1 − α)(1 − 1/e)·OPT for the kept set: exact when OPT is brute-forced, "
     "else the low end of the bracket OPT ∈ [greedy, greedy/(1 − 1/e)]; 0 = Theorem 4.4's bound holds with α = 0",
     "H2O Theorem 4.4 (Appendix D, Thm. D.32)",
     [](MetricContext& c) {
       return fl_applies(c) ? theorem44_alpha(c.fl_value(), c.fl_greedy(), c.fl_opt()).first : double(NAN);
     }, objectives_on},
    {"thm44_alpha_hi", "1", "the high end of that bracket (= thm44_alpha_lo when OPT is exact)",
     "H2O Theorem 4.4 (Appendix D, Thm. D.32)",
     [](MetricContext& c) {
       return fl_applies(c) ? theorem44_alpha(c.fl_value(), c.fl_greedy(), c.fl_opt()).second : double(NAN);
     }, objectives_on},
    {"loaded_bytes", "bytes",
     "bytes read to answer the query: the whole cache (= cache_bytes) for every policy but quest, which reads its "
     "pages' min/max keys and the selected pages; query_head mode adds the group's copies",
     "Quest §3 (Tang et al., 2024)", [](MetricContext& c) { return c.loaded_bytes; }},
    {"sink_mass", "1",
     "share of the exact row a_t on the first 4 positions of the sequence (the attention sinks; a property of the "
     "data, the same for every policy)",
     "StreamingLLM §3.1 (Xiao et al., 2024: initial tokens draw a large share of attention)",
     [](MetricContext& c) { return c.row_memo(-2, [&] { return attention_sink_mass(c.probs, c.t, 4); }); }},
    {"needle_mass", "1",
     "Σ_{j∈F} a_t(j): the exact row's mass on the needle's tokens F (retrieval tasks, `kvsim task`; a property of "
     "the data, the same for every policy)",
     "kvsim (needle-in-a-haystack: Kamradt 2023; RULER, Hsieh et al. 2024 §3.1)",
     [](MetricContext& c) { return needle_mass(c, false); }, needle_on},
    {"needle_kept_mass", "1",
     "Σ_{j∈F∩S} a_t(j): the part of needle_mass on needle tokens the cache kept (subset policies)",
     "kvsim; H2O §4.1's kept mass restricted to the needle",
     [](MetricContext& c) { return needle_mass(c, true); }, needle_on},
    {"needle_kept", "1", "|F∩S| / |F|: share of the needle's tokens in the cache (subset policies)", "kvsim",
     [](MetricContext& c) { return needle_kept(c); }, needle_on},
    {"topk_mass", "1",
     "Σ of the exact row a_t's k largest weights (k = min([eval] topk, t)): how concentrated the query's attention "
     "is (a property of the data, the same for every policy; ranks retrieval heads in `kvsim task`)",
     "kvsim; H2O Fig. 2 (the oracle's top-k mass)",
     [](MetricContext& c) {
       if (c.topk <= 0) return double(NAN);  // off: every metric is computed, only applying ones are written
       return c.row_memo(std::min(c.topk, c.t), [&] {
         std::vector<double> own;
         return top_mass(c.probs, c.t, std::min(c.topk, c.t), c.scratch ? *c.scratch : own, c.row_digit());
       });
     },
     topk_on},
    {"topk_kept", "1",
     "share of the exact row's top-k tokens (k = min([eval] topk, t); ties with the k-th included) the cache keeps "
     "(subset policies)",
     "kvsim; the recall of H2O Fig. 2's oracle set (the oracle_topk policy's cache)",
     [](MetricContext& c) { return topk_kept(c); }, topk_on},
};

}  // namespace

const std::vector<Metric>& metric_registry() {
  static_assert(kMaxMetrics >= 18, "MetricRow holds kMaxMetrics values");
  if (kMetrics.size() > kMaxMetrics) throw Error("metric registry: more metrics than kMaxMetrics");
  return kMetrics;
}

std::vector<MetricColumn> metric_columns() {
  std::vector<MetricColumn> out;
  const auto& r = metric_registry();
  for (size_t i = 0; i < r.size(); ++i) out.push_back({r[i].name, r[i].unit, r[i].description, r[i].source, i});
  return out;
}

std::vector<MetricColumn> metric_columns(const EvalSpec& eval) {
  std::vector<MetricColumn> out;
  const auto& r = metric_registry();
  const std::vector<char> on = metrics_applying(eval);
  for (size_t i = 0; i < r.size(); ++i)
    if (on[i]) out.push_back({r[i].name, r[i].unit, r[i].description, r[i].source, i});
  return out;
}

size_t metric_index(std::string_view name) {
  const auto& r = metric_registry();
  for (size_t i = 0; i < r.size(); ++i)
    if (name == r[i].name) return i;
  std::string known;
  for (const auto& m : r) known += (known.empty() ? "" : ", ") + std::string(m.name);
  throw Error("unknown metric '" + std::string(name) + "' (known: " + known + ")");
}

double metric_of(const MetricRow& row, std::string_view name) { return row[metric_index(name)]; }

std::string metrics_markdown() {
  std::ostringstream o;
  o << "# Metrics\n\n"
    << "<!-- Generated by `kvsim metrics --markdown` from the metric registry (sim/replay/metrics.cpp);\n"
    << "     tests/cli/cli_test.sh fails when this file and the registry disagree. -->\n\n"
    << "One row per (policy, layer, query head, evaluated step t). With q̃_t = softmax_scale·q_t, "
       "a_t = softmax(K_t q̃_t), Attn_t = a_tᵀV_t, τ_t = Σ_i exp(⟨k_i, q̃_t⟩), z the policy's output and S "
       "its kept token set. NaN marks a metric that does not apply at a step (e.g. kept_mass for `subgen`, "
       "which keeps no token subset); a metric that applies to none of a policy's rows is left out of its "
       "results.h5 group, and the objective metrics (log_*, fl_*, thm44) exist only with "
       "`[eval] objectives = true`.\n\n"
    << "| metric | unit | definition | source |\n|---|---|---|---|\n";
  for (const auto& m : metric_registry()) {
    std::string d;
    for (const char* c = m.description; *c; ++c) d += (*c == '|') ? std::string("\\|") : std::string(1, *c);
    o << "| `" << m.name << "` | " << m.unit << " | " << d << " | " << m.source << " |\n";
  }
  o << "\nThe exact reference runs in double precision (or float32 with `[eval] reference_precision`) for a block "
       "of evaluated steps at once: logits by one GEMM, a log-domain softmax, the output by a second GEMM. "
       "‖V_t‖_op is tracked by Lanczos on VᵀV (updated in 16-row blocks, sim/replay/operator_norm.cpp), "
       "warm-started from the last top Ritz vector; within 1e-9 relative of a dense eigen-solver.\n\n"
    << "Files (docs/cli.md): `results.h5` holds every row, `/policy_NN/{layer, head, step, <metric>...}`, each "
       "metric dataset with `unit`, `description` and `source` attributes from this registry; `summary.csv` has "
       "`count, mean, median, p95, max` per (policy, layer, metric) over the finite values, the all-layer "
       "aggregate as layer -1 with `all_layers` = 1 (0 on per-layer rows); `cells.csv` "
       "the same per (layer, query head); both end with one column per policy parameter (budget, memory, "
       "sink, …; empty where a policy has none), and each results.h5 policy group has typed `param_<name>` "
       "attributes. Several sequences add `sequences.csv` (docs/cli.md).\n";
  return o.str();
}

std::vector<char> metrics_applying(const EvalSpec& eval) {
  std::vector<char> on;
  for (const auto& m : metric_registry()) on.push_back(!m.applies || m.applies(eval));
  return on;
}

void compute_metrics(MetricContext& c, MetricRow& row, const std::vector<char>& applies) {
  const auto& r = metric_registry();
  if (applies.size() != r.size()) throw Error("compute_metrics: an applies mask of " + std::to_string(applies.size()) + " metrics, not " + std::to_string(r.size()));
  for (size_t i = 0; i < r.size(); ++i) row[i] = applies[i] ? r[i].compute(c) : NAN;
}

}  // namespace kvsim
