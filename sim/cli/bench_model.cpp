// `kvsim bench` section `model` (issue "performance beside a real PyTorch and at a real model's shape"):
// the recorder's batched prefill on a real LLM beside transformers' CPU forward over the same tokens in
// the same run, and the replay's throughput at that model's attention shape.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <unistd.h>

#include "bench_detail.hpp"
#include "kvsim/model/llama.hpp"

namespace kvsim::bench {
namespace {

namespace fs = std::filesystem;

fs::path exe_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// transformers' float32 CPU forward over the token ids in `ids_file` at each of `threads`, timed by
/// `python -m kvsim.compare_torch --hf-forward` (one model load; best of 2 after a warm-up): seconds per
/// thread count, or empty with `why` set when Python, transformers or the model cannot run it.
std::map<int, double> hf_forward_seconds(const std::string& model, const std::string& ids_file,
                                         const std::vector<int>& threads, std::string& why) {
  const char* env = std::getenv("KVSIM_PYTHON");
  const std::string py = env && *env ? env : (exe_dir().parent_path() / ".venv" / "bin" / "python").string();
  if (!fs::exists(py)) {
    why = py + " not found (set KVSIM_PYTHON, or bash scripts/setup.sh)";
    return {};
  }
  std::string list;
  for (int th : threads) {
    if (!list.empty()) list += ',';
    list += std::to_string(th);
  }
  const std::string cmd = "PYTHONPATH=" + quoted((exe_dir() / "python").string()) + " " + quoted(py) +
                          " -m kvsim.compare_torch --hf-forward " + quoted(model) + " --ids " + quoted(ids_file) +
                          " --threads " + list + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    why = "cannot start " + py;
    return {};
  }
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  std::map<int, double> s;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    int th = 0;
    double sec = 0;
    if (std::sscanf(line.c_str(), "hf_forward_seconds %d %lf", &th, &sec) == 2 && sec > 0) s[th] = sec;
  }
  if (rc != 0 || s.size() != threads.size()) {
    why = "python -m kvsim.compare_torch --hf-forward failed: " + out.substr(0, out.find('\n'));
    s.clear();
  }
  return s;
}

/// The recorder's prefill (LlamaModel::prefill with the per-layer q/k/v and the logits handed out,
/// as `kvsim record` does before writing them): seconds, best of `reps`. `values`, if set, receives
/// each layer's value rows V [n, n_kv_heads·head_dim] (copied outside the timed passes' work: the
/// first pass is only timed when reps == 1).
double prefill_seconds(const LlamaModel& m, const std::vector<int>& ids, int threads, int reps,
                       std::vector<MatF>* values = nullptr) {
  double best = 1e30;
  volatile float sink = 0;  // keeps the handed-out tensors' reads (as gemm_rate does)
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    m.prefill(
        ids, threads,
        [&](int, const MatF& Q, const MatF& K, const MatF& V, const MatF&) {
          sink = sink + Q(0, 0) + K(0, 0);
          if (values && r == 0) values->push_back(V);
        },
        [&](int, const MatF& L) { sink = sink + L(0, 0); });
    if (r > 0 || reps == 1) best = std::min(best, seconds_since(t0));
  }
  return best;
}

/// The replay at the model's attention shape: a synthetic heavy_hitter stream with its heads, KV heads
/// and head_dim (one layer), window and h2o at 20% memory, every 16th step evaluated, N threads.
/// Returns the cheapest policy's ns per step and cell (the ‖V_t‖_op share's denominator).
double replay_at_shape(const BenchOptions& o, BenchOut& b, const LlamaConfig& c, int N) {
  Experiment ex = synthetic_experiment(o.quick ? 1024 : 8192, 1, c.n_heads, c.n_kv_heads);
  ex.data.synth.head_dim = c.head_dim();
  ex.eval.every = 16;
  ex.policies = {{"window", "window", make_params({{"memory", 0.2}})}, {"h2o", "h2o", make_params({{"memory", 0.2}})}};
  SynthSource src(ex.data.synth);
  const RunResult r = run_experiment(ex, src, N);
  const double head_steps = double(c.n_heads) * double(ex.data.synth.n) / r.wall_seconds;
  const std::vector<double> ns = policy_means(r, "policy_ns");
  char line[640];
  std::snprintf(line, sizeof line,
                "  replay at this shape (%d query heads over %d KV heads, head_dim %d, n = %lld, one layer; window and "
                "h2o at 20%% memory, every 16th step, exact reference and all metrics, %d threads): %.0f head-steps/s "
                "(%.2f s); policy ns/step per KV head: window %.0f, h2o %.0f\n",
                c.n_heads, c.n_kv_heads, c.head_dim(), (long long)ex.data.synth.n, N, head_steps, r.wall_seconds,
                ns[0], ns[1]);
  b.out << line;
  b.js.add("model_replay_head_steps_per_s", head_steps);
  b.js.add("model_replay_window_ns", ns[0]);
  b.js.add("model_replay_h2o_ns", ns[1]);
  return std::min(ns[0], ns[1]);
}

