// Internal: fixed-capacity storage of cached (position, key, value) triples, the building block of
// the subset-keeping policies (window, sink, h2o, uniform; exact and oracle_topk always in double;
// buzz keeps its own slot store with the same two precisions).
//
// Precision (`[eval] policy_precision`, StreamInfo::policy_f32):
//  - "float64" (default): keys and values are held in double and the products run in double, so a
//    policy's own arithmetic adds no rounding beyond the reference's (tests check 1e-12).
//  - "float32": keys and values are held as the recording gives them (float32, so storage is exact)
//    and the two matrix-vector products run in float32 (2.4× the double rate here: Eigen GEMV at
//    m = 896, d = 128 measured 13.6 vs 5.6 GFMA/s); the softmax (softmax_f32) takes exp in float on the
//    float logits and sums in double.
//    Added error: ~1e-7·Σ|k_i q_i| on each logit and ~1e-7 relative on z — measured ≤ 1e-5 relative
//    on the output (tests/unit/test_policies.cpp), far below the errors the policies themselves make.
// Memory is *counted* at float32 in both modes (cache_vectors).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvsim/core/error.hpp"
#include "kvsim/core/lane_sums.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::policies {

/// Blocked stepping's query rows (BlockStepper::step_block): row i·G + g of Q is query head g's scaled query at
/// step t_first + i, as M's scalar (the per-step float32 path casts each query to float before its product).
template <class M>
void block_queries(const std::vector<const MatD*>& q_scaled, int64_t t_first, int64_t b, Eigen::Index d, M& Q) {
  const auto G = Eigen::Index(q_scaled.size());
  Q.resize(b * G, d);
  for (int64_t i = 0; i < b; ++i)
    for (Eigen::Index g = 0; g < G; ++g) Q.row(i * G + g) = q_scaled[size_t(g)]->row(t_first - 1 + i).template cast<typename M::Scalar>();
}

/// The same rows at any increasing `steps` (1-based): row i·G + g is query head g's scaled query at steps[i] —
/// a block's evaluated steps, for a policy that answers only those (kivi).
template <class M>
void block_queries(const std::vector<const MatD*>& q_scaled, const std::vector<int64_t>& steps, Eigen::Index d, M& Q) {
  const auto G = Eigen::Index(q_scaled.size());
  Q.resize(Eigen::Index(steps.size()) * G, d);
  for (size_t i = 0; i < steps.size(); ++i)
    for (Eigen::Index g = 0; g < G; ++g)
      Q.row(Eigen::Index(i) * G + g) = q_scaled[size_t(g)]->row(steps[i] - 1).template cast<typename M::Scalar>();
}

/// The float32 mode's softmax over m float logits l (overwritten with exp(l − max l)): p[i] = exp(l_i − max) / Σ,
/// written as doubles, the exponentials in float (Eigen's vectorized expf: twice the lanes of double, and its
/// ~1 ulp float error is below the logits' own float32 rounding), the sum Σ in double in 8 lanes (lane_sum).
/// Returns log Σ_i exp(l_i). One function for the per-step path (attend_group_f32) and the blocked walk
/// (ScorerPolicy::step_block), so both compute the same probabilities from the same logits bit for bit.
inline double softmax_f32(float* l, int64_t m, double* p) {
  Eigen::Map<Eigen::ArrayXf> a(l, Eigen::Index(m));
  const float mx = a.maxCoeff();
  a = (a - mx).exp();
  const double sum = detail::lane_sum(l, m);
  for (int64_t i = 0; i < m; ++i) p[i] = double(l[i]) / sum;
  return double(mx) + std::log(sum);
}

