// The exact policy answered from the cell's reference (sim/replay/reference_answers.hpp).
#include "reference_answers.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "kvsim/core/error.hpp"

namespace kvsim::cell {
namespace {

class ReferenceAnswerPolicy final : public Policy {
 public:
  ReferenceAnswerPolicy(std::unique_ptr<Policy> cpu, const Reference& ref, std::vector<int> heads)
      : cpu_(std::move(cpu)), ref_(ref), heads_(std::move(heads)) {}

  void observe(int64_t t, const float*, const float*) override { seen_ = t + 1; }

  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    if (size_t(q.rows()) != heads_.size() || out->size() != heads_.size())
      throw Error("internal: reference answers: the query group differs from the heads it answers");
    for (size_t i = 0; i < heads_.size(); ++i) {
      const ReferenceBlock& b = ref_.block(heads_[i]);
      const auto it = std::lower_bound(b.steps.begin(), b.steps.end(), t);
      if (it == b.steps.end() || *it != t)
        throw Error("internal: reference answers: step " + std::to_string(t) + " is not in the reference's block");
      const Eigen::Index r = Eigen::Index(it - b.steps.begin());
      Answer& a = (*out)[i];
      a.z = b.out.row(r).transpose();
      a.log_tau = b.log_tau[r];
      a.has_kept = true;
      a.kept.resize(size_t(t));
      std::iota(a.kept.begin(), a.kept.end(), int64_t(0));
    }
  }

  int64_t cache_tokens() const override { return seen_; }
  bool capacity_matched() const override { return cpu_->capacity_matched(); }
  double clusters() const override { return cpu_->clusters(); }

 private:
  std::unique_ptr<Policy> cpu_;
  const Reference& ref_;
  std::vector<int> heads_;
  int64_t seen_ = 0;
};

}  // namespace

std::unique_ptr<Policy> reference_answers(std::unique_ptr<Policy> cpu, const Reference& ref, std::vector<int> heads) {
  if (!cpu) throw Error("internal: reference answers: no policy");
  if (heads.empty()) throw Error("internal: reference answers: no query heads");
  return std::make_unique<ReferenceAnswerPolicy>(std::move(cpu), ref, std::move(heads));
}

}  // namespace kvsim::cell
