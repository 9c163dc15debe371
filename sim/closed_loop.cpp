#include "kvsim/closed_loop.hpp"

#include <cmath>
#include <iostream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvsim/error.hpp"
#include "kvsim/record.hpp"
#include "kvsim/results.hpp"
#include "kvsim/rng.hpp"
#include "kvsim/tokenizer.hpp"

namespace kvsim {

PolicyKVAttention::PolicyKVAttention(const LlamaConfig& cfg, const PolicySpec& spec, int64_t n_tokens, uint64_t seed,
                                     const std::string& gqa, const std::string& group_agg)
    : cfg_(cfg), per_query_(gqa == "query_head") {
  const int G = cfg.n_heads / cfg.n_kv_heads;
  const int caches = per_query_ ? cfg.n_heads : cfg.n_kv_heads;
  StreamInfo info;
  info.n = n_tokens;
  info.head_dim = cfg.head_dim();
  info.n_queries = per_query_ ? 1 : G;
  info.group_agg = group_agg;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < caches; ++h) {
      const uint64_t head_id = per_query_ ? uint64_t(h) : uint64_t(h) + (1ULL << 32);
      info.seed = derive_seed({seed, uint64_t(l), head_id, 0, 0});
      auto p = make_policy(spec.name, spec.params, info);
      if (p->needs_exact_probs() || p->needs_global_scores())
        throw Error("policy '" + spec.label + "' is a non-causal oracle (it needs future or exact attention) and cannot run in a closed loop");
      pol_.push_back(std::move(p));
    }
  answers_.resize(per_query_ ? 1 : G);
}

void PolicyKVAttention::attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  const int hs = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads;
  const double scale = 1.0 / std::sqrt(double(hs));
  const int caches = per_query_ ? cfg_.n_heads : cfg_.n_kv_heads;
  for (int c = 0; c < caches; ++c) {
    Policy& p = *pol_[size_t(layer) * caches + c];
    const int kvh = per_query_ ? c / G : c;
    p.observe(pos, k + kvh * hs, v + kvh * hs);
    const int first = per_query_ ? c : c * G, count = per_query_ ? 1 : G;
    MatD Q(count, hs);
    for (int g = 0; g < count; ++g)
      Q.row(g) = Eigen::Map<const VecF>(q + (first + g) * hs, hs).cast<double>().transpose() * scale;
    answers_.assign(count, Answer{});
    p.attend(pos + 1, Q, &answers_, nullptr);
    for (int g = 0; g < count; ++g) Eigen::Map<VecF>(out + (first + g) * hs, hs) = answers_[g].z.cast<float>();
  }
}

double PolicyKVAttention::mean_cache_tokens() const {
  double s = 0;
  for (const auto& p : pol_) s += double(p->cache_tokens());
  return s / double(pol_.size());
}

double teacher_forced_ce(LlamaModel& model, const std::vector<int>& tokens, KVAttention* attn) {
  model.set_attention(attn);
  std::vector<float> ce;
  for (size_t pos = 0; pos + 1 < tokens.size(); ++pos)
    ce.push_back(token_cross_entropy(model.forward(tokens[pos], int(pos)), tokens[pos + 1]));
  model.set_attention(nullptr);
  return mean_of(ce);
}

