#include "kvsim/cli/closed_loop.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvsim/analysis/bootstrap.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/model/policy_attention.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/core/rng.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim {

namespace {

/// Open loop: the window's exact recording (written to rec_path) through the config's policies.
RunResult open_loop(const ClosedLoopConfig& c, const std::vector<int>& win, const std::string& rec_path, int threads) {
  RecordOptions ro;
  ro.checkpoint = c.checkpoint;
  ro.tokenizer = c.tokenizer;
  ro.text_path = c.text;
  ro.tokens = c.tokens;
  ro.out = rec_path;
  ro.with_attn = false;
  ro.token_ids = win;
  record_model(ro);
  Experiment ex;
  ex.name = c.name;
  ex.seed = c.seed;
  ex.data.path = rec_path;
  ex.data.prefill = c.prefill;
  ex.eval = c.eval;
  ex.policies = c.policies;
  RecordingReader rec(rec_path);
  return run_experiment(ex, rec, threads);
}

/// Closed loop of one policy on one window: teacher-forced cross-entropy through the policy's cache,
/// and with `generate` the first greedy token that differs from the exact cache's. A policy that
/// drives the activations to NaN, or a non-causal oracle, gets NaN (with the reason on stderr).
void closed_loop_policy(const ClosedLoopConfig& c, LlamaModel& model, const PolicySpec& spec, const std::vector<int>& win,
                        const std::vector<int>& prompt, const std::vector<int>& gen_exact, ClosedLoopRow& r) {
  const auto& cfg = model.config();
  try {
    PolicyKVAttention attn(cfg, spec, c.tokens, c.seed, c.eval.gqa, c.eval.group_agg, c.prefill);
    r.ce_policy = teacher_forced_ce(model, win, &attn, c.prefill);
    r.ce_increase = r.ce_policy - r.ce_exact;
    r.cache_tokens = attn.mean_cache_tokens();
    if (c.generate > 0) {
      // Same stream length (and so the same token budgets) as the teacher-forced run.
      PolicyKVAttention gen_attn(cfg, spec, c.tokens, c.seed, c.eval.gqa, c.eval.group_agg, c.prefill);
      auto gen = greedy_tokens(model, prompt, int(gen_exact.size()), &gen_attn);
      for (size_t i = 0; i < gen.size(); ++i)
        if (gen[i] != gen_exact[i]) {
          r.diverge_at = int(i);
          break;
        }
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("non-finite") != std::string::npos) {
      // The policy drove the model's activations to inf/NaN: its closed loop has no finite
      // cross-entropy. Reported as NaN with the reason, not as a number.
      std::cerr << "kvsim closed-loop: " << spec.label << ", window " << r.window << ": the model broke down (" << what
                << "); ce = nan\n";
      r.ce_policy = r.ce_increase = NAN;
    } else if (what.find("non-causal oracle") != std::string::npos) {
      r.ce_policy = r.ce_increase = NAN;  // oracles are open-loop only
    } else {
      throw;
    }
  }
}

/// 0.05 → "5%".
std::string format_share(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%g%%", f * 100);
  return b;
}

/// closed_loop.csv: a row per (policy entry, window); the last three columns name the data set
/// (checkpoint and text file names, window length) so figures can title themselves.
void write_closed_loop_csv(const ClosedLoopConfig& c, const std::vector<ClosedLoopRow>& rows, const std::string& path) {
  namespace fs = std::filesystem;
  std::ostringstream o;
  o << "policy,label,window,ce_exact,ce_policy,ce_increase,open_rel_err,open_eps,cache_tokens,diverge_at,model,text,tokens\n";
  const std::string data = "," + csv_field(fs::path(c.checkpoint).stem().string()) + "," +
                           csv_field(fs::path(c.text).filename().string() +
                                     (c.text_tail > 0 ? " (last " + format_share(c.text_tail) + ")" : "")) +
                           "," + std::to_string(c.tokens) + "\n";
  char buf[512];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, ",%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d", r.window, r.ce_exact, r.ce_policy, r.ce_increase,
                  r.open_rel_err, r.open_eps, r.cache_tokens, r.diverge_at);
    o << csv_field(r.name) << ',' << csv_field(r.label) << buf << data;
  }
  write_file_atomically(path, o.str());
}

}  // namespace