class SlotCache {
 public:
  /// Slots are zero-filled.
  /// `lazy`: the store is allocated when the first token is put (before that, keys() and values() are
  /// empty), for caches the engine may answer in closed form (exact, window, sink): those never observe a
  /// token and then hold no store (64 MB for exact at n = 32768 in double).
  SlotCache(int64_t capacity, int d, bool f32 = false, bool lazy = false) : f32_(f32), d_(d), pos_(capacity, -1) {
    if (!lazy) allocate();
  }
  int64_t size() const { return size_; }
  /// Empties the cache, keeping its store (free slots keep finite stale data): for a policy that refills it.
  void clear() {
    std::fill(pos_.begin(), pos_.begin() + size_, int64_t(-1));
    size_ = 0;
  }
  int64_t capacity() const { return static_cast<int64_t>(pos_.size()); }
  bool f32() const { return f32_; }
  void append(int64_t t, const float* k, const float* v) {
    if (size_ >= capacity())
      throw Error("policy cache overflow: the stream is longer than the declared n (" + std::to_string(capacity()) + ")");
    put(size_++, t, k, v);
  }
  void put(int64_t slot, int64_t t, const float* k, const float* v) {
    const Eigen::Index d = d_;
    if (!allocated_) allocate();
    if (f32_) {
      keys_f_.row(slot) = Eigen::Map<const VecF>(k, d).transpose();
      values_f_.row(slot) = Eigen::Map<const VecF>(v, d).transpose();
    } else {
      keys_.row(slot) = Eigen::Map<const VecF>(k, d).cast<double>().transpose();
      values_.row(slot) = Eigen::Map<const VecF>(v, d).cast<double>().transpose();
    }
    pos_[slot] = t;
  }
  int64_t position(int64_t slot) const { return pos_[slot]; }
  /// The token position in each slot, [capacity] (−1: an empty slot).
  const int64_t* positions() const { return pos_.data(); }
  /// Softmax attention of q over the filled slots: z and log Σ exp(k·q).
  void attend(const Eigen::Ref<const VecD>& q, VecD& z, double& log_sum) {
    if (!f32_) {
      attend_cached(keys_, values_, size_, q, z, log_sum);
      return;
    }
    MatD qm = q.transpose();
    attend_group_f32(qm);
    z = Z_.row(0).transpose();
    log_sum = ls_[0];
  }
  /// Answer with the kept set filled in; returns log Σ exp(k·q) over the cache.
  double answer(const Eigen::Ref<const VecD>& q, Answer& a) {
    double ls;
    attend(q, a.z, ls);
    a.has_kept = true;
    a.kept.assign(pos_.begin(), pos_.begin() + size_);
    return ls;
  }
  /// Answers for a query group [G, d]. Returns the [m, G] attention of each query over the slots (for
  /// score-keeping policies; valid until the next call). `out` may be null.
  const ProbsD& answer_group(const MatD& q, std::vector<Answer>* out) {
    // Without `out` (a prompt streamed at prefill) only P is read: the Vᵀp products are skipped.
    if (f32_) attend_group_f32(q, out != nullptr);
    else attend_cached_group(keys_, values_, size_, q, P_, Z_, ls_, out != nullptr);
    if (!out) return P_;
    for (Eigen::Index g = 0; g < q.rows(); ++g) {
      Answer& a = (*out)[g];
      a.z = Z_.row(g).transpose();
      a.has_kept = true;
      a.kept.assign(pos_.begin(), pos_.begin() + size_);
    }
    return P_;
  }
  /// Over the store's first m slots (buzz keeps its tokens in a prefix of the store): logits K q (in the
  /// store's precision, rounded up to double) and Vᵀ w (w: [m]).
  void logits_head(const Eigen::Ref<const VecD>& q, int64_t m, VecD& logits) const {
    if (f32_) logits = (keys_f_.topRows(m) * q.cast<float>()).cast<double>();
    else logits.noalias() = keys_.topRows(m) * q;
  }
  /// The same in float (float32 mode only): the float products logits_head rounds up to double.
  void logits_head(const Eigen::Ref<const VecD>& q, int64_t m, VecF& logits) const {
    logits.noalias() = keys_f_.topRows(m) * q.cast<float>();
  }
  void weighted_values_head(const VecD& w, VecD& z) const {
    const Eigen::Index m = w.size();
    if (f32_) z = (values_f_.topRows(m).transpose() * w.cast<float>()).cast<double>();
    else z.noalias() = values_.topRows(m).transpose() * w;
  }
  /// Moves slot `from`'s key, value and position to slot `to` (`from` becomes empty).
  void move(int64_t from, int64_t to) {
    if (f32_) {
      keys_f_.row(to) = keys_f_.row(from);
      values_f_.row(to) = values_f_.row(from);
    } else {
      keys_.row(to) = keys_.row(from);
      values_.row(to) = values_.row(from);
    }
    pos_[to] = pos_[from];
    pos_[from] = -1;
  }
  /// Double-precision storage (float64 mode only).
  const MatD& keys() const { return keys_; }
  const MatD& values() const { return values_; }
  /// Float32 storage (float32 mode only).
  const MatF& keys_f() const { return keys_f_; }
  const MatF& values_f() const { return values_f_; }

