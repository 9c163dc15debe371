// `subgen`: SubGen Algorithm 1 (SubGen, Zandieh et al. 2024, §2) as a cache policy. See include/kvsim/analysis/subgen_algorithm.hpp.
#include <cmath>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"

namespace kvsim::policies {
namespace {

class SubGenPolicy final : public Policy, public GpuReplayable, public BlockStepper {
 public:
  SubGenPolicy(const SubGenConfig& c, const StreamInfo& s) : seed_(s.seed), sg_(c, s.head_dim, s.seed) {}
  void observe(int64_t t, const float* k, const float* v) override { sg_.update(t, k, v); }
  /// Line 7 for the group's query rows together (SubGen::query_rows: one pass over the samples for all of them).
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    sg_.query_rows(q, Z_, log_tau_);
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      a.z = Z_.row(i).transpose();
      a.log_tau = log_tau_[size_t(i)];
    }
  }
  /// Blocked stepping (BlockStepper, include/kvsim/policies/policy.hpp): SubGen reads only the evaluated queries, but
  /// line 12 compares every key with every representative. The block's keys take those dot products in one
  /// product (SubGen::begin_block); the tokens then join one by one and each evaluated step is answered as attend().
  bool blocks_evaluated_steps() const override { return true; }
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) override {
    check_step_block(t_first, t_last, K, q_scaled, out, "subgen");
    sg_.begin_block(K, t_first - 1, t_last - t_first + 1);
    size_t k = 0;
    observe_block(*this, t_first, t_last, K, V, out, [&] {
      const int64_t t = out->steps[k];
      Q_.resize(Eigen::Index(q_scaled.size()), K.cols());
      for (size_t g = 0; g < q_scaled.size(); ++g) Q_.row(Eigen::Index(g)) = q_scaled[g]->row(t - 1);
      attend(t, Q_, &out->answers[k], nullptr);
      ++k;
    });
    sg_.end_block();
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
    r.kind = cuda::ReplayKind::subgen;
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
  MatD Q_, Z_;  // attend() / step_block() scratch
  std::vector<double> log_tau_;
};

std::unique_ptr<Policy> make_subgen(ParamReader& p, const StreamInfo& s) {
  SubGenConfig c;
  c.sample_by_key = p.get_bool("sample_by_key");
  c.max_clusters = p.get_int("max_clusters");  // ≥ 0; 0 = no cap, Algorithm 1 as published
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
    double c_s = p.get_double("c_s"), c_t = p.get_double("c_t");
    if (p.has("s") || p.has("t")) throw Error("give either 'eps' (Theorem 1 mode) or 's' and 't', not both" + p.where("eps"));
    c.s = theorem1_s(eps, s.head_dim, c_s);
    c.t = theorem1_t(eps, c.delta, r, s.n, c_t);
  } else {
    c.s = p.get_int("s", -1);
    c.t = p.get_int("t", -1);
    if (c.s < 1) throw Error("parameter 's' (matrix-product samples) is required and must be ≥ 1" + p.where("s"));
    if (c.t < 1) throw Error("parameter 't' (samples per cluster) is required and must be ≥ 1" + p.where("t"));
  }
  // Sample counts size the cache's storage (s and 16·t rows of d floats up front): bounded by the
  // stream, so no config value allocates beyond it. A cluster cap above n never binds.
  const int64_t cap = kMaxSamplesPerToken * std::max<int64_t>(s.n, 1);
  const bool theorem = p.has("eps");
  if (c.s > cap)
    throw Error((theorem ? "Theorem 1's s = " : "parameter 's' = ") + std::to_string(c.s) + " exceeds " +
                std::to_string(kMaxSamplesPerToken) + "·n = " + std::to_string(cap) + " samples for this stream (n = " +
                std::to_string(s.n) + ")" + p.where(theorem ? "eps" : "s"));
  if (c.t > cap)
    throw Error((theorem ? "Theorem 1's t = " : "parameter 't' = ") + std::to_string(c.t) + " exceeds " +
                std::to_string(kMaxSamplesPerToken) + "·n = " + std::to_string(cap) + " samples per cluster for this stream (n = " +
                std::to_string(s.n) + ")" + p.where(theorem ? "eps" : "t"));
  if (s.n > 0) c.max_clusters = std::min(c.max_clusters, s.n);
  return std::make_unique<SubGenPolicy>(c, s);
}

/// s = ⌊M/2⌋ matrix-product samples (2s vectors) and at most ⌊M/(1+t)⌋ clusters (t default 3).
void subgen_memory(int64_t M, const Params& given, Params& out, const std::string& where) {
  ParamReader probe(given);  // typed reads with the usual errors
  const int64_t t = probe.get_int("t", 3);
  if (t < 1) throw Error("parameter 't' must be ≥ 1" + given.where("t"));
  const int64_t s = M / 2;
  const int64_t cap = M / (1 + t);
  if (s < 1 || cap < 1)
    throw Error("'memory' = " + std::to_string(M) + " tokens is too small for subgen with t = " + std::to_string(t) +
                " (needs s = ⌊M/2⌋ ≥ 1 and ⌊M/(1+t)⌋ ≥ 1 clusters)" + given.where("memory"));
  out.set("s", s, where);
  out.set("t", t, where);
  out.set("max_clusters", cap, where);
}

}  // namespace

KVSIM_POLICY(subgen) {
  static const PolicyInfo info{
      "subgen",
      "SubGen Algorithm 1 verbatim: online key clustering with radius `delta` (t uniform reservoir samples per "
      "cluster, Philox coin flips shared with the GPU; non-finite keys refused) + s matrix-product slots (each "
      "replaced w.p. ‖v‖²/(μ+‖v‖²)); output z/τ. Give `s` and `t`, or Theorem 1 mode `eps` and `r` "
      "(s = ⌈c_s ε⁻² d⌉, t = ⌈c_t ε⁻² e^{2δr} ln n⌉). Keeps no token subset (kept_mass is NaN)",
      "SubGen §2, Alg. 1, Lemma 1–2, Thm. 1",
      {{"delta", "float", "required (0 with max_clusters)", "cluster radius δ in key units"},
       {"s", "int", "required (or eps)", "matrix-product samples |M|"},
       {"t", "int", "required (or eps); 3 with memory", "reservoir samples per cluster |S_i|"},
       {"eps", "float", "none", "Theorem 1 mode: target ε (with r)"},
       {"r", "float", "none", "Theorem 1 mode: bound on the scaled query norm"},
       {"c_s", "float", "32", "Theorem 1 mode: constant of s"},
       {"c_t", "float", "0.05", "Theorem 1 mode: constant of t"},
       {"max_clusters", "int", "0", "kvsim's fixed-memory variant: cluster cap (δ doubles and clusters merge); 0 = as published",
        "[0, inf)"},
       {"sample_by_key", "bool", "false", "negative control for Lemma 1: sample M ∝ ‖k‖² (never for results)"}},
      make_subgen,
      MemoryRule{"capacity: s = ⌊M/2⌋ matrix-product samples and at most ⌊M/(1+t)⌋ clusters (t default 3)",
                 {"s", "max_clusters", "eps"},
                 subgen_memory},
      "yes (not sample_by_key)",
      {example_params({{"delta", 1.0}, {"s", int64_t(16)}, {"t", int64_t(4)}}),
       example_params({{"delta", 1.0}, {"eps", 0.5}, {"r", 1.0}})},
       "#e377c2",  // figure colour
       {example_params({{"delta", 8.0}, {"s", int64_t(256)}, {"t", int64_t(4)}}), false, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