std::vector<int> greedy_tokens(LlamaModel& model, const std::vector<int>& prompt, int total, KVAttention* attn) {
  model.set_attention(attn);
  std::vector<int> out(prompt);
  for (int pos = 0; pos < total - 1; ++pos) {
    const auto& logits = model.forward(out[pos], pos);
    if (pos + 1 < int(out.size())) continue;
    out.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  model.set_attention(nullptr);
  return out;
}

std::vector<ClosedLoopRow> run_closed_loop(const ClosedLoopConfig& c, const std::string& out_dir, int threads) {
  namespace fs = std::filesystem;
  LlamaModel model(c.checkpoint);
  const auto& cfg = model.config();
  if (c.tokens < 2 || c.tokens > cfg.seq_len)
    throw Error("model.tokens must be in [2, " + std::to_string(cfg.seq_len) + "] (the model's seq_len)");
  if (c.generate > 0 && std::min(16, c.tokens) + c.generate > c.tokens)
    throw Error("model.generate (" + std::to_string(c.generate) + ") + the 16-token prompt must fit in model.tokens (" +
                std::to_string(c.tokens) + ")");
  Tokenizer tok(c.tokenizer, cfg.vocab_size);
  std::ifstream in(c.text, std::ios::binary);
  if (!in) throw Error(c.text + ": cannot open text file");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const size_t need = size_t(c.tokens) * size_t(c.windows);
  if (text.size() > need * 16 + 64) text.resize(need * 16 + 64);
  std::vector<int> all = tok.encode(text, true, false);
  if (all.size() < need)
    throw Error(c.text + ": text yields " + std::to_string(all.size()) + " tokens, fewer than model.tokens × model.windows = " +
                std::to_string(need));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());

  std::vector<ClosedLoopRow> rows;
  for (int w = 0; w < c.windows; ++w) {
    std::vector<int> win(all.begin() + size_t(w) * c.tokens, all.begin() + size_t(w + 1) * c.tokens);
    const double ce_exact = teacher_forced_ce(model, win, nullptr);
    std::vector<int> gen_exact;
    const int prompt_len = std::min(16, c.tokens);
    const std::vector<int> prompt(win.begin(), win.begin() + prompt_len);
    if (c.generate > 0) gen_exact = greedy_tokens(model, prompt, prompt_len + c.generate, nullptr);
    // Open loop: the window's exact recording through the same policies (oracles allowed there).
    const std::string rec_path = (fs::path(out_dir) / ("window_" + std::to_string(w) + ".h5")).string();
    {
      RecordOptions ro;
      ro.checkpoint = c.checkpoint;
      ro.tokenizer = c.tokenizer;
      ro.text_path = c.text;
      ro.tokens = c.tokens;
      ro.out = rec_path;
      ro.with_attn = false;
      ro.token_ids = win;
      record_model(ro);
    }
    Experiment ex;
    ex.name = c.name;
    ex.seed = c.seed;
    ex.data.path = rec_path;
    ex.eval = c.eval;
    ex.policies = c.policies;
    RecordingReader rec(rec_path);
    RunResult open = run_experiment(ex, rec, threads);
    for (size_t p = 0; p < c.policies.size(); ++p) {
      const auto& spec = c.policies[p];
      ClosedLoopRow r;
      r.name = spec.name;
      r.label = spec.label;
      r.window = w;
      r.ce_exact = ce_exact;
      std::vector<double> re, ep;
      for (const auto& row : open.policies[p].rows) {
        re.push_back(row.rel_err);
        ep.push_back(row.eps_spectral);
      }
      r.open_rel_err = summarize(re).mean;
      r.open_eps = summarize(ep).mean;
      try {
        PolicyKVAttention attn(cfg, spec, c.tokens, c.seed, c.eval.gqa, c.eval.group_agg);
        r.ce_policy = teacher_forced_ce(model, win, &attn);
        r.ce_increase = r.ce_policy - ce_exact;
        r.cache_tokens = attn.mean_cache_tokens();
        if (c.generate > 0) {
          // Same stream length (and so the same token budgets) as the teacher-forced run.
          PolicyKVAttention gen_attn(cfg, spec, c.tokens, c.seed, c.eval.gqa, c.eval.group_agg);
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
          std::cerr << "kvsim closed-loop: " << spec.label << ", window " << w << ": the model broke down (" << what
                    << "); ce = nan\n";
          r.ce_policy = r.ce_increase = NAN;
        } else if (what.find("non-causal oracle") != std::string::npos) {
          r.ce_policy = r.ce_increase = NAN;  // oracles are open-loop only
        } else {
          throw;
        }
      }
      rows.push_back(r);
    }
    fs::remove(rec_path, ec);
  }
  const std::string path = (fs::path(out_dir) / "closed_loop.csv").string();
  {
    std::ofstream o(path + ".tmp");
    o << "policy,label,window,ce_exact,ce_policy,ce_increase,open_rel_err,open_eps,cache_tokens,diverge_at\n";
    char buf[512];
    for (const auto& r : rows) {
      std::string label = r.label;
      if (label.find(',') != std::string::npos) label = "\"" + label + "\"";
      std::snprintf(buf, sizeof buf, "%s,%s,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d\n", r.name.c_str(), label.c_str(), r.window,
                    r.ce_exact, r.ce_policy, r.ce_increase, r.open_rel_err, r.open_eps, r.cache_tokens, r.diverge_at);
      o << buf;
    }
    if (!o) throw Error(path + ": write failed");
  }
  fs::rename(path + ".tmp", path, ec);
  if (ec) throw Error(path + ": cannot move into place: " + ec.message());
  return rows;
}

}  // namespace kvsim
