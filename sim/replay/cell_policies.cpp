// A replay cell's policy instances: made, given global scores and the prompt (sim/replay/cell_policies.hpp);
// their stepping is in cell_stepping.cpp.
#include "cell_policies.hpp"

#include <chrono>

#include "kvsim/core/rng.hpp"
#include "gpu_layer_batch.hpp"
#include "phase_clock.hpp"
#include "reference_answers.hpp"
#include "kvsim/policies/gpu_replay.hpp"

namespace kvsim::cell {
namespace {
using Clock = std::chrono::steady_clock;
double ns_since(Clock::time_point t0) { return std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }

/// cuda::replay_policy timed into the profile's line for `label` (a cell's own replay; the layer
/// batch times its replays itself), so a profiled --device cuda run lists its replays by policy.
PolicyReplayFn timed_replay(std::string label) {
  return [label = std::move(label)](const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V,
                                    int kv_heads, int group, int64_t n, int d, double scale,
                                    const std::vector<int64_t>& steps, std::vector<float>& z,
                                    std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap) {
    phase::NamedScope by_policy(label);
    cuda::replay_policy(p, Q, K, V, kv_heads, group, n, d, scale, steps, z, log_sum, kept, kept_cap);
  };
}
}  // namespace

uint64_t instance_seed(const Experiment& ex, const Cell& cell, int64_t model_layer, size_t p, int i) {
  const bool per_query = ex.eval.gqa == GqaMode::query_head;
  const uint64_t head_id = per_query ? uint64_t(cell.heads[size_t(i)]) : uint64_t(cell.kv_head) + (1ULL << 32);
  return derive_seed({ex.seed, uint64_t(model_layer), head_id, uint64_t(p), 0});
}

PolicySteps::PolicySteps(const Experiment& ex, const Cell& cell, int64_t n, const RecordingMeta& meta, const Streams& streams,
                         double scale, Reference& reference, Metrics& metrics, GpuLayerBatch* batch)
    : ex_(ex), cell_(cell), batch_(batch), n_(n), d_(int(streams.keys32.cols())), G_(int(cell.heads.size())), meta_(meta),
      per_query_(ex.eval.gqa == GqaMode::query_head), s_(streams), scale_(scale), ref_(reference), metrics_(metrics),
      q_group_(G_, d_), q_one_(1, d_), answers_(size_t(G_)), one_(1), probs_group_(size_t(G_)), probs_one_(1) {}

std::vector<int> PolicySteps::heads_of(size_t i) const {  // the query heads instance i answers
  std::vector<int> gs;
  if (per_query_) gs.push_back(int(i));
  else
    for (int g = 0; g < G_; ++g) gs.push_back(g);
  return gs;
}

void PolicySteps::make() {
  runs_.resize(ex_.policies.size());
  for (size_t p = 0; p < runs_.size(); ++p) {
    for (int i = 0; i < (per_query_ ? G_ : 1); ++i) {
      auto inst = make_cell_policy(ex_, meta_, cell_, n_, p, i);
      if (ex_.eval.device == Device::cuda && answers_are_reference(*inst)) {
        // exact: the GPU reference already holds its answers (ReferenceAnswered).
        inst = reference_answers(std::move(inst), ref_, heads_of(size_t(i)));
      } else if (ex_.eval.device == Device::cuda && gpu_replay(*inst)) {
        std::vector<const MatF*> qs;
        for (int g : heads_of(size_t(i))) qs.push_back(&s_.queries32[g]);
        // kv_head mode: the layer's cells replayed together (one launch, a block per KV head).
        PolicyReplayFn replay = batch_ && !per_query_ ? batch_->replay_fn(cell_, p) : PolicyReplayFn{};
        if (!replay && phase::enabled()) replay = timed_replay(ex_.policies[p].label);
        inst = make_gpu_replay(std::move(inst), std::move(qs), s_.keys32, s_.values32, scale_, eval_steps(ex_.eval, n_),
                               std::move(replay), gpu_step_block(ex_.eval));
      }
      runs_[p].inst.push_back(std::move(inst));
    }
    runs_[p].every = runs_[p].inst[0]->needs_every_query();
    // The cache's own budget when the policy has a budgets_file, else M (include/kvsim/policies/budgets.hpp).
    runs_[p].memory_tokens = cell_memory_tokens(ex_.policies[p].params, cell_stream(ex_, cell_, n_, meta_));
    runs_[p].oracle = needs_exact_probs(*runs_[p].inst[0]);
    if (ex_.eval.closed_form == ClosedFormMode::blocked) runs_[p].closed = closed_form(*runs_[p].inst[0]);
    // Blocked stepping: every instance a BlockStepper (a GPU replay or an exact-probs oracle is not). One
    // that reads only the evaluated queries (kivi) answers a block's evaluated steps together.
    bool blocked = ex_.eval.stepping == SteppingMode::blocked && !runs_[p].oracle;
    for (auto& inst : runs_[p].inst) blocked &= block_stepper(*inst) != nullptr;
    runs_[p].blocked = blocked;
  }
}

void PolicySteps::global_scores() {
  bool want = false;
  for (auto& run : runs_) want |= needs_global_scores(*run.inst[0]);
  if (!want) return;
  const std::vector<VecD> global = ref_.global_scores();
  for (auto& run : runs_) {
    if (!needs_global_scores(*run.inst[0])) continue;
    for (size_t i = 0; i < run.inst.size(); ++i) {
      std::vector<const VecD*> mine;
      for (int g : heads_of(i)) mine.push_back(&global[g]);
      set_global_scores(*run.inst[i], mine);
    }
  }
}

/// `[data] prefill = P`: the prompt's P tokens to every instance at once (kvsim::prefill; its time
/// counts as P steps of policy_ns).
void PolicySteps::prefill(PolicyRun& run) {
  const int64_t P = ex_.data.prefill;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < run.inst.size(); ++i) {
    std::vector<const MatD*> qs;
    for (int g : heads_of(i)) qs.push_back(&s_.queries_scaled[g]);
    kvsim::prefill(*run.inst[i], P, s_.keys32, s_.values32, qs, run.blocked ? block_steps(run) : 0);
  }
  run.ns_since_eval += ns_since(t0);
  run.steps_since_eval += P;
  run.t = P;
}

