// `kvsim task`: retrieval trials in the closed loop with the open-loop link (include/kvsim/cli/task.hpp).
#include "kvsim/cli/task.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <tuple>
#include <toml.hpp>

#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/model/policy_attention.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "task_trial.hpp"

namespace kvsim {

using namespace task_detail;
namespace fs = std::filesystem;

namespace {

/// Budgets given as fractions become tokens of the prompt length L, so the open loop (an L-token
/// stream) and the closed loop (L + generate positions) size every cache alike. An entry with a budgets
/// file keeps its fraction as `budgets_memory`: the file's allocation for that fraction, scaled to the
/// pinned tokens (not an allocation for round(f · L) tokens at the file's n, which it need not hold).
std::vector<PolicySpec> pin_budgets(const std::vector<PolicySpec>& specs, int L) {
  std::vector<PolicySpec> out;
  for (const auto& s : specs) {
    const PolicyInfo& info = policy_info(s.name);
    PolicySpec p{s.name, s.label, Params{}};
    for (const auto& [k, v] : s.params.values()) {
      bool tokens = k == "memory";
      for (const auto& pi : info.params) tokens |= pi.name == k && pi.kind == "tokens";
      const double* f = std::get_if<double>(&v);
      if (tokens && f && *f > 0 && *f <= 1) p.params.set(k, int64_t(std::max<long long>(1, std::llround(*f * L))), s.params.origin(k));
      else p.params.set(k, v, s.params.origin(k));
      if (k == "memory" && s.params.has("budgets_file") && !s.params.has("budgets_memory"))
        p.params.set("budgets_memory", v, s.params.origin(k));
    }
    out.push_back(std::move(p));
  }
  return out;
}

/// The spans as "b-e b-e …" (trials.csv's evidence column).
std::string evidence_text(const std::vector<Span>& spans) {
  std::string s;
  for (const Span& sp : spans) s += (s.empty() ? "" : " ") + std::to_string(sp.begin) + "-" + std::to_string(sp.end);
  return s;
}

/// One trial: the exact prefill, the closed loop of every cache on the context then the question,
/// the answers scored, and the open loop on the same tensors. Rows: exact, the policies, the control.
/// The rows of a trial run open-loop only (TaskRunOptions::open_loop_only): one per policy.
std::vector<TaskRow> open_loop_trial(const TaskConfig& c, const LlamaModel& model, const Tokenizer& tok, const TaskTrial& tr,
                                     int L, double depth, int index, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto specs = pin_budgets(c.policies, L);
  const TrialTensors tt = exact_tensors(model, tr.tokens, threads, tr.question_begin);
  std::vector<TaskRow> rows(specs.size());
  std::vector<TaskRow*> policy_rows;
  for (size_t p = 0; p < specs.size(); ++p) {
    TaskRow& r = rows[p];
    r.cache = specs[p].label, r.policy = specs[p].name;
    r.length = L, r.depth = depth, r.trial = index, r.needle_depth = tr.depth;
    r.needle_begin = tr.needle_begin, r.needle_end = tr.needle_end, r.question_begin = tr.question_begin;
    r.answer = tr.value, r.evidence = evidence_text(tr.evidence);
    r.correct = -1, r.score = NAN;
    policy_rows.push_back(&r);
  }
  const bool answer_steps = c.link_steps == "answer" && !specs.empty();
  link_trial(c, model, specs, tr, tt, answer_steps ? exact_generation(c, model, tt, tr, threads) : tr.tokens, stop_tokens(tok),
             threads, policy_rows);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& r : rows) r.seconds = secs;
  return rows;
}

/// The closed loop of one trial: exact, every policy's cache and the control, each given the context at once
/// then decoding the question and the answer in one batch; rows named and scored. Returns the exact cache's
/// tokens. The caches and the context's tensors are freed on return, before the open loop builds its own.
std::vector<int> closed_loop_answers(const TaskConfig& c, const LlamaModel& model, const Tokenizer& tok, const TaskTrial& tr,
                                     const std::vector<PolicySpec>& specs, const TrialTensors& tt, const std::vector<int>& stop,
                                     int threads, std::vector<TaskRow>& rows, const std::function<void()>& lap) {
  const auto& cfg = model.config();
  const PromptTensors ctx = context_tensors(tt, cfg, tr.question_begin);
  const int L = int(tr.tokens.size()), out_size = cfg.n_heads * cfg.head_dim(), total = L + c.generate;
  std::vector<std::unique_ptr<GuardedAttention>> caches;
  auto add = [&](std::unique_ptr<KVAttention> a, const std::string& label, const std::string& name) {
    caches.push_back(std::make_unique<GuardedAttention>(std::move(a), out_size));
    TaskRow r;
    r.cache = label, r.policy = name;
    rows.push_back(r);
  };
  auto policy_cache = [&](const PolicySpec& s) {
    auto a = std::make_unique<PolicyKVAttention>(cfg, s, total, c.seed, c.eval.gqa, c.eval.group_agg, tr.question_begin,
                                                c.eval.policy_precision == Precision::float32, prompt_block_of(c.eval));
    a->load_prompt(ctx);
    return a;
  };
  add(policy_cache(PolicySpec{"exact", "exact", Params{}}), "exact", "exact");
  for (const auto& s : specs) add(policy_cache(s), s.label, s.name);
  if (c.evict_needle) add(std::make_unique<EvictSpanAttention>(cfg, ctx, tr.evidence), "evict_needle", "evict_needle");
  std::vector<KVAttention*> attn;
  for (auto& g : caches) attn.push_back(g.get());
  lap();
  const auto gen = batched_greedy(model, tr.tokens, tr.question_begin, total, nullptr, attn, threads);
  lap();
  for (size_t b = 0; b < rows.size(); ++b) {
    TaskRow& r = rows[b];
    r.generated = generated_text(tok, std::vector<int>(gen[b].begin() + L, gen[b].end()), stop);
    r.score = caches[b]->broken().empty() ? answer_score(r.generated, tr.answers, c.settings.match) : 0;
    r.correct = r.score == 1;
    r.cache_tokens = caches[b]->mean_cache_tokens();
  }
  return gen.at(0);
}

std::vector<TaskRow> run_trial(const TaskConfig& c, const LlamaModel& model, const Tokenizer& tok, const TaskTrial& tr,
                               int L, double depth, int index, int threads, std::vector<double>& phases) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto specs = pin_budgets(c.policies, L);
  const TrialTensors tt = exact_tensors(model, tr.tokens, threads, tr.question_begin);
  std::function<void()> lap = [&, last = t0]() mutable {
    const auto now = std::chrono::steady_clock::now();
    phases.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  lap();
  std::vector<TaskRow> rows;
  const std::vector<int> stop = stop_tokens(tok);
  const std::vector<int> exact_generated = closed_loop_answers(c, model, tok, tr, specs, tt, stop, threads, rows, lap);
  for (TaskRow& r : rows) {
    r.length = L, r.depth = depth, r.trial = index, r.needle_depth = tr.depth;
    r.needle_begin = tr.needle_begin, r.needle_end = tr.needle_end, r.question_begin = tr.question_begin;
    r.answer = tr.value;
    r.evidence = evidence_text(tr.evidence);
  }
  std::vector<TaskRow*> policy_rows;
  for (size_t p = 0; p < specs.size(); ++p) policy_rows.push_back(&rows[p + 1]);
  link_trial(c, model, specs, tr, tt, exact_generated, stop, threads, policy_rows);
  lap();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& r : rows) r.seconds = secs;
  return rows;
}

