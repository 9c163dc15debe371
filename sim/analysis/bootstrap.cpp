#include "kvsim/analysis/bootstrap.hpp"

#include <algorithm>
#include <cmath>
#include <boost/random/uniform_int_distribution.hpp>

#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"

namespace kvsim {

Interval bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed, double level, int resamples) {
  if (!(level > 0 && level < 1) || resamples < 100) throw Error("bootstrap: level must be in (0, 1), resamples ≥ 100");
  std::vector<double> v;
  for (double e : x)
    if (!std::isnan(e)) v.push_back(e);
  Interval ci;
  ci.n = int(v.size());
  if (v.empty()) {
    ci.mean = ci.low = ci.high = NAN;
    return ci;
  }
  double sum = 0;
  for (double e : v) sum += e;
  ci.mean = sum / double(v.size());
  if (v.size() == 1) {
    ci.low = ci.high = ci.mean;
    return ci;
  }
  Engine eng = make_engine({seed, 0xb007});
  boost::random::uniform_int_distribution<size_t> pick(0, v.size() - 1);
  std::vector<double> means(static_cast<size_t>(resamples), 0.0);
  for (auto& m : means) {
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += v[pick(eng)];
    m = s / double(v.size());
  }
  std::sort(means.begin(), means.end());
  auto quantile = [&](double p) {  // linear interpolation between order statistics
    const double pos = p * double(means.size() - 1);
    const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, means.size() - 1);
    return means[lo] + (pos - double(lo)) * (means[hi] - means[lo]);
  };
  ci.low = quantile((1 - level) / 2);
  ci.high = quantile((1 + level) / 2);
  return ci;
}

}  // namespace kvsim
