// SubGen's memory claims: Corollary 1's n^γ growth on a stream built for it, and Theorem 1's premises
// per KV head as `kvsim clusters` reports them (premises.csv), with r and t recomputed independently.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "helpers.hpp"
#include "kvsim/analysis/clustering.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"
#include "kvsim/io/recording.hpp"

using namespace kvsim;

TEST_CASE("subgen Corollary 1: stored vectors grow as n^gamma on a stream with m = ceil(n^gamma) clusters",
          "[subgen]") {
  auto p = test::small_synth("clustered", 1 << 16, 8, 1, 1, 1);
  p.cluster_c = 1.0;
  p.cluster_gamma = 0.5;
  p.cluster_diameter = 0.5;
  p.center_scale = 8.0;
  SynthSource src(p);
  MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0);
  SubGenConfig c;
  c.delta = 0.5;
  c.s = 4;
  c.t = 4;
  SubGen sg(c, 8, 11);
  std::vector<double> xs, ys;
  for (int64_t i = 0; i < K.rows(); ++i) {
    sg.update(i, K.row(i).data(), V.row(i).data());
    const int64_t n = i + 1;
    if (n >= 1024 && (n & (n - 1)) == 0) {  // n = 2^10 ... 2^16
      REQUIRE(sg.clusters() <= p.clusters_after(n));  // pigeonhole: m' ≤ m
      xs.push_back(std::log(double(n)));
      ys.push_back(std::log(double(sg.stored_vectors())));
    }
  }
  // Least-squares slope of log(stored vectors) against log n.
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    mx += xs[i];
    my += ys[i];
  }
  mx /= xs.size();
  my /= ys.size();
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  double slope = sxy / sxx;
  INFO("fitted exponent " << slope << " (gamma = 0.5)");
  CHECK(std::abs(slope - 0.5) <= 0.1);
  CHECK(slope < 1);
  // Negative control: δ far below the cluster diameter splits clusters; memory is no longer ~ n^γ.
  c.delta = 0.05;
  SubGen tiny(c, 8, 11);
  for (int64_t i = 0; i < 4096; ++i) tiny.update(i, K.row(i).data(), V.row(i).data());
  CHECK(tiny.clusters() > 4 * p.clusters_after(4096));
}

TEST_CASE("subgen premises per KV head: r, t and the verdict from kvsim clusters' premises.csv", "[subgen][premises]") {
  // Two clustered streams that differ only in the query norm bound: r = 2 (δ·r ≤ ln n at small δ) and
  // r = 40 (control: δ·r ≫ ln n at every δ).
  test::TempDir dir;
  std::map<double, std::vector<std::vector<std::string>>> rows;
  for (double qn : {2.0, 40.0}) {
    auto p = test::small_synth("clustered", 8192, 4, 1, 1, 1);
    p.query_norm = qn;
    p.seed = 1;
    SynthSource src(p);
    const std::string rec = dir.file("q" + std::to_string(int(qn)) + ".h5");
    write_synthetic(src, rec);
    ClusterStudy s;
    s.path = rec;
    run_cluster_study(s, dir.file("out" + std::to_string(int(qn))));
    std::ifstream in(dir.file("out" + std::to_string(int(qn))) + "/premises.csv");
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string c; std::getline(ss, c, ',');) f.push_back(c);
      rows[qn].push_back(f);
    }
    // Independent: r = the largest scaled query norm, t = c_t·e^{2δr}·ln n/ε² (kvsim's constants).
    RecordingReader rr(rec);
    const double r = double(rr.read(0, Tensor::q, 0).rowwise().norm().maxCoeff()) * rr.meta().softmax_scale;
    REQUIRE(rows[qn].size() == s.premise_deltas.size());
    for (const auto& f : rows[qn]) {
      CHECK(std::stod(f[4]) == Approx(r).epsilon(1e-5));
      const double dr = std::stod(f[5]);
      CHECK(dr == Approx(std::stod(f[3]) * r).epsilon(1e-5));
      CHECK(std::stod(f[9]) == Approx(0.05 / 0.25 * std::exp(2 * dr) * std::log(8192.0)).epsilon(1e-5));
    }
  }
  CHECK(rows[2.0][0][13] == "sublinear");  // δ = 0.125 × median norm: every premise holds
  for (const auto& f : rows[40.0]) CHECK(f[13].find("delta*r > ln n") != std::string::npos);  // control
}

TEST_CASE("kvsim clusters takes a hybrid recording's global layers unless clusters.layers names others", "[subgen][schema]") {
  // Three layers, the middle one global (layer_windows 16, 0, 16): the default studies layer 1 only,
  // as `kvsim run` replays it; naming the layers studies the local ones too (the control: the
  // default's restriction comes from layer_windows, not from the recording).
  test::TempDir dir;
  RecordingMeta m;
  m.model = "test";
  m.n_layers = 3;
  m.n_heads = m.n_kv_heads = 1;
  m.head_dim = 4;
  m.n_tokens = 64;
  m.softmax_scale = 0.5;
  auto write = [&](const std::string& name, std::vector<int64_t> windows) {
    m.layer_windows = std::move(windows);
    const std::string path = dir.file(name);
    RecordingWriter w(path, m);
    for (int l = 0; l < 3; ++l)
      for (Tensor t : {Tensor::q, Tensor::k, Tensor::v}) w.write(l, t, 0, MatF::Random(64, 4));
    w.finish();
    return path;
  };
  const std::string rec = write("hybrid.h5", {16, 0, 16});
  auto layers_in = [&](const std::string& out) {
    std::set<std::string> seen;
    std::ifstream in(out + "/clusters_fit.csv");
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) seen.insert(line.substr(0, line.find(',')));
    return seen;
  };
  ClusterStudy s;
  s.path = rec;
  const std::string summary = run_cluster_study(s, dir.file("default"));
  CHECK(layers_in(dir.file("default")) == std::set<std::string>{"1"});
  CHECK(summary.find("global layers 1 of 3") != std::string::npos);
  s.layers = {0, 1, 2};
  run_cluster_study(s, dir.file("named"));
  CHECK(layers_in(dir.file("named")) == std::set<std::string>{"0", "1", "2"});
  // Every layer local: a clear error rather than an empty study.
  s.path = write("all_local.h5", {16, 16, 16});
  s.layers.clear();
  CHECK_THROWS_WITH(run_cluster_study(s, dir.file("none")), Catch::Matchers::Contains("every layer is local"));
}
