// A replay cell's policies stepped through the stream (sim/replay/cell_policies.hpp).
#include <chrono>
#include <cmath>

#include "cell_policies.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/replay/banded.hpp"
#include "phase_clock.hpp"

namespace kvsim::cell {
namespace {
using Clock = std::chrono::steady_clock;
double ns_since(Clock::time_point t0) { return std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }
}  // namespace

void PolicySteps::step(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out) {
  PolicyRun& run = runs_[p];
  if (run.closed) return step_closed(p, block, out);
  if (run.blocked) return step_blocked(p, block, out);
  size_t r = 0;
  if (run.t == 0 && ex_.data.prefill > 0) prefill(run);
  while (run.t < block.back()) {
    // Step t: token index t-1 joins, then query q_t.
    const int64_t t = run.t + 1;
    const bool is_eval = (t == block[r]);
    const auto t0 = Clock::now();
    for (auto& inst : run.inst) inst->observe(t - 1, s_.keys32.row(t - 1).data(), s_.values32.row(t - 1).data());
    if (run.every || is_eval) attend(run, t, is_eval, r);
    run.ns_since_eval += ns_since(t0);
    run.steps_since_eval += 1;
    run.t = t;
    if (!is_eval) continue;
    double bytes = 0, loaded = 0;
    for (auto& inst : run.inst) {
      bytes += inst->cache_bytes(d_);
      loaded += loaded_bytes(*inst, d_);
    }
    evaluated(p, t, r, bytes, loaded, out);
    run.ns_since_eval = 0;
    run.steps_since_eval = 0;
    ++r;
  }
}

/// Blocked stepping: block_steps(run) steps per call of BlockStepper::step_block, however many evaluated steps they
/// hold (every one of them answered inside the walk); the rows of a block share its time per step as policy_ns.
void PolicySteps::step_blocked(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out) {
  PolicyRun& run = runs_[p];
  size_t r = 0;
  if (run.t == 0 && ex_.data.prefill > 0) prefill(run);
  while (run.t < block.back()) {
    const int64_t t_first = run.t + 1, t_last = std::min(block.back(), run.t + block_steps(run));
    size_t r_end = r;
    while (r_end < block.size() && block[r_end] <= t_last) ++r_end;
    const std::vector<int64_t> steps(block.begin() + std::ptrdiff_t(r), block.begin() + std::ptrdiff_t(r_end));
    const auto t0 = Clock::now();
    advance_block(run, t_first, t_last, steps);
    run.ns_since_eval += ns_since(t0);
    run.steps_since_eval += t_last - t_first + 1;
    run.t = t_last;
    for (size_t k = 0; k < steps.size(); ++k) {
      // What a PartialLoad (quest) read at the step; any other cache loads what it stores.
      double bytes = 0, loaded = 0;
      for (size_t i = 0; i < run.inst.size(); ++i) {
        bytes += block_answers_[i].cache_bytes[k];
        const double l = block_answers_[i].loaded_bytes[k];
        loaded += std::isnan(l) ? block_answers_[i].cache_bytes[k] : l;
        if (per_query_) answers_[i] = std::move(block_answers_[i].answers[k][0]);
      }
      if (!per_query_) answers_ = std::move(block_answers_[0].answers[k]);
      tokens_.assign(size_t(G_), 0);
      clusters_.assign(size_t(G_), 0);
      for (int g = 0; g < G_; ++g) {
        const BlockAnswers& a = block_answers_[per_query_ ? size_t(g) : 0];
        tokens_[size_t(g)] = a.cache_tokens[k];
        clusters_[size_t(g)] = a.clusters[k];
      }
      evaluated(p, steps[k], r + k, bytes, loaded, out, &tokens_, &clusters_);
    }
    if (steps.empty()) continue;
    run.ns_since_eval = 0;
    run.steps_since_eval = 0;
    r = r_end;
  }
}

/// Every row of the block gets policy_ns = the block's time over the steps it advanced.
void PolicySteps::step_closed(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out) {
  PolicyRun& run = runs_[p];
  const ClosedFormCache& c = *run.closed;
  const auto t0 = Clock::now();
  std::vector<const MatD*> qs(size_t(G_), nullptr);
  for (int g = 0; g < G_; ++g) qs[g] = &s_.queries_scaled[g];
  VecD* log_sums = c.log_tau ? &closed_log_sums_ : nullptr;
  if (ex_.eval.policy_precision == Precision::float32 && !c.double_only)
    closed_form_answers(qs, s_.keys32, s_.values32, c, block, closed_z_, log_sums);
  else closed_form_answers(qs, s_.keys, s_.values, c, block, closed_z_, log_sums);
  run.ns_since_eval = ns_since(t0);
  run.steps_since_eval = block.back() - run.t;
  run.t = block.back();
  for (size_t r = 0; r < block.size(); ++r) {
    const int64_t t = block[r];
    closed_form_kept(c, t, closed_kept_);
    for (int g = 0; g < G_; ++g) {
      answers_[g] = Answer{};
      answers_[g].z = closed_z_.row(Eigen::Index(r) * G_ + g).transpose();
      if (log_sums) answers_[g].log_tau = closed_log_sums_[Eigen::Index(r) * G_ + g];
      answers_[g].has_kept = true;
      answers_[g].kept = closed_kept_;
    }
    const double bytes = 2.0 * double(hd::sink_window_count(t, c.sink, c.window)) * d_ * sizeof(float) * double(run.inst.size());
    evaluated(p, t, r, bytes, bytes, out);
  }
}

/// The policy's attend() at step t with the group's (or each head's) scaled query; at evaluated
/// steps fills answers_[g] (fresh: nothing may leak from the previous policy's answer).
void PolicySteps::attend(PolicyRun& run, int64_t t, bool is_eval, size_t r) {
  if (is_eval)
    for (int g = 0; g < G_; ++g) answers_[g] = Answer{};
  const bool probs = is_eval && run.oracle;
  if (per_query_) {
    for (int g = 0; g < G_; ++g) {
      q_one_.row(0) = s_.queries_scaled[g].row(t - 1);
      one_[0] = Answer{};
      probs_one_[0] = probs ? ref_.probs_row(g, r) : nullptr;
      run.inst[g]->attend(t, q_one_, is_eval ? &one_ : nullptr, probs ? &probs_one_ : nullptr);
      if (is_eval) answers_[g] = std::move(one_[0]);
    }
    return;
  }
  for (int g = 0; g < G_; ++g) {
    q_group_.row(g) = s_.queries_scaled[g].row(t - 1);
    probs_group_[g] = probs ? ref_.probs_row(g, r) : nullptr;
  }
  run.inst[0]->attend(t, q_group_, is_eval ? &answers_ : nullptr, probs ? &probs_group_ : nullptr);
}

/// At an evaluated step: the memory rule on what the policy is matched on, then its rows.
void PolicySteps::evaluated(size_t p, int64_t t, size_t r, double bytes, double loaded, std::vector<MetricRow>& out,
                            const std::vector<int64_t>* tokens, const std::vector<double>* clusters) {
  phase::Scope ps(phase::metrics);
  PolicyRun& run = runs_[p];
  const Policy& first = *run.inst[0];
  metrics_.check_memory(p, run.memory_tokens, first, run.inst.size(), t, matched_on_loaded(first) ? loaded : bytes);
  Evaluated e;
  e.t = t;
  e.r = r;
  e.answers = &answers_;
  for (int g = 0; g < G_; ++g) e.answered_by.push_back(run.inst[per_query_ ? g : 0].get());
  if (tokens) e.cache_tokens = *tokens;
  if (clusters) e.clusters = *clusters;
  e.cache_bytes = bytes;
  e.loaded_bytes = loaded;
  e.policy_ns = run.ns_since_eval / double(run.steps_since_eval);
  metrics_.record(p, e, out);
}

}  // namespace kvsim::cell
