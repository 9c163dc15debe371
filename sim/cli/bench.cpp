#include "kvsim/cli/bench.hpp"
#include "bench_detail.hpp"
#include "kvsim/io/files.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "kvsim/cuda/cuda.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/reference.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"

namespace kvsim {
using namespace bench;

/// `kvsim bench --device cuda`, end to end: a synthetic 7B-shaped recording (32
/// layers × 32 heads, MHA, n = 8192, head_dim 128; quick: 2 layers, n = 2048) through every policy at
/// 20% memory, every 16th step evaluated, with `[eval] device = "cuda"` (exact reference and the
/// policies with a GPU replay on the GPU; subgen, exact and the metrics on the CPU) against the CPU
/// path on the same machine. The CPU run replays layer 0 only and is scaled by the layer count
/// (layers are independent cells of equal cost): a measured figure times L, printed as such.
/// Seconds of replay per policy of a run: its policy_ns summed over every row (a GPU replay books its
/// cell's whole replay at the first evaluated step; cells run side by side, so these overlap in time).
std::string replay_seconds(const RunResult& r) {
  size_t col = kMaxMetrics;
  for (const auto& c : r.metrics)
    if (c.name == "policy_ns") col = c.index;
  if (col == kMaxMetrics) return "";
  std::string s;
  char buf[128];
  for (const auto& p : r.policies) {
    double ns = 0;
    for (const auto& row : p.rows)
      if (std::isfinite(row[col])) ns += row[col];
    std::snprintf(buf, sizeof buf, " %s %.2f", p.spec.name.c_str(), ns * 1e-9);
    s += buf;
  }
  return s;
}

std::string e2e_bench(const BenchOptions& o, int threads) {
  const int64_t n = o.quick ? 2048 : 8192;
  const int L = o.quick ? 2 : 32;
  Experiment ex = synthetic_experiment(n, L, 32, 32);
  ex.eval.every = 16;
  ex.eval.policy_precision = Precision::float32;  // the GPU replays mirror the CPU's float32 policy arithmetic
  const auto P = make_params;
  ex.policies = {
      {"exact", "exact", P({})},
      {"window", "window", P({{"budget", 0.2}})},
      {"sink", "sink", P({{"budget", 0.2}})},
      {"h2o", "h2o", P({{"budget", 0.2}})},
      {"buzz", "buzz", P({{"memory", 0.2}})},
      {"uniform", "uniform", P({{"budget", 0.2}})},
      {"oracle_topk", "oracle_topk", P({{"budget", 0.2}})},
      {"subgen_kcenter", "subgen_kcenter", P({{"memory", 0.2}})},
      {"subgen", "subgen", P({{"memory", 0.2}})},
  };
  SynthSource src(ex.data.synth);
  Experiment gpu = ex;
  gpu.eval.device = Device::cuda;
  auto t0 = Clock::now();
  const RunResult gr = run_experiment(gpu, src, threads);
  const double g = seconds_since(t0);
  std::cout << "end to end, --device cuda: " << g << " s for " << L << " layers (the CPU path's layer 0 next)\n" << std::flush;
  Experiment cpu = ex;
  cpu.data.layers = {0};
  t0 = Clock::now();
  const RunResult cr = run_experiment(cpu, src, threads);
  const double c1 = seconds_since(t0);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "\nend to end: synthetic %d layers x 32 heads x n = %lld x head_dim 128, 9 policies at 20%% memory, every 16th "
                "step, %d threads:\n"
                "  --device cuda (all %d layers)      %9.1f s\n"
                "  CPU path (layer 0: %.1f s) x %d    %9.1f s   (GPU speed-up %.1fx)\n",
                L, (long long)n, threads, L, g, c1, L, c1 * L, c1 * L / g);
  std::string out = buf;
  out += "  replay seconds per policy, summed over its cells (side by side, so they overlap):\n    --device cuda:";
  out += replay_seconds(gr);
  out += "\n    CPU path, layer 0:";
  out += replay_seconds(cr);
  out += "\n";
  return out;
}