std::vector<ClosedLoopRow> run_closed_loop(const ClosedLoopConfig& c, const std::string& out_dir, int threads) {
  namespace fs = std::filesystem;
  LlamaModel model(c.checkpoint);
  const auto& cfg = model.config();
  if (c.tokens < 2 || c.tokens > cfg.seq_len)
    throw Error("model.tokens must be in [2, " + std::to_string(cfg.seq_len) + "] (the model's seq_len)");
  const int prompt_len = c.prefill > 0 ? c.prefill : std::min(16, c.tokens);
  if (c.generate > 0 && prompt_len + c.generate > c.tokens)
    throw Error("model.generate (" + std::to_string(c.generate) + ") + the " + std::to_string(prompt_len) +
                "-token prompt must fit in model.tokens (" +
                std::to_string(c.tokens) + ")");
  const Tokenizer tok = load_tokenizer(c.checkpoint, c.tokenizer, cfg.vocab_size);
  const std::vector<int> all =
      text_tokens(c.text, tok, int64_t(c.tokens) * c.windows, c.text_tail, "model.tokens × model.windows");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());

  const size_t kRelErr = metric_index("rel_err"), kEps = metric_index("eps_spectral");
  std::vector<ClosedLoopRow> rows;
  for (int w = 0; w < c.windows; ++w) {
    std::vector<int> win(all.begin() + size_t(w) * c.tokens, all.begin() + size_t(w + 1) * c.tokens);
    const double ce_exact = teacher_forced_ce(model, win, nullptr, c.prefill);
    std::vector<int> gen_exact;
    const std::vector<int> prompt(win.begin(), win.begin() + prompt_len);
    if (c.generate > 0) gen_exact = greedy_tokens(model, prompt, prompt_len + c.generate, nullptr);
    const std::string rec_path = (fs::path(out_dir) / ("window_" + std::to_string(w) + ".h5")).string();
    const RunResult open = open_loop(c, win, rec_path, threads);
    for (size_t p = 0; p < c.policies.size(); ++p) {
      ClosedLoopRow r;
      r.name = c.policies[p].name;
      r.label = c.policies[p].label;
      r.window = w;
      r.ce_exact = ce_exact;
      std::vector<double> re, ep;
      for (const auto& row : open.policies[p].rows) {
        re.push_back(row[kRelErr]);
        ep.push_back(row[kEps]);
      }
      r.open_rel_err = summarize(re).mean;
      r.open_eps = summarize(ep).mean;
      closed_loop_policy(c, model, c.policies[p], win, prompt, gen_exact, r);
      rows.push_back(r);
    }
    fs::remove(rec_path, ec);
  }
  write_closed_loop_csv(c, rows, (fs::path(out_dir) / "closed_loop.csv").string());
  return rows;
}

std::string closed_loop_report(const ClosedLoopConfig& c, const std::vector<ClosedLoopRow>& rows) {
  size_t w = 6;
  for (const auto& r : rows) w = std::max(w, r.label.size());
  std::ostringstream o;
  char buf[256];
  o << std::string("policy") + std::string(w - 6, ' ');
  std::snprintf(buf, sizeof buf, " %6s %9s %9s %11s %11s %9s %8s\n", "window", "ce_exact", "ce", "ce_increase", "open_relerr",
                "cache_tok", "diverge");
  o << buf;
  for (const auto& r : rows) {
    const std::string div = c.generate <= 0 ? "-" : r.diverge_at < 0 ? "never" : std::to_string(r.diverge_at);
    std::snprintf(buf, sizeof buf, " %6d %9.4f %9.4f %11.4f %11.4g %9.1f %8s\n", r.window, r.ce_exact, r.ce_policy,
                  r.ce_increase, r.open_rel_err, r.cache_tokens, div.c_str());
    o << r.label << std::string(w - r.label.size(), ' ') << buf;
  }
  o << "\nmeans over " << c.windows << " window(s), [95% bootstrap interval over windows]:\n";
  std::vector<std::string> order;
  for (const auto& r : rows)
    if (std::find(order.begin(), order.end(), r.label) == order.end()) order.push_back(r.label);
  for (size_t p = 0; p < order.size(); ++p) {
    std::vector<double> inc, err;
    for (const auto& r : rows)
      if (r.label == order[p]) {
        inc.push_back(r.ce_increase);
        err.push_back(r.open_rel_err);
      }
    const Interval a = bootstrap_mean_ci(inc, derive_seed({c.seed, 0xc10, p})), b = bootstrap_mean_ci(err, derive_seed({c.seed, 0xc11, p}));
    std::snprintf(buf, sizeof buf, "  ce_increase %9.4g [%9.4g, %9.4g]   open rel_err %9.4g [%9.4g, %9.4g]\n", a.mean, a.low,
                  a.high, b.mean, b.low, b.high);
    o << order[p] << std::string(w - order[p].size(), ' ') << buf;
  }
  return o.str();
}

}  // namespace kvsim
