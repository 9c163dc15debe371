// `[eval] device = "cuda"`: a policy with a GPU replay (GpuReplayable: window, sink, h2o,
// uniform, buzz, oracle_topk, subgen_kcenter streaming, subgen) runs on the GPU for a whole cell at
// once (cuda::replay_policy, sim/cuda/policies.cu); this adapter hands the GPU's answers to the
// engine at the evaluated steps, so metrics, memory checks and results are computed exactly as for
// the CPU policies; how to read a replay (cache size, kept rows, clusters, τ̂) is its kind's row of
// cuda::kReplayKindTable, never a test of the kind here. policy_ns then holds the cell's replay time (host
// transfers included) at the first evaluated step and near zero after it.
#include <algorithm>

#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/policies/gpu_replay.hpp"

namespace kvsim {
namespace {

class GpuReplayPolicy final : public Policy {
 public:
  GpuReplayPolicy(std::unique_ptr<Policy> cpu, cuda::PolicyReplay spec, std::vector<const MatF*> Q, const MatF& K,
                  const MatF& V, double scale, std::vector<int64_t> steps, PolicyReplayFn replay)
      : cpu_(std::move(cpu)), spec_(std::move(spec)), Q_(std::move(Q)), K_(K), V_(V), scale_(scale),
        steps_(std::move(steps)), replay_fn_(replay ? std::move(replay) : PolicyReplayFn(cuda::replay_policy)) {
    cap_ = info_.capacity(spec_);
  }

  void observe(int64_t t, const float*, const float*) override {
    if (t == 0) replay();
    seen_ = t + 1;
  }

  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    while (row_ < steps_.size() && steps_[row_] < t) ++row_;
    if (row_ == steps_.size() || steps_[row_] != t) throw Error("gpu replay: step " + std::to_string(t) + " was not replayed");
    const int G = int(Q_.size()), d = int(K_.cols());
    if (q.rows() != G) throw Error("gpu replay: query group size changed");
    const size_t rows = steps_.size();
    const bool no_subset = info_.kept == cuda::KeptRow::cluster_count;
    std::vector<int64_t> kept;
    if (no_subset) {  // subgen: no token subset, the row holds the cluster count m
      const int64_t m = kept_[row_ * size_t(kept_cap_)];
      last_vectors_ = m * (1 + spec_.t) + 2 * spec_.s;  // SubGen::stored_vectors
      last_count_ = (last_vectors_ + 1) / 2;
      last_clusters_ = double(m);
    } else {
      for (int64_t s = 0; s < kept_cap_; ++s)
        if (const int64_t x = kept_[row_ * size_t(kept_cap_) + size_t(s)]; x >= 0) kept.push_back(x);
      last_count_ = int64_t(kept.size());
      last_vectors_ = 2 * last_count_;
      if (info_.clusters == cuda::Clusters::beyond_recent) last_clusters_ = double(last_count_ - std::min(t, spec_.recent));
    }
    for (int g = 0; g < G; ++g) {
      Answer& a = (*out)[g];
      a.z = Eigen::Map<const VecF>(z_.data() + (size_t(g) * rows + row_) * d, d).cast<double>();
      const double ls = log_sum_[size_t(g) * rows + row_];
      if (info_.tau == cuda::Tau::uniform) a.log_tau = hd::uniform_log_tau(ls, t, last_count_);  // as UniformPolicy
      if (info_.tau == cuda::Tau::log_sum) a.log_tau = ls;  // log τ̂ (SubGen Algorithm 1, line 30)
      if (no_subset) {
        a.has_kept = false;
        a.kept.clear();
      } else {
        a.has_kept = true;
        a.kept = kept;
      }
    }
  }

  /// Fixed-size caches: min(t, capacity) at every step; buzz, subgen_kcenter, subgen: the size at the
  /// last answered step (the engine reads it at evaluated steps, right after attend()).
  int64_t cache_tokens() const override { return info_.fixed_size ? std::min(seen_, cap_) : last_count_; }
  int64_t cache_vectors() const override { return info_.fixed_size ? 2 * cache_tokens() : last_vectors_; }
  bool capacity_matched() const override { return cpu_->capacity_matched(); }
  /// subgen_kcenter: its centers (the kept tokens beyond the window); subgen: its clusters; at the
  /// last answered step. NaN for the others (as their CPU policies).
  double clusters() const override {
    if (info_.clusters == cuda::Clusters::none) return cpu_->clusters();
    return last_clusters_;
  }

 private:
  void replay() {
    const int G = int(Q_.size());
    const int64_t n = K_.rows();
    const int d = int(K_.cols());
    std::vector<float> q(size_t(G) * n * d);
    for (int g = 0; g < G; ++g) std::copy(Q_[g]->data(), Q_[g]->data() + size_t(n) * d, q.begin() + size_t(g) * n * d);
    replay_fn_(spec_, q.data(), K_.data(), V_.data(), 1, G, n, d, scale_, steps_, z_, log_sum_, kept_, kept_cap_);
    if (z_.size() != size_t(G) * steps_.size() * d || kept_.size() != steps_.size() * size_t(kept_cap_) ||
        log_sum_.size() != size_t(G) * steps_.size())
      throw Error("gpu replay: the replay returned arrays of the wrong size");
  }

  std::unique_ptr<Policy> cpu_;  // the CPU instance it replaces: its properties, never stepped
  cuda::PolicyReplay spec_;
  const cuda::ReplayKindInfo& info_ = cuda::replay_kind_info(spec_.kind);  // after spec_: initialised from it
  std::vector<const MatF*> Q_;
  const MatF& K_;
  const MatF& V_;
  double scale_;
  std::vector<int64_t> steps_;
  PolicyReplayFn replay_fn_;
  std::vector<float> z_;
  std::vector<double> log_sum_;
  std::vector<int64_t> kept_;
  int64_t kept_cap_ = 0, cap_ = 0, seen_ = 0, last_count_ = 0, last_vectors_ = 0;
  double last_clusters_ = 0;
  size_t row_ = 0;
};

}  // namespace

bool answers_are_reference(const Policy& p) { return dynamic_cast<const ReferenceAnswered*>(&p) != nullptr; }

std::optional<cuda::PolicyReplay> gpu_replay(const Policy& p) {
  if (auto* g = dynamic_cast<const GpuReplayable*>(&p)) return g->gpu_replay();
  return std::nullopt;
}

std::unique_ptr<Policy> make_gpu_replay(std::unique_ptr<Policy> cpu, std::vector<const MatF*> Q, const MatF& K,
                                        const MatF& V, double scale, std::vector<int64_t> steps, PolicyReplayFn replay,
                                        int64_t step_block) {
  if (!cpu) throw Error("gpu replay: no policy");
  std::optional<cuda::PolicyReplay> spec = gpu_replay(*cpu);
  if (!spec) throw Error("gpu replay: this policy has no GPU replay");
  spec->step_block = step_block;
  for (const MatF* m : Q)
    if (!m || m->rows() != K.rows() || m->cols() != K.cols()) throw Error("gpu replay: query shape differs from the keys'");
  if (V.rows() != K.rows() || V.cols() != K.cols()) throw Error("gpu replay: value shape differs from the keys'");
  return std::make_unique<GpuReplayPolicy>(std::move(cpu), std::move(*spec), std::move(Q), K, V, scale, std::move(steps),
                                           std::move(replay));
}

}  // namespace kvsim
