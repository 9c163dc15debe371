// One (layer, KV head) cell of a replay, in named steps:
//   load the cell's q, k, v  →  instantiate the policies (GPU replays when [eval] device = "cuda")
//   →  global scores for non-causal oracles  →  full attention for the H2O objectives
//   →  per block of evaluated steps: the exact reference (CPU double/float32 or GPU) and ‖V_t‖_op,
//      then every policy stepped to the block's end (observe every token; attend every step or only
//      at evaluated ones) — or, for closed-form caches (window, sink), the block's answers at once by
//      banded GEMMs — the equal-memory rule checked and the registry's metrics recorded.
// Stream semantics (docs/architecture.md, a replay step by step): at step t token t−1 (0-based) joins the cache, then q_t is answered.
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/core/rng.hpp"
#include "kvsim/replay/banded.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/gpu_reference.hpp"
#include "kvsim/replay/metrics.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim {
namespace {

using Clock = std::chrono::steady_clock;

/// The instances of one policy spec inside a cell: one (kv_head mode) or one per query head.
struct PolicyRun {
  std::vector<std::unique_ptr<Policy>> inst;
  bool every = false, oracle = false;
  int64_t t = 0;                 // tokens observed so far
  int64_t memory_tokens = -1;    // equal-memory target (param `memory`), -1 = none
  std::optional<ClosedFormCache> closed;  // replayed in blocks (Policy::closed_form), never stepped
  double ns_since_eval = 0;
  int64_t steps_since_eval = 0;
};

class CellReplay {
 public:
  CellReplay(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n)
      : ex_(ex), cell_(cell), n_(n), d_(src.meta().head_dim), G_(int(cell.heads.size())),
        scale_(src.meta().softmax_scale), per_query_(ex.eval.gqa == GqaMode::query_head), n_layers_(src.meta().n_layers),
        opn_(d_) {
    load(src);
  }

  void run(std::vector<std::vector<MetricRow>>& out) {
    make_policies();
    global_scores();
    objective_attention();
    const std::vector<int64_t> steps = eval_steps(ex_.eval, n_);
    for (size_t p = 0; p < runs_.size(); ++p) out[p].reserve(size_t(G_) * steps.size());  // exact: no growth slack
    const bool ref_f32 = ex_.eval.reference_precision == Precision::float32;
    for (size_t b0 = 0; b0 < steps.size();) {
      // Block of evaluated steps so that rows × t_max stays ≤ 4M doubles per query head.
      const size_t b1 = reference_block_end(steps, b0, ref_f32 ? kReferenceRowsF32 : 256);
      const std::vector<int64_t> block(steps.begin() + b0, steps.begin() + b1);
      reference_pass(block);
      for (size_t p = 0; p < runs_.size(); ++p) step_policy(p, block, out[p]);
      b0 = b1;
    }
  }

 private:
  void load(const StreamSource& src) {
    Kf_ = src.read(cell_.layer, Tensor::k, cell_.kv_head).topRows(n_);
    Vf_ = src.read(cell_.layer, Tensor::v, cell_.kv_head).topRows(n_);
    K_ = Kf_.cast<double>();
    V_ = Vf_.cast<double>();
    Q_.resize(G_);
    Qs_.resize(G_);
    for (int g = 0; g < G_; ++g) {
      Q_[g] = src.read(cell_.layer, Tensor::q, cell_.heads[g]).topRows(n_);
      Qs_[g] = Q_[g].cast<double>() * scale_;
    }
  }

  /// The query heads instance i answers: its own head (query_head mode) or the whole group.
  std::vector<int> heads_of(size_t i) const {
    std::vector<int> gs;
    if (per_query_) gs.push_back(int(i));
    else
      for (int g = 0; g < G_; ++g) gs.push_back(g);
    return gs;
  }

