// `kvsim bench` sections on the replay's own costs: closed-form caches
// replayed in blocks vs per step, blocked stepping vs per step, and the ‖V_t‖_op bookkeeping of eps_spectral.
#include "bench_detail.hpp"
#include "kvsim/cli/config.hpp"

namespace kvsim::bench {

void bench_eps(const BenchOptions& o, BenchOut& b, double cheapest) {
  auto& out = b.out;
  auto& js = b.js;
  const int64_t n = o.quick ? 512 : 4096;
  // eps_spectral bookkeeping (docs/metrics.md): per step, the value row joins VᵀV (rank-16 GEMM updates)
  // and warm-started Lanczos finds ‖V_t‖_op, at the same n and head_dim, on two value streams:
  // isotropic uniform values (the worst case for Lanczos: the top eigenvalues cluster at the
  // Marchenko–Pastur edge) and the same values with a decaying spectrum, coordinate k scaled by
  // k^-0.4 so λ_k ∝ k^-0.8 — the shape of the recorded values of the real checkpoints here (λ₂/λ₁
  // 0.5–0.97, λ₁₀/λ₁ 0.1–0.3 on shakespeare's heads). The engine does it once per cell and step and
  // shares it across all policies and query heads; the shares below charge it to one cheapest policy step.
  out << "eps_spectral bookkeeping (‖V_t‖_op by warm-started Lanczos on VᵀV, d = 128, per evaluated step;\n"
         "  share = it / (it + the cheapest policy step), shared by every policy and head of a cell):\n"
         "values                        ns/step  G-products/step  share every=1  share every=16\n";
  for (int stream = 0; stream < 2; ++stream) {
    std::srand(7);
    MatF Vb = MatF::Random(n, 128);
    if (stream == 1)
      for (int k = 0; k < 128; ++k) Vb.col(k) *= std::pow(float(k + 1), -0.4f);
    OperatorNormTracker tr(128);
    double sink = 0;
    int64_t products = 0;
    auto t0 = Clock::now();
    for (int64_t t = 0; t < n; ++t) {
      tr.add(Vb.row(t).data());
      sink += tr.op_norm();
      products += tr.last_iterations();
    }
    const double ns = seconds_since(t0) * 1e9 / double(n);
    const double share1 = ns / (ns + cheapest), share16 = ns / 16 / (ns / 16 + cheapest);
    // Padded by hand to one display width (printf pads bytes; λ and ∝ take 2 and 3).
    const char* name = stream == 0 ? "isotropic (worst case)    " : "decaying (λ_k ∝ k^-0.8)   ";
    std::snprintf(b.buf, sizeof b.buf, "%s %10.0f  %15.1f  %12.1f%%  %13.1f%%%s\n", name, ns, double(products) / double(n),
                  100 * share1, 100 * share16, sink > 0 ? "" : " ");
    out << b.buf;
    const std::string key = stream == 0 ? "eps_bookkeeping" : "eps_bookkeeping_decaying";
    js.add(key + "_ns", ns);
    js.add(key + "_products_per_step", double(products) / double(n));
    js.add(key + "_share_every1", share1);
    js.add(key + "_share_every16", share16);
  }
}

void bench_closed_form(const BenchOptions& o, BenchOut& b) {
  // Closed-form caches (ClosedFormPolicy) at n = 8192, head_dim 128, a GQA group of 2, budget 25%,
  // every step evaluated: `[eval] closed_form = "blocked"` (banded masked GEMMs) against "per_step"
  // (the instance stepped token by token), in float32 and double policy precision. Useful work per
  // step: 2 query heads × (q·k and a·v over the cached tokens) = 8 · tokens · head_dim flops.
  const int64_t n = o.quick ? 1024 : 8192;
  Experiment ex = synthetic_experiment(n, 1, 2, 1);
  ex.eval.every = 1;
  ex.eval.reference_precision = Precision::float32;  // not timed here: keeps the run short
  ex.policies = {{"window", "window", make_params({{"budget", 0.25}})}, {"sink", "sink", make_params({{"budget", 0.25}})}};
  SynthSource src(ex.data.synth);
  std::snprintf(b.buf, sizeof b.buf,
                "\nclosed-form caches (n = %lld, head_dim 128, GQA group of 2, budget 25%%, every step, 1 thread;\n"
                "  `[eval] closed_form`: blocked = banded masked GEMMs, per_step = the cache stepped token by token):\n",
                (long long)n);
  b.out << b.buf << "policy  precision  blocked ns/step  per_step ns/step  speed-up  blocked GFLOP/s  of SGEMM  of own GEMM\n";
  for (const char* prec : {"float32", "float64"}) {
    std::vector<double> ns[2], tokens;
    for (int mode = 0; mode < 2; ++mode)
      for (int rep = 0; rep < (mode == 0 && !o.quick ? 3 : 1); ++rep) {  // blocked: best of 3 (a run is ~1 s)
        Experiment e = ex;
        e.eval.policy_precision = *parse_choice<Precision>(prec);
        e.eval.closed_form = mode == 0 ? ClosedFormMode::blocked : ClosedFormMode::per_step;
        const RunResult r = run_experiment(e, src, 1);
        const std::vector<double> m = policy_means(r, "policy_ns");
        if (ns[mode].empty()) ns[mode] = m;
        for (size_t p = 0; p < m.size(); ++p) ns[mode][p] = std::min(ns[mode][p], m[p]);
        tokens = policy_means(r, "cache_tokens");
      }
    const bool f32 = std::string(prec) == "float32";
    for (size_t p = 0; p < ex.policies.size(); ++p) {
      const double rate = 8.0 * tokens[p] * 128 / ns[0][p];  // GFLOP/s = flops per ns
      std::snprintf(b.buf, sizeof b.buf, "%-7s %-9s %16.0f %17.0f %8.1fx %16.1f %8.1f%% %11.1f%%\n", ex.policies[p].name.c_str(),
                    prec, ns[0][p], ns[1][p], ns[1][p] / ns[0][p], rate, 100 * rate / b.gemm, 100 * rate / (f32 ? b.gemm : b.dgemm));
      b.out << b.buf;
      const std::string key = ex.policies[p].name + (f32 ? "_f32" : "_f64");
      b.js.add("closed_form_blocked_ns_" + key, ns[0][p]);
      b.js.add("closed_form_per_step_ns_" + key, ns[1][p]);
      b.js.add("closed_form_blocked_of_sgemm_" + key, rate / b.gemm);
    }
  }
}

void bench_blocked_stepping(const BenchOptions& o, BenchOut& b) {
  // Blocked stepping (BlockStepper: h2o, tova, scissorhands, buzz) against per-step, at n = 4096, 16384 and 32768 (quick:
  // 1024), head_dim 128, a GQA group of 4 on one KV head, budget 25%, every 16th step evaluated from n/4 (blocks
  // of ≤ 16 steps), float32 and float64. Useful work per step: the group's logits over the cached tokens every
  // step and its answers at one step in 16: 2 · 4 · tokens · 128 · (1 + 1/16) flops; "of GEMM" is that rate
  // over SGEMM (float32) or DGEMM (float64), the FMA bound the performance issue measures against.
  const std::vector<int64_t> lengths = o.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{4096, 16384, 32768};
  b.out << "\nblocked stepping (head_dim 128, GQA group of 4, budget 25%, every 16th step, 1 thread;\n"
           "  `[eval] stepping`: blocked = a block's logits by one GEMM then the steps walked, per_step = one GEMV per step):\n"
           "policy        n  precision  blocked ns/step  per_step ns/step  speed-up  blocked of GEMM\n";
  for (const int64_t n : lengths) {
    Experiment ex = synthetic_experiment(n, 1, 4, 1);
    ex.eval.every = 16;
    ex.eval.from = n / 4;
    ex.eval.reference_precision = Precision::float32;  // not timed here: keeps the run short
    ex.policies = {{"h2o", "h2o", make_params({{"memory", 0.25}})}, {"tova", "tova", make_params({{"memory", 0.25}})},
                   {"scissorhands", "scissorhands", make_params({{"memory", 0.25}})},
                   {"buzz", "buzz", make_params({{"memory", 0.25}})}};
    SynthSource src(ex.data.synth);
    for (const char* prec : {"float32", "float64"}) {
      std::vector<double> ns[2], tokens;
      for (int mode = 0; mode < 2; ++mode) {
        Experiment e = ex;
        e.eval.policy_precision = *parse_choice<Precision>(prec);
        e.eval.stepping = mode == 0 ? SteppingMode::blocked : SteppingMode::per_step;
        const RunResult r = run_experiment(e, src, 1);
        ns[mode] = policy_means(r, "policy_ns");
        tokens = policy_means(r, "cache_tokens");
      }
      const bool f32 = std::string(prec) == "float32";
      for (size_t p = 0; p < ex.policies.size(); ++p) {
        const double rate = 2.0 * 4 * tokens[p] * 128 * (1 + 1.0 / 16) / ns[0][p];  // GFLOP/s = flops per ns
        std::snprintf(b.buf, sizeof b.buf, "%-12s %6lld %-9s %16.0f %17.0f %8.1fx %15.1f%%\n", ex.policies[p].name.c_str(),
                      (long long)n, prec, ns[0][p], ns[1][p], ns[1][p] / ns[0][p], 100 * rate / (f32 ? b.gemm : b.dgemm));
        b.out << b.buf;
        const std::string key = ex.policies[p].name + "_" + std::to_string(n) + (f32 ? "_f32" : "_f64");
        b.js.add("blocked_stepping_ns_" + key, ns[0][p]);
        b.js.add("per_step_ns_" + key, ns[1][p]);
      }
    }
  }
}

}  // namespace kvsim::bench
