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

const ParamValue* ParamReader::read(const std::string& key, const std::optional<std::string>& def) {
  const ParamValue* v = p_.find(key);
  asked_[key] = v ? std::nullopt : def;
  if (v) used_.insert(key);
  return v;
}

int64_t ParamReader::get_int(const std::string& key, int64_t def) {
  const ParamValue* v = read(key, std::to_string(def));
  if (!v) return def;
  if (auto p = std::get_if<int64_t>(v)) return *p;
  throw Error("parameter '" + key + "' must be an integer" + where(key));
}

double ParamReader::get_double(const std::string& key, double def) {
  const ParamValue* v = read(key, param_to_string(ParamValue(def)));
  if (!v) return def;
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
  if (auto p = std::get_if<std::string>(v)) return *p;
  throw Error("parameter '" + key + "' must be a string" + where(key));
}

int64_t ParamReader::get_budget(const std::string& key, int64_t n, int64_t def) {
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
