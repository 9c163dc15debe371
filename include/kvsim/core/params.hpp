// kvsim: named parameters (a [[policy]] table, a --set override) and a policy specification.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>

namespace kvsim {

/// One parameter value from a config ([[policy]] table) or the command line.
using ParamValue = std::variant<int64_t, double, bool, std::string>;

/// Named parameters with the place they came from (for error messages): a [[policy]] table or a
/// `--set` override, as given. Pure: nothing here changes when a value is read. Policies read their
/// parameters through a ParamReader, which records what was asked.
class Params {
 public:
  void set(const std::string& key, ParamValue v, std::string where = "");
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  /// The value of `key`, or nullptr when absent.
  const ParamValue* find(const std::string& key) const;
  /// " (file:line)" for error messages; empty if unknown.
  std::string where(const std::string& key) const;
  /// Where `key` was set, unformatted ("file:line"; empty if unknown): for copying it to another Params.
  std::string origin(const std::string& key) const;
  /// "key=value, ..." in key order (for labels and result attributes).
  std::string to_string() const;
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  std::map<std::string, ParamValue> values_;
  std::map<std::string, std::string> where_;
};

/// A policy factory's typed view of its Params (PolicyInfo::make): every getter converts the value,
/// throws kvsim::Error naming the key and where it was set when the value has the wrong kind, and
/// records the key as read, so that `check_all_used` rejects keys no factory asked for (typos are
/// errors, not silent defaults). One reader per construction; the Params it reads stay untouched.
class ParamReader {
 public:
  explicit ParamReader(const Params& p) : p_(p) {}
  bool has(const std::string& key) const { return p_.has(key); }
  std::string where(const std::string& key) const { return p_.where(key); }
  int64_t get_int(const std::string& key, int64_t def);
  double get_double(const std::string& key, double def);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  /// A token budget: an integer is a number of tokens, a float in (0, 1] a fraction of n (rounded,
  /// at least 1). A count above n (when n > 0 is known) is clamped to n: a cache cannot hold more
  /// tokens than the stream has, so "more than n" means "keep everything" and never sizes an
  /// allocation. Throws if missing and no default is given.
  int64_t get_budget(const std::string& key, int64_t n, int64_t def = -1);
  /// Throws "<owner>: unknown parameter 'k' (where)" for the first given key no getter read.
  void check_all_used(const std::string& owner) const;
  /// Every key a getter asked for, with the default it applied when the key was absent (nullopt when
  /// it was given, or absent without a default). The policy registry's tests compare this with the
  /// documented parameters and defaults.
  const std::map<std::string, std::optional<std::string>>& asked() const { return asked_; }

 private:
  const Params& p_;
  std::set<std::string> used_;
  std::map<std::string, std::optional<std::string>> asked_;
  /// Records the read of `key` (with the default applied when absent) and returns its value or nullptr.
  const ParamValue* read(const std::string& key, const std::optional<std::string>& def);
};

std::string param_to_string(const ParamValue& v);

/// A [[policy]] entry of an experiment: registry name, unique display label, parameters.
struct PolicySpec {
  std::string name;    ///< registry name (exact, window, ...)
  std::string label;   ///< unique display label, e.g. "window(budget=0.25)"
  Params params;
};

}  // namespace kvsim
