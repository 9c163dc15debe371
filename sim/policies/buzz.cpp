// `buzz`: BUZZ (Zhao et al., 2024) §3.3 Algorithms 1-2 — sink + beehive body + sliding window; see
// include/kvsim/analysis/buzz_theorem.hpp (sim/analysis/buzz_theorem.cpp) for the body recurrence. `log_scale = true` multiplies the logits by
// log_512(t) (BUZZ §3.5, Eq. 7-8; t = tokens so far), measured against the unscaled exact reference.
#include "kvsim/policies/gpu_replay.hpp"
#include "kvsim/analysis/buzz_theorem.hpp"

#include <cmath>
#include <deque>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// A cached token: its position, its slot in the contiguous key/value store, and its accumulated
/// (group-aggregated) attention score.
struct Tok {
  int64_t pos;
  int64_t slot;
  double score = 0;
};

class BuzzPolicy final : public Policy, public GpuReplayable, public BlockStepper {
 public:
  BuzzPolicy(int64_t sink, int64_t window, int64_t T, int64_t stride, bool log_scale, const StreamInfo& s)
      : sink_(sink), w_(window), T_(T), s_(stride), log_scale_(log_scale), agg_(s.group_agg), d_(s.head_dim),
        store_(sink + window + T + 1, s.head_dim, s.policy_f32), agg_acc_(s.group_agg, 0) {
    // Capacity: sink + window + body (old + new < T between evictions), plus one slot of slack.
    owner_.assign(store_.capacity(), -1);
  }

  bool needs_every_query() const override { return true; }
  bool capacity_matched() const override { return true; }