/// eps_spectral's ‖V_t‖_op bookkeeping on the model's own value rows (every layer and KV head of the
/// prefill, one step at a time, as at eval.every = 1), beside the synthetic streams of bench_eps:
/// ns per step and its share of (it + the cheapest policy step at this shape).
void eps_on_values(BenchOut& b, const std::vector<MatF>& values, int kv_heads, int hd, double cheapest) {
  double sink = 0;
  int64_t steps = 0, products = 0;
  const auto t0 = Clock::now();
  for (const MatF& V : values)
    for (int h = 0; h < kv_heads; ++h) {
      OperatorNormTracker tr(hd);
      for (int64_t t = 0; t < V.rows(); ++t) {
        tr.add(V.row(t).data() + int64_t(h) * hd);
        sink += tr.op_norm();
        products += tr.last_iterations();
        ++steps;
      }
    }
  const double ns = seconds_since(t0) * 1e9 / double(std::max<int64_t>(1, steps));
  const double share1 = ns / (ns + cheapest), share16 = ns / 16 / (ns / 16 + cheapest);
  char line[640];
  std::snprintf(line, sizeof line,
                "  ‖V_t‖_op bookkeeping on these values (%zu layers x %d KV heads, head_dim %d): %.0f ns/step, %.1f "
                "G-products/step; share of the cheapest policy step above: %.1f%% at every=1, %.1f%% at every=16%s\n",
                values.size(), kv_heads, hd, ns, double(products) / double(std::max<int64_t>(1, steps)), 100 * share1,
                100 * share16, sink > 0 ? "" : " ");
  b.out << line;
  b.js.add("model_eps_bookkeeping_ns", ns);
  b.js.add("model_eps_share_every1", share1);
  b.js.add("model_eps_share_every16", share16);
}

}  // namespace

void bench_model(const BenchOptions& o, BenchOut& b, int N) {
  const std::string model = o.model.empty() ? (exe_dir().parent_path() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").string()
                                            : o.model;
  b.out << "\nmodel (" << model << "):\n";
  if (!fs::exists(model)) {
    b.out << "  SKIPPED: no such file (bash scripts/setup.sh fetches SmolLM2; or --model PATH)\n";
    return;
  }
  const LlamaModel m(model);
  const LlamaConfig& c = m.config();
  const int n = o.quick ? 64 : 1024;
  std::mt19937 rng(1);
  std::vector<int> ids(static_cast<size_t>(n));
  for (int& t : ids) t = int(rng() % uint32_t(c.vocab_size));
  const fs::path ids_file = fs::temp_directory_path() / ("kvsim_bench_ids_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(ids_file);
    for (int t : ids) f << t << ' ';
  }
  std::vector<int> threads{1};
  if (N > 1) threads.push_back(N);
  std::string why;
  const std::map<int, double> hf = hf_forward_seconds(model, ids_file.string(), threads, why);
  b.out << "  prefill of " << n << " seeded random token ids, float32, logits of every position:\n"
        << "  threads   kvsim record tokens/s   transformers forward tokens/s   ratio\n";
  std::vector<MatF> values;
  for (int th : threads) {
    const double ks = prefill_seconds(m, ids, th, o.quick ? 1 : 3, values.empty() ? &values : nullptr);
    const double hs = hf.count(th) ? hf.at(th) : NAN;
    if (hs > 0)
      std::snprintf(b.buf, sizeof b.buf, "  %7d %23.1f %31.1f %6.2fx\n", th, n / ks, n / hs, hs / ks);
    else
      std::snprintf(b.buf, sizeof b.buf, "  %7d %23.1f   SKIPPED: %.180s\n", th, n / ks, why.c_str());
    b.out << b.buf;
    b.js.add("model_prefill_tokens_per_s_threads" + std::to_string(th), n / ks);
    b.js.add("model_hf_forward_tokens_per_s_threads" + std::to_string(th), n / hs);
  }
  fs::remove(ids_file);
  const double cheapest = replay_at_shape(o, b, c, N);
  eps_on_values(b, values, c.n_kv_heads, c.head_dim(), cheapest);
}

}  // namespace kvsim::bench