  void make_policies() {
    runs_.resize(ex_.policies.size());
    for (size_t p = 0; p < runs_.size(); ++p) {
      StreamInfo info;
      info.n = n_;
      info.head_dim = d_;
      info.group_agg = ex_.eval.group_agg;
      info.policy_f32 = ex_.eval.policy_precision == Precision::float32;
      info.n_queries = per_query_ ? 1 : G_;
      info.prefill = ex_.data.prefill;
      info.layer = cell_.layer;
      info.n_layers = n_layers_;
      const int n_inst = per_query_ ? G_ : 1;
      for (int i = 0; i < n_inst; ++i) {
        const uint64_t head_id = per_query_ ? uint64_t(cell_.heads[i]) : uint64_t(cell_.kv_head) + (1ULL << 32);
        info.seed = derive_seed({ex_.seed, uint64_t(cell_.layer), head_id, uint64_t(p), 0});
        auto inst = make_policy(ex_.policies[p].name, ex_.policies[p].params, info);
        // `[eval] device = "cuda"`: policies with a GPU replay run there (sim/policies/gpu_replay.cpp).
        if (ex_.eval.device == Device::cuda && inst->gpu_replay()) {
          std::vector<const MatF*> qs;
          for (int g : heads_of(i)) qs.push_back(&Q_[g]);
          inst = make_gpu_replay(std::move(inst), std::move(qs), Kf_, Vf_, scale_, eval_steps(ex_.eval, n_));
        }
        runs_[p].inst.push_back(std::move(inst));
      }
      runs_[p].every = runs_[p].inst[0]->needs_every_query();
      runs_[p].memory_tokens = memory_target_tokens(ex_.policies[p].params, n_);
      runs_[p].oracle = runs_[p].inst[0]->needs_exact_probs();
      if (ex_.eval.closed_form == ClosedFormMode::blocked) runs_[p].closed = runs_[p].inst[0]->closed_form();
    }
  }

  /// Column sums of the full causal attention, for non-causal oracles (H2O's global heavy hitters).
  void global_scores() {
    bool want = false;
    for (auto& run : runs_) want |= run.inst[0]->needs_global_scores();
    if (!want) return;
    std::vector<VecD> global(G_);
    for (int g = 0; g < G_; ++g) global[g] = global_attention_scores(Q_[g], K_, scale_);
    for (auto& run : runs_) {
      if (!run.inst[0]->needs_global_scores()) continue;
      for (size_t i = 0; i < run.inst.size(); ++i) {
        std::vector<const VecD*> mine;
        for (int g : heads_of(i)) mine.push_back(&global[g]);
        run.inst[i]->set_global_scores(mine);
      }
    }
  }

  /// Full causal attention of the first T_obj queries (for the facility-location objective).
  void objective_attention() {
    t_obj_ = ex_.eval.objectives ? std::min(n_, ex_.eval.objectives_max_t) : 0;
    attn_all_.resize(G_);
    if (t_obj_ <= 0) return;
    std::vector<int64_t> all(t_obj_);
    for (int64_t t = 0; t < t_obj_; ++t) all[t] = t + 1;
    ReferenceBlock blk;
    for (int g = 0; g < G_; ++g) {
      exact_attention(Q_[g], K_, V_, scale_, all, blk);
      attn_all_[g] = std::move(blk.probs);
    }
  }

  /// The exact reference for the block's steps (every query head) and ‖V_t‖_op at each of them.
  void reference_pass(const std::vector<int64_t>& block) {
    ref_.resize(G_);
    for (int g = 0; g < G_; ++g) {
      if (ex_.eval.device == Device::cuda) cuda::exact_attention_block(Q_[g], Kf_, Vf_, scale_, block, ref_[g]);
      else if (ex_.eval.reference_precision == Precision::float32) exact_attention_f32(Q_[g], Kf_, Vf_, scale_, block, ref_[g]);
      else exact_attention(Q_[g], K_, V_, scale_, block, ref_[g]);
    }
    opnorm_.resize(block.size());
    for (size_t r = 0; r < block.size(); ++r) {
      for (; opn_t_ < block[r]; ++opn_t_) opn_.add(Vf_.row(opn_t_).data());
      opnorm_[r] = opn_.op_norm();
    }
  }

  /// Steps policy p from its last step to the block's end; at evaluated steps checks the memory rule
  /// and appends one row per query head.
  void step_policy(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out) {
    PolicyRun& run = runs_[p];
    if (run.closed) return step_closed(p, block, out);
    size_t r = 0;
    if (run.t == 0 && ex_.data.prefill > 0) prefill(run);
    while (run.t < block.back()) {
      const int64_t t = run.t + 1;  // step t: token index t-1 joins, then query q_t
      const bool is_eval = (t == block[r]);
      const auto t0 = Clock::now();
      for (auto& inst : run.inst) inst->observe(t - 1, Kf_.row(t - 1).data(), Vf_.row(t - 1).data());
      if (run.every || is_eval) attend(run, t, is_eval, r);
      run.ns_since_eval += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      ++run.steps_since_eval;
      run.t = t;
      if (!is_eval) continue;
      double bytes = 0, loaded = 0;
      for (auto& inst : run.inst) {
        bytes += inst->cache_bytes(d_);
        loaded += inst->loaded_bytes(d_);
      }
      check_memory(p, t, run.inst[0]->matched_on_loaded() ? loaded : bytes);
      record(p, t, r, bytes, loaded, out);
      run.ns_since_eval = 0;
      run.steps_since_eval = 0;
      ++r;
    }
  }

