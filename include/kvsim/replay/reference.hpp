// kvsim: the exact attention reference (docs/architecture.md, a replay step by step), computed for a block of evaluated steps at once
// with blocked matrix products (Eigen GEMM) and a log-domain softmax, in double precision.
//
// For step t (1-based: tokens 1..t are in the stream) and scaled query q̃_t = scale·q_t:
//   logits l_t = K_t q̃_t ∈ R^t,  a_t = softmax(l_t),  Attn_t = a_tᵀ V_t,  log τ_t = log Σ_i exp(l_t,i)
#pragma once
#include <vector>

#include "kvsim/core/types.hpp"

namespace kvsim {

struct ReferenceBlock {
  std::vector<int64_t> steps;  ///< evaluated steps t (1-based, increasing)
  /// [rows, t_max]: row r is a_t for t = steps[r], zero beyond t. Empty for the float32 reference,
  /// which keeps probs_f and probs_inv instead: use probs_row(), which serves both.
  MatD probs;
  MatF probs_f;                ///< float32 reference: [rows, t_max] unnormalized e^{l − max}, zero beyond t
  VecD probs_inv;              ///< float32 reference: a_t = probs_f.row(r) · probs_inv[r]
  MatD out;                    ///< [rows, d]: Attn_t
  VecD log_tau;                ///< [rows]: log of the partition function τ_t
  VecD probs_norm;             ///< [rows]: ‖a_t‖₂

  /// Row r of the probabilities (t_max doubles): probs.row(r) itself, or the float32 block's row
  /// normalized and widened into `scratch` (one row at a time, while it is in cache: the float32
  /// pass never writes its whole block out in double).
  const double* probs_row(Eigen::Index r, VecD& scratch) const {
    if (probs_f.rows() == 0) return probs.row(r).data();
    scratch = probs_f.row(r).transpose().cast<double>() * probs_inv[r];
    return scratch.data();
  }
};

/// Exact attention of query head rows `steps` of Q ([n, d], unscaled) against K, V ([n, d], double).
/// `steps` must be non-empty, increasing, within [1, n]. `window` > 0: a local (sliding-window) layer's
/// attention, step t reads only keys t − window + 1 … t (1-based), the probabilities of older keys
/// are 0 and τ sums over the window (Gemma 3's local layers; 0 = every key).
void exact_attention(const MatF& Q, const MatD& K, const MatD& V, double scale, const std::vector<int64_t>& steps,
                     ReferenceBlock& out, int64_t window = 0);

/// The same block in float32 arithmetic (`[eval] reference_precision = "float32"`): SGEMMs for the
/// logits and the output, the softmax in float with τ's sum in double; results stored in `out` as
/// double. About 2x the speed of exact_attention() (Eigen's SGEMM runs ~3x its DGEMM here); the price
/// is float rounding of the logits: with Δ = max_i |δl_i| ≤ γ_{d+1}·Σ_j |q̃_j k_ij| (u = 2^-24),
/// |δ log τ| ≤ Δ + O(t·u) and ‖δ Attn‖₂ ≤ (e^{2Δ} − 1 + O(t·u))·Σ_i a_i‖v_i‖₂ — ~1e-5 relative at
/// real-model logits (tests/unit/test_reference.cpp checks both bounds against long double). Use it for
/// large sweeps of approximate policies, whose errors are 1e-3 and up; keep float64 (1e-6, docs/theory.md)
/// for anything compared against the exact policy.
void exact_attention_f32(const MatF& Q, const MatF& K, const MatF& V, double scale, const std::vector<int64_t>& steps,
                         ReferenceBlock& out, int64_t window = 0);

/// End (exclusive) of the block of `steps` starting at index `begin` that one exact_attention call
/// handles: at most `max_rows` rows and rows × t_max ≤ 2^22 entries, at least one row. 256 rows for
/// the float64 reference; 128 for float32, where it measured 15% faster (the block's probabilities stay
/// in cache between the two GEMMs: 91 vs 80 GFLOP/s at n = 8192, d = 128 on the 2-core machine).
size_t reference_block_end(const std::vector<int64_t>& steps, size_t begin, size_t max_rows = 256);
/// Rows per block for exact_attention_f32.
inline constexpr size_t kReferenceRowsF32 = 128;

/// Column sums of the full causal attention matrix: g(j) = Σ_{t ≥ j} a_t(j) over all n queries of
/// Q ([n, d], unscaled) — H2O's "global" heavy-hitter score (H2O §3, Fig. 2). O(n²d), blocked.
/// `window` as in exact_attention.
VecD global_attention_scores(const MatF& Q, const MatD& K, double scale, int64_t window = 0);

/// Incremental operator norm ‖V_t‖_op = sqrt(λ_max(V_tᵀV_t)) (docs/metrics.md, for SubGen Eq. 3's ε;
/// sim/replay/operator_norm.cpp). `add` appends a value row to a pending block; every kPending rows
/// the d×d Gram matrix takes them in one rank-kPending GEMM (products with G in between add the
/// pending rows' term Pᵀ(Px)). `op_norm` runs restarted Lanczos (≤ 24 O(d²) products per restart)
/// from the previous top Ritz vector plus 1e-3 of the new rows' signed sum (so a direction only the
/// new rows span is still reached), until the Ritz residual r ≤ 1e-9·θ, or r² ≤ 1e-11·θ·gap (the gap
/// estimated by the second Ritz value), or the Ritz value stalls (checked after 1, 2, …, 8, 12, 16,
/// 20, 24 products). Accuracy (tested against Eigen's dense solver, tests/unit/test_reference.cpp):
/// ‖V_t‖_op within 1e-9 relative on clustered (isotropic), decaying and moving value streams.
/// last_iterations() = products with G in the last call.
class OperatorNormTracker {
 public:
  explicit OperatorNormTracker(int d);
  void add(const float* v);
  double op_norm();
  /// V_tᵀV_t over every added row (takes the pending rows in first).
  const MatD& gram();
  int last_iterations() const { return iters_; }
  static constexpr int kPending = 16;

 private:
  void flush();
  void gram_times(const double* x, double* w);  // w = V_tᵀV_t x; counts a product
  double finish(double theta);
  MatD G_;   // VᵀV over the flushed rows, both triangles
  MatD P_;   // [kPending, d]: added rows not yet in G_
  int np_ = 0;
  Eigen::MatrixXd Q_;  // scratch: Lanczos basis, column-major so each basis vector is contiguous
  VecD x_;      // the last top Ritz vector
  VecD fresh_;  // Σ ±v over the rows added since the last op_norm (joins Lanczos' start)
  int64_t rows_ = 0;
  VecD w_, h_;  // scratch: the next Lanczos vector; projections
  VecD alpha_, beta_;  // scratch: the Lanczos tridiagonal
  int d_;
  int iters_ = 0;
  bool dirty_ = true;
  double last_ = 0;
};

}  // namespace kvsim