  void observe(int64_t t, const float* k, const float* v) override {
    Tok x{t, store(t, k, v), 0};
    if (int64_t(sink_tokens_.size()) < sink_) {
      sink_tokens_.push_back(x);
      return;
    }
    window_.push_back(x);
    if (int64_t(window_.size()) > w_) {
      new_.push_back(window_.front());
      window_.pop_front();
      if (int64_t(old_.size() + new_.size()) >= T_) evict();
    }
  }

  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    // One matrix-vector product per query over the occupied slots, which are always the store's prefix
    // [0, top_) (compact()): contiguous memory, and no free slot to mask.
    attend_with(t, q.rows(), [&](Eigen::Index i, auto& logits) { store_.logits_head(q.row(i).transpose(), top_, logits); }, out);
  }

  /// Blocked stepping (BlockStepper, include/kvsim/policies/policy.hpp): the block's logits over the store's
  /// occupied prefix at its start and over its own keys by two GEMMs; a slot a block token is stored in (always
  /// past that prefix) reads that token's column, answering at each of out->steps. An eviction round renumbers
  /// the slots (compact()), so the rows of the block's remaining steps then take their logits over the store
  /// anew by one more product (once per round: every few hundred tokens at these budgets).
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) override {
    check_step_block(t_first, t_last, K, q_scaled, out, "buzz");
    const int64_t b = t_last - t_first + 1;
    const auto G = Eigen::Index(q_scaled.size()), d = K.cols();
    auto walk = [&](auto& Ls, auto& Lb, auto& Q, const auto& slot_keys, const auto& block_keys) {
      block_queries(q_scaled, t_first, b, d, Q);
      Ls.resize(b * G, store_.capacity());
      if (g_blocked_masking_off) Ls.setZero();  // the test hook reads columns no product formed
      // Rows of steps i0.. against the slots as they now stand; block_tok_[s]: the block token in slot s (−1:
      // slot s's column of Ls), block_slots_: the slots block tokens took since.
      auto slot_logits = [&](int64_t i0) {
        const Eigen::Index r0 = i0 * G, rows = (b - i0) * G;
        Ls.middleRows(r0, rows).leftCols(top_).noalias() = Q.middleRows(r0, rows) * slot_keys.topRows(top_).transpose();
        block_tok_.assign(owner_.size(), -1);
        block_slots_.clear();
      };
      slot_logits(0);
      Lb.noalias() = Q * block_keys.transpose();
      for (int64_t i = 0; i < b; ++i) {
        const int64_t t = t_first + i, rounds = compactions_;
        observe(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
        if (compactions_ != rounds) {
          // The slots were renumbered; the token just stored is among them. The test hook keeps the stale
          // columns (each slot reads whatever token held it at the block's start).
          if (!g_blocked_masking_off) {
            slot_logits(i);
          } else {
            block_tok_.assign(owner_.size(), -1);
            block_slots_.clear();
          }
        } else {
          if (block_tok_[size_t(last_slot_)] < 0) block_slots_.push_back(last_slot_);
          block_tok_[size_t(last_slot_)] = i;
        }
        const int64_t k = out ? out->index_of(t) : -1;
        // The logits in the store's precision (attend_with takes a VecF in float32 mode, a VecD in float64).
        auto logits_of = [&](Eigen::Index g, auto& logits) {
          using S = typename std::decay_t<decltype(logits)>::Scalar;
          const Eigen::Index row = i * G + g;
          logits = Ls.row(row).head(top_).transpose().template cast<S>();
          for (const int64_t s : block_slots_) logits[s] = S(Lb(row, block_tok_[size_t(s)]));
        };
        attend_with(t, G, logits_of, k >= 0 ? &out->answers[size_t(k)] : nullptr);
        if (k >= 0) out->record_state(size_t(k), *this, int(d));
      }
    };
    if (store_.f32()) {
      walk(block_lf_[0], block_lf_[1], block_qf_, store_.keys_f(), K.middleRows(t_first - 1, b));
    } else {
      block_kd_ = K.middleRows(t_first - 1, b).cast<double>();
      walk(block_ld_[0], block_ld_[1], block_qd_, store_.keys(), block_kd_);
    }
  }

 private:
  /// attend()'s body with the logits of query row i over the occupied slots [0, top_) from `logits_of`
  /// (called with a VecF in float32 mode, a VecD in float64 mode).
  template <class LogitsOf>
  void attend_with(int64_t t, Eigen::Index rows, LogitsOf&& logits_of, std::vector<Answer>* out) {
    const int64_t m = top_;
    const double lambda = hd::buzz_log_scale(t, log_scale_);
    const bool scaled = out && lambda != 1.0;
    agg_acc_.reset(m);
    VecD& x = shifted_;
    VecD& p = p_;
    VecD& ps = ps_;
    p.resize(m);
    for (Eigen::Index i = 0; i < rows; ++i) {
      // Scores accumulate the model's (unscaled) attention; the answer uses the scaled logits.
      if (store_.f32()) {
        // float32 mode: softmax_f32 (the exponentials in float, the sum in double), as the scorers have it.
        logits_of(i, lf_);
        if (scaled) {  // the shifted logits in double, as float64 mode has them (softmax_f32 overwrites lf_)
          const double mx = double(lf_.head(m).maxCoeff());
          x = lf_.head(m).cast<double>().array() - mx;
        }
        softmax_f32(lf_.data(), m, p.data());
      } else {
        logits_of(i, logits_);
        x = logits_.head(m).array() - logits_.head(m).maxCoeff();
        p = x.array().exp();
        p /= p.sum();
      }
      agg_acc_.add(p);
      if (out) {
        if (scaled) {
          ps = (lambda * x.array()).exp();
          ps /= ps.sum();
        }
        Answer& a = (*out)[i];
        store_.weighted_values_head(scaled ? ps : p, a.z);
        a.has_kept = true;
        a.kept.clear();
        for (auto* part : {&sink_tokens_, &old_, &new_})
          for (const Tok& x : *part) a.kept.push_back(x.pos);
        for (const Tok& x : window_) a.kept.push_back(x.pos);
      }
    }
    agg_acc_.result_into(step_);
    for (auto* part : {&sink_tokens_, &old_, &new_})
      for (Tok& x : *part) x.score += step_[x.slot];
    for (Tok& x : window_) x.score += step_[x.slot];
  }

 public:
  int64_t cache_tokens() const override { return int64_t(sink_tokens_.size() + old_.size() + new_.size() + window_.size()); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.kind = cuda::ReplayKind::buzz;
    r.sink = sink_;
    r.window = w_;
    r.threshold = T_;
    r.stride = s_;
    r.log_scale = log_scale_;
    r.group_agg = static_cast<int>(agg_);
    return r;
  }

 private:
  /// The next free slot: the occupied slots are always the prefix [0, top_) (compact()).
  int64_t store(int64_t t, const float* k, const float* v) {
    if (top_ >= store_.capacity()) throw Error("buzz: slot store overflow (internal capacity " + std::to_string(owner_.size()) + ")");
    const int64_t slot = top_++;
    last_slot_ = slot;
    store_.put(slot, t, k, v);
    owner_[slot] = t;
    return slot;
  }

  /// The eviction rule is hd::buzz_evict, shared with the GPU replay (sim/cuda/policies.cu).
  void evict() {
    std::vector<Tok> kept(old_.size() + new_.size());
    std::copy(old_.begin(), old_.end(), kept.begin());
    const int64_t k = hd::buzz_evict(kept.data(), int64_t(old_.size()), new_.data(), int64_t(new_.size()), s_,
                                     [this](const Tok& x) { owner_[x.slot] = -1; });
    kept.resize(size_t(k));
    old_ = std::move(kept);
    new_.clear();
    history_.push_back(int64_t(old_.size()));
    compact();
  }

  /// Moves the tokens an eviction round kept down to the lowest slots, in slot order, so the occupied slots are
  /// again the prefix [0, top_): the products and the softmax then run over the cache and not its capacity
  /// (which is about 1.5× the mean cache). O(cache · d) once per round; no token leaves between rounds.
  void compact() {
    remap_.assign(owner_.size(), -1);
    int64_t to = 0;
    for (int64_t from = 0; from < top_; ++from) {
      if (owner_[size_t(from)] < 0) continue;
      if (from != to) {
        store_.move(from, to);
        owner_[size_t(to)] = owner_[size_t(from)];
        owner_[size_t(from)] = -1;
      }
      remap_[size_t(from)] = to++;
    }
    top_ = to;
    for (auto* part : {&sink_tokens_, &old_, &new_})
      for (Tok& x : *part) x.slot = remap_[size_t(x.slot)];
    for (Tok& x : window_) x.slot = remap_[size_t(x.slot)];
    ++compactions_;
  }

  int64_t sink_, w_, T_, s_;
  bool log_scale_;
  GroupAgg agg_;
  int d_;
  SlotCache store_;             // contiguous keys/values (float64 or float32), indexed by slot
  VecD logits_, shifted_, p_, ps_, step_;  // attend() scratch (no allocation per step)
  GroupAggregate agg_acc_;      // the step's group aggregate (reset per step, no allocation)
  VecF lf_;                     // float32 mode's logits (softmax_f32 turns them into exponentials)
  MatD block_qd_, block_kd_, block_ld_[2];  // step_block() scratch
  MatF block_qf_, block_lf_[2];
  std::vector<int64_t> block_tok_, block_slots_;  // the block token in each slot (−1: none), the slots taken
  int64_t last_slot_ = -1;      // the slot store() filled last
  int64_t top_ = 0;             // slots [0, top_) are occupied (between eviction rounds, all of them)
  int64_t compactions_ = 0;     // eviction rounds so far (each renumbers the slots)
  std::vector<int64_t> owner_;  // token position in each slot, −1 = free
  std::vector<int64_t> remap_;  // compact()'s scratch: each slot's new slot
  std::vector<Tok> sink_tokens_, old_, new_;
  std::deque<Tok> window_;
  std::vector<int64_t> history_;

 public:
  static const std::vector<int64_t>& history_of(const Policy& p) { return static_cast<const BuzzPolicy&>(p).history_; }
};

