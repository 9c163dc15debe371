#include "kvsim/policies/policy.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "kvsim/core/error.hpp"
#include "kvsim/policies/budgets.hpp"
#include "kvsim/policies/registry.hpp"

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

void attend_cached_group(const MatD& keys, const MatD& values, int64_t m, const MatD& q, ProbsD& P, MatD& Z,
                         VecD& log_sum, bool with_values) {
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
    if (with_values) Z.row(g).noalias() = (values.topRows(m).transpose() * p).transpose();
  }
}

void prefill(Policy& p, int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled, int64_t block) {
  if (auto* c = dynamic_cast<PromptCompressor*>(&p)) return c->prefill(P, K, V, q_scaled);
  if (BlockStepper* b = block > 0 ? block_stepper(p) : nullptr) {
    for (int64_t t = 1; t <= P; t += block) b->step_block(t, std::min(P, t + block - 1), K, V, q_scaled, nullptr);
    return;
  }
  MatD q(Eigen::Index(q_scaled.size()), K.cols());
  for (int64_t t = 1; t <= P; ++t) {
    p.observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
    if (!p.needs_every_query()) continue;
    for (size_t g = 0; g < q_scaled.size(); ++g) q.row(Eigen::Index(g)) = q_scaled[g]->row(t - 1);
    p.attend(t, q, nullptr, nullptr);
  }
}

std::optional<ClosedFormCache> closed_form(const Policy& p) {
  if (auto* c = dynamic_cast<const ClosedFormPolicy*>(&p)) return c->closed_form();
  return std::nullopt;
}

bool g_blocked_masking_off = false;

void BlockAnswers::reset(const std::vector<int64_t>& steps_in_block, size_t rows) {
  steps = steps_in_block;
  answers.assign(steps.size(), std::vector<Answer>(rows));
  cache_bytes.assign(steps.size(), std::numeric_limits<double>::quiet_NaN());
  loaded_bytes.assign(steps.size(), std::numeric_limits<double>::quiet_NaN());
  cache_tokens.assign(steps.size(), -1);
  clusters.assign(steps.size(), std::numeric_limits<double>::quiet_NaN());
}

void BlockAnswers::record_state(size_t k, const Policy& p, int head_dim) {
  cache_bytes.at(k) = p.cache_bytes(head_dim);
  cache_tokens.at(k) = p.cache_tokens();
  clusters.at(k) = p.clusters();
}

int64_t BlockAnswers::index_of(int64_t t) const {
  const auto it = std::lower_bound(steps.begin(), steps.end(), t);
  return it != steps.end() && *it == t ? int64_t(it - steps.begin()) : -1;
}

void BlockAnswers::check(int64_t t_first, int64_t t_last, const std::string& who) const {
  bool ok = answers.size() == steps.size() && cache_bytes.size() == steps.size() && loaded_bytes.size() == steps.size() &&
            cache_tokens.size() == steps.size() && clusters.size() == steps.size();
  for (size_t k = 0; ok && k < steps.size(); ++k)
    ok = steps[k] >= t_first && steps[k] <= t_last && (k == 0 || steps[k] > steps[k - 1]);
  if (!ok)
    throw Error(who + ": step_block: the evaluated steps are not ascending within [" + std::to_string(t_first) + ", " +
                std::to_string(t_last) + "] or not sized by BlockAnswers::reset");
}

void check_step_block(int64_t t_first, int64_t t_last, const MatF& K, const std::vector<const MatD*>& q_scaled,
                      const BlockAnswers* out, const std::string& who) {
  if (t_first < 1 || t_last < t_first || t_last > K.rows() || q_scaled.empty())
    throw Error(who + ": step_block: steps [" + std::to_string(t_first) + ", " + std::to_string(t_last) +
                "] outside a stream of " + std::to_string(K.rows()) + " tokens");
  if (out) out->check(t_first, t_last, who);
}

void observe_block(Policy& p, int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, BlockAnswers* out,
                   const std::function<void()>& at_evaluated) {
  for (int64_t t = t_first; t <= t_last; ++t) {
    p.observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
    const int64_t k = out ? out->index_of(t) : -1;
    if (k < 0) continue;
    out->record_state(size_t(k), p, int(K.cols()));
    at_evaluated();
  }
}

