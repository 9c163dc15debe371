// kvsim: closed-loop model quality — a llama2.c model whose every (layer, KV head) cache is managed
// by a policy, so later tokens are computed from compressed attention exactly as a deployed cache
// would behave (beyond what the papers measure: how attention error turns into model quality).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kvsim/io/spec.hpp"
#include "kvsim/model/llama.hpp"

namespace kvsim {

struct ClosedLoopConfig {
  std::string name = "closed_loop";
  uint64_t seed = 1;
  std::string checkpoint, tokenizer, text;
  int tokens = 512;       ///< tokens per window (≤ the model's seq_len)
  int windows = 1;        ///< consecutive windows of the tokenized text
  double text_tail = 0;   ///< > 0: windows from the text's last share of tokens (held-out split)
  int generate = 0;       ///< > 0: also greedy-generate this many tokens from each window's prompt
  /// > 0: each window's first `prefill` tokens are the prompt (exact attention, then kvsim::prefill);
  /// cross-entropy is scored on the decoded positions only and generation starts from this prompt
  /// (0: no prompt; generation starts from the first 16 tokens).
  int prefill = 0;
  EvalSpec eval;          ///< gqa, group_agg (and open-loop evaluation cadence)
  std::vector<PolicySpec> policies;
};

/// TOML: name, seed, [model] checkpoint, tokenizer, text, text_tail, tokens, windows, generate, prefill; [eval]; [[policy]].
ClosedLoopConfig load_closed_loop(const std::string& path, const std::vector<std::string>& overrides = {});

struct ClosedLoopRow {
  std::string name, label;
  int window = 0;
  double ce_exact = 0, ce_policy = 0, ce_increase = 0;  ///< nats/token, teacher-forced
  double open_rel_err = NAN, open_eps = NAN;            ///< open-loop means on the exact recording
  double cache_tokens = NAN;                            ///< mean cached tokens per cache at the end
  int diverge_at = -1;                                  ///< generation: first differing token (-1: none / not run)
};

/// The printed report: one line per (policy, window) with full labels ("never" when greedy output never
/// differed, "-" when generation was off), then per policy the mean over windows of the cross-entropy
/// increase and the open-loop rel_err with 95% bootstrap intervals over windows.
std::string closed_loop_report(const ClosedLoopConfig& c, const std::vector<ClosedLoopRow>& rows);

/// Runs every policy on every window closed-loop (and open-loop on the window's exact recording);
/// writes closed_loop.csv into out_dir (atomically) and returns the rows.
std::vector<ClosedLoopRow> run_closed_loop(const ClosedLoopConfig& c, const std::string& out_dir, int threads);

}  // namespace kvsim
