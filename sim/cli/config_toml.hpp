// Internal: the TOML reading every kvsim config shares (sim/cli/config_toml.cpp) — one-line errors
// naming FILE:LINE and the offending line, typed getters, and the [eval] and [[policy]] tables —
// used by the experiment, closed-loop, cluster-study and task configs (sim/cli/config.cpp,
// sim/cli/task_config.cpp).
#pragma once
#include <cstdint>
#include <istream>
#include <set>
#include <string>
#include <toml.hpp>
#include <vector>

#include "kvsim/core/params.hpp"
#include "kvsim/core/runtime.hpp"
#include "kvsim/io/spec.hpp"

namespace kvsim::config_detail {

/// "FILE:LINE: " for a place in a config (or "--set KEY=VALUE: " for a value given on the command line).
std::string place(const toml::source_location& loc);
/// Every config error is one line: FILE:LINE: message (`the line`).
[[noreturn]] void fail_at(const toml::value& v, const std::string& msg);
/// A toml11 exception (multi-line, with an excerpt) as one line: FILE:LINE: first message line.
Error one_line(const toml::exception& e, const std::string& prefix = "");
/// Fails on the first key of `table` outside `allowed`, naming `where` and the allowed keys.
void check_keys(const toml::value& table, const std::set<std::string>& allowed, const std::string& where);
// Typed getters: `def` when the key is absent, a one-line error naming `where` + key on a wrong type.
int64_t get_int(const toml::value& t, const std::string& key, int64_t def, const std::string& where);
/// get_int for a key stored as `int`: a value outside [-2^31, 2^31) is refused in one line instead of wrapping
/// (4294967297 would otherwise read as 1).
int get_int32(const toml::value& t, const std::string& key, int def, const std::string& where);
double get_double(const toml::value& t, const std::string& key, double def, const std::string& where);
std::string get_string(const toml::value& t, const std::string& key, const std::string& def, const std::string& where);
std::vector<int> get_int_list(const toml::value& t, const std::string& key, const std::string& where);
/// A number or a list of numbers (empty when absent).
std::vector<double> get_double_list(const toml::value& t, const std::string& key, const std::string& where);
/// A string, or a non-empty list of strings (`[data] path = ["a.h5", "b.h5"]`).
std::vector<std::string> get_string_list(const toml::value& t, const std::string& key, const std::string& where);
ParamValue to_param(const toml::value& v, const std::string& key);

/// A config table read key by key: each getter reads its key with the free getters above (type,
/// default and the one-line error) and records it, and finish() fails on the first key of the table
/// no getter read, naming the keys that were. So a key is declared once, by the code that reads it:
/// there is no second list of allowed keys to keep in step.
class Table {
 public:
  /// `prefix` names keys in errors ("data."); `where` names the table ("[data]").
  Table(const toml::value& v, std::string prefix, std::string where);
  bool contains(const std::string& key) const { return v_.contains(key); }
  /// The value of `key`, recorded as read (for checks that need the value itself).
  const toml::value& at(const std::string& key);
  /// Records keys read elsewhere (a sub-table parsed by its own function).
  void read(std::initializer_list<const char*> keys);
  int64_t get_int(const std::string& key, int64_t def);
  int get_int32(const std::string& key, int def);
  double get_double(const std::string& key, double def);
  std::string get_string(const std::string& key, const std::string& def);
  bool get_bool(const std::string& key, bool def);
  std::vector<int> get_int_list(const std::string& key);
  std::vector<double> get_double_list(const std::string& key);
  std::vector<std::string> get_string_list(const std::string& key);
  /// Fails at the first key no getter read: "unknown key 'k' in WHERE (allowed: the keys read)".
  void finish() const;
  const toml::value& value() const { return v_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const toml::value& v_;
  std::string prefix_, where_;
  std::set<std::string> read_;
};
/// "FILE:LINE" of a value.
std::string where_of(const toml::value& v);
/// With a prompt of P tokens the prompt's steps are not decoded: eval.from defaults to P + 1 and a
/// given one must be > P.
void eval_after_prompt(const toml::value& root, int64_t P, const std::string& key, EvalSpec& e);
/// The [runtime] table into `r` (absent keys keep their values; include/kvsim/core/runtime.hpp): a
/// key outside runtime_keys(), a value of the wrong TOML type or out of range fails at its line.
void parse_runtime(const toml::value& root, Runtime& r);
/// The [eval] table into `e` (absent keys keep their defaults).
void parse_eval(const toml::value& root, EvalSpec& e);
/// Every [[policy]] entry, list-valued parameters expanded (cartesian product, in key order), labels
/// made unique; names, keys and kinds checked now (check_policy_spec).
std::vector<PolicySpec> parse_policies(const toml::value& root, const std::string& origin);
/// Parse TOML from `in` (named `origin` in errors), anchor its paths at `base` (the config file's
/// folder; empty for text that is not a file) and apply `--set` overrides.
toml::value parse_root(std::istream& in, const std::string& origin, const std::vector<std::string>& overrides,
                       const std::string& base = "");
/// The folder holding config file `path` ("." when it has none), against which its paths resolve.
std::string config_dir(const std::string& path);
/// The config file at `path`, parsed as parse_root does.
toml::value load_root(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace kvsim::config_detail