BlockStepper* block_stepper(Policy& p) {
  auto* b = dynamic_cast<BlockStepper*>(&p);
  return b && (p.needs_every_query() || b->blocks_evaluated_steps()) ? b : nullptr;
}

int64_t stepping_block_size(int64_t cache_tokens, int n_queries) {
  const int64_t cells = int64_t(4) << 20 >> 3;  // 4 MiB of doubles
  const int64_t b = cells / (std::max<int64_t>(1, n_queries) * std::max<int64_t>(1, cache_tokens + 16));
  return std::clamp<int64_t>(b, 16, 256);
}

bool needs_exact_probs(const Policy& p) { return dynamic_cast<const ExactProbsOracle*>(&p) != nullptr; }

bool needs_global_scores(const Policy& p) {
  auto* o = dynamic_cast<const GlobalScoresOracle*>(&p);
  return o && o->needs_global_scores();
}

void set_global_scores(Policy& p, const std::vector<const VecD*>& per_query_head) {
  auto* o = dynamic_cast<GlobalScoresOracle*>(&p);
  if (!o) throw Error("set_global_scores: this policy takes no global scores");
  o->set_global_scores(per_query_head);
}

double loaded_bytes(const Policy& p, int head_dim) {
  if (auto* l = dynamic_cast<const PartialLoad*>(&p)) return l->loaded_bytes(head_dim);
  return p.cache_bytes(head_dim);
}

bool matched_on_loaded(const Policy& p) { return dynamic_cast<const PartialLoad*>(&p) != nullptr; }

double memory_share(const Policy& p) {
  if (auto* m = dynamic_cast<const LayerMemoryShare*>(&p)) return m->memory_share();
  return 1.0;
}

int64_t memory_target_tokens(const Params& params, int64_t n) {
  if (!params.has("memory")) return -1;
  ParamReader reader(params);
  return reader.get_budget("memory", n);
}

namespace {

/// `memory` alone (with where it was set), as budgets.cpp reads it.
Params memory_only(const Params& params) {
  Params m;
  m.set("memory", *params.find("memory"), params.origin("memory"));
  return m;
}

/// The memory whose allocation a budgets file supplies: `budgets_memory` where given (kvsim task sets it
/// to the fraction it pinned to tokens), else `memory`.
Params allocation_memory(const Params& params) {
  if (!params.has("budgets_memory")) return memory_only(params);
  Params m;
  m.set("memory", *params.find("budgets_memory"), params.origin("budgets_memory"));
  return m;
}

std::string budgets_path(const Params& params) {
  const auto* v = std::get_if<std::string>(params.find("budgets_file"));
  if (!v || v->empty()) throw Error("parameter 'budgets_file' must be the path of a budgets file (kvsim allocate)" + params.where("budgets_file"));
  return *v;
}

}  // namespace

int64_t cell_memory_tokens(const Params& params, const StreamInfo& s) {
  if (!params.has("budgets_file") || !params.has("memory")) return memory_target_tokens(params, s.n);
  return cell_budget(budgets_path(params), allocation_memory(params), memory_only(params), s);
}

