#include "kvsim/analysis/objectives.hpp"

#include <cmath>
#include <functional>
#include <queue>

namespace kvsim {

double facility_value(const MatD& A, int64_t t, const std::vector<int64_t>& S) {
  double s = 0;
  for (int64_t i = 0; i < t; ++i) {
    double best = 0;
    for (int64_t j : S) best = std::max(best, A(i, j));
    s += best;
  }
  return s;
}

double facility_greedy(const MatD& A, int64_t t, int64_t m) {
  m = std::min(m, t);
  std::vector<double> cover(t, 0.0);  // max over the chosen set, per query
  auto gain = [&](int64_t j) {
    double g = 0;
    for (int64_t i = j; i < t; ++i) g += std::max(0.0, A(i, j) - cover[i]);  // A(i, j) = 0 for i < j
    return g;
  };
  // Max-heap of (upper bound on gain, -index): submodularity makes stale gains upper bounds.
  std::priority_queue<std::pair<double, int64_t>> heap;
  for (int64_t j = 0; j < t; ++j) heap.emplace(gain(j), -j);
  double value = 0;
  for (int64_t picked = 0; picked < m && !heap.empty();) {
    auto [bound, negj] = heap.top();
    heap.pop();
    const int64_t j = -negj;
    const double g = gain(j);
    if (heap.empty() || g >= heap.top().first) {
      // g is at least every other candidate's upper bound: j is the greedy choice.
      value += g;
      for (int64_t i = j; i < t; ++i) cover[i] = std::max(cover[i], A(i, j));
      ++picked;
    } else {
      heap.emplace(g, negj);
    }
  }
  return value;
}

double facility_brute(const MatD& A, int64_t t, int64_t m, double limit) {
  m = std::min(m, t);
  double combos = 1;
  for (int64_t k = 0; k < m; ++k) {
    combos = combos * double(t - k) / double(k + 1);
    if (combos > limit) return NAN;
  }
  double best = 0;
  std::vector<int64_t> S;
  std::function<void(int64_t)> rec = [&](int64_t from) {
    if (int64_t(S.size()) == m) {
      best = std::max(best, facility_value(A, t, S));
      return;
    }
    for (int64_t j = from; j < t; ++j) {
      S.push_back(j);
      rec(j + 1);
      S.pop_back();
    }
  };
  rec(0);
  return best;
}

double theorem44_verdict(double f, double greedy, double opt, double alpha, double beta) {
  const double c = (1 - alpha) * (1 - std::exp(-1.0));
  if (!std::isnan(opt)) return f >= c * opt - beta ? 1.0 : 0.0;
  const double opt_lo = greedy, opt_hi = greedy / (1 - std::exp(-1.0));
  if (f >= c * opt_hi - beta) return 1.0;  // holds for every OPT in range
  if (f < c * opt_lo - beta) return 0.0;   // fails for every OPT in range
  return NAN;
}

}  // namespace kvsim