// A finished trial's rows are checkpointed as TOML (any generated text round-trips).
toml::value to_toml(const std::vector<TaskRow>& rows) {
  toml::array arr;
  for (const auto& r : rows)
    arr.push_back(toml::table{{"length", r.length}, {"trial", r.trial}, {"depth", r.depth}, {"needle_depth", r.needle_depth},
                              {"needle_begin", r.needle_begin}, {"needle_end", r.needle_end}, {"question_begin", r.question_begin},
                              {"cache", r.cache}, {"policy", r.policy}, {"answer", r.answer}, {"generated", r.generated},
                              {"correct", r.correct}, {"score", r.score}, {"evidence", r.evidence}, {"rel_err", r.rel_err}, {"eps", r.eps}, {"kept_mass", r.kept_mass},
                              {"needle_mass", r.needle_mass}, {"needle_kept_mass", r.needle_kept_mass},
                              {"needle_kept", r.needle_kept}, {"needle_kept_share", r.needle_kept_share},
                              {"cache_tokens", r.cache_tokens}, {"seconds", r.seconds}});
  for (size_t i = 0; i < rows.size(); ++i)
    for (const ScoreColumn& s : offline_score_columns()) arr[i].as_table()[s.name] = rows[i].*s.field;
  return toml::table{{"row", arr}};
}

