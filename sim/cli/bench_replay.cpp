// `kvsim bench` sections on the replay's own costs: closed-form caches
// replayed in blocks vs per step, blocked stepping vs per step (every registered policy that steps in blocks),
// and the ‖V_t‖_op bookkeeping of eps_spectral.
#include "bench_detail.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/policies/registry.hpp"

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
  // Every registered policy with a bench entry (PolicyInfo::bench) whose instance steps in blocks (block_stepper, not a
  // closed form: the score-based evictors walk their blocks, the others answer a block's evaluated steps together),
  // blocked against per step, at n = 4096, 16384 and 32768 (quick: 1024), head_dim 128, a GQA group of 4 on one KV
  // head, every 16th step evaluated from n/4 (the prompt-compressing ones after a prompt of n/4), float32 and float64.
  // Each policy's bound is the cell section's (cell_policy: the products its cache implies at the GEMM rate, DGEMM
  // where it answers in double); "x bound" is the blocked run's seconds over it, the performance issue's measure.
  const std::vector<int64_t> lengths = o.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{4096, 16384, 32768};
  b.out << "\nblocked stepping (every registered policy that steps in blocks; head_dim 128, GQA group of 4, its bench\n"
           "  budget, every 16th step from n/4, 1 thread; `[eval] stepping`: blocked = a block's products as GEMMs,\n"
           "  per_step = one step at a time; x bound: blocked seconds over the cell section's FMA bound):\n"
           "policy                n  precision  reads  blocked ns/step  per_step ns/step  speed-up  x bound\n";
  std::vector<std::string> closed, per_step_only;
  for (const int64_t n : lengths) {
    Experiment ex = synthetic_experiment(n, 1, 4, 1);
    ex.eval.every = 16;
    ex.eval.from = n / 4;
    ex.eval.reference_precision = Precision::float32;  // not timed here: keeps the run short
    Experiment expf = ex;  // the prompt-compressing caches decode after a prompt of n/4
    expf.data.prefill = n / 4;
    expf.eval.from = n / 4 + 1;
    SynthSource src(ex.data.synth);
    const Cell cell{0, 0, {0, 1, 2, 3}};
    for (const PolicyInfo* info : policy_registry()) {
      const PolicyInfo::Bench& bench = info->bench;
      if (bench.params.values().empty()) continue;
      Experiment& e = bench.after_prefill ? expf : ex;
      e.policies.push_back({info->name, info->name, bench.params});
      const auto inst = make_cell_policy(e, src.meta(), cell, n, e.policies.size() - 1, 0);
      const bool is_closed = closed_form(*inst).has_value();
      if (is_closed || !block_stepper(*inst)) {
        e.policies.pop_back();
        if (n == lengths.front()) (is_closed ? closed : per_step_only).push_back(info->name);
      }
    }
    for (const char* prec : {"float32", "float64"})
      for (const Experiment* base : {&ex, &expf}) {
        if (base->policies.empty()) continue;
        Experiment e = *base;
        e.eval.policy_precision = *parse_choice<Precision>(prec);
        RunResult r[2];
        for (int mode = 0; mode < 2; ++mode) {
          Experiment m = e;
          m.eval.stepping = mode == 0 ? SteppingMode::blocked : SteppingMode::per_step;
          r[mode] = run_experiment(m, src, 1);
        }
        const std::vector<double> ns0 = policy_means(r[0], "policy_ns"), ns1 = policy_means(r[1], "policy_ns");
        for (size_t p = 0; p < e.policies.size(); ++p) {
          const CellPolicy c = cell_policy(e, src, r[0], p);
          const double x = c.seconds / c.bound_seconds(b);
          std::snprintf(b.buf, sizeof b.buf, "%-18s %6lld  %-9s %6s %16.0f %17.0f %8.1fx %7.1fx\n", e.policies[p].name.c_str(),
                        (long long)n, prec, c.every ? "every" : "eval", ns0[p], ns1[p], ns1[p] / ns0[p], x);
          b.out << b.buf;
          const std::string key = e.policies[p].name + "_" + std::to_string(n) + (std::string(prec) == "float32" ? "_f32" : "_f64");
          b.js.add("blocked_stepping_ns_" + key, ns0[p]);
          b.js.add("per_step_ns_" + key, ns1[p]);
          b.js.add("blocked_stepping_x_bound_" + key, x);
        }
      }
  }
  b.out << "closed forms (the closed-form section):";
  for (const std::string& name : closed) b.out << " " << name;
  b.out << "; stepped one at a time (docs/performance.md says why):";
  for (const std::string& name : per_step_only) b.out << " " << name;
  b.out << "\n";
}

}  // namespace kvsim::bench
