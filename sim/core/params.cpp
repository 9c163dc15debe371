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

std::string Params::where(const std::string& key) const {
  auto it = where_.find(key);
  return (it == where_.end() || it->second.empty()) ? "" : " (" + it->second + ")";
}

std::string Params::origin(const std::string& key) const {
  auto it = where_.find(key);
  return it == where_.end() ? "" : it->second;
}

int64_t Params::get_int(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  note(key, it == values_.end() ? std::optional<std::string>(std::to_string(def)) : std::nullopt);
  if (it == values_.end()) return def;
  used_.insert(key);
  if (auto p = std::get_if<int64_t>(&it->second)) return *p;
  throw Error("parameter '" + key + "' must be an integer" + where(key));
}

double Params::get_double(const std::string& key, double def) const {
  auto it = values_.find(key);
  note(key, it == values_.end() ? std::optional<std::string>(param_to_string(ParamValue(def))) : std::nullopt);
  if (it == values_.end()) return def;
  used_.insert(key);
  if (auto p = std::get_if<double>(&it->second)) return *p;
  if (auto p = std::get_if<int64_t>(&it->second)) return double(*p);
  throw Error("parameter '" + key + "' must be a number" + where(key));
}

bool Params::get_bool(const std::string& key, bool def) const {
  auto it = values_.find(key);
  note(key, it == values_.end() ? std::optional<std::string>(std::string(def ? "true" : "false")) : std::nullopt);
  if (it == values_.end()) return def;
  used_.insert(key);
  if (auto p = std::get_if<bool>(&it->second)) return *p;
  throw Error("parameter '" + key + "' must be true or false" + where(key));
}

std::string Params::get_string(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  note(key, it == values_.end() ? std::optional<std::string>(def) : std::nullopt);
  if (it == values_.end()) return def;
  used_.insert(key);
  if (auto p = std::get_if<std::string>(&it->second)) return *p;
  throw Error("parameter '" + key + "' must be a string" + where(key));
}

int64_t Params::get_budget(const std::string& key, int64_t n, int64_t def) const {
  auto it = values_.find(key);
  note(key, it == values_.end() && def >= 0 ? std::optional<std::string>(std::to_string(def)) : std::nullopt);
  if (it == values_.end()) {
    if (def < 0) throw Error("missing parameter '" + key + "' (tokens as an integer, or a fraction of n in (0, 1])");
    return def;
  }
  used_.insert(key);
  if (auto p = std::get_if<int64_t>(&it->second)) {
    if (*p < 0) throw Error("parameter '" + key + "' must be ≥ 0 tokens" + where(key));
    return n > 0 ? std::min(*p, n) : *p;  // more than the stream holds = keep every token
  }
  if (auto p = std::get_if<double>(&it->second)) {
    if (!(*p > 0 && *p <= 1))
      throw Error("parameter '" + key + "' = " + std::to_string(*p) +
                  " : a fractional budget must be in (0, 1]; give whole tokens as an integer" + where(key));
    return std::max<int64_t>(1, std::llround(*p * double(n)));
  }
  throw Error("parameter '" + key + "' must be a number of tokens or a fraction of n" + where(key));
}

void Params::check_all_used(const std::string& owner) const {
  for (auto& [k, v] : values_)
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
