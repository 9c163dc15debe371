// kvsim: caches whose content is a closed form of the step (ClosedFormPolicy: window, sink)
// answered for a block of evaluated steps at once — a banded, masked attention through two GEMMs
// instead of two matrix-vector products per step and query head.
//
// For step t (1-based: tokens 0..t−1 have joined) a sink + window cache holds
//   S_t = [0, min(sink, t)) ∪ [max(sink, t − window), t)        (hd::sink_window_token's closed form)
// and answers z_t = Σ_{j∈S_t} softmax_j(k_j·q̃_t) v_j. A chunk of steps t_1 < … < t_R (at most
// kBandRows of them and at most 2^22 logits, t_R − t_1 ≤ max(kBandRows − 1, window / 4)) uses the tokens
//   [0, min(sink, t_R)) ∪ [max(sink, t_1 − window), t_R),
// so its logits are one [R·H, a + W] GEMM (H query heads, a sink columns, W band columns), each row
// masked to its own S_t, then a softmax and a second GEMM with the same columns of V. The masked-out
// work is W − window ≤ max(127, window/4) columns per row.
#pragma once
#include <vector>

#include "kvsim/core/masked_attention.hpp"
#include "kvsim/core/types.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {

/// Steps per chunk of closed_form_answers (rows per query head of one GEMM).
inline constexpr size_t kBandRows = 128;

/// Answers of the sink + window cache `c` for query heads qs (each [n, d], scaled: q̃ = scale·q, in
/// double) at the increasing 1-based `steps`, against K, V [n, d] in double. On return Z is
/// [steps × H, d] with row r·H + h = z of query head h at steps[r]; `log_sums`, when given, is
/// resized to [steps × H] with the same rows' log Σ_{j∈S_t} exp(k_j·q̃) (the cache's log partition
/// function: exact's log τ, SubGen Eq. 2's τ over the whole prefix). Arithmetic as the per-step path
/// (Policy::attend → attend_cached_group: double logits, softmax and products), in another summation
/// order: equal within 1e-12 relative (tests/unit/test_banded.cpp). Throws kvsim::Error on steps outside
/// [1, n], an empty cache (window 0 and sink 0) or mismatched shapes.
void closed_form_answers(const std::vector<const MatD*>& qs, const MatD& K, const MatD& V, const ClosedFormCache& c,
                         const std::vector<int64_t>& steps, MatD& Z, VecD* log_sums = nullptr);

/// The same in float32 (`[eval] policy_precision = "float32"`, the per-step path's SlotCache f32
/// mode): the scaled queries rounded to float, SGEMM logits, the softmax's exponentials in float with
/// their sum in double, an SGEMM for the output normalized in double (log_sums: the float maximum plus
/// the log of that double sum, as the per-step softmax_f32). Equal to the per-step float32
/// path within 1e-5 relative (tests/unit/test_banded.cpp).
void closed_form_answers(const std::vector<const MatD*>& qs, const MatF& K, const MatF& V, const ClosedFormCache& c,
                         const std::vector<int64_t>& steps, MatD& Z, VecD* log_sums = nullptr);

/// The cached tokens of `c` after t tokens have joined, in the per-step cache's slot order (the
/// sink tokens, then the window ring from slot `sink` on: what SlotCache's positions list) — so
/// metrics summed over the kept set (kept_mass) add in the per-step path's order.
void closed_form_kept(const ClosedFormCache& c, int64_t t, std::vector<int64_t>& kept);

}  // namespace kvsim