namespace {

void bench_exact(const BenchOptions& o, BenchOut& b) {
  auto& out = b.out;
  auto& js = b.js;
  auto& buf = b.buf;
  const double gemm = b.gemm;
  out << "exact reference pass (one head, every step, blocked GEMMs; best of " << (o.quick ? 1 : 3)
      << "; `[eval] reference_precision`):\n";
  out << "      n    d  precision     seconds   GFLOP/s  of SGEMM  of own GEMM\n";
  const std::vector<int64_t> ns = o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{2048, 8192, 32768};
  for (int64_t n : ns)
    for (int d : {64, 128})
      for (bool f32 : {false, true}) {
        const double s = exact_pass_seconds(n, d, f32, o.quick || n > 8192 ? 1 : 3);
        const double flops = 2.0 * double(n) * double(n) * d;  // causal: 2 matmuls × n²/2 × d × 2
        const double rate = flops / s / 1e9;
        // of own GEMM: float64 against Eigen's DGEMM, float32 against the reference's GEMM (reference_gemm_ab)
        std::snprintf(buf, sizeof buf, "%7lld %4d  %-9s %11.3f %9.2f %8.1f%% %11.1f%%\n", (long long)n, d,
                      f32 ? "float32" : "float64", s, rate, 100 * rate / gemm, 100 * rate / (f32 ? b.ref_sgemm : b.dgemm));
        out << buf;
        js.add(std::string(f32 ? "exact_f32_gflops_n" : "exact_gflops_n") + std::to_string(n) + "_d" + std::to_string(d), rate);
      }

}

/// Per policy: one cell (n tokens, head_dim 128, group of 2 query heads), 25% budgets, in double and
/// in float32 policy precision. Returns the cheapest float32 policy step (ns).
double bench_policies(const BenchOptions& o, BenchOut& b, Experiment& ex) {
  auto& out = b.out;
  auto& js = b.js;
  auto& buf = b.buf;
  const double gemm = b.gemm;
  const int64_t n = o.quick ? 512 : 4096;
  ex = synthetic_experiment(n, 1, 2, 1);
  ex.eval.every = 1;  // every policy answers every step, so the per-step bound below is uniform
  // Every registered policy with a bench entry (PolicyInfo::bench, in its own file): the
  // prompt-compressing ones decode after a prefill of n/2 tokens (its cost spread over them); those
  // whose arithmetic follows `[eval] policy_precision` are timed again in float32.
  Experiment expf = ex;
  expf.data.prefill = n / 2;
  expf.eval.from = n / 2 + 1;
  Experiment ex32 = ex;
  ex32.eval.policy_precision = Precision::float32;
  for (const PolicyInfo* info : policy_registry()) {
    const PolicyInfo::Bench& bench = info->bench;
    if (bench.params.values().empty()) continue;
    (bench.after_prefill ? expf : ex).policies.push_back({info->name, info->name, bench.params});
    if (bench.float32) ex32.policies.push_back({info->name, info->name + " f32", bench.params});
  }
  SynthSource src(ex.data.synth);
  RunResult r = run_experiment(ex, src, 1);
  RunResult rpf = run_experiment(expf, src, 1);
  RunResult r32 = run_experiment(ex32, src, 1);
  std::snprintf(buf, sizeof buf, "\npolicy steps (n = %lld, head_dim 128, GQA group of 2, kv_head mode, answer every step, 1 thread):\n",
                (long long)n);
  out << buf << "policy            ns/step  head-steps/s  cached tok  ns/step/token  vs FMA bound\n";
  const double fma_per_ns = gemm / 2.0;  // multiply-adds per ns at the SGEMM rate (GFLOP/s / 2)
  for (const RunResult* run : {&r, &rpf, &r32}) {
    const std::vector<double> ns = policy_means(*run, "policy_ns"), tokens = policy_means(*run, "cache_tokens");
    for (size_t p = 0; p < run->policies.size(); ++p) {
      const auto& pr = run->policies[p];
      const double mean_ns = ns[p], mean_tok = tokens[p];
      // Arithmetic lower bound of one step: for each of the 2 query heads, q·k and a·v over the cached
      // tokens = 2 × tokens × head_dim multiply-adds, at the measured SGEMM rate.
      const double bound_ns = 2.0 * mean_tok * 128 * 2 / fma_per_ns;
      std::snprintf(buf, sizeof buf, "%-16s %8.0f %13.0f %11.1f %14.2f %11.1fx\n", pr.spec.label.c_str(), mean_ns,
                    1e9 / mean_ns, mean_tok, mean_ns / std::max(1.0, mean_tok), mean_ns / bound_ns);
      out << buf;
      std::string key = pr.spec.label;
      std::replace(key.begin(), key.end(), ' ', '_');
      js.add("policy_ns_" + key, mean_ns);
    }
  }
  const std::vector<double> ns32 = policy_means(r32, "policy_ns");
  return *std::min_element(ns32.begin(), ns32.end());
}

/// SubGen Algorithm 1 in Theorem 1's regime (clustered stream, d = 4, δ = 0.5, r = 1, m(n) = ⌈n^0.5⌉,
/// ε = 0.5): time per update + query against the work the algorithm's memory implies, m'·t + s
/// (the query touches m' representatives, m'·t samples and s matrix-product rows).
void bench_subgen_regime(const BenchOptions& o, BenchOut& b) {
  b.out << "\nsubgen in Theorem 1's regime (d = 4, eps = 0.5, clustered, m = ceil(n^0.5); 1 thread):\n"
        << "      n   m'    t     s   m't+s   update ns  query ns  query ns/(m't+s)\n";
  for (int64_t n : {int64_t(1) << (o.quick ? 11 : 13), int64_t(1) << (o.quick ? 12 : 15)}) {
    SynthParams p;
    p.preset = "clustered";
    p.n = n;
    p.head_dim = 4;
    p.n_layers = p.n_heads = p.n_kv_heads = 1;
    p.cluster_diameter = 0.5;
    p.query_norm = 1.0;
    p.center_scale = 8.0;
    SynthSource src(p);
    const MatF K = src.read(0, Tensor::k, 0), V = src.read(0, Tensor::v, 0), Q = src.read(0, Tensor::q, 0);
    SubGenConfig c;
    c.delta = 0.5;
    c.s = theorem1_s(0.5, 4, kSubGenCs);
    c.t = theorem1_t(0.5, 0.5, 1.0, n, kSubGenCt);
    SubGen sg(c, 4, 1);
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) sg.update(i, K.row(i).data(), V.row(i).data());
    const double upd = seconds_since(t0) * 1e9 / double(n);
    VecD z;
    double sink = 0;
    const int64_t queries = 256;
    t0 = Clock::now();
    for (int64_t i = 0; i < queries; ++i) sink += sg.query(Q.row(n - 1 - i).cast<double>().transpose() * src.meta().softmax_scale, z);
    const double qns = seconds_since(t0) * 1e9 / double(queries);
    const double work = double(sg.clusters() * c.t + c.s);
    std::snprintf(b.buf, sizeof b.buf, "%7lld %4lld %4lld %5lld %7.0f %11.0f %9.0f %17.2f%s\n", (long long)n,
                  (long long)sg.clusters(), (long long)c.t, (long long)c.s, work, upd, qns, qns / work, sink == 0 ? " " : "");
    b.out << b.buf;
    b.js.add("subgen_regime_query_ns_per_work_n" + std::to_string(n), qns / work);
  }
}