std::vector<TaskRow> from_toml(const std::string& path) {
  std::vector<TaskRow> rows;
  try {
    const auto root = toml::parse(path);
    for (const auto& t : toml::find<toml::array>(root, "row")) {
      TaskRow r;
      auto d = [&](const char* k) { return toml::find<double>(t, k); };
      auto i = [&](const char* k) { return int(toml::find<int64_t>(t, k)); };
      r.length = i("length"), r.trial = i("trial"), r.depth = d("depth"), r.needle_depth = d("needle_depth");
      r.needle_begin = i("needle_begin"), r.needle_end = i("needle_end"), r.question_begin = i("question_begin");
      r.cache = toml::find<std::string>(t, "cache"), r.policy = toml::find<std::string>(t, "policy");
      r.answer = toml::find<std::string>(t, "answer"), r.generated = toml::find<std::string>(t, "generated");
      r.correct = i("correct"), r.rel_err = d("rel_err"), r.kept_mass = d("kept_mass"), r.needle_mass = d("needle_mass");
      r.needle_kept_mass = d("needle_kept_mass"), r.needle_kept = d("needle_kept"), r.needle_kept_share = d("needle_kept_share");
      r.cache_tokens = d("cache_tokens"), r.seconds = d("seconds");
      // Written from the RULER suite on; a checkpoint of an earlier run has one expected string.
      r.score = toml::find_or<double>(t, "score", double(r.correct)), r.eps = toml::find_or<double>(t, "eps", NAN);
      r.evidence = toml::find_or<std::string>(t, "evidence", std::string());
      for (const ScoreColumn& s : offline_score_columns()) r.*s.field = toml::find_or<double>(t, s.name, NAN);  // from 2026-11-29
      rows.push_back(r);
    }
  } catch (const std::exception& e) {
    throw Error(path + ": unreadable task checkpoint (" + std::string(e.what()).substr(0, 120) + "); rerun with --force");
  }
  return rows;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

/// Newlines as the two characters \\n, so that every trials.csv row is one line.
std::string one_line_text(const std::string& s) {
  std::string o;
  for (char ch : s) o += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return o;
}

void write_trials_csv(const TaskConfig& c, const std::vector<TaskRow>& rows, const std::string& path) {
  std::ostringstream o;
  o << "kind,length,depth,trial,needle_depth,needle_begin,needle_end,question_begin,cache,policy,answer,generated,correct,"
       "score,evidence,rel_err,eps,kept_mass,needle_mass,needle_kept_mass,needle_kept,needle_kept_share,";
  for (const ScoreColumn& s : offline_score_columns()) o << s.name << ',';
  o << "cache_tokens,seconds,model,link_steps\n";
  const std::string model = csv_field(fs::path(c.checkpoint).stem().string());
  for (const auto& r : rows) {
    o << c.kind << ',' << r.length << ',' << fmt(r.depth) << ',' << r.trial << ',' << fmt(r.needle_depth) << ',' << r.needle_begin
      << ',' << r.needle_end << ',' << r.question_begin << ',' << csv_field(r.cache) << ',' << csv_field(r.policy) << ','
      << csv_field(r.answer) << ',' << csv_field(one_line_text(r.generated)) << ',' << r.correct << ',' << fmt(r.score) << ','
      << csv_field(r.evidence) << ',' << fmt(r.rel_err) << ',' << fmt(r.eps) << ','
      << fmt(r.kept_mass) << ',' << fmt(r.needle_mass) << ',' << fmt(r.needle_kept_mass) << ',' << fmt(r.needle_kept) << ','
      << fmt(r.needle_kept_share) << ',';
    for (const ScoreColumn& s : offline_score_columns()) o << fmt(r.*s.field) << ',';
    o << fmt(r.cache_tokens) << ',' << fmt(r.seconds) << ',' << model << ',' << c.link_steps << '\n';
  }
  write_file_atomically(path, o.str());
}

struct Cell {
  int n = 0, k = 0;
  double score = 0;  ///< Σ RULER score
  double share = 0;
  int shares = 0;
};

/// Per (L, cache), in the rows' order of first appearance.
std::vector<std::pair<std::pair<int, std::string>, Cell>> accuracy_cells(const std::vector<TaskRow>& rows) {
  std::vector<std::pair<std::pair<int, std::string>, Cell>> out;
  std::map<std::pair<int, std::string>, size_t> at;
  for (const auto& r : rows) {
    const auto key = std::make_pair(r.length, r.cache);
    if (!at.count(key)) at[key] = out.size(), out.push_back({key, Cell{}});
    Cell& c = out[at[key]].second;
    ++c.n, c.k += r.correct, c.score += r.score;
    if (!std::isnan(r.needle_kept_share)) c.share += r.needle_kept_share, ++c.shares;
  }
  return out;
}

std::string accuracy_csv(const TaskConfig& c, const std::vector<TaskRow>& rows) {
  const auto cells = accuracy_cells(rows);
  // A length counts where the exact cache's RULER score is ≥ 0.8 (its accuracy, for one expected string).
  std::map<int, double> exact, exact_score;
  for (const auto& [key, cell] : cells)
    if (key.second == "exact") exact[key.first] = double(cell.k) / cell.n, exact_score[key.first] = cell.score / cell.n;
  std::ostringstream o;
  o << "kind,length,cache,trials,correct,accuracy,wilson_low,wilson_high,score,exact_accuracy,exact_score,counts,"
       "needle_kept_share\n";
  for (const auto& [key, cell] : cells) {
    const auto [lo, hi] = wilson_interval(cell.k, cell.n);
    o << c.kind << ',' << key.first << ',' << csv_field(key.second) << ',' << cell.n << ',' << cell.k << ','
      << fmt(double(cell.k) / cell.n) << ',' << fmt(lo) << ',' << fmt(hi) << ',' << fmt(cell.score / cell.n) << ','
      << fmt(exact[key.first]) << ',' << fmt(exact_score[key.first]) << ',' << (exact_score[key.first] >= 0.8 ? 1 : 0) << ',' << fmt(cell.shares ? cell.share / cell.shares : NAN) << '\n';
  }
  return o.str();
}

}  // namespace

