#include "kvsim/core/params.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kvsim/core/error.hpp"

namespace kvsim {

void Params::set(const std::string& key, ParamValue v, std::string where) {
  values_[key] = std::move(v);
  where_[key] = std::move(where);
}

const ParamValue* Params::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::string Params::where(const std::string& key) const {
  auto it = where_.find(key);
  return (it == where_.end() || it->second.empty()) ? "" : " (" + it->second + ")";
}

std::string Params::origin(const std::string& key) const {
  auto it = where_.find(key);
  return it == where_.end() ? "" : it->second;
}

std::optional<ParamValue> literal_default(const ParamDecl& p) {
  const std::string& d = p.default_value;
  if (d.empty() || d.find(' ') != std::string::npos || d == "required" || d == "none") return std::nullopt;
  if (p.kind == "string") return ParamValue(d);
  if (p.kind == "bool" && (d == "true" || d == "false")) return ParamValue(d == "true");
  if ((p.kind == "int" || p.kind == "tokens") && d.find_first_not_of("-0123456789") == std::string::npos)
    return ParamValue(int64_t(std::stoll(d)));
  if (p.kind == "float" && d.find_first_not_of("-0123456789.e") == std::string::npos) return ParamValue(std::stod(d));
  return std::nullopt;
}

const ParamDecl* ParamReader::decl(const std::string& key) const {
  if (!decls_) return nullptr;
  for (const auto& d : *decls_)
    if (d.name == key) return &d;
  throw Error("reads parameter '" + key + "', which it does not declare (its registry entry's parameters)");
}

ParamValue ParamReader::declared_default(const std::string& key) const {
  const ParamDecl* d = decl(key);
  if (!d) throw Error("parameter '" + key + "': no declarations to take its default from");
  if (d->default_value == "required") throw Error("missing parameter '" + key + "' (" + d->doc + ")");
  if (auto v = literal_default(*d)) return *v;
  throw Error("parameter '" + key + "': its declared default '" + d->default_value + "' is a rule, not a value");
}

namespace {
/// Whether x lies in the interval `range` ("(0, 1)", "[1, inf)", "[-1, 64]"); throws for a malformed one.
bool in_interval(double x, const std::string& range) {
  const size_t comma = range.find(',');
  if (range.size() < 5 || comma == std::string::npos || (range.front() != '(' && range.front() != '[') ||
      (range.back() != ')' && range.back() != ']'))
    throw Error("declared range '" + range + "' is not an interval such as (0, 1] or [1, inf)");
  auto bound = [&](std::string t) {
    t.erase(0, t.find_first_not_of(' '));
    t.erase(t.find_last_not_of(' ') + 1);
    if (t == "inf" || t == "-inf") return t == "inf" ? HUGE_VAL : -HUGE_VAL;
    if (const size_t c = t.find('^'); c != std::string::npos) return std::pow(std::stod(t.substr(0, c)), std::stod(t.substr(c + 1)));
    return std::stod(t);
  };
  const double lo = bound(range.substr(1, comma - 1)), hi = bound(range.substr(comma + 1, range.size() - comma - 2));
  return (range.front() == '[' ? x >= lo : x > lo) && (range.back() == ']' ? x <= hi : x < hi);
}
}  // namespace

void ParamReader::check_range(const std::string& key, const ParamValue& v) const {
  const ParamDecl* d = decl(key);
  if (!d || d->range.empty()) return;
  if (auto s = std::get_if<std::string>(&v)) {
    const std::string choices = "|" + d->range + "|";
    if (choices.find("|" + *s + "|") == std::string::npos) {
      std::string list = d->range;
      std::replace(list.begin(), list.end(), '|', ',');
      throw Error("parameter '" + key + "' must be one of " + list + ", not \"" + *s + "\"" + where(key));
    }
    return;
  }
  const double x = std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v))
                   : std::holds_alternative<double>(v) ? std::get<double>(v) : 0.0;
  if (std::holds_alternative<bool>(v)) return;
  if (!in_interval(x, d->range))
    throw Error("parameter '" + key + "' = " + param_to_string(v) + " must be in " + d->range + where(key));
}

int64_t ParamReader::get_int(const std::string& key) {
  return get_int(key, p_.has(key) ? 0 : std::get<int64_t>(declared_default(key)));
}