const std::vector<ParamInfo>& buzz_params();

// sink and stride are integers up to 2^31 (declared ranges): larger ones would overflow Theorem 3.1's
// s² and the capacity sums; they are token counts, so 2^31 is far beyond any stream.
std::unique_ptr<Policy> make_buzz(ParamReader& p, const StreamInfo& s) {
  const int64_t sink = p.get_int("sink");
  const int64_t window = p.get_budget("window", s.n);
  const int64_t T = p.get_budget("threshold", s.n);
  const int64_t stride = p.get_int("stride");
  if (window < 1) throw Error("parameter 'window' must be ≥ 1" + p.where("window"));
  if (T < stride) throw Error("parameter 'threshold' must be ≥ stride" + p.where("threshold"));
  return std::make_unique<BuzzPolicy>(sink, window, T, stride, p.get_bool("log_scale"), s);
}

/// Capacity sink + window + T = M, with T/w at Theorem 3.1's value for the stride.
void buzz_memory(int64_t M, const Params& given, Params& out, const std::string& where) {
  ParamReader probe(given, &buzz_params());  // typed reads with the usual errors and the declared defaults
  const int64_t sink = probe.get_int("sink");
  const int64_t s = probe.get_int("stride");
  const double r = buzz_predicted_T_over_w(s);
  int64_t w = std::max<int64_t>(1, std::llround(double(M - sink) / (1 + r)));
  const int64_t T = std::max<int64_t>(s, M - sink - w);
  w = std::min(w, M - sink - T);  // the threshold is at least one stride; the window gives way
  if (w < 1)
    throw Error("'memory' = " + std::to_string(M) + " tokens is too small for buzz: sink (" + std::to_string(sink) +
                ") + window (≥ 1) + threshold (≥ stride " + std::to_string(s) + ") needs at least " +
                std::to_string(sink + 1 + s) + given.where("memory"));
  out.set("window", w, where);
  out.set("threshold", T, where);
}

}  // namespace

