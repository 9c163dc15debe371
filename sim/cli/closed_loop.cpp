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

/// The batch of one window: the exact cache first, then every policy of the config that can run in a
/// closed loop (`row[p]` = its place in the batch, −1 for a non-causal oracle: open-loop only).
struct Batch {
  std::vector<std::unique_ptr<GuardedAttention>> caches;
  std::vector<int> row;
  std::vector<KVAttention*> attn() const {
    std::vector<KVAttention*> a;
    for (const auto& c : caches) a.push_back(c.get());
    return a;
  }
};

Batch make_batch(const ClosedLoopConfig& c, const LlamaModel& model, const PromptTensors* prompt) {
  const auto& cfg = model.config();
  Batch b;
  auto add = [&](const PolicySpec& spec) {
    auto a = std::make_unique<PolicyKVAttention>(cfg, spec, c.tokens, c.seed, c.eval.gqa, c.eval.group_agg, c.prefill,
                                                 c.eval.policy_precision == Precision::float32, prompt_block_of(c.eval));
    if (prompt) a->load_prompt(*prompt);
    b.caches.push_back(std::make_unique<GuardedAttention>(std::move(a), cfg.n_heads * cfg.head_dim()));
  };
  add(PolicySpec{"exact", "exact", Params{}});
  for (const auto& spec : c.policies) {
    try {
      add(spec);
      b.row.push_back(int(b.caches.size()) - 1);
    } catch (const Error& e) {
      if (std::string(e.what()).find("non-causal oracle") == std::string::npos) throw;
      b.row.push_back(-1);  // oracles are open-loop only
    }
  }
  return b;
}

/// Teacher-forced mean cross-entropy (nats/token) of every sequence of the batch over the window's
/// positions from `from` on (predicting win[i+1] at position i), all sequences decoded together
/// (LlamaModel::decode_step); NaN for a sequence whose guard stopped it.
std::vector<double> batched_ce(const LlamaModel& model, const std::vector<int>& win, int from, Batch& batch, int threads) {
  const size_t B = batch.caches.size();
  const auto attn = batch.attn();
  std::vector<double> sum(B, 0.0);
  MatF logits;
  int count = 0;
  for (int pos = from; pos + 1 < int(win.size()); ++pos, ++count) {
    model.decode_step(std::vector<int>(B, win[size_t(pos)]), pos, attn, threads, logits);
    for (size_t b = 0; b < B; ++b)
      sum[b] += token_cross_entropy(logits.row(Eigen::Index(b)).data(), int(logits.cols()), win[size_t(pos) + 1]);
  }
  for (size_t b = 0; b < B; ++b) sum[b] = batch.caches[b]->broken().empty() ? sum[b] / std::max(1, count) : NAN;
  return sum;
}

/// Closed loop of every policy on one window, all policies and the exact cache decoded as one batch:
/// with a prompt (`[model] prefill = P`) the prompt runs once through the model's batched prefill and
/// every cache receives it at once (kvsim::prefill), then positions P.. are decoded; without, every
/// position streams through the caches. Fills ce_exact, ce_policy, ce_increase, cache_tokens and
/// (with `generate`) diverge_at of rows[p] for each config policy p; a non-causal oracle gets NaN.
void closed_loop_window(const ClosedLoopConfig& c, const LlamaModel& model, const std::vector<int>& win, int threads,
                        std::vector<ClosedLoopRow>& rows) {
  const int prompt_len = c.prefill > 0 ? c.prefill : std::min(16, c.tokens);
  const std::vector<int> prompt(win.begin(), win.begin() + prompt_len);
  PromptTensors pt;
  if (c.prefill > 0) pt = prompt_tensors(model, prompt, threads);
  const PromptTensors* loaded = c.prefill > 0 ? &pt : nullptr;
  Batch batch = make_batch(c, model, loaded);
  const std::vector<double> ce = batched_ce(model, win, c.prefill, batch, threads);
  std::vector<std::vector<int>> gen;
  if (c.generate > 0) {
    Batch fresh = make_batch(c, model, loaded);  // same stream length, so the same token budgets
    gen = batched_greedy(model, prompt, loaded ? prompt_len : 0, prompt_len + c.generate, loaded ? &pt.last_logits : nullptr,
                         fresh.attn(), threads);
  }
  for (size_t p = 0; p < rows.size(); ++p) {
    ClosedLoopRow& r = rows[p];
    r.ce_exact = ce[0];
    const int b = batch.row[p];
    if (b < 0) {
      r.ce_policy = r.ce_increase = NAN;
      continue;
    }
    if (!batch.caches[size_t(b)]->broken().empty())
      std::cerr << "kvsim closed-loop: " << r.label << ", window " << r.window << ": the model broke down ("
                << batch.caches[size_t(b)]->broken() << "); ce = nan\n";
    r.ce_policy = ce[size_t(b)];
    r.ce_increase = r.ce_policy - r.ce_exact;
    r.cache_tokens = batch.caches[size_t(b)]->mean_cache_tokens();
    if (gen.empty() || std::isnan(r.ce_policy)) continue;
    for (size_t i = 0; i < gen[size_t(b)].size(); ++i)
      if (gen[size_t(b)][i] != gen[0][i]) {
        r.diverge_at = int(i);
        break;
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
  if (c.prefill < 0 || c.prefill >= c.tokens)
    throw Error("model.prefill (" + std::to_string(c.prefill) + ") must be in [0, model.tokens = " + std::to_string(c.tokens) + ")");
  if (c.generate > 0 && prompt_len + c.generate > c.tokens)
    throw Error("model.generate (" + std::to_string(c.generate) + ") + the " + std::to_string(prompt_len) +
                "-token prompt must fit in model.tokens (" +
                std::to_string(c.tokens) + ")");
  const Tokenizer tok = load_tokenizer(c.checkpoint, c.tokenizer, cfg.vocab_size);
  const std::vector<std::vector<int>> all =
      text_windows(c.text, tok, c.tokens, c.windows, c.text_tail, "model.tokens × model.windows");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());

  const size_t kRelErr = metric_index("rel_err"), kEps = metric_index("eps_spectral");
  std::vector<ClosedLoopRow> rows;
  for (int w = 0; w < c.windows; ++w) {
    const std::vector<int>& win = all[size_t(w)];
    const std::string rec_path = (fs::path(out_dir) / ("window_" + std::to_string(w) + ".h5")).string();
    const RunResult open = open_loop(c, win, rec_path, threads);
    std::vector<ClosedLoopRow> wrows(c.policies.size());
    for (size_t p = 0; p < c.policies.size(); ++p) {
      ClosedLoopRow& r = wrows[p];
      r.name = c.policies[p].name;
      r.label = c.policies[p].label;
      r.window = w;
      std::vector<double> re, ep;
      for (const auto& row : open.policies[p].rows) {
        re.push_back(row[kRelErr]);
        ep.push_back(row[kEps]);
      }
      r.open_rel_err = summarize(re).mean;
      r.open_eps = summarize(ep).mean;
    }
    closed_loop_window(c, model, win, threads, wrows);
    rows.insert(rows.end(), wrows.begin(), wrows.end());
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
