// kvsim: SubGen (Zandieh, Han, Mirrokni, Karbasi, "SubGen: Token Generation in Sublinear Time and
// Memory", Zandieh et al. 2024) Algorithm 1, line by line, as an inspectable data structure.
//
//   D = {(x_i, S_i, n_i)}: UPDATESOFTMAXNORMALIZER (lines 11-23) — online clustering of keys with
//       radius δ around the first key of each cluster (its representative x_i), n_i members, and t
//       uniform reservoir samples S_i per cluster (each slot replaced w.p. 1/n_i, line 17).
//   M = s slots of (k, v): UPDATEMATRIXPRODUCT (lines 24-28) — each slot replaced by the new (k, v)
//       w.p. ‖v‖²/(μ + ‖v‖²), so each slot is an ℓ2-norm (of v) sample (Lemma 1). μ = Σ‖v‖² (line 6).
//   QUERYSTREAMATTN (lines 29-31): z = Σ_{(k,v)∈M} μ/(s‖v‖²)·e^{<q,k>}·v,
//                                   τ = Σ_i (n_i/t)·Σ_{k∈S_i} e^{<q,k>},   output z/τ.
// All exponentials share one shift (the largest logit involved), so real logits never overflow;
// the estimate of log τ is returned exactly (shift added back).
//
// Theorem 1 (§2.4): with ‖q‖ ≤ r, t = Ω(ε⁻² e^{2δr} log n) and s = Ω(ε⁻² d), the output satisfies
// Eq. (1)/(3), ‖z/τ − Attn‖ ≤ ε‖softmax(Kq)‖‖V‖_op, w.p. ≥ 0.99; memory and per-step time are
// O(d(mt + s)) on (m, δ)-clusterable keys. `theorem1_s/t` give s and t with the constants kvsim uses.
#pragma once
#include <cstdint>
#include <vector>

#include "kvsim/core/types.hpp"

namespace kvsim {

struct SubGenConfig {
  double delta = 1.0;   ///< cluster radius δ (key units, ‖k − x_i‖ ≤ δ joins cluster i)
  int64_t s = 64;       ///< matrix-product samples |M|
  int64_t t = 16;       ///< samples per cluster |S_i|
  /// Negative control for Lemma 1: sample M ∝ ‖k‖² (the typo in the paper's §2.2 prose) instead of
  /// ∝ ‖v‖². Never use for results.
  bool sample_by_key = false;
  /// 0 = Algorithm 1 as published (m' grows with the stream). > 0 = kvsim's fixed-memory variant
  /// for equal-memory comparisons (not in the paper): when a new cluster would make m' exceed it,
  /// δ doubles and clusters whose representatives lie within the new δ of an earlier kept one merge
  /// into it (the doubling step of Charikar et al., SubGen ref. [3]), repeated until m' ≤ cap.
  /// Merging keeps Lemma 2's per-slot uniformity: slot j of the merged cluster is A's slot j w.p.
  /// n_A/(n_A+n_B), else B's — uniform over A ∪ B because each input slot is uniform over its own
  /// cluster. Members then lie within δ_0 + δ_1 + … + δ_k < 2·δ of their representative after k
  /// doubling rounds (δ = δ_k; one round gives 1.5·δ, repeated rounds approach 2·δ), not δ.
  int64_t max_clusters = 0;
};

/// Theorem 1's sample sizes with kvsim's documented constants: s = ⌈c_s·ε⁻²·d⌉,
/// t = ⌈c_t·ε⁻²·e^{2δr}·ln n⌉ (n ≥ 2).
int64_t theorem1_s(double eps, int d, double c_s);
int64_t theorem1_t(double eps, double delta, double r, int64_t n, double c_t);

class SubGen {
 public:
  SubGen(const SubGenConfig& cfg, int d, uint64_t seed);
  /// Lines 4-6 for token `index` (0-based) with key k and value v (length d).
  void update(int64_t index, const float* k, const float* v);
  /// Line 7 / 29-31: writes z/τ into `out` (length d) and returns log τ̂.
  double query(const Eigen::Ref<const VecD>& q, VecD& out) const;
  /// Lines 29-30 before the division, both scaled by e^{-shift}: z·e^{-shift} and τ·e^{-shift}
  /// (for checking Eq. (5) and (6) separately). Returns shift.
  double query_parts(const Eigen::Ref<const VecD>& q, VecD& z_scaled, double& tau_scaled) const;
  /// Line 7 for the G query rows of Q ([G, d]) at once: row g of Z ([G, d]) and log_tau[g] are query()'s z/τ and
  /// log τ̂ for row g, up to the products' summation order. The stored samples are read once for all G rows
  /// (two matrix products) instead of once per row: a KV group's query heads share one pass over the cache.
  void query_rows(const MatD& Q, MatD& Z, std::vector<double>& log_tau) const;
  /// Blocked stepping: the dot products of the keys K.row(first) … K.row(first + b − 1) with every representative
  /// as it stands now, one matrix product for the b keys. update() of those tokens then reads line 12's
  /// estimates from it (and takes a dot product only with a representative opened inside the block) instead of
  /// one matrix–vector product over all representatives per token; a merge round, which renumbers them, ends
  /// it. The nearest representative is still decided by the exact distance, so the clusters are the same.
  void begin_block(const MatF& K, int64_t first, int64_t b);
  void end_block() { block_b_ = 0; }