std::string task_report(const TaskConfig& c, const std::vector<TaskRow>& rows) {
  std::ostringstream o;
  char buf[256];
  size_t w = 12;
  for (const auto& r : rows) w = std::max(w, r.cache.size());
  o << c.kind << ": accuracy per prompt length and cache [95% Wilson interval]; score = RULER's mean share of the expected "
       "strings found; '*' = the exact cache scores below 0.8 there, so the length does not count\n";
  for (const auto& [key, cell] : accuracy_cells(rows)) {
    const auto [lo, hi] = wilson_interval(cell.k, cell.n);
    std::snprintf(buf, sizeof buf, "L=%-6d %s%s %3d/%-3d = %5.3f [%5.3f, %5.3f]  score %5.3f  needle kept share %s\n",
                  key.first, key.second.c_str(), std::string(w - key.second.size(), ' ').c_str(), cell.k, cell.n,
                  double(cell.k) / cell.n, lo, hi, cell.score / cell.n, cell.shares ? fmt(cell.share / cell.shares).c_str() : "-");
    o << buf;
  }
  for (const auto& [key, cell] : accuracy_cells(rows))
    if (key.second == "exact" && cell.score < 0.8 * cell.n)
      o << "* L=" << key.first << ": the exact cache answers " << cell.k << "/" << cell.n << " (score " << fmt(cell.score / cell.n) << ")\n";
  return o.str();
}

namespace {

/// `s` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') o += {'\\', char(ch)};
    else if (ch < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", ch);
      o += b;
    } else o += char(ch);
  }
  return o + "\"";
}

