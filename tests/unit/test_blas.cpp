// The float32 GEMM wrappers (include/kvsim/core/blas.hpp): the model's (gemm_abt/gemm_ab) and the
// exact reference's (reference_gemm_abt/_ab, oneMKL where linked): products against a float64 product
// of the same float inputs, strided views, bad shapes, and many threads calling them at once.
#include <catch2/catch.hpp>
#include <random>
#include <thread>
#include <vector>

#include "kvsim/core/blas.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"

using namespace kvsim;

namespace {
MatF random_mat(int64_t r, int64_t c, uint64_t seed) {
  Engine rng = make_engine({seed});
  std::normal_distribution<float> normal;
  MatF m(r, c);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

/// Largest |C − exact| relative to the bound's scale Σ|a||b| of each entry (float32 rounding of a
/// k-term dot product is at most about k·2^-24 of it).
double worst_rel(const MatF& C, const MatD& exact, const MatD& scale) {
  double w = 0;
  for (int64_t i = 0; i < C.size(); ++i) w = std::max(w, std::abs(double(C.data()[i]) - exact.data()[i]) / scale.data()[i]);
  return w;
}

/// The two GEMM pairs under test, with the backend each names.
struct Gemms {
  const char* what;
  void (*abt)(const ConstRefF&, const ConstRefF&, RefF);
  void (*ab)(const ConstRefF&, const ConstRefF&, RefF);
  std::string backend;
};
std::vector<Gemms> gemm_pairs() {
  return {{"gemm_abt/gemm_ab", gemm_abt, gemm_ab, gemm_backend()},
          {"reference_gemm_abt/_ab", reference_gemm_abt, reference_gemm_ab, reference_gemm_backend()}};
}
}  // namespace

TEST_CASE("gemm_abt and gemm_ab match a float64 product on strided views", "[blas]") {
  for (const Gemms& g : gemm_pairs()) {
    INFO(g.what << ", backend: " << g.backend);
    const MatF big_a = random_mat(70, 140, 1), big_b = random_mat(333, 140, 2), big_v = random_mat(333, 61, 3);
    // A: 37 rows of a wider matrix's first 129 columns (row stride 140); B: the first 301 rows.
    const auto A = big_a.block(5, 0, 37, 129);
    const auto B = big_b.block(0, 0, 301, 129);
    MatF wide(37, 320);
    auto C = wide.leftCols(301);  // C written through a row stride of 320
    g.abt(A, B, C);
    const MatD exact = A.cast<double>() * B.cast<double>().transpose();
    const MatD scale = A.cast<double>().cwiseAbs() * B.cast<double>().cwiseAbs().transpose();
    const double w1 = worst_rel(MatF(C), exact, scale);
    CHECK(w1 < 129 * 6e-8);
    CHECK(w1 > 0);  // float32 arithmetic really ran (a float64 product cast down would round once only)

    MatF Z(37, 61);
    const MatF P = C;
    g.ab(P, big_v.topRows(301), Z);
    const MatD exact2 = P.cast<double>() * big_v.topRows(301).cast<double>();
    const MatD scale2 = P.cast<double>().cwiseAbs() * big_v.topRows(301).cast<double>().cwiseAbs();
    CHECK(worst_rel(Z, exact2, scale2) < 301 * 6e-8);

    // Negative control: a product with B's rows shifted by one is far outside the bound.
    MatF off(37, 301);
    g.abt(A, big_b.block(1, 0, 301, 129), off);
    CHECK(worst_rel(off, exact, scale) > 0.01);
  }
}

TEST_CASE("gemm_abt: an empty inner dimension gives zeros, mismatched shapes throw", "[blas]") {
  for (const Gemms& g : gemm_pairs()) {
    INFO(g.what);
    const MatF A(4, 0), B(3, 0);
    MatF C = MatF::Constant(4, 3, 7.0f);
    g.abt(A, B, C);
    CHECK(C.cwiseAbs().maxCoeff() == 0.0f);
    const MatF X = random_mat(4, 5, 4), Y = random_mat(3, 6, 5);
    MatF D(4, 3);
    CHECK_THROWS_AS(g.abt(X, Y, D), Error);  // inner dimensions 5 vs 6
    MatF E(4, 4);
    CHECK_THROWS_AS(g.abt(X, random_mat(3, 5, 6), E), Error);  // C is 4x4, not 4x3
    CHECK_THROWS_AS(g.ab(X, Y, D), Error);  // 4x5 by 3x6
  }
}

TEST_CASE("gemm_abt from many threads at once gives the serial answers bit for bit", "[blas]") {
  // kvsim calls its GEMMs from its own worker threads (OpenBLAS's buffer allocator must be locked;
  // oneMKL's sequential layer keeps no shared state).
  for (const Gemms& g : gemm_pairs()) {
    INFO(g.what);
    constexpr int kThreads = 8, kReps = 20;
    std::vector<MatF> A, B, serial;
    for (int t = 0; t < kThreads; ++t) {
      A.push_back(random_mat(128, 64 + 8 * t, 10 + t));
      B.push_back(random_mat(500 + 37 * t, 64 + 8 * t, 30 + t));
      serial.emplace_back(128, B.back().rows());
      g.abt(A.back(), B.back(), serial.back());
    }
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        MatF C(128, B[size_t(t)].rows());
        for (int r = 0; r < kReps; ++r) {
          g.abt(A[size_t(t)], B[size_t(t)], C);
          mismatches[size_t(t)] += (C.array() != serial[size_t(t)].array()).count() > 0;
        }
      });
    for (auto& th : pool) th.join();
    for (int t = 0; t < kThreads; ++t) CHECK(mismatches[size_t(t)] == 0);
    // The answers differ between threads (each thread's product is its own, not a shared buffer's).
    CHECK((serial[0].leftCols(100).array() != serial[1].leftCols(100).array()).any());
  }
}
