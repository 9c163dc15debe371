// Internal to the replay (sim/replay/cell.cpp): the exact side of one cell — what the policies are
// measured against.
#pragma once
#include <vector>

#include "cell_streams.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim::cell {

/// Per block of evaluated steps, the exact reference of every query head (Attn_t, a_t, ‖a_t‖₂,
/// log τ_t: on the CPU in double or float32, or on the GPU — `[eval] reference_precision`, `device`)
/// and ‖V_{1..t}‖_op (SubGen Eq. 3's normalizer); once per cell, the full causal attention of the
/// first objectives_max_t queries (H2O §4.1's objectives) and the attention column sums that
/// non-causal oracles rank by (H2O §3's "global" heavy hitters).
class Reference {
 public:
  /// `window` > 0: a local layer's sliding window (data.local_layers = "replay"); the exact reference
  /// is then window attention over the last `window` keys (exact_attention). ‖V_t‖_op still covers
  /// all t value rows (an upper bound on the window's), so eps_spectral there is a lower bound.
  Reference(const EvalSpec& eval, const Streams& streams, int64_t n, double scale, int64_t window = 0);

  /// The exact reference and ‖V_t‖_op at each of `block`'s steps (increasing, after the last block's).
  void pass(const std::vector<int64_t>& block);
  /// Full causal attention of the first min(n, objectives_max_t) queries, when `[eval] objectives`.
  void objective_attention();
  /// Per query head, g(j) = Σ_{i ≥ j} a_i(j) over the whole stream.
  std::vector<VecD> global_scores() const;

  const ReferenceBlock& block(int g) const { return ref_[size_t(g)]; }
  /// Query head g's exact attention row at block row r (a float32 block's row widened to double).
  const double* probs_row(int g, size_t r) { return ref_[size_t(g)].probs_row(Eigen::Index(r), prow_[size_t(g)]); }
  double v_opnorm(size_t r) const { return opnorm_[r]; }
  const MatD& full_attention(int g) const { return attn_all_[size_t(g)]; }

 private:
  const EvalSpec& eval_;
  const Streams& s_;
  const int64_t n_;
  const double scale_;
  const int64_t window_;
  std::vector<ReferenceBlock> ref_;
  std::vector<VecD> prow_;  // a float32 block's probability row, widened when read
  OperatorNormTracker opnorm_tracker_;
  int64_t opnorm_t_ = 0;    // value rows the tracker has seen
  std::vector<double> opnorm_;
  int64_t t_obj_ = 0;
  std::vector<MatD> attn_all_;
};

}  // namespace kvsim::cell