/// The filler text's tokens (task.filler, encoded without BOS): what every trial's filler is cut from.
std::vector<int> filler_tokens(const TaskConfig& c, const Tokenizer& tok) {
  if (c.filler.empty()) return {};  // frequent_words needs none
  std::ifstream in(c.filler, std::ios::binary);
  if (!in) throw Error(c.filler + ": cannot read the task's filler text (task.filler)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return tok.encode(text, false, false);
}

/// One line of progress per trial on stderr: what was run (or read from its checkpoint) and how long it took.
void print_progress(const TaskRunOptions& opt, const std::vector<TaskRow>& trial, const std::vector<double>& phases, int done,
                    int total, int L, double depth, int i, bool checkpointed) {
  if (opt.open_loop_only) {
    std::fprintf(stderr, "kvsim task: trial %d/%d (L=%d, depth %g, #%d): open loop of %zu caches, %.1f s%s\n", done + 1, total, L,
                 depth, i, trial.size(), trial.empty() ? 0.0 : trial[0].seconds, checkpointed ? " (checkpointed)" : "");
    return;
  }
  int right = 0;
  for (size_t b = 1; b < trial.size(); ++b) right += trial[b].correct;
  std::fprintf(stderr, "kvsim task: trial %d/%d (L=%d, depth %g, #%d): exact %s, %d/%zu other caches right, %.1f s", done + 1,
               total, L, depth, i, trial[0].correct ? "right" : "wrong", right, trial.size() - 1, trial[0].seconds);
  if (phases.size() == 4)
    std::fprintf(stderr, " (prefill %.1f, caches %.1f, decode %.1f, open loop %.1f)", phases[0], phases[1], phases[2], phases[3]);
  std::fprintf(stderr, checkpointed ? " (checkpointed)\n" : "\n");
}

}  // namespace

void write_task_prompts(const TaskConfig& c, const std::string& path) {
  LlamaModel model(c.checkpoint);
  const Tokenizer tok = load_tokenizer(c.checkpoint, c.tokenizer, model.config().vocab_size);
  const std::vector<int> filler = filler_tokens(c, tok);
  std::ostringstream o;
  for (int L : c.lengths) {
    const auto specs = pin_budgets(c.policies, L);
    for (double d : c.depths)
      for (int i = 0; i < c.trials; ++i) {
        const TaskTrial tr = make_trial(TrialSpec{c.kind, c.templ, L, d, i, c.seed, c.settings}, tok, filler);
        o << "{\"kind\": " << json_string(c.kind) << ", \"length\": " << L << ", \"depth\": " << d << ", \"trial\": " << i
          << ", \"needle_depth\": " << (std::isnan(tr.depth) ? "null" : fmt(tr.depth)) << ", \"needle_begin\": " << tr.needle_begin << ", \"needle_end\": " << tr.needle_end
          << ", \"question_begin\": " << tr.question_begin << ", \"key\": " << json_string(tr.key)
          << ", \"value\": " << json_string(tr.value) << ", \"answers\": [";
        for (size_t a = 0; a < tr.answers.size(); ++a) o << (a ? ", " : "") << json_string(tr.answers[a]);
        o << "], \"evidence\": [";
        for (size_t e = 0; e < tr.evidence.size(); ++e) o << (e ? ", " : "") << "[" << tr.evidence[e].begin << ", " << tr.evidence[e].end << "]";
        o << "], \"match\": " << json_string(c.settings.match) << ", \"generate\": " << c.generate << ", \"budgets\": {";
        for (size_t p = 0; p < specs.size(); ++p) {
          // The cache's pinned size in tokens (memory, else budget); -1 when it has neither.
          int64_t b = -1;
          for (const char* k : {"budget", "memory"})
            if (const auto* v = specs[p].params.find(k); v && std::holds_alternative<int64_t>(*v)) b = std::get<int64_t>(*v);
          o << (p ? ", " : "") << json_string(specs[p].label) << ": " << b;
        }
        o << "}, \"tokens\": [";
        for (size_t t = 0; t < tr.tokens.size(); ++t) o << (t ? ", " : "") << tr.tokens[t];
        o << "]}\n";
      }
  }
  write_file_atomically(path, o.str());
}

