// Internal to `kvsim bench` (sim/cli/bench*.cpp): timing helpers, the synthetic experiments and the
// report every section writes to.
#pragma once
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kvsim/cli/bench.hpp"
#include "kvsim/core/blas.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

/// GEMM rate of `product(A, B, C)` (C = A·B, n×n×n) in GFLOP/s: best of 7 after a warm-up.
template <class M, class Product>
double best_gemm_rate(int n, Product product) {
  M A = M::Random(n, n), B = M::Random(n, n), C(n, n);
  product(A, B, C);  // warm-up (page faults, frequency ramp)
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto t0 = Clock::now();
    product(A, B, C);
    best = std::min(best, seconds_since(t0));
  }
  volatile typename M::Scalar sink = C(0, 0);
  (void)sink;
  return 2.0 * n * n * double(n) / best / 1e9;
}

/// GEMM rate of Eigen on n×n×n (GFLOP/s) in scalar type S, best of 7 after a warm-up. The float rate
/// is the roofline of this run; the double rate is the ceiling of the float64 reference.
template <class S>
double gemm_rate(int n) {
  using M = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  return best_gemm_rate<M>(n, [](const M& A, const M& B, M& C) { C.noalias() = A * B; });
}

/// The float32 exact reference's GEMM (kvsim::reference_gemm_ab: oneMKL where linked, include/kvsim/core/blas.hpp)
/// on n×n×n in GFLOP/s, one thread, best of 7 after a warm-up.
inline double reference_sgemm_rate(int n) {
  return best_gemm_rate<MatF>(n, [](const MatF& A, const MatF& B, MatF& C) { reference_gemm_ab(A, B, C); });
}

/// The exact reference pass over every step of one head (as the engine does it), in float64
/// (exact_attention) or float32 (exact_attention_f32): seconds, best of `reps`.
inline double exact_pass_seconds(int64_t n, int d, bool f32, int reps) {
  MatF Q = MatF::Random(n, d), Kf = MatF::Random(n, d), Vf = MatF::Random(n, d);
  MatD K = Kf.cast<double>(), V = Vf.cast<double>();
  std::vector<int64_t> steps(n);
  for (int64_t t = 0; t < n; ++t) steps[t] = t + 1;
  ReferenceBlock blk;
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    for (size_t b0 = 0; b0 < steps.size();) {
      const size_t b1 = reference_block_end(steps, b0, f32 ? kReferenceRowsF32 : 256);
      const std::vector<int64_t> block(steps.begin() + b0, steps.begin() + b1);
      if (f32) exact_attention_f32(Q, Kf, Vf, 1.0 / std::sqrt(double(d)), block, blk);
      else exact_attention(Q, K, V, 1.0 / std::sqrt(double(d)), block, blk);
      b0 = b1;
    }
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

/// Builds Params from {key, value} pairs.
inline Params make_params(std::initializer_list<std::pair<std::string, ParamValue>> kv) {
  Params p;
  for (auto& [k, v] : kv) p.set(k, v);
  return p;
}

/// A synthetic heavy_hitter experiment of the given shape (head_dim 128) for the benchmarks.
inline Experiment synthetic_experiment(int64_t n, int layers, int heads, int kv_heads) {
  Experiment ex;
  ex.data.synthetic = true;
  ex.data.synth.preset = "heavy_hitter";
  ex.data.synth.n = n;
  ex.data.synth.head_dim = 128;
  ex.data.synth.n_layers = layers;
  ex.data.synth.n_heads = heads;
  ex.data.synth.n_kv_heads = kv_heads;
  return ex;
}

struct Json {
  std::ostringstream s;
  bool first = true;
  void add(const std::string& key, double v) {
    s << (first ? "" : ",\n") << "  \"" << key << "\": " << (std::isfinite(v) ? std::to_string(v) : "null");
    first = false;
  }
};

/// Output text, JSON figures and the run's roofline, shared by the bench sections.
struct BenchOut {
  std::ostringstream out;
  Json js;
  char buf[256];
  double gemm = 0;   // SGEMM GFLOP/s (the roofline)
  double dgemm = 0;  // DGEMM GFLOP/s
  double ref_sgemm = 0;  // the float32 reference's GEMM (reference_gemm_ab), GFLOP/s
};

/// The mean of metric `name` over each policy's rows (one per query head and evaluated step), in
/// the run's policy order.
inline std::vector<double> policy_means(const RunResult& r, const std::string& name) {
  const size_t k = metric_index(name);
  std::vector<double> out;
  for (const auto& pr : r.policies) {
    double m = 0;
    for (const auto& row : pr.rows) m += row[k];
    out.push_back(pr.rows.empty() ? NAN : m / double(pr.rows.size()));
  }
  return out;
}

/// Sections defined in sim/cli/bench_replay.cpp.
void bench_eps(const BenchOptions& o, BenchOut& b, double cheapest);
void bench_closed_form(const BenchOptions& o, BenchOut& b);
void bench_blocked_stepping(const BenchOptions& o, BenchOut& b);
/// Section `cell` (sim/cli/bench_cell.cpp): o.cell replayed at one thread against its FMA bound.
void bench_cell(const BenchOptions& o, BenchOut& b);

/// One policy's figures over a run (sim/cli/bench_cell.cpp): seconds of its steps, the multiply-adds of its
/// bound (docs/performance.md "The cell's FMA bound"), whether it reads every query and answers in double.
struct CellPolicy {
  double seconds = 0, fmas = 0, rule_fmas = 0, tokens = 0;
  int64_t rows = 0;
  bool every = false, in_double = false;
  /// The bound in seconds: the logits' and answers' multiply-adds at the DGEMM rate where it answers in double,
  /// else SGEMM, and its own rule's (PolicyInfo::Bench::rule_products, in double) at the DGEMM rate.
  double bound_seconds(const BenchOut& b) const {
    return 2.0 * fmas / ((in_double ? b.dgemm : b.gemm) * 1e9) + 2.0 * rule_fmas / (b.dgemm * 1e9);
  }
};
/// Policy p of run r (of experiment ex on src), counted as the cell section counts it.
CellPolicy cell_policy(const Experiment& ex, const StreamSource& src, const RunResult& r, size_t p);
/// Section `model` (sim/cli/bench_model.cpp): the recorder's prefill on a real LLM beside transformers'
/// forward, and the replay's head-steps/s at that model's shape; N = the run's thread count.
void bench_model(const BenchOptions& o, BenchOut& b, int N);

}  // namespace kvsim::bench