  // Introspection (tests, metrics).
  int64_t clusters() const { return int64_t(count_.size()); }
  const MatD& representatives() const { return reps_; }   ///< first clusters() rows are valid
  int64_t cluster_count(int64_t i) const { return count_[i]; }
  int64_t representative_index(int64_t i) const { return rep_index_[i]; }
  /// Token indices held by cluster i's t sample slots.
  const std::vector<int64_t>& cluster_samples(int64_t i) const { return sample_index_[i]; }
  /// Token index in matrix-product slot j (−1 before the first token).
  int64_t slot_index(int64_t j) const { return m_index_[j]; }
  /// Cluster assignment of every token so far (the partition C_1..C_m of Lemma 2).
  const std::vector<int32_t>& assignment() const { return assign_; }
  double mu() const { return mu_; }
  /// Current cluster radius: cfg.delta, doubled at each merge round when max_clusters > 0.
  double delta() const { return delta_; }
  /// Stored d-vectors: m representatives + m·t cluster samples + s keys + s values.
  int64_t stored_vectors() const { return clusters() * (1 + cfg_.t) + 2 * cfg_.s; }
  const SubGenConfig& config() const { return cfg_; }

 private:
  SubGenConfig cfg_;
  int d_;
  uint64_t seed_;       // coin flips: hd::philox_u01(seed_, token or merge round, slot, kind)
  int64_t merges_ = 0;  // merge rounds so far (the merge flips' counter)
  double delta_;
  void merge_clusters();  // one doubling round (max_clusters > 0)
  /// Line 12: the nearest representative to key k (kp: its recorded float32) and its squared distance; −1 if none.
  int64_t nearest(int64_t index, const VecD& k, const float* kp, double& best_d2);
  // begin_block(): <k, x_i> of the block's keys (rows) with the first block_m_ representatives, valid while
  // merges_ == block_merges_; tokens block_first_ … block_first_ + block_b_ − 1.
  MatD block_dots_, block_keys_;
  int64_t block_first_ = 0, block_b_ = 0, block_m_ = 0, block_merges_ = 0;
  void draw(uint32_t token, int64_t count, uint32_t kind);  // u_[0, count) = this token's coin flips
  /// Line 29's weight of matrix-product slot j before its e^{<q,k>}: μ/(s‖v_j‖²) (slots with ‖v_j‖ > 0).
  double product_weight(int64_t j) const { return mu_ / (double(cfg_.s) * mv_sqnorm_[j]); }
  std::vector<double> u_;
  // D
  MatD reps_;                 // [capacity, d] representatives
  MatF reps_f_;               // the same keys as recorded (float32): distances by hd::key_sqdist
  VecD est_;                  // update() scratch: estimated distances to the representatives
  VecD rep_sqnorm_;
  std::vector<int64_t> count_, rep_index_;
  MatD samples_;               // [capacity·t, d]: cluster i's t samples in rows i·t .. i·t + t − 1
  std::vector<std::vector<int64_t>> sample_index_;
  std::vector<int32_t> assign_;
  // M
  MatD mk_, mv_;               // [s, d]
  VecD mv_sqnorm_;
  std::vector<int64_t> m_index_;
  double mu_ = 0;
};

}  // namespace kvsim

namespace kvsim {
/// kvsim's constants for Theorem 1's Ω(·) (used by `subgen` with `eps` unless c_s / c_t are given).
/// Measured on the clustered preset (d = 8, n = 256, δ = 0.5, r = 2; tests/unit/test_subgen.cpp):
///  - c_s = 32: the proof splits ε into ε/3 for Eq. (6) (matrix product) and ε/3 for Eq. (5) (τ);
///    Eq. (6) at ε/3 needs ~9× the samples Eq. (3) alone needs. With c_s = 1, Eq. (3)'s achieved
///    ε has p99 ≈ 1.8ε; with c_s = 32, Eq. (6) holds in ≥ 99.5% of seeds.
///  - c_t = 0.05: the e^{2δr} factor is a worst case; on this stream t = 0.05·ε⁻²e^{2δr}ln n already
///    gives Eq. (5) in ≥ 99.5% of seeds, while t/10 fails it (the negative control).
inline constexpr double kSubGenCs = 32.0;
/// Most samples (SubGen's s, or t per cluster) a stream of n tokens may ask for: 64·n. More would
/// only allocate storage the stream cannot fill with distinct keys; kvsim refuses it by name.
inline constexpr int64_t kMaxSamplesPerToken = 64;
inline constexpr double kSubGenCt = 0.05;
}  // namespace kvsim
