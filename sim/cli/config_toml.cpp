#include "config_toml.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "kvsim/core/error.hpp"
#include "kvsim/policies/policy.hpp"
#include "overrides.hpp"

namespace kvsim::config_detail {

using TV = toml::value;
namespace fs = std::filesystem;

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
Error one_line(const toml::exception& e, const std::string& prefix) {
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

void parse_runtime(const TV& root, Runtime& r) {
  if (!root.contains("runtime")) return;
  const TV& t = root.at("runtime");
  if (!t.is_table()) fail_at(t, "runtime must be a table ([runtime])");
  std::set<std::string> allowed;
  for (const auto& k : runtime_keys()) allowed.insert(k.key);
  check_keys(t, allowed, "[runtime]");
  for (const auto& k : runtime_keys()) {
    if (!t.contains(k.key)) continue;
    const TV& v = t.at(k.key);
    const std::string type = k.type, who = std::string("runtime.") + k.key;
    std::string text;
    if (type == "string" && v.is_string()) text = v.as_string();
    else if (type == "integer" && v.is_integer()) text = std::to_string(v.as_integer());
    else if (type == "boolean" && v.is_boolean()) text = v.as_boolean() ? "true" : "false";
    else if (type == "float" && (v.is_floating() || v.is_integer())) text = toml::format(v);
    else fail_at(v, who + " must be a " + (type == "float" ? std::string("number") : type));
    try {
      k.set(r, text, who);
    } catch (const Error& e) {
      fail_at(v, e.what());
    }
  }
}

int64_t get_int(const TV& t, const std::string& key, int64_t def, const std::string& where) {
  if (!t.contains(key)) return def;
  const TV& v = t.at(key);
  if (!v.is_integer()) fail_at(v, where + key + " must be an integer");
  return v.as_integer();
}

namespace {
// x as an int, or a one-line error at v: "<what> does not fit in 32 bits".
int fit_int32(const TV& v, int64_t x, const std::string& what) {
  if (x < int64_t(std::numeric_limits<int>::min()) || x > int64_t(std::numeric_limits<int>::max()))
    fail_at(v, what + " does not fit in 32 bits");
  return int(x);
}
}  // namespace

int get_int32(const TV& t, const std::string& key, int def, const std::string& where) {
  const int64_t v = get_int(t, key, def, where);
  return t.contains(key) ? fit_int32(t.at(key), v, where + key + " = " + std::to_string(v)) : int(v);
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
  auto one = [&](const TV& e) {
    if (!e.is_integer()) fail_at(e, where + key + " must be a list of integers");
    const int64_t x = e.as_integer();
    out.push_back(fit_int32(e, x, where + key + ": " + std::to_string(x)));
  };
  if (v.is_integer()) {
    one(v);
    return out;
  }
  if (!v.is_array()) fail_at(v, where + key + " must be a list of integers");
  for (const auto& e : v.as_array()) one(e);
  return out;
}

std::vector<double> get_double_list(const TV& t, const std::string& key, const std::string& where) {
  std::vector<double> out;
  if (!t.contains(key)) return out;
  const TV& v = t.at(key);
  if (v.is_integer() || v.is_floating()) return {get_double(t, key, 0, where)};
  if (!v.is_array()) fail_at(v, where + key + " must be a number or a list of numbers");
  for (const auto& e : v.as_array()) {
    if (e.is_integer()) out.push_back(double(e.as_integer()));
    else if (e.is_floating()) out.push_back(e.as_floating());
    else fail_at(e, where + key + " must be a list of numbers");
  }
  return out;
}

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

Table::Table(const TV& v, std::string prefix, std::string where) : v_(v), prefix_(std::move(prefix)), where_(std::move(where)) {
  if (!v_.is_table()) fail_at(v_, where_ + " must be a table");
}
const TV& Table::at(const std::string& key) {
  read_.insert(key);
  return v_.at(key);
}
void Table::read(std::initializer_list<const char*> keys) {
  for (const char* k : keys) read_.insert(k);
}
int64_t Table::get_int(const std::string& key, int64_t def) {
  read_.insert(key);
  return config_detail::get_int(v_, key, def, prefix_);
}
int Table::get_int32(const std::string& key, int def) {
  read_.insert(key);
  return config_detail::get_int32(v_, key, def, prefix_);
}
double Table::get_double(const std::string& key, double def) {
  read_.insert(key);
  return config_detail::get_double(v_, key, def, prefix_);
}
std::string Table::get_string(const std::string& key, const std::string& def) {
  read_.insert(key);
  return config_detail::get_string(v_, key, def, prefix_);
}
bool Table::get_bool(const std::string& key, bool def) {
  read_.insert(key);
  if (!v_.contains(key)) return def;
  if (!v_.at(key).is_boolean()) fail_at(v_.at(key), prefix_ + key + " must be true or false");
  return v_.at(key).as_boolean();
}
std::vector<int> Table::get_int_list(const std::string& key) {
  read_.insert(key);
  return config_detail::get_int_list(v_, key, prefix_);
}
std::vector<double> Table::get_double_list(const std::string& key) {
  read_.insert(key);
  return config_detail::get_double_list(v_, key, prefix_);
}
std::vector<std::string> Table::get_string_list(const std::string& key) {
  read_.insert(key);
  return config_detail::get_string_list(v_, key, prefix_);
}
void Table::finish() const { check_keys(v_, read_, where_); }

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
void get_choice(Table& table, const std::string& key, E& out) {
  const std::string text = table.get_string(key, to_string(out));
  if (!table.contains(key)) return;
  const std::optional<E> v = parse_choice<E>(text);
  if (!v) fail_at(table.at(key), "eval." + key + " must be " + choice_names<E>() + ", not \"" + text + "\"");
  out = *v;
}

void parse_eval(const TV& root, EvalSpec& e) {
  if (!root.contains("eval")) return;
  const TV& ev = root.at("eval");
  if (!ev.is_table()) fail_at(ev, "[eval] must be a table");
  Table t(ev, "eval.", "[eval]");  // every key below is read, so finish() names any other as unknown
  if (t.contains("objectives") && !ev.at("objectives").is_boolean()) fail_at(ev.at("objectives"), "eval.objectives must be true or false");
  e.objectives = t.get_bool("objectives", e.objectives);
  e.objectives_every = t.get_int("objectives_every", e.objectives_every);
  if (e.objectives_every < 1) fail_at(t.at("objectives_every"), "eval.objectives_every must be ≥ 1");
  e.objectives_max_t = t.get_int("objectives_max_t", e.objectives_max_t);
  if (e.objectives_max_t < 1 || e.objectives_max_t > 16384)
    fail_at(t.at("objectives_max_t"), "eval.objectives_max_t must be in [1, 16384] (memory is t² doubles per head)");
  e.theorem44_alpha = t.get_double("theorem44_alpha", 0.0);
  e.theorem44_beta = t.get_double("theorem44_beta", 0.0);
  if (!(e.theorem44_alpha >= 0 && e.theorem44_alpha < 1)) fail_at(t.at("theorem44_alpha"), "eval.theorem44_alpha must be in [0, 1)");
  e.every = t.get_int("every", 1);
  if (e.every < 1) fail_at(t.at("every"), "eval.every must be ≥ 1");
  e.from = t.get_int("from", 1);
  if (e.from < 1) fail_at(t.at("from"), "eval.from must be ≥ 1");
  get_choice(t, "gqa", e.gqa);
  get_choice(t, "group_agg", e.group_agg);
  get_choice(t, "policy_precision", e.policy_precision);
  get_choice(t, "device", e.device);
  get_choice(t, "reference_precision", e.reference_precision);
  get_choice(t, "closed_form", e.closed_form);
  get_choice(t, "stepping", e.stepping);
  e.stepping_block = t.get_int("stepping_block", 0);
  if (e.stepping_block < 0 || e.stepping_block > 65536)
    fail_at(t.at("stepping_block"), "eval.stepping_block must be in [0, 65536] (0: the engine's choice)");
  e.topk = t.get_int("topk", e.topk);
  if (e.topk < 0 || e.topk > (int64_t(1) << 31)) fail_at(t.at("topk"), "eval.topk must be in [0, 2^31] (0: off)");
  t.finish();
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

/// Parse TOML from `in` (named `origin` in errors), anchor its paths at `base` (the config file's
/// folder; empty for text that is not a file) and apply `--set` overrides.
TV parse_root(std::istream& in, const std::string& origin, const std::vector<std::string>& overrides,
              const std::string& base) {
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

}  // namespace kvsim::config_detail
