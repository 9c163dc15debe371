// BUZZ (Zhao et al., 2024) theory helpers: the beehive body recurrence and Theorem 3.1's T/w rule.
#include "kvsim/analysis/buzz_theorem.hpp"

namespace kvsim {

std::vector<int64_t> buzz_body_recurrence(int64_t T, int64_t s, int steps) {
  std::vector<int64_t> a;
  int64_t prev = 0;
  for (int j = 0; j < steps; ++j) {
    prev = prev / buzz_s_hat(s) + (T - prev) / s;
    a.push_back(prev);
  }
  return a;
}

double buzz_predicted_T_over_w(int64_t s) {
  return s % 2 ? double(s * s + 1) / double(s + 1) : double(s - 1);
}

double buzz_limit_coefficient(int64_t s) {
  return s % 2 ? double(s * s + 1) / double(s * s + s) : double(s - 1) / double(s);
}

}  // namespace kvsim
