// H2O's observations as metrics (H2O, Zhang et al. 2023, §3, Fig. 2): attention sparsity and the power law of
// accumulated attention, each against an independent computation, with negative controls.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "helpers.hpp"
#include "kvsim/analysis/objectives.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

TEST_CASE("observations: attention_sparsity counts entries below 1% of the row maximum", "[h2o][observations]") {
  std::vector<double> row = {0.5, 0.004, 0.006, 0.2, 0.0049, 0.2901};
  CHECK(attention_sparsity(row.data(), 6) == Approx(2.0 / 6));  // 0.004 and 0.0049 < 0.005
  std::vector<double> one_hot(100, 0.0);
  one_hot[17] = 1;
  CHECK(attention_sparsity(one_hot.data(), 100) == Approx(0.99));
  std::vector<double> uniform(100, 0.01);
  CHECK(attention_sparsity(uniform.data(), 100) == 0);  // control: a flat row is not sparse
}

TEST_CASE("observations: attention_sink_mass is the share of the row on the first k positions", "[observations]") {
  std::vector<double> row = {0.4, 0.1, 0.05, 0.05, 0.2, 0.2};
  CHECK(attention_sink_mass(row.data(), 6, 4) == Approx(0.6));
  CHECK(attention_sink_mass(row.data(), 6, 1) == Approx(0.4));
  CHECK(attention_sink_mass(row.data(), 3, 4) == Approx(1.0));  // t ≤ k: every position is a sink
  std::vector<double> scaled = row;                               // unnormalized rows: a share, not a sum
  for (double& x : scaled) x *= 7;
  CHECK(attention_sink_mass(scaled.data(), 6, 4) == Approx(0.6));
  std::vector<double> late(100, 0.0);                             // control: all mass far from the start
  late[90] = 1;
  CHECK(attention_sink_mass(late.data(), 100, 4) == 0);
  std::vector<double> zero(10, 0.0);
  CHECK(std::isnan(attention_sink_mass(zero.data(), 10, 4)));
}

TEST_CASE("observations: the power-law fit recovers an exact power law and rejects an exponential", "[h2o][observations]") {
  std::vector<double> pl, ex;
  for (int r = 1; r <= 500; ++r) {
    pl.push_back(3.0 * std::pow(double(r), -0.7));
    ex.push_back(std::pow(0.97, double(r)));
  }
  std::reverse(pl.begin(), pl.end());  // order does not matter: the fit ranks by size
  const PowerLawFit a = powerlaw_fit(pl), b = powerlaw_fit(ex);
  CHECK(a.slope == Approx(-0.7).margin(1e-12));
  CHECK(a.r2 == Approx(1.0).margin(1e-12));
  double top = 0, all = 0;
  std::sort(pl.begin(), pl.end(), std::greater<double>());
  for (size_t i = 0; i < pl.size(); ++i) (i < 50 ? top : all) += pl[i];
  CHECK(a.top10_share == Approx(top / (top + all)).epsilon(1e-12));
  CHECK(b.r2 < 0.9);  // control: an exponential rank-size curve is not a power law
  CHECK(std::isnan(powerlaw_fit({1.0, 2.0}).slope));  // too few points
}

TEST_CASE("observations: engine metrics equal a direct computation from the stream's q and k", "[h2o][observations]") {
  const int64_t n = 96;
  SynthSource src(test::small_synth("heavy_hitter", n, 8, 1, 2, 1));
  Experiment ex;
  ex.eval.every = 8;
  ex.eval.from = 8;  // steps 8, 16, ..., 96: the objective steps 16, 32, ..., 96 among them
  ex.eval.objectives = true;
  ex.eval.objectives_every = 16;
  PolicySpec w{"window", "window", {}};
  w.params.set("budget", int64_t(16), "test");
  ex.policies = {w};
  const RunResult r = run_experiment(ex, src, 1);
  const MatF K = src.read(0, Tensor::k, 0);
  const double scale = src.meta().softmax_scale;
  const size_t sp = metric_index("attn_sparsity"), sl = metric_index("accum_slope"), r2 = metric_index("accum_r2");
  int checked = 0;
  for (const auto& row : r.policies[0].rows) {
    const MatF Q = src.read(0, Tensor::q, row.head);
    // Naive causal attention rows 0..t−1 (query i over keys 0..i), in double.
    MatD A = MatD::Zero(row.step, row.step);
    for (int64_t i = 0; i < row.step; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, A(i, j) = scale * K.row(j).cast<double>().dot(Q.row(i).cast<double>()));
      for (int64_t j = 0; j <= i; ++j) sum += (A(i, j) = std::exp(A(i, j) - mx));
      for (int64_t j = 0; j <= i; ++j) A(i, j) /= sum;
    }
    const int64_t t = row.step;
    double mx = 0;
    for (int64_t j = 0; j < t; ++j) mx = std::max(mx, A(t - 1, j));
    int64_t small = 0;
    for (int64_t j = 0; j < t; ++j) small += A(t - 1, j) < 0.01 * mx;
    CHECK(row[sp] == Approx(double(small) / double(t)).margin(1e-12));
    if (t % 16 == 0 || t == n) {
      std::vector<double> acc(size_t(t), 0.0);
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j <= i; ++j) acc[size_t(j)] += A(i, j);
      const PowerLawFit f = powerlaw_fit(acc);
      CHECK(row[sl] == Approx(f.slope).epsilon(1e-9));
      CHECK(row[r2] == Approx(f.r2).epsilon(1e-9));
      ++checked;
    } else {
      CHECK(std::isnan(row[sl]));  // only at objective steps
    }
  }
  CHECK(checked == 2 * 6);  // 2 query heads × steps 16, 32, ..., 96
}
