// Test helpers: greedy and brute-force maximization of set functions, and an exhaustive
// diminishing-returns (submodularity) check — for H2O's (1 − 1/e) guarantee (H2O §4.1).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace kvsim::test {

using SetFn = std::function<double(const std::vector<int>&)>;

inline double greedy(const SetFn& f, int n, int k) {
  std::vector<int> S;
  for (int step = 0; step < k; ++step) {
    int best = -1;
    double bv = -INFINITY;
    for (int j = 0; j < n; ++j) {
      if (std::find(S.begin(), S.end(), j) != S.end()) continue;
      S.push_back(j);
      double v = f(S);
      S.pop_back();
      if (v > bv) {
        bv = v;
        best = j;
      }
    }
    S.push_back(best);
  }
  return f(S);
}

inline double brute(const SetFn& f, int n, int k) {
  double best = -INFINITY;
  std::vector<int> S;
  std::function<void(int)> rec = [&](int from) {
    if (int(S.size()) == k) {
      best = std::max(best, f(S));
      return;
    }
    for (int j = from; j < n; ++j) {
      S.push_back(j);
      rec(j + 1);
      S.pop_back();
    }
  };
  rec(0);
  return best;
}

/// Diminishing returns, exhaustively over A ⊆ B ⊆ {first min(n, 7) items} and every x ∉ B:
/// f(A + x) − f(A) ≥ f(B + x) − f(B).
inline bool looks_submodular(const SetFn& f, int n) {
  const int m = std::min(n, 7);
  auto members = [](int mask, int m) {
    std::vector<int> v;
    for (int j = 0; j < m; ++j)
      if (mask >> j & 1) v.push_back(j);
    return v;
  };
  for (int bm = 0; bm < (1 << m); ++bm) {
    for (int am = bm;; am = (am - 1) & bm) {  // every submask of bm
      std::vector<int> A = members(am, m), B = members(bm, m);
      for (int x = 0; x < n; ++x) {
        if (x < m && (bm >> x & 1)) continue;
        auto A2 = A, B2 = B;
        A2.push_back(x);
        B2.push_back(x);
        if (f(A2) - f(A) < f(B2) - f(B) - 1e-12) return false;
      }
      if (am == 0) break;
    }
  }
  return true;
}

/// H2O's facility location over the first n queries: f(S) = Σ_{i<n} max_{j∈S} a_i(j), with
/// probs(i, j) = a_i(j) (row i = query i's attention).
template <class M>
SetFn facility_location(const M& probs, int n) {
  return [&probs, n](const std::vector<int>& S) {
    double s = 0;
    for (int i = 0; i < n; ++i) {
      double best = 0;
      for (int j : S) best = std::max(best, probs(i, j));
      s += best;
    }
    return s;
  };
}

/// f(S) = log(1 + Σ_{j∈S} e^{<k_j, q̃>}/τ) = log(1 + Σ_{j∈S} a(j)) for query row `row`.
template <class M>
SetFn log_partition_mass(const M& probs, int row) {
  return [&probs, row](const std::vector<int>& S) {
    double s = 0;
    for (int j : S) s += probs(row, j);
    return std::log1p(s);
  };
}

}  // namespace kvsim::test