const std::vector<int64_t>& buzz_body_history(const Policy& p) { return BuzzPolicy::history_of(p); }

namespace {
const std::vector<ParamInfo>& buzz_params() {
  static const std::vector<ParamInfo> v{
      {"sink", "int", "4", "attention-sink tokens kept from the start", "[0, 2^31]"},
      {"window", "tokens", "required", "sliding window w of the most recent tokens"},
      {"threshold", "tokens", "required", "body size T that triggers an eviction round (≥ stride)"},
      {"stride", "int", "5", "segment length s of local max sampling", "[2, 2^31]"},
      {"log_scale", "bool", "false", "scale logits by log₅₁₂ t (BUZZ §3.5)"}};
  return v;
}
}  // namespace

KVSIM_POLICY(buzz) {
  static const PolicyInfo info{
      "buzz",
      "`sink` + beehive body + `window`: tokens leaving the window join the body as \"new\"; when the body reaches "
      "`threshold` T, new tokens keep the accumulated-score argmax of each segment of `stride` s, old tokens every "
      "ŝ = ⌊(s+1)/2⌋-th; `log_scale = true` multiplies logits by log₅₁₂ t",
      "BUZZ §3.3 Alg. 1–2, §3.5 Eq. 7–8, Thm. 3.1",
      buzz_params(),
      make_buzz,
      MemoryRule{"capacity: sink + window + threshold = M with T/w from Theorem 3.1 (Eq. 6) for the stride",
                 {"window", "threshold"},
                 buzz_memory},
      "yes",
      {example_params({{"window", 0.1}, {"threshold", 0.15}})},
      "#8c564b",  // figure colour
      {example_params({{"window", 0.05}, {"threshold", 0.2}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