  /// A closed-form cache (Policy::closed_form): the block's answers for every query head at once by
  /// banded masked GEMMs in the policy's precision (include/kvsim/replay/banded.hpp); the instance is
  /// never stepped (a prefill included: the closed form holds after it). Every row of the block gets
  /// policy_ns = the block's time over the steps it advanced.
  void step_closed(size_t p, const std::vector<int64_t>& block, std::vector<MetricRow>& out) {
    PolicyRun& run = runs_[p];
    const ClosedFormCache& c = *run.closed;
    const auto t0 = Clock::now();
    std::vector<const MatD*> qs(size_t(G_), nullptr);
    for (int g = 0; g < G_; ++g) qs[g] = &Qs_[g];
    if (ex_.eval.policy_precision == Precision::float32) closed_form_answers(qs, Kf_, Vf_, c, block, zc_);
    else closed_form_answers(qs, K_, V_, c, block, zc_);
    run.ns_since_eval = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    run.steps_since_eval = block.back() - run.t;
    run.t = block.back();
    for (size_t r = 0; r < block.size(); ++r) {
      const int64_t t = block[r];
      closed_form_kept(c, t, kept_);
      for (int g = 0; g < G_; ++g) {
        answers_[g] = Answer{};
        answers_[g].z = zc_.row(Eigen::Index(r) * G_ + g).transpose();
        answers_[g].has_kept = true;
        answers_[g].kept = kept_;
      }
      const double bytes = 2.0 * double(hd::sink_window_count(t, c.sink, c.window)) * d_ * sizeof(float) * double(run.inst.size());
      check_memory(p, t, bytes);
      record(p, t, r, bytes, bytes, out);
    }
  }

  /// `[data] prefill = P`: the prompt's P tokens to every instance at once (Policy::prefill; its
  /// time counts as P steps of policy_ns).
  void prefill(PolicyRun& run) {
    const int64_t P = ex_.data.prefill;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < run.inst.size(); ++i) {
      std::vector<const MatD*> qs;
      for (int g : heads_of(i)) qs.push_back(&Qs_[g]);
      run.inst[i]->prefill(P, Kf_, Vf_, qs);
    }
    run.ns_since_eval += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    run.steps_since_eval += P;
    run.t = P;
  }

  /// The policy's attend() at step t with the group's (or each head's) scaled query; at evaluated
  /// steps fills answers_[g] (fresh: nothing may leak from the previous policy's answer).
  void attend(PolicyRun& run, int64_t t, bool is_eval, size_t r) {
    if (is_eval)
      for (int g = 0; g < G_; ++g) answers_[g] = Answer{};
    const bool probs = is_eval && run.oracle;
    if (per_query_) {
      for (int g = 0; g < G_; ++g) {
        qone_.row(0) = Qs_[g].row(t - 1);
        one_[0] = Answer{};
        probs_one_[0] = probs ? ref_[g].probs_row(r, prow_[g]) : nullptr;
        run.inst[g]->attend(t, qone_, is_eval ? &one_ : nullptr, probs ? &probs_one_ : nullptr);
        if (is_eval) answers_[g] = std::move(one_[0]);
      }
      return;
    }
    for (int g = 0; g < G_; ++g) {
      qgroup_.row(g) = Qs_[g].row(t - 1);
      probs_group_[g] = probs ? ref_[g].probs_row(r, prow_[g]) : nullptr;
    }
    run.inst[0]->attend(t, qgroup_, is_eval ? &answers_ : nullptr, probs ? &probs_group_ : nullptr);
  }