void bench_threads(const BenchOptions& o, BenchOut& b, const Experiment& ex, int N) {
  auto& out = b.out;
  auto& js = b.js;
  auto& buf = b.buf;
  // Threads: a multi-cell run at 1 and N threads, identical results.
  Experiment mc = ex;
  mc.data.synth.n = o.quick ? 256 : 2048;
  mc.data.synth.n_layers = 4;
  mc.data.synth.n_heads = 8;
  mc.data.synth.n_kv_heads = 4;
  mc.data.synth.head_dim = 64;
  mc.policies.resize(3);
  SynthSource msrc(mc.data.synth);
  auto t1 = Clock::now();
  RunResult one = run_experiment(mc, msrc, 1);
  const double s1 = seconds_since(t1);
  auto tn = Clock::now();
  RunResult many = run_experiment(mc, msrc, N);
  const double sn = seconds_since(tn);
  bool same = true;
  const size_t kRelErr = metric_index("rel_err");
  for (size_t p = 0; p < one.policies.size(); ++p)
    for (size_t i = 0; i < one.policies[p].rows.size(); ++i)
      same &= one.policies[p].rows[i][kRelErr] == many.policies[p].rows[i][kRelErr];
  std::snprintf(buf, sizeof buf,
                "\nmulti-cell run (4 layers x 4 KV heads, n = %lld, 3 policies): 1 thread %.2f s, %d threads %.2f s, "
                "speed-up %.2fx, results %s\n",
                (long long)mc.data.synth.n, s1, N, sn, s1 / sn, same ? "identical" : "DIFFERENT");
  out << buf;
  js.add("threads", N);
  js.add("speedup", s1 / sn);
  js.add("identical", same ? 1 : 0);
  const double rss = peak_rss_mb();
  std::snprintf(buf, sizeof buf, "peak resident memory: %.0f MB\n", rss);
  out << buf;
  js.add("peak_rss_mb", rss);

}

