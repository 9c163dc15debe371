#include "kvsim/analysis/objectives.hpp"

#include <algorithm>
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
  double combos = 1;  // C(t, m) = C(t, t − m): the shorter product never overshoots (C(t, t) = 1)
  for (int64_t k = 0; k < std::min(m, t - m); ++k) {
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
    for (int64_t j = from; j <= t - (m - int64_t(S.size())); ++j) {  // only prefixes that can still reach m
      S.push_back(j);
      rec(j + 1);
      S.pop_back();
    }
  };
  rec(0);
  return best;
}

namespace {
// Relative slack for comparisons against (1 − 1/e)·OPT: values computed along different summation
// orders (greedy vs brute force vs the policy's set) differ by a few ulps; 1e-12 absorbs that and no
// more, so a verdict never flips on rounding.
constexpr double kRoundingSlack = 1e-12;
}  // namespace

double theorem44_verdict(double f, double greedy, double opt, double alpha, double beta) {
  const double c = (1 - alpha) * (1 - std::exp(-1.0)), slack = 1 - kRoundingSlack;
  if (!std::isnan(opt)) return f >= c * opt * slack - beta ? 1.0 : 0.0;
  const double opt_lo = greedy, opt_hi = greedy / (1 - std::exp(-1.0));
  if (f >= c * opt_hi * slack - beta) return 1.0;  // holds for every OPT in range
  if (f < c * opt_lo * slack - beta) return 0.0;   // fails for every OPT in range
  return NAN;
}

std::pair<double, double> theorem44_alpha(double f, double greedy, double opt) {
  const double c = 1 - std::exp(-1.0);
  auto alpha = [&](double o) {
    if (!(o > 0)) return 0.0;
    const double a = 1 - f / (c * o);
    return a <= kRoundingSlack ? 0.0 : a;
  };
  if (!std::isnan(opt)) return {alpha(opt), alpha(opt)};
  return {alpha(greedy), alpha(greedy / c)};  // OPT ∈ [greedy, greedy/(1 − 1/e)]
}

double attention_sparsity(const double* p, int64_t t, double rel) {
  if (t <= 0) return 0;
  double mx = 0;
  for (int64_t j = 0; j < t; ++j) mx = std::max(mx, p[j]);
  int64_t small = 0;
  for (int64_t j = 0; j < t; ++j) small += p[j] < rel * mx;
  return double(small) / double(t);
}

double attention_sink_mass(const double* p, int64_t t, int64_t k) {
  double head = 0, all = 0;
  for (int64_t j = 0; j < t; ++j) {
    all += p[j];
    if (j < k) head += p[j];
  }
  return all > 0 ? head / all : NAN;
}

PowerLawFit powerlaw_fit(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !(x > 0) || !std::isfinite(x); }), v.end());
  PowerLawFit f;
  const size_t k = v.size();
  if (k < 3) return f;
  std::sort(v.begin(), v.end(), std::greater<double>());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0, total = 0, top = 0;
  const size_t k10 = (k + 9) / 10;
  for (size_t r = 0; r < k; ++r) {
    const double x = std::log(double(r + 1)), y = std::log(v[r]);
    sx += x, sy += y, sxx += x * x, sxy += x * y, syy += y * y;
    total += v[r];
    if (r < k10) top += v[r];
  }
  const double n = double(k), cxx = sxx - sx * sx / n, cxy = sxy - sx * sy / n, cyy = syy - sy * sy / n;
  f.slope = cxy / cxx;
  f.r2 = cyy > 0 ? cxy * cxy / (cxx * cyy) : 1.0;
  f.top10_share = top / total;
  return f;
}

PowerLawFit accumulated_powerlaw(const MatD& A, int64_t t) {
  std::vector<double> acc(static_cast<size_t>(t), 0.0);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j <= i; ++j) acc[size_t(j)] += A(i, j);
  return powerlaw_fit(std::move(acc));
}

}  // namespace kvsim
