#include "kvsim/policies/policy.hpp"

#include <cmath>
#include <functional>
#include <sstream>

#include "kvsim/analysis/buzz.hpp"
#include "kvsim/core/error.hpp"
#include "factories.hpp"

namespace kvsim {

void attend_cached(const MatD& keys, const MatD& values, int64_t m, const Eigen::Ref<const VecD>& q, VecD& z,
                   double& log_sum) {
  const int d = static_cast<int>(keys.cols());
  z.setZero(d);
  if (m <= 0) {
    log_sum = -INFINITY;
    return;
  }
  VecD logits = keys.topRows(m) * q;
  double mx = logits.maxCoeff();
  logits = (logits.array() - mx).exp();
  double sum = logits.sum();
  z.noalias() = values.topRows(m).transpose() * logits;
  z /= sum;
  log_sum = mx + std::log(sum);
}

void attend_cached_group(const MatD& keys, const MatD& values, int64_t m, const MatD& q, MatD& P, MatD& Z,
                         VecD& log_sum) {
  const Eigen::Index G = q.rows(), d = keys.cols();
  Z.setZero(G, d);
  log_sum.setConstant(G, -INFINITY);
  if (m <= 0) {
    P.resize(0, G);
    return;
  }
  // One matrix-vector product per query: measured faster than a [m, d]×[d, G] GEMM for the small G
  // of a query group (GEMM packs K and V at every step: window step 83 µs -> 152 µs at m = 896, G = 2).
  // The softmax runs on a contiguous vector (a column of the row-major P is strided, which made
  // Eigen fall back to scalar exp: 13% of a window step), then lands in P.
  P.resize(m, G);
  thread_local VecD p;
  for (Eigen::Index g = 0; g < G; ++g) {
    p.resize(m);
    p.noalias() = keys.topRows(m) * q.row(g).transpose();
    const double mx = p.maxCoeff();
    p = (p.array() - mx).exp().matrix();
    const double sum = p.sum();
    p /= sum;
    log_sum[g] = mx + std::log(sum);
    P.col(g) = p;
    Z.row(g).noalias() = (values.topRows(m).transpose() * p).transpose();
  }
}

namespace {
using Factory = std::function<std::unique_ptr<Policy>(const Params&, const StreamInfo&)>;
const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> r{
      {"exact", policies::make_exact},
      {"window", policies::make_window},
      {"sink", policies::make_sink},
      {"oracle_topk", policies::make_oracle_topk},
      {"uniform", policies::make_uniform},
      {"subgen", policies::make_subgen},
      {"subgen_kcenter", policies::make_subgen_kcenter},
      {"h2o", policies::make_h2o},
      {"buzz", policies::make_buzz},
  };
  return r;
}
}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (auto& [n, f] : registry()) v.push_back(n);
    return v;
  }();
  return names;
}

int64_t memory_target_tokens(const Params& params, int64_t n) {
  if (!params.has("memory")) return -1;
  Params copy = params;  // reading marks keys used; keep the caller's bookkeeping untouched
  return copy.get_budget("memory", n);
}

Params translate_memory(const std::string& name, const Params& params, const StreamInfo& info) {
  if (!params.has("memory")) return params;
  const int64_t M = memory_target_tokens(params, info.n);
  Params out;
  for (const auto& [k, v] : params.values())
    if (k != "memory") out.set(k, v, params.where(k));
  auto refuse_both = [&](const char* key) {
    if (params.has(key))
      throw Error("give 'memory' (matched cache size) or '" + std::string(key) + "', not both" + params.where(key));
  };
  const std::string where = params.where("memory");
  if (name == "window" || name == "sink" || name == "uniform" || name == "oracle_topk" || name == "h2o") {
    refuse_both("budget");
    out.set("budget", M, where);
  } else if (name == "buzz") {
    refuse_both("window");
    refuse_both("threshold");
    // Capacity sink + window + T = memory, with T/w at Theorem 3.1's value for the stride.
    Params probe = params;  // typed reads with the usual errors, without touching the caller's copy
    const int64_t sink = probe.get_int("sink", 4);
    const int64_t s = probe.get_int("stride", 5);
    const double r = buzz_predicted_T_over_w(s);
    int64_t w = std::max<int64_t>(1, std::llround(double(M - sink) / (1 + r)));
    const int64_t T = std::max<int64_t>(s, M - sink - w);
    w = std::min(w, M - sink - T);  // the threshold is at least one stride; the window gives way
    if (w < 1)
      throw Error("'memory' = " + std::to_string(M) + " tokens is too small for buzz: sink (" + std::to_string(sink) +
                  ") + window (≥ 1) + threshold (≥ stride " + std::to_string(s) + ") needs at least " +
                  std::to_string(sink + 1 + s) + where);
    out.set("window", w, where);
    out.set("threshold", T, where);
  } else if (name == "subgen_kcenter") {
    refuse_both("recent");
    refuse_both("centers");
    const int64_t centers = M / 2;
    out.set("centers", centers, where);
    out.set("recent", std::max<int64_t>(1, M - centers), where);
    if (!params.has("mode")) out.set("mode", std::string("streaming"), where);
  } else if (name == "subgen") {
    refuse_both("s");
    refuse_both("max_clusters");
    refuse_both("eps");
    Params probe = params;
    const int64_t t = probe.get_int("t", 3);
    if (t < 1) throw Error("parameter 't' must be ≥ 1" + params.where("t"));
    const int64_t s = M / 2;
    const int64_t cap = M / (1 + t);
    if (s < 1 || cap < 1)
      throw Error("'memory' = " + std::to_string(M) + " tokens is too small for subgen with t = " + std::to_string(t) +
                  " (needs s = ⌊M/2⌋ ≥ 1 and ⌊M/(1+t)⌋ ≥ 1 clusters)" + where);
    out.set("s", s, where);
    out.set("t", t, where);
    out.set("max_clusters", cap, where);
  } else {
    throw Error("'memory' cannot be matched for '" + name + "': it keeps the whole stream" + where);
  }
  return out;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const Params& given, const StreamInfo& info) {
  for (auto& [n, f] : registry()) {
    if (n != name) continue;
    std::unique_ptr<Policy> p;
    try {
      const Params params = translate_memory(name, given, info);
      p = f(params, info);
      params.check_all_used("policy '" + name + "'");
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind("policy '", 0) == 0) throw;
      throw Error("policy '" + name + "': " + msg);
    }
    return p;
  }
  std::string known;
  for (auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown policy '" + name + "' (known: " + known + ")");
}

}  // namespace kvsim
