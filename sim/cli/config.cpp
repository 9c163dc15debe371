#include "kvsim/cli/config.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <sstream>
#include <toml.hpp>

#include "kvsim/cli/closed_loop.hpp"
#include "kvsim/analysis/clustering.hpp"
#include "kvsim/core/error.hpp"
#include "overrides.hpp"

namespace kvsim {
namespace {

using TV = toml::value;
namespace fs = std::filesystem;
using config_detail::parse_override_value;
using config_detail::apply_override;
using config_detail::anchor_paths;

/// "FILE:LINE: " for a place in a config (or "--set KEY=VALUE: " for a value given on the command line).
std::string place(const toml::source_location& loc) {
  if (loc.file_name() == "--set") return "--set value `" + loc.line_str().substr(loc.line_str().rfind("x = ") == 0 ? 4 : 0) + "`: ";
  if (loc.line() == 0) return loc.file_name() == "unknown file" ? "" : loc.file_name() + ": ";
  return loc.file_name() + ":" + std::to_string(loc.line()) + ": ";
}

/// The offending config line, trimmed, in backquotes (empty when unknown).
std::string excerpt(const toml::source_location& loc) {
  if (loc.file_name() == "--set" || loc.line() == 0) return "";
  std::string s = loc.line_str();
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
  if (a == std::string::npos) return "";
  s = s.substr(a, b - a + 1);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return " (`" + s + "`)";
}

/// Every config error is one line: FILE:LINE: message (`the line`).
[[noreturn]] void fail_at(const TV& v, const std::string& msg) {
  const auto loc = v.location();
  throw Error(place(loc) + msg + excerpt(loc));
}

/// A toml11 exception (multi-line, with an excerpt) as one line: FILE:LINE: first message line.
Error one_line(const toml::exception& e, const std::string& prefix = "") {
  std::string first = e.what();
  first = first.substr(0, first.find('\n'));
  if (first.rfind("[error] ", 0) == 0) first = first.substr(std::strlen("[error] "));
  if (first.rfind("toml::", 0) == 0 && first.find(": ") != std::string::npos) first = first.substr(first.find(": ") + 2);
  return Error(place(e.location()) + prefix + first + excerpt(e.location()));
}

void check_keys(const TV& table, const std::set<std::string>& allowed, const std::string& where) {
  for (const auto& [k, v] : table.as_table()) {
    if (!allowed.count(k)) {
      std::string list;
      for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail_at(v, "unknown key '" + k + "' in " + where + " (allowed: " + list + ")");
    }
  }
}

int64_t get_int(const TV& t, const std::string& key, int64_t def, const std::string& where) {
  if (!t.contains(key)) return def;
  const TV& v = t.at(key);
  if (!v.is_integer()) fail_at(v, where + key + " must be an integer");
  return v.as_integer();
}

double get_double(const TV& t, const std::string& key, double def, const std::string& where) {
  if (!t.contains(key)) return def;
  const TV& v = t.at(key);
  if (v.is_integer()) return double(v.as_integer());
  if (!v.is_floating()) fail_at(v, where + key + " must be a number");
  return v.as_floating();
}

std::string get_string(const TV& t, const std::string& key, const std::string& def, const std::string& where) {
  if (!t.contains(key)) return def;
  const TV& v = t.at(key);
  if (!v.is_string()) fail_at(v, where + key + " must be a string");
  return v.as_string();
}

std::vector<int> get_int_list(const TV& t, const std::string& key, const std::string& where) {
  std::vector<int> out;
  if (!t.contains(key)) return out;
  const TV& v = t.at(key);
  if (v.is_integer()) return {static_cast<int>(v.as_integer())};
  if (!v.is_array()) fail_at(v, where + key + " must be a list of integers");
  for (const auto& e : v.as_array()) {
    if (!e.is_integer()) fail_at(e, where + key + " must be a list of integers");
    out.push_back(static_cast<int>(e.as_integer()));
  }
  return out;
}

/// A string, or a non-empty list of strings (`[data] path = ["a.h5", "b.h5"]`).
std::vector<std::string> get_string_list(const TV& t, const std::string& key, const std::string& where) {
  const TV& v = t.at(key);
  if (v.is_string()) return {v.as_string()};
  if (!v.is_array() || v.as_array().empty()) fail_at(v, where + key + " must be a string or a non-empty list of strings");
  std::vector<std::string> out;
  for (const auto& e : v.as_array()) {
    if (!e.is_string()) fail_at(e, where + key + " must be a list of strings");
    out.push_back(e.as_string());
  }
  return out;
}

ParamValue to_param(const TV& v, const std::string& key) {
  if (v.is_integer()) return int64_t(v.as_integer());
  if (v.is_floating()) return double(v.as_floating());
  if (v.is_boolean()) return bool(v.as_boolean());
  if (v.is_string()) return std::string(v.as_string());
  fail_at(v, "policy parameter '" + key + "' must be a number, boolean, string, or a list of those (a sweep)");
}

std::string where_of(const TV& v) {
  const auto loc = v.location();
  return loc.file_name() + ":" + std::to_string(loc.line());
}


/// With a prompt of P tokens the prompt's steps are not decoded: eval.from defaults to P + 1 and a
/// given one must be > P.
void eval_after_prompt(const TV& root, int64_t P, const std::string& key, EvalSpec& e) {
  if (P <= 0) return;
  if (!(root.contains("eval") && root.at("eval").contains("from"))) e.from = P + 1;
  else if (e.from <= P)
    fail_at(root.at("eval").at("from"), "eval.from (" + std::to_string(e.from) + ") must be > " + key + " (" +
                                            std::to_string(P) + "): the prompt's steps are not decoded");
}

/// `[eval] key` as a choice of E (include/kvsim/core/choices.hpp), left at `out` when absent; any
/// other value fails naming the key and the allowed values.
template <class E>
void get_choice(const TV& table, const std::string& key, E& out) {
  if (!table.contains(key)) return;
  const std::string text = get_string(table, key, to_string(out), "eval.");
  const std::optional<E> v = parse_choice<E>(text);
  if (!v) fail_at(table.at(key), "eval." + key + " must be " + choice_names<E>() + ", not \"" + text + "\"");
  out = *v;
}

void parse_eval(const TV& root, EvalSpec& e) {
  if (root.contains("eval")) {
    const TV& ev = root.at("eval");
    if (!ev.is_table()) fail_at(ev, "[eval] must be a table");
    check_keys(ev, {"every", "from", "gqa", "group_agg", "policy_precision", "device", "reference_precision", "closed_form", "objectives", "objectives_every", "objectives_max_t",
                    "theorem44_alpha", "theorem44_beta"},
               "[eval]");
    if (ev.contains("objectives")) {
      if (!ev.at("objectives").is_boolean()) fail_at(ev.at("objectives"), "eval.objectives must be true or false");
      e.objectives = ev.at("objectives").as_boolean();
    }
    e.objectives_every = get_int(ev, "objectives_every", e.objectives_every, "eval.");
    if (e.objectives_every < 1) fail_at(ev.at("objectives_every"), "eval.objectives_every must be ≥ 1");
    e.objectives_max_t = get_int(ev, "objectives_max_t", e.objectives_max_t, "eval.");
    if (e.objectives_max_t < 1 || e.objectives_max_t > 16384)
      fail_at(ev.at("objectives_max_t"), "eval.objectives_max_t must be in [1, 16384] (memory is t² doubles per head)");
    e.theorem44_alpha = get_double(ev, "theorem44_alpha", 0.0, "eval.");
    e.theorem44_beta = get_double(ev, "theorem44_beta", 0.0, "eval.");
    if (!(e.theorem44_alpha >= 0 && e.theorem44_alpha < 1))
      fail_at(ev.at("theorem44_alpha"), "eval.theorem44_alpha must be in [0, 1)");
    e.every = get_int(ev, "every", 1, "eval.");
    if (e.every < 1) fail_at(ev.at("every"), "eval.every must be ≥ 1");
    e.from = get_int(ev, "from", 1, "eval.");
    if (e.from < 1) fail_at(ev.at("from"), "eval.from must be ≥ 1");
    get_choice(ev, "gqa", e.gqa);
    get_choice(ev, "group_agg", e.group_agg);
    get_choice(ev, "policy_precision", e.policy_precision);
    get_choice(ev, "device", e.device);
    get_choice(ev, "reference_precision", e.reference_precision);
    get_choice(ev, "closed_form", e.closed_form);
  }

}

std::vector<PolicySpec> parse_policies(const TV& root, const std::string& origin) {
  std::vector<PolicySpec> out;
  if (!root.contains("policy") || !root.at("policy").is_array() || root.at("policy").as_array().empty())
    throw Error(origin + ": no [[policy]] entries");
  std::set<std::string> labels;
  for (const auto& pe : root.at("policy").as_array()) {
    if (!pe.is_table()) fail_at(pe, "each [[policy]] must be a table");
    if (!pe.contains("name")) fail_at(pe, "[[policy]] entry without 'name'");
    std::string name = get_string(pe, "name", "", "policy.");
    std::string label = get_string(pe, "label", "", "policy.");
    // Expand list-valued parameters (cartesian product, in key order).
    std::vector<std::pair<std::string, std::vector<std::pair<ParamValue, std::string>>>> axes;
    for (const auto& [k, v] : pe.as_table()) {
      if (k == "name" || k == "label") continue;
      std::vector<std::pair<ParamValue, std::string>> vals;
      if (v.is_array()) {
        if (v.as_array().empty()) fail_at(v, "policy parameter '" + k + "' is an empty list");
        for (const auto& e : v.as_array()) vals.emplace_back(to_param(e, k), where_of(e));
      } else {
        vals.emplace_back(to_param(v, k), where_of(v));
      }
      axes.emplace_back(k, std::move(vals));
    }
    std::sort(axes.begin(), axes.end(), [](auto& a, auto& b) { return a.first < b.first; });
    size_t total = 1;
    for (auto& a : axes) total *= a.second.size();
    for (size_t combo = 0; combo < total; ++combo) {
      PolicySpec spec;
      spec.name = name;
      size_t rest = combo;
      bool swept = false;
      std::string sweep_part;
      for (auto& [k, vals] : axes) {
        const auto& [val, where] = vals[rest % vals.size()];
        if (vals.size() > 1) {
          swept = true;
          sweep_part += (sweep_part.empty() ? "" : ",") + k + "=" + param_to_string(val);
        }
        rest /= vals.size();
        spec.params.set(k, val, where);
      }
      std::string pstr = spec.params.to_string();
      if (!label.empty()) spec.label = swept ? label + "(" + sweep_part + ")" : label;
      else spec.label = pstr.empty() ? name : name + "(" + pstr + ")";
      if (!labels.insert(spec.label).second)
        fail_at(pe, "duplicate policy label '" + spec.label + "' (give each [[policy]] a distinct 'label')");
      out.push_back(std::move(spec));
    }
  }
  // The checks that need no stream (names, keys, kinds), now, so a typo fails before any data is read;
  // the rest once, against the real stream (check_policy_spec, include/kvsim/policies/policy.hpp).
  for (const auto& p : out) {
    try {
      check_policy_spec(p.name, p.params);
    } catch (const Error& e) {
      throw Error(origin + ": " + e.what());
    }
  }
  return out;
}

Experiment interpret(const TV& root, const std::string& origin) {
  Experiment ex;
  check_keys(root, {"name", "seed", "data", "eval", "policy"}, origin + " (top level)");
  ex.name = get_string(root, "name", "experiment", "");
  int64_t seed = get_int(root, "seed", 1, "");
  if (seed < 0) fail_at(root.at("seed"), "seed must be ≥ 0");
  ex.seed = uint64_t(seed);

  if (!root.contains("data") || !root.at("data").is_table()) throw Error(origin + ": missing [data] table");
  const TV& data = root.at("data");
  check_keys(data, {"path", "synthetic", "n", "d", "n_layers", "n_heads", "n_kv_heads", "layers", "heads", "tokens",
                    "prefill", "softmax_scale", "q_scale", "k_scale", "v_scale", "cluster_c", "cluster_gamma", "cluster_diameter",
                    "center_scale", "query_norm", "n_heavy", "heavy_strength", "sequences", "recipe"},
             "[data]");
  const bool has_path = data.contains("path"), has_syn = data.contains("synthetic");
  if (has_path == has_syn) throw Error(origin + ": [data] needs exactly one of 'path' (a recording) or 'synthetic' (a preset)");
  ex.data.layers = get_int_list(data, "layers", "data.");
  ex.data.heads = get_int_list(data, "heads", "data.");
  ex.data.tokens = get_int(data, "tokens", 0, "data.");
  if (ex.data.tokens < 0) fail_at(data.at("tokens"), "data.tokens must be ≥ 0");
  ex.data.prefill = get_int(data, "prefill", 0, "data.");
  if (ex.data.prefill < 0) fail_at(data.at("prefill"), "data.prefill must be ≥ 0 (0 = no prompt)");
  if (ex.data.tokens > 0 && ex.data.prefill >= ex.data.tokens)
    fail_at(data.at("prefill"), "data.prefill must be < data.tokens (at least one decoded step)");
  if (has_path) {
    const std::vector<std::string> paths = get_string_list(data, "path", "data.");
    ex.data.path = paths.front();
    ex.data.recipe = get_string(data, "recipe", "", "data.");
    if (paths.size() > 1) ex.data.paths = paths;
    for (const char* k : {"n", "d", "n_layers", "n_heads", "n_kv_heads", "sequences"})
      if (data.contains(k)) fail_at(data.at(k), std::string("data.") + k + " only applies to synthetic data");
  } else {
    auto& s = ex.data.synth;
    ex.data.synthetic = true;
    s.preset = get_string(data, "synthetic", "", "data.");
    s.n = get_int(data, "n", s.n, "data.");
    s.head_dim = int(get_int(data, "d", s.head_dim, "data."));
    s.n_layers = int(get_int(data, "n_layers", s.n_layers, "data."));
    s.n_heads = int(get_int(data, "n_heads", s.n_heads, "data."));
    s.n_kv_heads = int(get_int(data, "n_kv_heads", s.n_heads, "data."));
    s.seed = ex.seed;
    s.softmax_scale = get_double(data, "softmax_scale", s.softmax_scale, "data.");
    s.q_scale = get_double(data, "q_scale", s.q_scale, "data.");
    s.k_scale = get_double(data, "k_scale", s.k_scale, "data.");
    s.v_scale = get_double(data, "v_scale", s.v_scale, "data.");
    s.cluster_c = get_double(data, "cluster_c", s.cluster_c, "data.");
    s.cluster_gamma = get_double(data, "cluster_gamma", s.cluster_gamma, "data.");
    s.cluster_diameter = get_double(data, "cluster_diameter", s.cluster_diameter, "data.");
    s.center_scale = get_double(data, "center_scale", s.center_scale, "data.");
    s.query_norm = get_double(data, "query_norm", s.query_norm, "data.");
    s.n_heavy = int(get_int(data, "n_heavy", s.n_heavy, "data."));
    s.heavy_strength = get_double(data, "heavy_strength", s.heavy_strength, "data.");
    s.validate(origin + ": data.");
    const int64_t seqs = get_int(data, "sequences", 1, "data.");
    if (seqs < 1 || seqs > 100000) fail_at(data.at("sequences"), "data.sequences must be in [1, 100000]");
    ex.data.sequences = int(seqs);
  }

  parse_eval(root, ex.eval);
  eval_after_prompt(root, ex.data.prefill, "data.prefill", ex.eval);
  ex.policies = parse_policies(root, origin);
  return ex;
}

/// Parse TOML from `in` (named `origin` in errors), anchor its paths at `base` (the config file's
/// folder; empty for text that is not a file) and apply `--set` overrides.
TV parse_root(std::istream& in, const std::string& origin, const std::vector<std::string>& overrides,
              const std::string& base = "") {
  TV root;
  try {
    root = toml::parse(in, origin);
  } catch (const toml::syntax_error& e) {
    throw one_line(e, "config syntax error: ");
  }
  anchor_paths(root, base);
  for (const auto& o : overrides) apply_override(root, o);
  return root;
}

/// The folder holding config file `path` ("." when it has none), against which its paths resolve.
std::string config_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

TV load_root(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open config file");
  return parse_root(in, path, overrides, config_dir(path));
}

/// The experiment a parsed config (paths anchored, overrides applied) describes.
Experiment experiment_from(const TV& root, const std::string& origin) {
  try {
    Experiment ex = interpret(root, origin);
    std::ostringstream s;
    s << toml::format(root, 100);
    ex.config_text = s.str();
    ex.resolved_text = resolved_config(ex);
    return ex;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

}  // namespace

ParamValue parse_param_value(const std::string& text) {
  TV v = parse_override_value(text);
  if (v.is_array()) throw Error("--param " + text + ": lists are not allowed here (one value per run)");
  return to_param(v, text);
}

ClosedLoopConfig load_closed_loop(const std::string& path, const std::vector<std::string>& overrides) {
  TV root = load_root(path, overrides);
  try {
    ClosedLoopConfig c;
    check_keys(root, {"name", "seed", "model", "eval", "policy"}, path + " (top level)");
    c.name = get_string(root, "name", c.name, "");
    int64_t seed = get_int(root, "seed", 1, "");
    if (seed < 0) fail_at(root.at("seed"), "seed must be ≥ 0");
    c.seed = uint64_t(seed);
    if (!root.contains("model") || !root.at("model").is_table()) throw Error(path + ": missing [model] table");
    const TV& m = root.at("model");
    check_keys(m, {"checkpoint", "tokenizer", "text", "text_tail", "tokens", "windows", "generate", "prefill"}, "[model]");
    c.checkpoint = get_string(m, "checkpoint", "", "model.");
    c.tokenizer = get_string(m, "tokenizer", "", "model.");
    c.text = get_string(m, "text", "", "model.");
    if (c.checkpoint.empty() || c.text.empty())
      throw Error(path + ": [model] needs 'checkpoint' and 'text' (and 'tokenizer' for a llama2.c checkpoint)");
    c.tokens = int(get_int(m, "tokens", c.tokens, "model."));
    c.windows = int(get_int(m, "windows", c.windows, "model."));
    c.generate = int(get_int(m, "generate", 0, "model."));
    if (c.windows < 1) fail_at(m.at("windows"), "model.windows must be ≥ 1");
    c.text_tail = get_double(m, "text_tail", 0.0, "model.");
    if (!(c.text_tail >= 0 && c.text_tail < 1)) fail_at(m.at("text_tail"), "model.text_tail must be in [0, 1)");
    if (c.generate < 0) fail_at(m.at("generate"), "model.generate must be ≥ 0");
    c.prefill = int(get_int(m, "prefill", 0, "model."));
    if (c.prefill < 0 || c.prefill >= c.tokens)
      fail_at(m.at("prefill"), "model.prefill must be in [0, model.tokens) (0 = no prompt)");
    parse_eval(root, c.eval);
    eval_after_prompt(root, c.prefill, "model.prefill", c.eval);
    c.policies = parse_policies(root, path);
    return c;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

ClusterStudy load_cluster_study(const std::string& path, const std::vector<std::string>& overrides) {
  TV root = load_root(path, overrides);
  try {
    ClusterStudy s;
    check_keys(root, {"name", "data", "clusters"}, path + " (top level)");
    s.name = get_string(root, "name", s.name, "");
    if (!root.contains("data") || !root.at("data").is_table()) throw Error(path + ": missing [data] table");
    check_keys(root.at("data"), {"path", "recipe"}, "[data]");
    s.path = get_string(root.at("data"), "path", "", "data.");
    if (s.path.empty()) throw Error(path + ": [data] needs 'path' (a recording)");
    if (root.contains("clusters")) {
      const TV& c = root.at("clusters");
      check_keys(c, {"delta_rel", "centers", "layers"}, "[clusters]");
      s.delta_rel = get_double(c, "delta_rel", s.delta_rel, "clusters.");
      if (!(s.delta_rel > 0)) fail_at(c.at("delta_rel"), "clusters.delta_rel must be > 0");
      s.centers = get_int(c, "centers", s.centers, "clusters.");
      if (s.centers < 1) fail_at(c.at("centers"), "clusters.centers must be ≥ 1");
      s.layers = get_int_list(c, "layers", "clusters.");
    }
    return s;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

Experiment parse_experiment(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  std::istringstream in(text);
  return experiment_from(parse_root(in, origin, overrides), origin);
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  return experiment_from(load_root(path, overrides), path);
}

}  // namespace kvsim
