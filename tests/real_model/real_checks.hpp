// Theorem checks on the keys, values and queries of a real recording, shared by the real-model test
// binaries (stories260K, shakespeare-q80).
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>

#include "submodular.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim::test {

/// SubGen Lemma 2 (SubGen §3.1, Algorithm 1 lines 11-23) after every step on KV head 0 of every
/// layer, δ = 0.5 × the layer's median key norm: x_i ∈ C_i, members within δ of their
/// representative, representatives > δ apart, counts summing to n. Returns the clusters per layer.
inline std::vector<int64_t> check_lemma2(RecordingReader& rec) {
  std::vector<int64_t> clusters;
  for (int l = 0; l < rec.meta().n_layers; ++l) {
    MatF K = rec.read(l, Tensor::k, 0), V = rec.read(l, Tensor::v, 0);
    std::vector<float> norms(K.rows());
    for (int64_t i = 0; i < K.rows(); ++i) norms[i] = K.row(i).norm();
    std::nth_element(norms.begin(), norms.begin() + norms.size() / 2, norms.end());
    SubGenConfig c;
    c.delta = 0.5 * norms[norms.size() / 2];
    c.s = 8;
    c.t = 4;
    SubGen sg(c, int(K.cols()), 1);
    for (int64_t n = 0; n < K.rows(); ++n) {
      sg.update(n, K.row(n).data(), V.row(n).data());
      const auto& a = sg.assignment();
      int64_t total = 0;
      for (int64_t i = 0; i < sg.clusters(); ++i) {
        REQUIRE(a[sg.representative_index(i)] == i);
        total += sg.cluster_count(i);
        for (int64_t j = 0; j < i; ++j)
          REQUIRE((sg.representatives().row(i) - sg.representatives().row(j)).norm() > c.delta);
      }
      REQUIRE(total == n + 1);
      REQUIRE((K.row(n).cast<double>() - sg.representatives().row(a[n])).norm() <= c.delta);
    }
    INFO("layer " << l << ": m' = " << sg.clusters() << " clusters for " << K.rows() << " keys at delta = " << c.delta);
    clusters.push_back(sg.clusters());
  }
  return clusters;
}

/// H2O's greedy guarantee (H2O §4, Theorem 4.4's (1 − 1/e)) on two submodular attention objectives
/// of query head 0, tokens off..off+19 of every layer, k = 1..6, against brute force. Returns the
/// number of instances checked (2 objectives × 6 budgets per layer).
inline int check_greedy_bound(RecordingReader& rec, int off) {
  const auto& m = rec.meta();
  const double bound = 1 - std::exp(-1.0);
  int instances = 0;
  for (int l = 0; l < m.n_layers; ++l) {
    const int n = 20;
    MatF Q = rec.read(l, Tensor::q, 0).middleRows(off, n);
    MatD K = rec.read(l, Tensor::k, 0).middleRows(off, n).cast<double>();
    MatD V = rec.read(l, Tensor::v, 0).middleRows(off, n).cast<double>();
    std::vector<int64_t> steps;
    for (int t = 1; t <= n; ++t) steps.push_back(t);
    ReferenceBlock ref;
    exact_attention(Q, K, V, m.softmax_scale, steps, ref);
    SetFn facility = facility_location(ref.probs, n);
    SetFn logmass = log_partition_mass(ref.probs, n - 1);
    for (auto* f : {&facility, &logmass}) {
      REQUIRE(looks_submodular(*f, n));
      for (int k = 1; k <= 6; ++k) {
        double g = greedy(*f, n, k), opt = brute(*f, n, k);
        INFO("layer " << l << " k " << k << ": greedy " << g << " opt " << opt);
        REQUIRE(g >= bound * opt - 1e-12);
        ++instances;
      }
    }
  }
  return instances;
}

}  // namespace kvsim::test
