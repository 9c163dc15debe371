#include "overrides.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>

#include "kvsim/core/error.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::config_detail {

using TV = toml::value;

TV parse_override_value(const std::string& text) {
  std::istringstream in("x = " + text);
  try {
    auto t = toml::parse(in, "--set");
    return t.at("x");
  } catch (const std::exception&) {
    return TV(text);
  }
}

/// Whether a [[policy]] entry accepts parameter `key`: its policy documents it (registry), it is
/// `memory` and the policy has an equal-memory rule, or the entry sets it already.
bool accepts(const TV& entry, const std::string& key) {
  if (!entry.is_table()) return false;
  if (entry.contains(key) || key == "label") return true;
  if (!entry.contains("name") || !entry.at("name").is_string()) return false;
  try {
    const PolicyInfo& info = policy_info(entry.at("name").as_string());
    if (key == "memory") return info.memory.has_value();
    for (const auto& p : info.params)
      if (p.name == key) return true;
  } catch (const Error&) {
    return true;  // an unknown policy name is reported by name later
  }
  return false;
}

/// After `--set policy.KEY`: a size parameter that `memory` replaces (the policy's MemoryRule) and
/// `memory` itself exclude each other, so setting one drops the other from the entry.
void drop_other_sizing(TV& entry, const std::string& key) {
  if (!entry.contains("name") || !entry.at("name").is_string()) return;
  try {
    const PolicyInfo& info = policy_info(entry.at("name").as_string());
    if (!info.memory) return;
    const auto& r = info.memory->refuses;
    if (key == "memory")
      for (const auto& k : r) entry.as_table().erase(k);
    else if (std::find(r.begin(), r.end(), key) != r.end())
      entry.as_table().erase("memory");
  } catch (const Error&) {
  }
}

/// `--set policy.KEY=value`: sets KEY on every [[policy]] entry that accepts it, names the skipped
/// ones on stderr, and fails only when none accepts it.
void apply_to_accepting(toml::array& arr, const std::string& key, const TV& value, const std::string& spec) {
  std::string skipped;
  int applied = 0;
  for (size_t i = 0; i < arr.size(); ++i) {
    if (accepts(arr[i], key)) {
      arr[i].as_table()[key] = value;
      ++applied;
      // `memory` replaces a policy's size parameters, and they replace it: drop the other form.
      drop_other_sizing(arr[i], key);
      continue;
    }
    const std::string name = arr[i].is_table() && arr[i].contains("name") && arr[i].at("name").is_string()
                                 ? arr[i].at("name").as_string() : "?";
    skipped += (skipped.empty() ? "" : ", ") + std::to_string(i) + " (" + name + ")";
  }
  if (applied == 0) throw Error("--set '" + spec + "': no [[policy]] entry accepts '" + key + "'");
  if (!skipped.empty())
    std::cerr << "kvsim: --set " << spec << ": skipped [[policy]] entries " << skipped << " (no parameter '" << key << "')\n";
}

void apply_override(TV& root, const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) throw Error("--set '" + spec + "': expected key=value");
  std::string path = spec.substr(0, eq);
  TV value = parse_override_value(spec.substr(eq + 1));
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  std::function<void(TV&, size_t)> go = [&](TV& node, size_t i) {
    const std::string& key = parts[i];
    if (node.is_array()) {
      auto& arr = node.as_array();
      bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit);
      if (numeric) {
        size_t idx = std::stoul(key);
        if (idx >= arr.size()) throw Error("--set '" + spec + "': index " + key + " out of range (" + std::to_string(arr.size()) + " entries)");
        if (i + 1 == parts.size()) throw Error("--set '" + spec + "': cannot replace a whole entry");
        go(arr[idx], i + 1);
      } else if (i + 1 == parts.size() && i == 1 && parts[0] == "policy") {
        apply_to_accepting(arr, key, value, spec);  // policy.KEY: the entries that accept KEY
      } else {
        for (auto& e : arr) go(e, i);  // apply to every entry
      }
      return;
    }
    if (!node.is_table()) throw Error("--set '" + spec + "': '" + key + "' is not inside a table");
    if (i + 1 == parts.size()) {
      node.as_table()[key] = value;
      return;
    }
    auto& tab = node.as_table();
    if (!tab.count(key)) tab[key] = toml::table{};
    go(tab[key], i + 1);
  };
  go(root, 0);
}

/// `p` relative to the folder `base` holding the config file (absolute paths and an empty base
/// leave it as written), lexically normalised: `experiments/../results/x.h5` → `results/x.h5`.
std::string anchor(const std::string& p, const std::string& base) {
  if (p.empty() || base.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(base) / p).lexically_normal().string();
}

/// Rewrite the file paths a config names — `[data] path` (string or list) and `[model]` checkpoint,
/// tokenizer and text — relative to the config file's folder. Runs before `--set` overrides, so a
/// path given on the command line keeps meaning "relative to the working directory".
void anchor_paths(toml::value& root, const std::string& base) {
  if (base.empty() || !root.is_table()) return;
  auto fix = [&](toml::value& v) {
    // In place, so that the value keeps its file:line for error messages (toml11 v3's string holds `str`).
    if (v.is_string()) v.as_string().str = anchor(v.as_string().str, base);
  };
  if (root.contains("data") && root.at("data").is_table() && root.at("data").contains("path")) {
    toml::value& p = root.as_table().at("data").as_table().at("path");
    if (p.is_array())
      for (auto& e : p.as_array()) fix(e);
    else
      fix(p);
  }
  if (root.contains("model") && root.at("model").is_table())
    for (const char* k : {"checkpoint", "tokenizer", "text"})
      if (root.at("model").contains(k)) fix(root.as_table().at("model").as_table().at(k));
  if (root.contains("task") && root.at("task").is_table() && root.at("task").contains("filler"))
    fix(root.as_table().at("task").as_table().at("filler"));
  if (root.contains("policy") && root.at("policy").is_array())  // per-cache budgets (kvsim allocate's files)
    for (auto& pe : root.as_table().at("policy").as_array())
      if (pe.is_table() && pe.contains("budgets_file")) {
        toml::value& b = pe.as_table().at("budgets_file");
        if (b.is_array())
          for (auto& e : b.as_array()) fix(e);
        else
          fix(b);
      }
}

}  // namespace kvsim::config_detail
