// `kvsim task` configs (include/kvsim/cli/task.hpp, docs/tasks.md).
#include <sstream>

#include "config_toml.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/core/error.hpp"

namespace kvsim {

using namespace config_detail;
using TV = toml::value;

namespace {

void parse_task_table(const TV& t, TaskConfig& c) {
  check_keys(t, {"kind", "filler", "lengths", "depths", "trials", "generate", "evict_needle", "prefix", "needle", "question"},
             "[task]");
  c.kind = get_string(t, "kind", c.kind, "task.");
  if (c.kind != "passkey" && c.kind != "word") fail_at(t.at("kind"), "task.kind must be \"passkey\" or \"word\"");
  c.templ = default_template(c.kind);
  c.templ.prefix = get_string(t, "prefix", c.templ.prefix, "task.");
  c.templ.needle = get_string(t, "needle", c.templ.needle, "task.");
  c.templ.question = get_string(t, "question", c.templ.question, "task.");
  if (c.templ.needle.find("{value}") == std::string::npos) fail_at(t.at("needle"), "task.needle must contain {value} (the answer)");
  c.filler = get_string(t, "filler", "", "task.");
  if (c.filler.empty()) fail_at(t, "[task] needs 'filler' (a real text file the filler is cut from)");
  c.lengths = get_int_list(t, "lengths", "task.");
  if (c.lengths.empty()) fail_at(t, "[task] needs 'lengths' (prompt lengths in tokens)");
  for (int L : c.lengths)
    if (L < 32) fail_at(t.at("lengths"), "task.lengths must be ≥ 32 tokens");
  if (t.contains("depths")) c.depths = get_double_list(t, "depths", "task.");
  if (c.depths.empty()) fail_at(t.at("depths"), "task.depths must not be empty");
  for (double d : c.depths)
    if (!(d >= 0 && d <= 1)) fail_at(t.at("depths"), "task.depths must be in [0, 1]");
  c.trials = int(get_int(t, "trials", c.trials, "task."));
  if (c.trials < 1) fail_at(t.at("trials"), "task.trials must be ≥ 1");
  c.generate = int(get_int(t, "generate", c.generate, "task."));
  if (c.generate < 1 || c.generate > 256) fail_at(t.at("generate"), "task.generate must be in [1, 256]");
  if (t.contains("evict_needle")) {
    if (!t.at("evict_needle").is_boolean()) fail_at(t.at("evict_needle"), "task.evict_needle must be true or false");
    c.evict_needle = t.at("evict_needle").as_boolean();
  }
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
    c.policies = parse_policies(root, path);
    std::ostringstream s;
    s << toml::format(root, 100);
    c.config_text = s.str();
    return c;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

}  // namespace kvsim
