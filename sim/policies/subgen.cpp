// `subgen`: SubGen Algorithm 1 (seeds/000, §2) as a cache policy. See include/kvsim/analysis/subgen.hpp.
#include <cmath>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/analysis/subgen.hpp"

namespace kvsim::policies {
namespace {

class SubGenPolicy final : public Policy {
 public:
  SubGenPolicy(const SubGenConfig& c, const StreamInfo& s) : seed_(s.seed), sg_(c, s.head_dim, s.seed) {}
  void observe(int64_t t, const float* k, const float* v) override { sg_.update(t, k, v); }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      a.log_tau = sg_.query(q.row(i).transpose(), a.z);
    }
  }
  /// SubGen keeps no subset of tokens; its memory in KV-pair equivalents is stored vectors / 2.
  int64_t cache_tokens() const override { return (sg_.stored_vectors() + 1) / 2; }
  int64_t cache_vectors() const override { return sg_.stored_vectors(); }
  double clusters() const override { return double(sg_.clusters()); }
  bool capacity_matched() const override { return true; }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    const SubGenConfig& c = sg_.config();
    if (c.sample_by_key) return std::nullopt;  // Lemma 1's negative control stays on the CPU
    cuda::PolicyReplay r;
    r.name = "subgen";
    r.delta = c.delta;
    r.s = c.s;
    r.t = c.t;
    r.max_clusters = c.max_clusters;
    r.seeds = {seed_};
    return r;
  }

 private:
  uint64_t seed_;
  SubGen sg_;
};

}  // namespace

std::unique_ptr<Policy> make_subgen(const Params& p, const StreamInfo& s) {
  SubGenConfig c;
  c.sample_by_key = p.get_bool("sample_by_key", false);
  c.max_clusters = p.get_int("max_clusters", 0);
  if (c.max_clusters < 0) throw Error("parameter 'max_clusters' must be ≥ 0 (0 = no cap, Algorithm 1 as published)" + p.where("max_clusters"));
  // With a cluster cap δ adapts (doubling), so it may start at 0: every distinct key opens a cluster
  // until the cap, then δ starts from half the closest pair of representatives.
  c.delta = p.get_double("delta", c.max_clusters > 0 ? 0.0 : -1.0);
  if (c.max_clusters > 0 ? !(c.delta >= 0) : !(c.delta > 0))
    throw Error(std::string("parameter 'delta' (cluster radius in key units) ") +
                (c.max_clusters > 0 ? "must be ≥ 0" : "is required and must be > 0") + p.where("delta"));
  if (p.has("eps")) {
    // Theorem 1 mode: s and t from ε, δ, r and n with kvsim's constants (overridable).
    double eps = p.get_double("eps", 0);
    double r = p.get_double("r", -1);
    if (!(r >= 0)) throw Error("parameter 'r' (bound on the scaled query norm) is required with 'eps'" + p.where("eps"));
    double c_s = p.get_double("c_s", kSubGenCs), c_t = p.get_double("c_t", kSubGenCt);
    if (p.has("s") || p.has("t")) throw Error("give either 'eps' (Theorem 1 mode) or 's' and 't', not both" + p.where("eps"));
    c.s = theorem1_s(eps, s.head_dim, c_s);
    c.t = theorem1_t(eps, c.delta, r, s.n, c_t);
  } else {
    c.s = p.get_int("s", -1);
    c.t = p.get_int("t", -1);
    if (c.s < 1) throw Error("parameter 's' (matrix-product samples) is required and must be ≥ 1" + p.where("s"));
    if (c.t < 1) throw Error("parameter 't' (samples per cluster) is required and must be ≥ 1" + p.where("t"));
  }
  return std::make_unique<SubGenPolicy>(c, s);
}

}  // namespace kvsim::policies