namespace {

/// check_policy_spec without the "policy 'name': " prefix.
void check_spec(const PolicyInfo& info, const Params& params) {
  const bool memory = params.has("memory");
  if (memory && !info.memory)
    throw Error("'memory' cannot be matched for '" + info.name + "': it has no equal-memory rule" + params.where("memory"));
  for (const auto& [key, value] : params.values()) {
    if (key == "budgets_file") {  // per-cache budgets averaging `memory` (include/kvsim/policies/budgets.hpp)
      if (!memory) throw Error("'budgets_file' needs 'memory', the mean budget its allocations are for" + params.where(key));
      if (info.name == "pyramidkv")
        throw Error("'budgets_file' replaces pyramidkv's layer budgets: give it to snapkv instead" + params.where(key));
      const std::string path = budgets_path(params);
      if (params.has("budgets_memory")) ParamReader(params).get_budget("budgets_memory", 0);  // named as itself
      try {
        allocation_for(path, read_budgets_file(path), allocation_memory(params));  // this memory is in the file
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + params.where(key));
      }
      continue;
    }
    if (key == "budgets_memory") {  // which allocation of the file, when `memory` is given otherwise
      if (!params.has("budgets_file")) throw Error("'budgets_memory' needs 'budgets_file'" + params.where(key));
      ParamReader(params).get_budget("budgets_memory", 0);  // a number: tokens, or a fraction of the file's n
      continue;
    }
    if (key == "memory") {
      for (const auto& r : info.memory->refuses)
        if (params.has(r)) throw Error("give 'memory' (matched cache size) or '" + r + "', not both" + params.where(r));
      ParamReader(params).get_budget("memory", 0);  // its kind; its value against n waits for the stream
      continue;
    }
    const ParamInfo* doc = nullptr;
    for (const auto& p : info.params)
      if (p.name == key) doc = &p;
    if (!doc) throw Error("unknown parameter '" + key + "'" + params.where(key));
    const std::string& kind = doc->kind;
    const bool number = std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value);
    const bool ok = kind == "tokens" || kind == "float" ? number
                    : kind == "int"                     ? std::holds_alternative<int64_t>(value)
                    : kind == "bool"                    ? std::holds_alternative<bool>(value)
                                                        : std::holds_alternative<std::string>(value);
    if (!ok) {
      const char* want = kind == "tokens"  ? "a number of tokens or a fraction of n"
                         : kind == "int"   ? "an integer"
                         : kind == "float" ? "a number"
                         : kind == "bool"  ? "true or false"
                                           : "a string";
      throw Error("parameter '" + key + "' must be " + want + params.where(key));
    }
    if (kind == "tokens") ParamReader(params).get_budget(key, 0);  // ≥ 0 tokens, or a fraction in (0, 1]
    ParamReader declared(params, &info.params);  // the declared range, now rather than when the stream is read
    if (kind == "int") declared.get_int(key, 0);
    if (kind == "float") declared.get_double(key, 0.0);
    if (kind == "string") declared.get_string(key, "");
  }
  if (!memory)  // `memory` supplies the sizes its rule derives
    for (const auto& p : info.params)
      if (p.default_value == "required" && !params.has(p.name))
        throw Error("missing parameter '" + p.name + "' (" + p.doc + ")");
}

}  // namespace

void check_policy_spec(const std::string& name, const Params& params) {
  const PolicyInfo& info = policy_info(name);
  try {
    check_spec(info, params);
  } catch (const Error& e) {
    throw Error("policy '" + name + "': " + e.what());
  }
}

namespace {

/// `memory = M` replaced by the parameters of the policy's equal-memory rule (registry.hpp).
Params translate_memory(const PolicyInfo& info, const Params& params, const StreamInfo& stream) {
  if (!params.has("memory")) return params;
  const int64_t M = cell_memory_tokens(params, stream);
  if (!info.memory)
    throw Error("'memory' cannot be matched for '" + info.name + "': it has no equal-memory rule" + params.where("memory"));
  Params out;
  for (const auto& [k, v] : params.values())
    if (k != "memory" && k != "budgets_file" && k != "budgets_memory") out.set(k, v, params.origin(k));
  for (const auto& key : info.memory->refuses)
    if (params.has(key))
      throw Error("give 'memory' (matched cache size) or '" + key + "', not both" + params.where(key));
  info.memory->apply(M, params, out, params.origin("memory"));
  return out;
}

}  // namespace

std::unique_ptr<Policy> make_policy(const std::string& name, const Params& given, const StreamInfo& stream) {
  const PolicyInfo& info = policy_info(name);
  std::unique_ptr<Policy> p;
  try {
    const Params params = translate_memory(info, given, stream);
    ParamReader reader(params, &info.params);  // the declared defaults and ranges
    p = info.make(reader, stream);
    reader.check_all_used("policy '" + name + "'");
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("policy '", 0) == 0) throw;
    throw Error("policy '" + name + "': " + msg);
  }
  return p;
}

}  // namespace kvsim
