// kvsim: submodular attention objectives for H2O's guarantee (H2O §4.1, Appendix D; docs/metrics.md, docs/theory.md).
// H2O's own objective is F_score, the attention mass of the kept set (§4.1, Def. 4.3: the kept_mass
// metric); the facility location below is kvsim's choice of a monotone submodular function over the
// whole attention matrix to which Theorem 4.4's (1 − 1/e) greedy bound applies — H2O does not define it.
//
// With A(i, j) = a_i(j), the attention of query i on token j (zero for j > i):
//   facility location  f_t(S) = Σ_{i ≤ t} max_{j ∈ S} A(i, j)   — monotone submodular in S;
//   log mass           g_t(S) = log(1 + Σ_{j ∈ S} e^{<k_j, q̃_t>}/τ_t) = log(1 + Σ_{j∈S} a_t(j)),
//                      maximized over |S| = m by the top-m tokens (so greedy = OPT for g).
// H2O Theorem 4.4: the eviction policy's set S̃_t satisfies f(S̃_t) ≥ (1 − α)(1 − 1/e)·max_{|S|=k} f(S) − β.
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvsim/core/types.hpp"

namespace kvsim {

/// f_t(S) for the first t queries (rows) of A. Indices in S must be < A.cols().
double facility_value(const MatD& A, int64_t t, const std::vector<int64_t>& S);

/// Lazy greedy (Minoux) for max f_t(S) over |S| = m, S ⊆ {0..t−1}: each pick has the largest
/// marginal gain (exactly greedy; equal gains may resolve differently than a plain left-to-right
/// scan), so the value is ≥ (1 − 1/e)·OPT.
double facility_greedy(const MatD& A, int64_t t, int64_t m);

/// Exact max f_t(S) over |S| = m by enumeration when C(t, m) ≤ limit; NaN otherwise.
double facility_brute(const MatD& A, int64_t t, int64_t m, double limit = 2e4);

/// Theorem 4.4 verdict for value f against (1 − α)(1 − 1/e)·OPT − β, when OPT is only known to lie in
/// [greedy, greedy/(1 − 1/e)] (or exactly, when `opt` is not NaN): 1 = holds, 0 = fails, NaN = cannot tell.
/// Comparisons allow 1e-12 relative rounding, so equal values computed in different orders agree.
double theorem44_verdict(double f, double greedy, double opt, double alpha, double beta);

/// H2O Theorem 4.4 (β = 0) read backwards: the smallest α ≥ 0 with f ≥ (1 − α)(1 − 1/e)·OPT, i.e.
/// max(0, 1 − f/((1 − 1/e)·OPT)), as {low, high}: equal when OPT is known (brute force), else the
/// bracket over OPT ∈ [greedy, greedy/(1 − 1/e)] (low from OPT = greedy). Within 1e-12 of 0 → 0.
std::pair<double, double> theorem44_alpha(double f, double greedy, double opt);

// H2O's observations (H2O §3 "Sparsity" and "Heavy hitters", Fig. 2), measured rather than assumed.

/// Fraction of the t entries of an attention row p below `rel` times its maximum (H2O §3: "> 95%
/// sparse", entries below 1% of the row maximum). 0 for t = 0.
double attention_sparsity(const double* p, int64_t t, double rel = 0.01);

/// Attention-sink share (StreamingLLM, Xiao et al. 2024, §3.1): Σ_{j<k} p_j / Σ_{j<t} p_j for the
/// exact row p (length t, positions from the start of the sequence); NaN when the row sums to 0.
double attention_sink_mass(const double* p, int64_t t, int64_t k = 4);

/// A least-squares power-law fit of a rank-size curve: log v_(r) = c + slope·log r over the ranks
/// r = 1..k of the positive values sorted descending; r2 its coefficient of determination, and
/// top10_share the share of the total held by the top ⌈k/10⌉ values.
struct PowerLawFit {
  double slope = NAN, r2 = NAN, top10_share = NAN;
};
PowerLawFit powerlaw_fit(std::vector<double> values);

/// H2O's accumulated attention after t queries, acc(j) = Σ_{i < t} A(i, j) for tokens j < t (A as
/// above, rows = queries), and its power-law fit (H2O Fig. 2: "accumulated attention scores follow a
/// power law").
PowerLawFit accumulated_powerlaw(const MatD& A, int64_t t);

}  // namespace kvsim
