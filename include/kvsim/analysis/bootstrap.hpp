// kvsim: confidence intervals over sequences. A run over several sequences reports,
// per policy and metric, the mean of the per-sequence means with a percentile-bootstrap interval:
// resample the sequences with replacement `resamples` times (seeded, so the interval is reproducible),
// take each resample's mean, and report the (1 − level)/2 and (1 + level)/2 quantiles (Efron &
// Tibshirani, "An Introduction to the Bootstrap", 1993, §13.3). With one sequence the interval is the
// point itself (no spread is known); NaN entries (a metric that did not apply) are dropped first.
#pragma once
#include <cstdint>
#include <vector>

namespace kvsim {

struct Interval {
  double mean = 0;   ///< mean of the finite values
  double low = 0;    ///< lower bound of the interval
  double high = 0;   ///< upper bound
  int n = 0;         ///< finite values used (sequences)
};

/// Percentile-bootstrap confidence interval of the mean of x. All NaN (or empty): n = 0, NaN bounds.
/// level in (0, 1), resamples ≥ 100.
Interval bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed, double level = 0.95, int resamples = 4000);

}  // namespace kvsim
