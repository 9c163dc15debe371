// Budgets per unit by marginal gain over convexified curves (include/kvsim/analysis/allocation.hpp).
#include "kvsim/analysis/allocation.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvsim/core/error.hpp"

namespace kvsim {

BudgetCurve convex_minorant(const BudgetCurve& c) {
  if (c.tokens.empty() || c.tokens.size() != c.value.size()) throw Error("a budget curve needs as many values as budgets, at least one");
  for (size_t k = 1; k < c.tokens.size(); ++k)
    if (c.tokens[k] <= c.tokens[k - 1]) throw Error("a budget curve's budgets must ascend without repeats");
  for (double v : c.value)
    if (!std::isfinite(v)) throw Error("a budget curve holds a value that is not finite");
  BudgetCurve hull;
  double best = c.value[0];
  for (size_t k = 0; k < c.tokens.size(); ++k) {
    best = std::min(best, c.value[k]);  // rule 1: monotone
    const double x = double(c.tokens[k]), y = best;
    // rule 2: pop vertices that lie on or above the chord from their predecessor to (x, y)
    while (hull.tokens.size() >= 2) {
      const size_t m = hull.tokens.size();
      const double x0 = double(hull.tokens[m - 2]), y0 = hull.value[m - 2];
      const double x1 = double(hull.tokens[m - 1]), y1 = hull.value[m - 1];
      if ((y1 - y0) * (x - x0) < (y - y0) * (x1 - x0)) break;  // (x1, y1) strictly below the chord: keep
      hull.tokens.pop_back();
      hull.value.pop_back();
    }
    hull.tokens.push_back(c.tokens[k]);
    hull.value.push_back(y);
  }
  return hull;
}

double minorant_value(const BudgetCurve& hull, double b) {
  const auto& x = hull.tokens;
  if (b <= double(x.front())) return hull.value.front();
  if (b >= double(x.back())) return hull.value.back();
  const size_t k = size_t(std::upper_bound(x.begin(), x.end(), int64_t(std::floor(b))) - x.begin());  // x[k−1] ≤ b < x[k]
  const double w = (b - double(x[k - 1])) / double(x[k] - x[k - 1]);
  return hull.value[k - 1] + w * (hull.value[k] - hull.value[k - 1]);
}

BudgetAllocationResult allocate_budgets(const std::vector<BudgetCurve>& curves, int64_t mean) {
  if (curves.empty()) throw Error("no budget curves to allocate over");
  struct Segment { double slope; size_t unit, index; int64_t length; };
  std::vector<BudgetCurve> hulls;
  std::vector<Segment> segs;
  BudgetAllocationResult r;
  int64_t lo = 0, hi = 0;
  for (size_t u = 0; u < curves.size(); ++u) {
    hulls.push_back(convex_minorant(curves[u]));
    const BudgetCurve& h = hulls.back();
    lo += h.tokens.front();
    hi += h.tokens.back();
    r.budgets.push_back(h.tokens.front());
    for (size_t k = 1; k < h.tokens.size(); ++k) {
      const int64_t len = h.tokens[k] - h.tokens[k - 1];
      segs.push_back({(h.value[k] - h.value[k - 1]) / double(len), u, k, len});
    }
  }
  const int64_t total = int64_t(curves.size()) * mean;
  if (total < lo || total > hi)
    throw Error("mean budget " + std::to_string(mean) + " tokens is outside what the measured curves hold: [" +
                std::to_string((lo + int64_t(curves.size()) - 1) / int64_t(curves.size())) + ", " +
                std::to_string(hi / int64_t(curves.size())) + "] tokens per unit");
  // Steepest first; within a unit the hull's slopes ascend, so (slope, unit, index) keeps its order.
  std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) {
    if (a.slope != b.slope) return a.slope < b.slope;
    return a.unit != b.unit ? a.unit < b.unit : a.index < b.index;
  });
  int64_t left = total - lo;
  for (const Segment& s : segs) {
    if (left == 0) break;
    const int64_t take = std::min(left, s.length);
    r.budgets[s.unit] += take;
    left -= take;
  }
  for (size_t u = 0; u < curves.size(); ++u) {
    r.objective += minorant_value(hulls[u], double(r.budgets[u]));
    r.uniform_objective += minorant_value(hulls[u], double(mean));
  }
  return r;
}

}  // namespace kvsim
