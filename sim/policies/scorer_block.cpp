// Blocked stepping for the ScorerPolicy family that reads every query (h2o, tova, scissorhands; knorm and h2o's
// oracle form read only the evaluated queries and block those, SlotAnswersStepper): the BlockStepper contract of
// include/kvsim/policies/policy.hpp.
// A block of b consecutive steps forms every logit it needs with two GEMMs — the block's b·G query rows against
// the keys in the slots at the block's start, and against the block's own b keys — and then walks the b steps
// in order: each step's eviction (observe_slot, the per-step rule itself), the softmax over the entries present at that step (a slot taken over by block token
// i reads token i's column from then on: an evicted token is masked for the later rows), and the score update
// (update_scores, the subclass's rule) in O(cache) per step instead of O(cache · d). The answer at each evaluated
// step of the block is Vᵀp over the slots as they stand at that step, as the per-step path computes it.
#include <string>
#include <type_traits>

#include "scorer.hpp"

namespace kvsim::policies {

void ScorerPolicy::step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V,
                              const std::vector<const MatD*>& q_scaled, BlockAnswers* out) {
  if (!needs_every_query()) {  // scores fixed when a token joins: only the evaluated steps attend
    SlotAnswersStepper::step_block(t_first, t_last, K, V, q_scaled, out);
    return;
  }
  check_step_block(t_first, t_last, K, q_scaled, out, name_);
  const int64_t b = t_last - t_first + 1, m0 = cache_.size();
  const auto G = Eigen::Index(q_scaled.size()), d = K.cols();
  // The answers at step t: Vᵀp per query head over the slots as they now stand (the per-step path's products).
  auto answer_now = [&](int64_t t) {
    const int64_t k = out ? out->index_of(t) : -1;
    if (k < 0) return;
    const int64_t m = cache_.size();
    for (Eigen::Index g = 0; g < G; ++g) {
      Answer& a = out->answers[size_t(k)][size_t(g)];
      if (cache_.f32()) a.z = (cache_.values_f().topRows(m).transpose() * block_P_.col(g).cast<float>()).cast<double>();
      else a.z.noalias() = cache_.values().topRows(m).transpose() * block_P_.col(g);
      a.has_kept = true;
      a.kept.resize(size_t(m));
      for (int64_t s = 0; s < m; ++s) a.kept[size_t(s)] = cache_.position(s);
    }
    out->record_state(size_t(k), *this, int(d));
  };
  // The logits: Ls [b·G, budget] over the slots (the block's start fills columns [0, m0)), Lb [b·G, b] over the
  // block's own keys. When block token i takes slot s, row i'·G + g (i' ≥ i) reads Lb's column i for slot s instead
  // of Ls's column s: the evicted token is gone for the later rows (masked). block_tok_[s] is that block token (−1:
  // the slot still holds what it held at the block's start); block_slots_ lists the slots taken, each once. A row
  // is then one contiguous copy of Ls's row patched at ≤ b slots from Lb's row (O(cache + b) per step; copying Lb's
  // column into Ls instead would touch b·G strided rows per step).
  auto walk = [&](auto& Ls, auto& Lb, const auto& Q, const auto& slot_keys, const auto& block_keys) {
    Ls.resize(b * G, budget_);
    Ls.leftCols(m0).noalias() = Q * slot_keys.topRows(m0).transpose();
    Lb.noalias() = Q * block_keys.transpose();
    block_tok_.assign(size_t(budget_), -1);
    block_slots_.clear();
    VecD& col = block_col_;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t t = t_first + i;
      const int64_t before = cache_.size();
      const int64_t slot = observe_slot(t - 1, K.row(t - 1).data(), V.row(t - 1).data());
      if (slot >= 0 && (!g_blocked_masking_off || slot >= before)) {
        if (block_tok_[size_t(slot)] < 0) block_slots_.push_back(slot);
        block_tok_[size_t(slot)] = i;
      }
      const int64_t m = cache_.size();
      block_P_.resize(m, G);
      for (Eigen::Index g = 0; g < G; ++g) {
        // The per-step softmax, operation for operation (policy.cpp attend_cached_group; SlotCache's float32
        // path, softmax_f32, which writes block_P_'s contiguous column directly).
        const Eigen::Index row = i * G + g;
        if constexpr (std::is_same_v<typename std::decay_t<decltype(Ls)>::Scalar, float>) {
          VecF& lf = block_colf_;
          lf = Ls.row(row).head(m).transpose();
          for (const int64_t s : block_slots_) lf[s] = Lb(row, block_tok_[size_t(s)]);
          softmax_f32(lf.data(), m, block_P_.col(g).data());
        } else {
          col = Ls.row(row).head(m).transpose();
          for (const int64_t s : block_slots_) col[s] = Lb(row, block_tok_[size_t(s)]);
          const double mx = col.maxCoeff();
          col = (col.array() - mx).exp().matrix();
          const double sum = col.sum();
          col /= sum;
          block_P_.col(g) = col;
        }
      }
      update_scores(t, block_P_, score_);
      answer_now(t);
    }
  };
  if (cache_.f32()) {
    block_queries(q_scaled, t_first, b, d, block_qf_);
    walk(block_lf_[0], block_lf_[1], block_qf_, cache_.keys_f(), K.middleRows(t_first - 1, b));
  } else {
    block_queries(q_scaled, t_first, b, d, block_qd_);
    block_kd_ = K.middleRows(t_first - 1, b).cast<double>();
    walk(block_ld_[0], block_ld_[1], block_qd_, cache_.keys(), block_kd_);
  }
}

}  // namespace kvsim::policies
