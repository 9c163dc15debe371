// kvsim: `kvsim task` — retrieval tasks in the closed loop (docs/tasks.md). For every trial (task kind,
// prompt length L, needle depth d, index) the model reads the prompt once with exact attention (the
// batched prefill); every cache — the exact one, each [[policy]] entry and the evict_needle control
// (the exact cache without the needle's tokens) — receives the context (the prompt before the
// question) at once, as kvpress compresses a context (kvsim::prefill); the question's tokens then
// stream through each cache and the answer is decoded greedily, all caches as one batch. Each cache's
// answer is scored by exact match; beside it, the open-loop metrics of the same policy on the trial's
// exact tensors at the question's query steps, or the answer's ([task] link_steps) (rel_err, eps
// (SubGen's ε), kept_mass, needle_mass, needle_kept_mass, needle_kept) link the attention error to the answer.
#pragma once
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvsim/io/results.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/model/retrieval.hpp"

namespace kvsim {

struct TaskConfig {
  std::string name = "task";
  uint64_t seed = 1;
  std::string checkpoint, tokenizer;
  std::string kind = "passkey";     ///< one of task_kinds()
  TaskSettings settings;            ///< the kind's draws, format and scoring rule
  TaskTemplate templ;               ///< default_template(kind, settings), with any [task] prefix/needle/question given
  std::string filler;               ///< the real text the filler is cut from
  std::vector<int> lengths;         ///< prompt lengths L (tokens)
  std::vector<double> depths = {0.1, 0.3, 0.5, 0.7, 0.9};
  int trials = 10;                  ///< trials per (L, depth)
  int generate = 12;                ///< greedy tokens decoded per answer
  bool evict_needle = true;         ///< add the evict_needle control cache
  /// The open loop's evaluated steps: "question" (the question's tokens) or "answer" (the steps that
  /// produce the exact cache's answer, replayed over the prompt followed by that answer).
  std::string link_steps = "question";
  EvalSpec eval;                    ///< gqa, group_agg, policy_precision (the link's evaluation)
  std::vector<PolicySpec> policies; ///< budgets as fractions are fractions of L
  std::string config_text;          ///< as given, with --set overrides (a resumed run must match it)
};

/// TOML: name, seed, [model] checkpoint, tokenizer; [task] kind, filler, lengths, depths, trials,
/// generate, evict_needle, link_steps, prefix, needle, question, format, match and the kind's own settings
/// (value_type, needles, hops, chains, common, common_repeats, uncommon_repeats, alpha, vocab; a key
/// that does not apply to the kind is refused); [eval]; [[policy]]. Throws kvsim::Error naming
/// FILE:LINE and the key.
TaskConfig load_task(const std::string& path, const std::vector<std::string>& overrides = {});

/// One cache's result on one trial.
struct TaskRow {
  int length = 0, trial = 0;
  double depth = 0;          ///< the configured depth
  double needle_depth = 0;   ///< where the first evidence needle landed (share of the filler before it; NaN: none)
  int needle_begin = 0, needle_end = 0, question_begin = 0;
  std::string cache;         ///< "exact", a policy label, or "evict_needle"
  std::string policy;        ///< registry name ("exact", "evict_needle" for the control)
  std::string answer, generated;  ///< answer: every expected string, joined by ", "
  int correct = 0;           ///< 1 when every expected string is in the answer (score = 1)
  double score = 0;          ///< RULER's string_match_all: the share of the expected strings found
  std::string evidence;      ///< the evidence spans "b-e b-e …" (TaskTrial::evidence)
  /// Open loop at the link's steps (the question's or the answer's query steps), means over (layer,
  /// query head, step): NaN for the control and where a metric does not apply (needle_kept_share =
  /// Σ needle_kept_mass / Σ needle_mass).
  double rel_err = NAN, eps = NAN, kept_mass = NAN, needle_mass = NAN, needle_kept_mass = NAN, needle_kept = NAN,
         needle_kept_share = NAN;
  /// Offline scores that need no needle position (docs/tasks.md, "Offline scores"), over the same
  /// rows: the mean share of each query's exact top-k tokens kept (metric topk_kept, k = [eval] topk
  /// or 16); rel_err, kept_mass and topk_kept restricted to the retrieval heads (the ⌈10%⌉ of
  /// (layer, query head) pairs whose exact attention at the question is most concentrated: largest
  /// mean topk_mass, chosen from the exact rows alone); and the worst layer's mean (largest rel_err,
  /// smallest kept_mass and topk_kept).
  double topk_kept = NAN, rel_err_rheads = NAN, kept_mass_rheads = NAN, topk_kept_rheads = NAN,
         rel_err_worst_layer = NAN, kept_mass_worst_layer = NAN, topk_kept_worst_layer = NAN;
  double cache_tokens = NAN;  ///< closed loop: mean cached tokens per (layer, cache) after the answer
  double seconds = 0;         ///< the trial's wall time (the same for every cache of the trial)
};

struct TaskRunOptions {
  std::string out;
  int threads = 0;
  bool resume = false, force = false;  ///< as `kvsim run`: continue / discard an unfinished run in out
  bool quiet = false;
  /// Only the open loop (`kvsim task --open-loop`): per trial the exact prefill and every policy's
  /// replay at the link's steps ([task] link_steps), no cache answers, no policy's generation; rows
  /// for the policies only, with correct = −1, score and cache_tokens NaN; written to open_loop.csv
  /// (trials.csv's columns), no accuracy.csv. The offline scores' input (docs/tasks.md, "Offline scores").
  bool open_loop_only = false;
};

/// Runs every trial, writes trials.csv and accuracy.csv into opt.out (atomically; each finished trial
/// is checkpointed under opt.out/trials/ until the run completes) and returns the rows.
std::vector<TaskRow> run_task(const TaskConfig& c, const TaskRunOptions& opt);

/// Writes every trial's prompt as JSON Lines to `path` (atomically) without running it, so that another
/// implementation can answer the same tokens (scripts/kvpress_task.py): per trial kind, length, depth,
/// trial, needle_depth, needle_begin, needle_end, question_begin, key, value, generate, budgets (each
/// [[policy]] label's cache size in tokens, pinned as run_task pins it; -1 for none) and tokens.
/// Throws kvsim::Error naming task.filler when the filler cannot be read.
void write_task_prompts(const TaskConfig& c, const std::string& path);

/// One of TaskRow's offline scores as a trials.csv column (and a checkpoint key): its name and field.
struct ScoreColumn {
  const char* name;
  double TaskRow::*field;
};
/// TaskRow's offline scores in column order (topk_kept, rel_err_rheads, …, topk_kept_worst_layer).
const std::vector<ScoreColumn>& offline_score_columns();
/// The retrieval heads of an open loop run with `[eval] topk` > 0: the ⌈10%⌉ (at least one) of its
/// (layer, query head) pairs with the largest mean topk_mass over the rows (the exact attention's
/// concentration, the same for every policy), ties to the earlier pair. Empty without topk_mass.
std::set<std::pair<int, int>> retrieval_heads(const RunResult& res);
/// Fills r's offline scores from one policy's open-loop rows: topk_kept's mean; rel_err, kept_mass
/// and topk_kept over the rows of `rheads`; each one's worst layer mean (the largest rel_err, the
/// smallest kept_mass and topk_kept). NaN where no row has the metric.
void offline_scores(const PolicyResult& pol, const std::set<std::pair<int, int>>& rheads, TaskRow& r);

/// accuracy.csv's rows as a table: per (L, cache) trials, correct, accuracy and its 95% Wilson interval.
std::string task_report(const TaskConfig& c, const std::vector<TaskRow>& rows);

}  // namespace kvsim