int64_t PolicySteps::block_steps(const PolicyRun& run) const {
  if (ex_.eval.stepping_block > 0) return ex_.eval.stepping_block;
  const int64_t b = stepping_block_size(std::max<int64_t>(run.memory_tokens, run.inst[0]->cache_tokens()), per_query_ ? 1 : G_);
  // A policy that reads only the evaluated queries forms logits for those alone: the same rows per block
  // when the block spans `every` times the steps.
  return run.every ? b : b * std::max<int64_t>(1, ex_.eval.every);
}

void PolicySteps::advance_block(PolicyRun& run, int64_t t_first, int64_t t_last, const std::vector<int64_t>& steps) {
  block_answers_.resize(run.inst.size());
  for (size_t i = 0; i < run.inst.size(); ++i) {
    std::vector<const MatD*> qs;
    for (int g : heads_of(i)) qs.push_back(&s_.queries_scaled[g]);
    block_answers_[i].reset(steps, qs.size());
    block_stepper(*run.inst[i])->step_block(t_first, t_last, s_.keys32, s_.values32, qs, &block_answers_[i]);
  }
}

}  // namespace kvsim::cell

namespace kvsim {

std::unique_ptr<Policy> make_cell_policy(const Experiment& ex, const RecordingMeta& meta, const Cell& cell, int64_t n,
                                         size_t p, int i) {
  StreamInfo info = cell_stream(ex, cell, n, meta);
  info.seed = cell::instance_seed(ex, cell, meta.model_layer(cell.layer), p, i);
  return make_policy(ex.policies[p].name, ex.policies[p].params, info);
}

StreamInfo cell_stream(const Experiment& ex, const Cell& cell, int64_t n, const RecordingMeta& meta) {
  StreamInfo info;
  info.n = n;
  info.head_dim = meta.head_dim;
  info.softmax_scale = meta.softmax_scale;
  info.rope_theta = meta.rope_theta;
  info.rope_halves = meta.rope_halves;
  info.rope_applied = meta.rope == "applied";
  info.group_agg = ex.eval.group_agg;
  info.policy_f32 = ex.eval.policy_precision == Precision::float32;
  info.n_queries = ex.eval.gqa == GqaMode::query_head ? 1 : int(cell.heads.size());
  info.prefill = ex.data.prefill;
  // The model's layer, so that a layer-subset recording (subset_layers) replays as the full one does.
  info.layer = int(meta.model_layer(cell.layer));
  info.kv_head = cell.kv_head;
  info.n_layers = meta.model_layer_count();
  info.n_kv_heads = meta.n_kv_heads;
  if (!ex.data.replay_local && !meta.is_local(cell.layer)) {  // local layers stay exact: rank the global ones
    info.managed_layer = info.n_managed_layers = 0;
    for (int l = 0; l < meta.n_layers; ++l)
      if (!meta.is_local(l)) {
        if (l < cell.layer) ++info.managed_layer;
        ++info.n_managed_layers;
      }
  }
  return info;
}

}  // namespace kvsim
