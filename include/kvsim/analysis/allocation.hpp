// kvsim: where to put the memory — budgets per layer or per (layer, KV head) that minimize a summed
// offline objective at a given mean memory, from measured error-vs-budget curves (`kvsim allocate`,
// docs/cli.md "Budgets per layer and head").
//
// The rule (marginal-gain allocation over monotone, convexified curves):
//  1. Monotone: a unit's measured points (budget b_k tokens, objective f_k), b ascending, become
//     g_k = min_{j ≤ k} f_j — more memory never has to do worse than less.
//  2. Convex: h = the lower convex hull of the points (b_k, g_k), linear between its vertices; it is
//     non-increasing and its slopes increase (diminishing returns).
//  3. Greedy: every unit starts at its smallest measured budget; the remaining tokens go, one hull
//     segment (or the part of one that fits) at a time, to the steepest slope of any unit.
// Optimality: for convex piecewise-linear h_u, the greedy budgets minimize Σ_u h_u(b_u) subject to
// Σ_u b_u = U·M and lo_u ≤ b_u ≤ hi_u, over real and over integer budgets alike (segment ends are
// integers). The condition it meets (KKT): there is a slope λ such that every unit below its top has
// h_u'(b_u⁺) ≥ λ and every unit above its bottom has h_u'(b_u⁻) ≤ λ — no token moved from one unit to
// another lowers the sum. On the measured (possibly non-convex) curve g, every unit but at most one ends
// on a hull vertex, where h = g, so the result is optimal for g up to that one unit's interpolation.
#pragma once
#include <cstdint>
#include <vector>

namespace kvsim {

/// One unit's measured curve: objective `value[k]` (lower is better) at `tokens[k]` (ascending, distinct).
struct BudgetCurve {
  std::vector<int64_t> tokens;
  std::vector<double> value;
};

/// The vertices of a curve's monotone lower convex hull (rules 1–2 above), tokens ascending.
BudgetCurve convex_minorant(const BudgetCurve& c);

/// h(b): linear interpolation between the hull's vertices; b is clamped to [first, last] vertex.
double minorant_value(const BudgetCurve& hull, double b);

struct BudgetAllocationResult {
  std::vector<int64_t> budgets;    ///< per unit, tokens; Σ = units × mean
  double objective = 0;            ///< Σ_u h_u(b_u)
  double uniform_objective = 0;    ///< Σ_u h_u(mean): every unit at the mean
};

/// The greedy allocation (rule 3) of units × `mean` tokens over `curves`. Throws kvsim::Error when a
/// curve is empty or unsorted, or `mean` lies outside what the curves can hold (below the sum of their
/// smallest measured budgets or above the sum of their largest), naming the range.
BudgetAllocationResult allocate_budgets(const std::vector<BudgetCurve>& curves, int64_t mean);

}  // namespace kvsim
