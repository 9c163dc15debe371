// kvsim: masked attention over two sets of rows — the chunk the closed-form caches answer a block of
// evaluated steps with (include/kvsim/replay/banded.hpp) and KIVI its (sim/policies/kivi.cpp): the
// queries' logits against both sets by two GEMMs, each query row masked to its own rows, a softmax, and
// two GEMMs with the same rows of the values.
#pragma once
#include <cstdint>
#include <vector>

#include "kvsim/core/types.hpp"

namespace kvsim {

/// One query row's rows in two_part_attention: Ka's rows [0, a_end) and Kb's rows [b_beg, b_end).
struct TwoPartMask {
  int64_t a_end = 0, b_beg = 0, b_end = 0;
};

/// Masked attention of query rows Q [R, d] (scaled: q̃ = scale·q) over the rows of (Ka, Va) and those of
/// (Kb, Vb): row r attends over Ka[0, masks[r].a_end) ∪ Kb[masks[r].b_beg, masks[r].b_end), with
/// z_r = Σ softmax(k·q̃_r) v over those rows written to Z's row z0 + r (Z sized by the caller, [≥ z0 + R, d])
/// and, when log_sums is given, log Σ exp(k·q̃_r) (the rows' log partition function, SubGen Eq. 2's τ over
/// them) to (*log_sums)[z0 + r]. In double: the per-step path's arithmetic (double logits, softmax and
/// products) in another summation order. Throws kvsim::Error on shapes that disagree, output rows that do
/// not fit, or a mask outside its rows or empty.
void two_part_attention(const MatD& Q, const Eigen::Ref<const MatD>& Ka, const Eigen::Ref<const MatD>& Va,
                        const Eigen::Ref<const MatD>& Kb, const Eigen::Ref<const MatD>& Vb, const std::vector<TwoPartMask>& masks,
                        MatD& Z, Eigen::Index z0, VecD* log_sums);
/// The same in float32 (`[eval] policy_precision = "float32"`): SGEMM logits, the softmax's exponentials in
/// float (arguments clamped at −87: subnormal weights slow the output SGEMM, and cannot move z) with their
/// sum in double, an SGEMM for the output normalized in double; log_sums = the float maximum plus the log
/// of that double sum.
void two_part_attention(const MatF& Q, const Eigen::Ref<const MatF>& Ka, const Eigen::Ref<const MatF>& Va,
                        const Eigen::Ref<const MatF>& Kb, const Eigen::Ref<const MatF>& Vb, const std::vector<TwoPartMask>& masks,
                        MatD& Z, Eigen::Index z0, VecD* log_sums);

}  // namespace kvsim
