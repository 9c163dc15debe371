// Internal: fixed-capacity storage of cached (position, key, value) triples, the building block of
// every subset-keeping policy. Keys and values are kept in double so that a policy's own arithmetic
// adds no rounding beyond the reference's (memory is still *counted* at float32, see cache_vectors).
#pragma once
#include <vector>

#include "kvsim/error.hpp"
#include "kvsim/policy.hpp"

namespace kvsim::policies {

class SlotCache {
 public:
  SlotCache(int64_t capacity, int d) : keys_(capacity, d), values_(capacity, d), pos_(capacity, -1) {}
  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(pos_.size()); }
  void append(int64_t t, const float* k, const float* v) {
    if (size_ >= capacity())
      throw Error("policy cache overflow: the stream is longer than the declared n (" + std::to_string(capacity()) + ")");
    put(size_++, t, k, v);
  }
  void put(int64_t slot, int64_t t, const float* k, const float* v) {
    const auto d = keys_.cols();
    keys_.row(slot) = Eigen::Map<const VecF>(k, d).cast<double>().transpose();
    values_.row(slot) = Eigen::Map<const VecF>(v, d).cast<double>().transpose();
    pos_[slot] = t;
  }
  int64_t position(int64_t slot) const { return pos_[slot]; }
  /// Softmax attention of q over the filled slots: z and log Σ exp(k·q).
  void attend(const Eigen::Ref<const VecD>& q, VecD& z, double& log_sum) const {
    attend_cached(keys_, values_, size_, q, z, log_sum);
  }
  /// Answer with the kept set filled in; returns log Σ exp(k·q) over the cache.
  double answer(const Eigen::Ref<const VecD>& q, Answer& a) const {
    double ls;
    attend(q, a.z, ls);
    a.has_kept = true;
    a.kept.assign(pos_.begin(), pos_.begin() + size_);
    return ls;
  }
  /// Answers for a query group [G, d] in one pass (attend_cached_group); P receives the [m, G]
  /// attention of each query over the slots (for score-keeping policies). `out` may be null.
  void answer_group(const MatD& q, std::vector<Answer>* out, MatD& P) {
    attend_cached_group(keys_, values_, size_, q, P, Z_, ls_);
    if (!out) return;
    for (Eigen::Index g = 0; g < q.rows(); ++g) {
      Answer& a = (*out)[g];
      a.z = Z_.row(g).transpose();
      a.has_kept = true;
      a.kept.assign(pos_.begin(), pos_.begin() + size_);
    }
  }
  const MatD& keys() const { return keys_; }
  const MatD& values() const { return values_; }

 private:
  MatD keys_, values_;
  std::vector<int64_t> pos_;
  int64_t size_ = 0;
  MatD Z_;   // scratch for answer_group
  VecD ls_;
};

}  // namespace kvsim::policies