std::vector<TaskRow> run_task(const TaskConfig& c, const TaskRunOptions& opt) {
  LlamaModel model(c.checkpoint);
  const auto& cfg = model.config();
  const Tokenizer tok = load_tokenizer(c.checkpoint, c.tokenizer, cfg.vocab_size);
  for (int L : c.lengths)
    if (L + c.generate > cfg.seq_len)
      throw Error("task.lengths: " + std::to_string(L) + " + task.generate exceeds the model's context (" + std::to_string(cfg.seq_len) + ")");
  // A policy that cannot run here (a non-causal oracle, a bad parameter) fails now, before any trial.
  for (const auto& s : pin_budgets(c.policies, c.lengths[0]))
    PolicyKVAttention(cfg, s, c.lengths[0] + c.generate, c.seed, c.eval.gqa, c.eval.group_agg, c.lengths[0] / 2,
                      c.eval.policy_precision == Precision::float32);
  const std::vector<int> filler = filler_tokens(c, tok);
  // Settings that cannot fit a length fail now, before any file is written.
  for (int L : c.lengths) make_trial(TrialSpec{c.kind, c.templ, L, c.depths[0], 0, c.seed, c.settings}, tok, filler);
  const fs::path out(opt.out), ckpt = out / "trials";
  std::error_code ec;
  if (opt.force) fs::remove_all(ckpt, ec);
  // An open-loop-only run checkpoints its own kind of rows: the mode is part of what must match.
  const std::string run_text = c.config_text + (opt.open_loop_only ? "\n# kvsim task --open-loop\n" : "");
  if (fs::exists(ckpt / "config.toml")) {
    std::ifstream cf(ckpt / "config.toml");
    const std::string prev((std::istreambuf_iterator<char>(cf)), std::istreambuf_iterator<char>());
    if (!opt.resume) throw Error(opt.out + ": holds an unfinished task run (trials/); pass --resume to continue it or --force to start over");
    if (prev != run_text)
      throw Error(opt.out + ": the unfinished run there had another config (or the other of --open-loop and a full run); pass --force to start over");
  }
  fs::create_directories(ckpt, ec);
  if (ec) throw Error(ckpt.string() + ": cannot create the checkpoint folder: " + ec.message());
  write_file_atomically((ckpt / "config.toml").string(), run_text);
  // Trials run trial-index-major (every depth's trial #0, then every depth's #1, …), so that a run
  // stopped part-way (a long length, resumed later) has covered every depth about equally; the rows
  // are written in the (L, depth, trial) order of the config all the same.
  std::map<std::tuple<size_t, size_t, int>, std::vector<TaskRow>> by_trial;
  const int total = int(c.lengths.size() * c.depths.size()) * c.trials;
  int done = 0;
  for (size_t li = 0; li < c.lengths.size(); ++li)
    for (int i = 0; i < c.trials; ++i)
      for (size_t di = 0; di < c.depths.size(); ++di, ++done) {
        const int L = c.lengths[li];
        char name[64];
        std::snprintf(name, sizeof name, "L%d_d%zu_t%03d.toml", L, di, i);
        const fs::path file = ckpt / name;
        std::vector<TaskRow> trial;
        std::vector<double> phases;  // prefill, caches, decode, open loop (s)
        const bool checkpointed = fs::exists(file);
        if (checkpointed) {
          trial = from_toml(file.string());
        } else {
          const TaskTrial tr = make_trial(TrialSpec{c.kind, c.templ, L, c.depths[di], i, c.seed, c.settings}, tok, filler);
          trial = opt.open_loop_only ? open_loop_trial(c, model, tok, tr, L, c.depths[di], i, opt.threads)
                                     : run_trial(c, model, tok, tr, L, c.depths[di], i, opt.threads, phases);
          std::ostringstream s;
          s << to_toml(trial);
          write_file_atomically(file.string(), s.str());
        }
        if (!opt.quiet) print_progress(opt, trial, phases, done, total, L, c.depths[di], i, checkpointed);
        by_trial[{li, di, i}] = std::move(trial);
      }
  std::vector<TaskRow> rows;
  for (auto& [key, trial] : by_trial) rows.insert(rows.end(), trial.begin(), trial.end());
  if (opt.open_loop_only) {
    write_trials_csv(c, rows, (out / "open_loop.csv").string());
  } else {
    write_trials_csv(c, rows, (out / "trials.csv").string());
    write_file_atomically((out / "accuracy.csv").string(), accuracy_csv(c, rows));
  }
  fs::remove_all(ckpt, ec);
  return rows;
}

}  // namespace kvsim
