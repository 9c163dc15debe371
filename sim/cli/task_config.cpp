// `kvsim task` configs (include/kvsim/cli/task.hpp, docs/tasks.md).
#include <algorithm>
#include <set>
#include <sstream>

#include "config_toml.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/core/error.hpp"

namespace kvsim {

using namespace config_detail;
using TV = toml::value;

namespace {

/// The [task] keys every kind takes, and those of one kind only (refused for the others).
const std::vector<std::string> kCommonKeys = {"kind",   "filler", "lengths",  "depths", "trials", "generate", "evict_needle",
                                              "link_steps", "prefix", "needle", "question", "format", "match"};
std::vector<std::string> kind_keys(const std::string& kind) {
  if (kind == "niah_single") return {"value_type"};
  if (kind.rfind("niah_", 0) == 0) return {"value_type", "needles"};
  if (kind == "variable_tracking") return {"hops", "chains", "examples"};
  if (kind == "common_words") return {"common", "common_repeats", "uncommon_repeats", "examples"};
  if (kind == "frequent_words") return {"alpha", "vocab"};
  return {};
}

/// Greedy tokens long enough for the kind's whole answer (RULER's are 128 for a needle, 30, 120, 50).
int default_generate(const std::string& kind, const TaskSettings& s) {
  if (kind == "passkey" || kind == "word") return 12;
  if (kind == "variable_tracking") return 30;
  if (kind == "common_words") return 120;
  if (kind == "frequent_words") return 50;
  const bool many = kind == "niah_multivalue" || kind == "niah_multiquery";
  return many ? (s.value_type == "uuid" ? 128 : 64) : (s.value_type == "uuid" ? 48 : 16);
}

int int_in(const TV& t, const char* key, int def, int lo, int hi) {
  const int64_t v = get_int(t, key, def, "task.");
  if (v < lo || v > hi) fail_at(t.at(key), "task." + std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return int(v);
}

std::string choice(const TV& t, const char* key, const std::string& def, const std::vector<std::string>& allowed) {
  const std::string v = get_string(t, key, def, "task.");
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string all;
    for (const auto& a : allowed) all += (all.empty() ? "\"" : ", \"") + a + "\"";
    fail_at(t.at(key), "task." + std::string(key) + " must be one of " + all);
  }
  return v;
}

void parse_settings(const TV& t, TaskConfig& c) {
  TaskSettings& s = c.settings;
  const bool fixed = c.kind == "passkey" || c.kind == "word";
  if (fixed && t.contains("format")) fail_at(t.at("format"), "task.format applies to the RULER kinds; passkey and word take task.prefix, needle and question");
  s.format = choice(t, "format", s.format, {"chatml", "plain"});
  s.match = choice(t, "match", fixed ? "word" : "substring", {"substring", "word"});
  s.value_type = choice(t, "value_type", s.value_type, {"number", "word", "uuid"});
  s.needles = int_in(t, "needles", s.needles, 1, 64);
  s.hops = int_in(t, "hops", s.hops, 1, 32);
  s.chains = int_in(t, "chains", s.chains, 1, 16);
  s.common = int_in(t, "common", s.common, 1, 100);
  s.common_repeats = int_in(t, "common_repeats", 0, 0, 1000);
  s.uncommon_repeats = int_in(t, "uncommon_repeats", 0, 0, 1000);
  if (t.contains("common_repeats") != t.contains("uncommon_repeats"))
    fail_at(t, "task.common_repeats and task.uncommon_repeats go together (neither: RULER's, by length)");
  if (s.common_repeats && s.common_repeats <= s.uncommon_repeats)
    fail_at(t.at("common_repeats"), "task.common_repeats must exceed task.uncommon_repeats (or the common words are not common)");
  s.alpha = get_double(t, "alpha", s.alpha, "task.");
  if (!(s.alpha > 1 && s.alpha <= 10)) fail_at(t.at("alpha"), "task.alpha must be in (1, 10] (a Zipf exponent with a finite ζ)");
  s.vocab = int_in(t, "vocab", 0, 0, 100000);
  s.examples = int_in(t, "examples", s.examples, 0, 4);
  if (s.vocab != 0 && s.vocab < 5) fail_at(t.at("vocab"), "task.vocab must be ≥ 5 (or 0: L / 50)");
}

void parse_task_table(const TV& t, TaskConfig& c) {
  c.kind = get_string(t, "kind", c.kind, "task.");
  const auto& kinds = task_kinds();
  if (std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end()) {
    std::string all;
    for (const auto& k : kinds) all += (all.empty() ? "\"" : ", \"") + k + "\"";
    fail_at(t.at("kind"), "task.kind must be one of " + all);
  }
  std::vector<std::string> keys = kCommonKeys, own = kind_keys(c.kind);
  keys.insert(keys.end(), own.begin(), own.end());
  for (const auto& kind : kinds)  // a key of another kind is named as such, not as an unknown key
    for (const auto& k : kind_keys(kind))
      if (t.contains(k) && std::find(own.begin(), own.end(), k) == own.end())
        fail_at(t.at(k), "task." + k + " does not apply to task.kind \"" + c.kind + "\"");
  check_keys(t, std::set<std::string>(keys.begin(), keys.end()), "[task]");
  parse_settings(t, c);
  c.templ = default_template(c.kind, c.settings);
  c.templ.prefix = get_string(t, "prefix", c.templ.prefix, "task.");
  c.templ.needle = get_string(t, "needle", c.templ.needle, "task.");
  c.templ.question = get_string(t, "question", c.templ.question, "task.");
  if (!task_has_needles(c.kind) && t.contains("needle")) fail_at(t.at("needle"), "task.needle: " + c.kind + " hides no needle");
  if (task_has_needles(c.kind) && c.templ.needle.find("{value}") == std::string::npos)
    fail_at(t.at("needle"), "task.needle must contain {value} (the answer)");
  c.filler = get_string(t, "filler", "", "task.");
  if (c.filler.empty() && c.kind != "frequent_words") fail_at(t, "[task] needs 'filler' (a real text file the filler is cut from)");
  c.lengths = get_int_list(t, "lengths", "task.");
  if (c.lengths.empty()) fail_at(t, "[task] needs 'lengths' (prompt lengths in tokens)");
  for (int L : c.lengths)
    if (L < 32) fail_at(t.at("lengths"), "task.lengths must be ≥ 32 tokens");
  // A kind without needles (common_words, frequent_words) takes depths too: each depth only seeds its
  // trials, so that depths × trials is the trial count of every kind.
  if (t.contains("depths")) c.depths = get_double_list(t, "depths", "task.");
  if (c.depths.empty()) fail_at(t.at("depths"), "task.depths must not be empty");
  for (double d : c.depths)
    if (!(d >= 0 && d <= 1)) fail_at(t.at("depths"), "task.depths must be in [0, 1]");
  // Each trial is a prompt decoded once per cache: 10000 per (length, depth) is far past any interval's need,
  // and a larger count is a typo that would run for days (or fill the disk with --prompts).
  c.trials = int_in(t, "trials", c.trials, 1, 10000);
  c.generate = int_in(t, "generate", default_generate(c.kind, c.settings), 1, 256);
  if (t.contains("evict_needle")) {
    if (!t.at("evict_needle").is_boolean()) fail_at(t.at("evict_needle"), "task.evict_needle must be true or false");
    c.evict_needle = t.at("evict_needle").as_boolean();
  }
  c.link_steps = get_string(t, "link_steps", c.link_steps, "task.");
  if (c.link_steps != "question" && c.link_steps != "answer")
    fail_at(t.at("link_steps"), "task.link_steps must be \"question\" or \"answer\" (got \"" + c.link_steps + "\")");
}

}  // namespace

TaskConfig load_task(const std::string& path, const std::vector<std::string>& overrides) {
  TV root = load_root(path, overrides);
  try {
    TaskConfig c;
    check_keys(root, {"name", "seed", "model", "task", "eval", "policy"}, path + " (top level)");
    c.name = get_string(root, "name", c.name, "");
    const int64_t seed = get_int(root, "seed", 1, "");
    if (seed < 0) fail_at(root.at("seed"), "seed must be ≥ 0");
    c.seed = uint64_t(seed);
    if (!root.contains("model") || !root.at("model").is_table()) throw Error(path + ": missing [model] table");
    const TV& m = root.at("model");
    check_keys(m, {"checkpoint", "tokenizer"}, "[model]");
    c.checkpoint = get_string(m, "checkpoint", "", "model.");
    c.tokenizer = get_string(m, "tokenizer", "", "model.");
    if (c.checkpoint.empty()) throw Error(path + ": [model] needs 'checkpoint'");
    if (!root.contains("task") || !root.at("task").is_table()) throw Error(path + ": missing [task] table");
    parse_task_table(root.at("task"), c);
    parse_eval(root, c.eval);
    if (root.contains("eval"))
      for (const char* k : {"every", "from", "objectives", "device"})
        if (root.at("eval").contains(k))
          fail_at(root.at("eval").at(k), std::string("eval.") + k + " does not apply to a task (the question's steps are evaluated, on the CPU)");
    // A task without [[policy]] entries runs the exact cache and the control: which cells the model can answer.
    if (root.contains("policy")) c.policies = parse_policies(root, path);
    std::ostringstream s;
    s << toml::format(root, 100);
    c.config_text = s.str();
    return c;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

}  // namespace kvsim