double ParamReader::get_double(const std::string& key) {
  if (p_.has(key)) return get_double(key, 0.0);
  const ParamValue d = declared_default(key);
  return get_double(key, std::holds_alternative<int64_t>(d) ? double(std::get<int64_t>(d)) : std::get<double>(d));
}

bool ParamReader::get_bool(const std::string& key) {
  return get_bool(key, p_.has(key) ? false : std::get<bool>(declared_default(key)));
}

std::string ParamReader::get_string(const std::string& key) {
  return get_string(key, p_.has(key) ? std::string() : std::get<std::string>(declared_default(key)));
}

const ParamValue* ParamReader::read(const std::string& key, const std::optional<std::string>& def) {
  (void)decl(key);  // with declarations, an undeclared key is the factory's error
  const ParamValue* v = p_.find(key);
  asked_[key] = v ? std::nullopt : def;
  if (v) used_.insert(key);
  return v;
}

// The two-argument getters: `def` when absent; a given value is checked for its kind, then against
// the declared range (defaults are not: a rule's default may lie outside it, e.g. -1 = none).
int64_t ParamReader::get_int(const std::string& key, int64_t def) {
  const ParamValue* v = read(key, std::to_string(def));
  if (!v) return def;
  if (auto p = std::get_if<int64_t>(v)) {
    check_range(key, *v);
    return *p;
  }
  throw Error("parameter '" + key + "' must be an integer" + where(key));
}

double ParamReader::get_double(const std::string& key, double def) {
  const ParamValue* v = read(key, param_to_string(ParamValue(def)));
  if (!v) return def;
  if (std::holds_alternative<double>(*v) || std::holds_alternative<int64_t>(*v)) check_range(key, *v);
  if (auto p = std::get_if<double>(v)) return *p;
  if (auto p = std::get_if<int64_t>(v)) return double(*p);
  throw Error("parameter '" + key + "' must be a number" + where(key));
}

bool ParamReader::get_bool(const std::string& key, bool def) {
  const ParamValue* v = read(key, std::string(def ? "true" : "false"));
  if (!v) return def;
  if (auto p = std::get_if<bool>(v)) return *p;
  throw Error("parameter '" + key + "' must be true or false" + where(key));
}

std::string ParamReader::get_string(const std::string& key, const std::string& def) {
  const ParamValue* v = read(key, def);
  if (!v) return def;
  if (auto p = std::get_if<std::string>(v)) {
    check_range(key, *v);
    return *p;
  }
  throw Error("parameter '" + key + "' must be a string" + where(key));
}

int64_t ParamReader::get_budget(const std::string& key, int64_t n, int64_t def) {
  if (def < 0 && !p_.has(key))
    if (const ParamDecl* d = decl(key); d && d->default_value != "required") def = std::get<int64_t>(declared_default(key));
  const ParamValue* v = read(key, def >= 0 ? std::optional<std::string>(std::to_string(def)) : std::nullopt);
  if (!v) {
    if (def < 0) throw Error("missing parameter '" + key + "' (tokens as an integer, or a fraction of n in (0, 1])");
    return def;
  }
  if (auto p = std::get_if<int64_t>(v)) {
    if (*p < 0) throw Error("parameter '" + key + "' must be ≥ 0 tokens" + where(key));
    return n > 0 ? std::min(*p, n) : *p;  // more than the stream holds = keep every token
  }
  if (auto p = std::get_if<double>(v)) {
    if (!(*p > 0 && *p <= 1))
      throw Error("parameter '" + key + "' = " + std::to_string(*p) +
                  " : a fractional budget must be in (0, 1]; give whole tokens as an integer" + where(key));
    return std::max<int64_t>(1, std::llround(*p * double(n)));
  }
  throw Error("parameter '" + key + "' must be a number of tokens or a fraction of n" + where(key));
}

void ParamReader::check_all_used(const std::string& owner) const {
  for (auto& [k, v] : p_.values())
    if (!used_.count(k)) throw Error(owner + ": unknown parameter '" + k + "'" + where(k));
}

std::string param_to_string(const ParamValue& v) {
  std::ostringstream s;
  std::visit([&](auto&& x) {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<T, bool>) s << (x ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>) s << x;
    else s << x;
  }, v);
  return s.str();
}

std::string Params::to_string() const {
  std::string s;
  for (auto& [k, v] : values_) {
    if (!s.empty()) s += ",";
    s += k + "=" + param_to_string(v);
  }
  return s;
}

}  // namespace kvsim
