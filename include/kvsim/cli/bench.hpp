// kvsim: `kvsim bench` — throughput figures against the machine's own limits.
#pragma once
#include <string>
#include <vector>

#include "kvsim/core/choices.hpp"

namespace kvsim {

struct BenchOptions {
  bool quick = false;        ///< smaller sizes (used by the test); the default runs the full set
  int threads = 0;           ///< N for the 1-vs-N comparison (0 = all cores)
  std::string json;          ///< also write the figures as JSON here (atomically)
  Device device = Device::cpu;  ///< cuda: the GPU figures of include/kvsim/cuda/cuda.hpp instead
  /// GGUF or llama2.c checkpoint of section `model` (empty: models/SmolLM2-135M-Instruct.Q4_1.gguf
  /// beside the build folder; the section is SKIPPED when the file is absent)
  std::string model;
  /// Sections to run (empty: all): exact, policies, closed_form, blocked_stepping, eps, subgen_regime,
  /// threads, model, cell (kBenchSections; cell only with `cell`). eps and threads also run policies (they
  /// read its figures).
  std::vector<std::string> only;
  /// Section `cell`: this experiment config replayed at one thread, each policy's time beside its FMA
  /// bound (sim/cli/bench_cell.cpp); `cell_set` are its `--set KEY=VALUE` overrides. Empty: no cell section.
  std::string cell;
  std::vector<std::string> cell_set;
};

/// The CPU bench's section names, in the order they run (`kvsim bench --only`).
inline const std::vector<std::string> kBenchSections = {"exact",         "policies", "closed_form", "blocked_stepping",
                                                        "eps",           "subgen_regime", "threads", "model",
                                                        "cell"};

/// Runs the benchmarks and returns the printable report (figures, not pass/fail).
std::string run_bench(const BenchOptions& o);

/// Eigen's GEMM rate on n×n×n in GFLOP/s (float32 when f32, else double), one thread, best of 7 after a
/// warm-up: the roofline `kvsim bench` prints (also used by `python3 -m kvsim.compare_torch`).
double gemm_gflops(int n, bool f32);
/// The float32 exact reference's GEMM rate (kvsim::reference_gemm_ab; reference_gemm_backend() names
/// it), as gemm_gflops.
double reference_gemm_gflops(int n);

}  // namespace kvsim