  /// The equal-memory rule (docs/policies.md): `memory = M` holds min(M, t) tokens' worth at every step
  /// (±2%), or never more than M tokens' worth (+2%) for capacity-matched policies; `bytes` is what
  /// the policy is matched on (cache_bytes, or loaded_bytes for quest) and M is scaled by the cache's
  /// memory_share (PyramidKV's layer budgets).
  void check_memory(size_t p, int64_t t, double bytes) const {
    const PolicyRun& run = runs_[p];
    if (run.memory_tokens <= 0) return;
    const bool capacity = run.inst[0]->capacity_matched();
    const double per_token = 2.0 * d_ * sizeof(float) * double(run.inst.size());
    const int64_t M = int64_t(std::llround(double(run.memory_tokens) * run.inst[0]->memory_share()));
    const double target = double(capacity ? M : std::min(M, t)) * per_token;
    if (capacity ? bytes > 1.02 * target : std::abs(bytes - target) > 0.02 * target)
      throw Error("policy '" + ex_.policies[p].label + "' cannot be matched on memory" +
                  (capacity ? std::string(" (capacity rule: never above the target)") : std::string(" at every step")) +
                  ": at step " + std::to_string(t) + " (layer " + std::to_string(cell_.layer) + ", KV head " +
                  std::to_string(cell_.kv_head) + ") it stores " + std::to_string(int64_t(bytes)) +
                  " bytes vs the target " + std::to_string(int64_t(target)) +
                  " (±2%); compare it with 'budget'-style parameters instead");
  }

  /// One row per query head at evaluated step t (block row r): the metric registry over its context.
  void record(size_t p, int64_t t, size_t r, double bytes, double loaded, std::vector<MetricRow>& out) {
    const PolicyRun& run = runs_[p];
    for (int g = 0; g < G_; ++g) {
      const Answer& a = answers_[g];
      if (a.z.size() != d_) throw Error("policy '" + ex_.policies[p].label + "' returned an answer of the wrong size");
      MetricContext c;
      c.t = t;
      c.n = n_;
      c.answer = &a;
      c.policy = run.inst[per_query_ ? g : 0].get();
      c.exact_out = ref_[g].out.row(r).data();
      c.head_dim = d_;
      c.probs = ref_[g].probs_row(r, prow_[g]);
      c.probs_norm = ref_[g].probs_norm[r];
      c.log_tau = ref_[g].log_tau[r];
      c.v_opnorm = opnorm_[r];
      c.cache_bytes = bytes;
      c.loaded_bytes = loaded;
      c.policy_ns = run.ns_since_eval / double(run.steps_since_eval);
      c.objectives = ex_.eval.objectives;
      c.objectives_due = t <= t_obj_ && (t % ex_.eval.objectives_every == 0 || t == n_);
      c.theorem44_alpha = ex_.eval.theorem44_alpha;
      c.theorem44_beta = ex_.eval.theorem44_beta;
      c.attn_all = &attn_all_[g];
      c.group_index = g;
      c.greedy_cache = &greedy_cache_;
      c.powerlaw_cache = &powerlaw_cache_;
      c.scratch = &scratch_;
      MetricRow m;
      m.layer = cell_.layer;
      m.head = cell_.heads[g];
      m.step = t;
      compute_metrics(c, m);
      out.push_back(m);
    }
  }

  const Experiment& ex_;
  const Cell& cell_;
  const int64_t n_;
  const int d_, G_;
  const double scale_;
  const bool per_query_;
  const int n_layers_;
  MatF Kf_, Vf_;
  MatD K_, V_;
  std::vector<MatF> Q_;
  std::vector<MatD> Qs_;
  std::vector<PolicyRun> runs_;
  int64_t t_obj_ = 0;
  std::vector<MatD> attn_all_;
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<double, double>> greedy_cache_;  // (g, t, m) -> greedy, opt
  std::map<std::pair<int, int64_t>, PowerLawFit> powerlaw_cache_;                        // (g, t) -> H2O Fig. 2 fit
  OperatorNormTracker opn_;
  int64_t opn_t_ = 0;
  std::vector<ReferenceBlock> ref_;
  std::vector<double> opnorm_;
  MatD zc_;                    // a closed-form block's answers [steps × G, d]
  std::vector<int64_t> kept_;  // a closed-form cache's tokens at one step
  std::vector<VecD> prow_ = std::vector<VecD>(size_t(G_));  // a float32 block's probability row, widened when read
  std::vector<double> scratch_;
  MatD qgroup_ = MatD(G_, d_), qone_ = MatD(1, d_);
  std::vector<Answer> answers_ = std::vector<Answer>(size_t(G_)), one_ = std::vector<Answer>(1);
  std::vector<const double*> probs_group_ = std::vector<const double*>(size_t(G_)), probs_one_ = std::vector<const double*>(1);
};

}  // namespace

void replay_cell(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n,
                 std::vector<std::vector<MetricRow>>& out) {
  CellReplay(ex, src, cell, n).run(out);
}

}  // namespace kvsim
