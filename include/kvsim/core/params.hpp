// kvsim: named parameters (a [[policy]] table, a --set override) and a policy specification.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

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

/// One declared parameter of a policy: the one place its type, default, doc and range are written
/// (a policy's registry entry, include/kvsim/policies/registry.hpp). Its factory reads it through a
/// ParamReader that holds the declarations, so the default it applies is the declared one, and the
/// value is checked against the range there; the documentation, `kvsim policies`, the resolved
/// config and the Python API are written from the same entry.
struct ParamDecl {
  std::string name;
  /// "tokens" (an integer count, or a float in (0, 1] = fraction of n), "int", "float", "bool", "string".
  std::string kind;
  /// The default the factory applies when the key is absent: a literal ("4", "false", "accumulated",
  /// read by the one-argument getters); "required"; or a rule in words ("recent + 4·centers") that the
  /// factory computes and passes to a two-argument getter.
  std::string default_value;
  std::string doc;  ///< meaning and unit
  /// Allowed values, checked by the reader on the given or default value; empty: any of its kind.
  /// Numbers: an interval "(0, 1)", "[1, 64]", "[0, inf)", "[2, 2^31]"; strings: the choices "accumulated|oracle".
  std::string range = {};
};

/// A declaration's literal default (kind "int": 4, "float": 0.5, "bool": false, "string":
/// "accumulated") as a value; nullopt for "required", "none" and rules such as "recent + 4·centers".
std::optional<ParamValue> literal_default(const ParamDecl& p);

/// A policy factory's typed view of its Params (PolicyInfo::make): every getter converts the value,
/// throws kvsim::Error naming the key and where it was set when the value has the wrong kind, and
/// records the key as read, so that `check_all_used` rejects keys no factory asked for (typos are
/// errors, not silent defaults). One reader per construction; the Params it reads stay untouched.
class ParamReader {
 public:
  /// `decls`: the policy's declared parameters (kept by the caller); with them, the one-argument
  /// getters apply the declared default and every getter checks the declared range, and reading an
  /// undeclared key is an error (a factory out of step with its declaration).
  explicit ParamReader(const Params& p, const std::vector<ParamDecl>* decls = nullptr) : p_(p), decls_(decls) {}
  bool has(const std::string& key) const { return p_.has(key); }
  std::string where(const std::string& key) const { return p_.where(key); }
  int64_t get_int(const std::string& key, int64_t def);
  double get_double(const std::string& key, double def);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  /// The declared parameter `key` with its declared literal default when absent (a "required" one
  /// that is absent is an error naming it); needs the declarations.
  int64_t get_int(const std::string& key);
  double get_double(const std::string& key);
  bool get_bool(const std::string& key);
  std::string get_string(const std::string& key);
  /// A token budget: an integer is a number of tokens, a float in (0, 1] a fraction of n (rounded,
  /// at least 1). A count above n (when n > 0 is known) is clamped to n: a cache cannot hold more
  /// tokens than the stream has, so "more than n" means "keep everything" and never sizes an
  /// allocation. Without `def`, the declared literal default (when there are declarations); throws if
  /// missing and there is neither.
  int64_t get_budget(const std::string& key, int64_t n, int64_t def = -1);
  /// Throws "<owner>: unknown parameter 'k' (where)" for the first given key no getter read.
  void check_all_used(const std::string& owner) const;
  /// Every key a getter asked for, with the default it applied when the key was absent (nullopt when
  /// it was given, or absent without a default). The policy registry's tests compare this with the
  /// documented parameters and defaults.
  const std::map<std::string, std::optional<std::string>>& asked() const { return asked_; }

 private:
  const Params& p_;
  const std::vector<ParamDecl>* decls_;
  std::set<std::string> used_;
  std::map<std::string, std::optional<std::string>> asked_;
  /// Records the read of `key` (with the default applied when absent) and returns its value or nullptr.
  const ParamValue* read(const std::string& key, const std::optional<std::string>& def);
  /// The declaration of `key` (nullptr without declarations; throws for an undeclared key).
  const ParamDecl* decl(const std::string& key) const;
  /// The declared literal default of `key` (throws when it has none: required and absent, or a rule).
  ParamValue declared_default(const std::string& key) const;
  /// Throws unless `v` (the value read for `key`) lies in the declared range.
  void check_range(const std::string& key, const ParamValue& v) const;
};

std::string param_to_string(const ParamValue& v);

/// A [[policy]] entry of an experiment: registry name, unique display label, parameters.
struct PolicySpec {
  std::string name;    ///< registry name (exact, window, ...)
  std::string label;   ///< unique display label, e.g. "window(budget=0.25)"
  Params params;
};

}  // namespace kvsim