void write_bench_json(const BenchOptions& o, BenchOut& b) {
  auto& out = b.out;
  auto& js = b.js;
  if (!o.json.empty()) {
    write_file_atomically(o.json, "{\n" + js.s.str() + "\n}\n");
    out << "wrote " << o.json << "\n";
  }
}

}  // namespace

double gemm_gflops(int n, bool f32) { return f32 ? gemm_rate<float>(n) : gemm_rate<double>(n); }
double reference_gemm_gflops(int n) { return reference_sgemm_rate(n); }

std::string run_bench(const BenchOptions& o) {
  const int N = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  if (!o.model.empty() && !std::filesystem::exists(o.model))
    throw Error(o.model + ": no such checkpoint (kvsim bench --model)");
  if (o.cell.empty() && std::find(o.only.begin(), o.only.end(), "cell") != o.only.end())
    throw Error("kvsim bench --only cell: name the config with --cell CONFIG");
  if (!o.cell.empty() && !std::filesystem::exists(o.cell)) throw Error(o.cell + ": no such config (kvsim bench --cell)");
  if (o.device == Device::cuda) {  // printed as each part ends: the end-to-end part takes minutes
    std::cout << cuda::bench(o.quick) << std::flush;
    return e2e_bench(o, N);
  }
  BenchOut b;
  const int gn = o.quick ? 256 : 1024;
  b.gemm = gemm_rate<float>(gn);
  const double dgemm = b.dgemm = gemm_rate<double>(gn);
  b.ref_sgemm = reference_sgemm_rate(gn);
  b.out << "machine: " << std::thread::hardware_concurrency() << " hardware threads\n";
  std::snprintf(b.buf, sizeof b.buf,
                "Eigen SGEMM %d^3 (1 thread, best of 7): %.1f GFLOP/s  <- roofline for this run\n"
                "Eigen DGEMM %d^3 (1 thread, best of 7): %.1f GFLOP/s  (%.0f%% of SGEMM: the float64 reference's ceiling)\n\n",
                gn, b.gemm, gn, dgemm, 100 * dgemm / b.gemm);
  b.out << b.buf;
  b.out << "float32 reference GEMM: " << reference_gemm_backend() << "\n";
  std::snprintf(b.buf, sizeof b.buf, "  %d^3 (1 thread, best of 7): %.1f GFLOP/s  (the float32 exact pass's ceiling)\n\n", gn,
                b.ref_sgemm);
  b.out << b.buf;
  b.js.add("reference_sgemm_gflops", b.ref_sgemm);
  b.js.add("sgemm_gflops", b.gemm);
  b.js.add("dgemm_gflops", dgemm);
  auto want = [&](const char* s) { return o.only.empty() || std::find(o.only.begin(), o.only.end(), s) != o.only.end(); };
  if (want("exact")) bench_exact(o, b);
  Experiment ex;
  const double cheapest = want("policies") || want("eps") || want("threads") ? bench_policies(o, b, ex) : 0.0;
  if (want("closed_form")) bench_closed_form(o, b);
  if (want("blocked_stepping")) bench_blocked_stepping(o, b);
  if (want("eps")) bench_eps(o, b, cheapest);
  if (want("subgen_regime")) bench_subgen_regime(o, b);
  if (want("threads")) bench_threads(o, b, ex, N);
  if (want("model")) bench_model(o, b, N);
  if (!o.cell.empty() && want("cell")) bench_cell(o, b);
  write_bench_json(o, b);
  return b.out.str();
}

}  // namespace kvsim