 private:
  /// float32 products and softmax_f32: fills P_ [m, G], Z_ [G, d] (zeros unless with_values), ls_ [G].
  void attend_group_f32(const MatD& q, bool with_values = true) {
    const Eigen::Index G = q.rows(), d = d_, m = size_;
    Z_.setZero(G, d);
    ls_.setConstant(G, -INFINITY);
    P_.resize(m, G);
    if (m == 0) return;
    VecF& lf = lf_;
    VecF& pf = pf_;
    VecF& qf = qf_;
    lf.resize(m);
    pf.resize(m);
    qf.resize(d);
    for (Eigen::Index g = 0; g < G; ++g) {
      qf = q.row(g).transpose().cast<float>();
      lf.noalias() = keys_f_.topRows(m) * qf;
      ls_[g] = softmax_f32(lf.data(), m, P_.col(g).data());  // P_ is column-major: column g is contiguous
      if (!with_values) continue;
      pf = P_.col(g).cast<float>();
      Z_.row(g) = (values_f_.topRows(m).transpose() * pf).cast<double>().transpose();
    }
  }

  void allocate() {
    if (f32_) {
      keys_f_.setZero(capacity(), d_);
      values_f_.setZero(capacity(), d_);
    } else {
      keys_.setZero(capacity(), d_);
      values_.setZero(capacity(), d_);
    }
    allocated_ = true;
  }

  bool f32_;
  int d_;
  bool allocated_ = false;

  MatD keys_, values_;
  MatF keys_f_, values_f_;
  std::vector<int64_t> pos_;
  int64_t size_ = 0;
  ProbsD P_;    // scratch: the group's probabilities [m, G]
  MatD Z_;      // scratch
  VecF lf_, pf_, qf_;  // float32 scratch (no allocation per step)
  VecD ls_;
};

/// Blocked stepping (BlockStepper, include/kvsim/policies/policy.hpp) for a policy that reads only the evaluated
/// queries and answers them with exact softmax attention over a SlotCache holding the stream's own keys and values
/// (SlotCache::answer_group or answer: keydiff, lagkv, uniform, snapkv, pyramidkv, expected_attention, press_replay).
/// The block's tokens join one by one (observe_block), each evaluated step's slots are noted, and then one
/// product of every evaluated query row against the keys those steps held forms the logits: the store's slots as
/// they stand at the block's end, read where they sit, plus the few tokens evicted before it (copied from the
/// stream, whose rows the store holds). Each row takes the softmax over its own step's slots only (softmax_f32 in
/// float32 mode, as answer_group), and one more product forms the answers. A token several steps hold is read
/// once for all of them (the steps are answered in groups whose union stays within 1.1× their largest set).
/// Equal to attend() at each evaluated step up to the products' summation order.
class SlotAnswersStepper : public BlockStepper {
 public:
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) override;
  bool blocks_evaluated_steps() const override { return true; }

 protected:
  /// The policy, and the store its attend() answers from (slot order is the Answer's kept order).
  virtual Policy& stepper_policy() = 0;
  virtual const SlotCache& answering_store() const = 0;
  /// Answer::log_tau from log Σ_{slots} exp(k·q̃) at step t with m slots (uniform's estimate); NaN by default.
  virtual double answer_log_tau(double /*log_sum*/, int64_t /*t*/, int64_t /*m*/) const {
    return std::numeric_limits<double>::quiet_NaN();
  }

 private:
  /// The block's working arrays, one set per thread (sim/policies/slot_block.cpp): shared by every instance a
  /// thread steps, since a cell's policies step one after another (20 MB an instance at a 6k-token cache).
  struct Scratch;
  /// Steps [i0, i1) of out->steps, answered by the two products over the store and the group's evicted tokens.
  void answer_steps(Scratch& w, size_t i0, size_t i1, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                    BlockAnswers* out) const;
};

}  // namespace kvsim::policies
